"""The peer watch (``actfirst.parallel.watchdog``) on real gloo ranks of spawned processes: a rank whose peer dies
is stopped naming that peer, whether the peer died silently, reported its failure or broke a collective; a rank
that holds the GIL for longer than the timeout is not taken for dead (its heartbeat is a process of its own)."""

import time

import pytest
from train_helpers import spawn_ranks, start_ranks


def _finish(procs, join_s: float = 300.0) -> list:
    """Wait for rank 0 (a bound, not an assertion), then for the rest; the exit statuses in rank order."""
    procs[0].join(timeout=join_s)
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    return [p.exitcode for p in procs]


def watched_rank(how: str, timeout_s: float, pid_file: str) -> None:
    """Rank 1 dies without a word (``silent``) or reports its failure (``report``); rank 0 then waits outside any
    collective (60 s, then exits 0), where only the peer watch can stop it. Rank 1 first writes its heartbeat
    process's pid to ``pid_file``."""
    import os
    import time
    from pathlib import Path

    from actfirst.parallel.context import init_parallel
    from actfirst.parallel.watchdog import PeerWatch

    ctx = init_parallel()
    watch = PeerWatch(ctx.rank, ctx.world_size, timeout_s=timeout_s, interval_s=0.2).start()
    if ctx.rank == 1:
        Path(pid_file).write_text(str(watch._heart.pid))
        time.sleep(1.0)
        if how == "report":
            watch.report_failure("rank 1 failed: ValueError: injected")
        os._exit(9)
    time.sleep(60)  # a long rollout: no collective would notice


@pytest.mark.parametrize("how", ["silent", "report"])
def test_peer_watch_stops_a_rank_whose_peer_died(how, capfd, tmp_path):
    """Heartbeat timeout 5 s: the peer watch stops rank 0 (its exit status) before its 60 s wait ends, naming why:
    a silent death by the missing heartbeat, a reported one by the report. The dead rank's heartbeat process ends
    with it."""
    import psutil

    from actfirst.parallel.launch import PEER_STOPPED_EXIT

    procs, _ = start_ranks(watched_rank, 2, how, 5.0, str(tmp_path / "heart.pid"))
    assert _finish(procs) == [PEER_STOPPED_EXIT, 9]
    err = capfd.readouterr().err
    why = "rank 1 stopped responding" if how == "silent" else "rank 1 failed: ValueError: injected"
    assert f"[rank 0] stopping: {why}" in err, err
    heart = int((tmp_path / "heart.pid").read_text())
    deadline = time.monotonic() + 60  # a bound, not the assertion: it ends within an interval of its parent
    while psutil.pid_exists(heart) and psutil.Process(heart).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"rank 1's heartbeat process {heart} outlived rank 1"
        time.sleep(0.2)


def gil_holding_rank(timeout_s: float, hold_s: float) -> dict | None:
    """Rank 1 holds the GIL for ``hold_s`` in one C call: libc's ``sleep`` through ``ctypes.PyDLL``, which calls
    without releasing the GIL (``CDLL`` would release it; ``time.sleep`` does; a pure-Python loop hands it over every
    5 ms). A thread of rank 1 counts while it can, which shows the GIL was held. Rank 0 waits outside any
    collective, watching rank 1. Returns rank 1's figures."""
    import ctypes
    import threading
    import time

    import torch.distributed as dist

    from actfirst.parallel.context import init_parallel
    from actfirst.parallel.watchdog import PeerWatch

    ctx = init_parallel()
    watch = PeerWatch(ctx.rank, ctx.world_size, timeout_s=timeout_s, interval_s=0.2).start()
    dist.barrier()  # both watches run
    result = None
    if ctx.rank == 1:
        ticks = [0]

        def count() -> None:
            while True:
                ticks[0] += 1
                time.sleep(0.01)

        threading.Thread(target=count, daemon=True).start()
        time.sleep(0.5)
        before, t0 = ticks[0], time.monotonic()
        ctypes.PyDLL(None).sleep(int(hold_s))
        result = {"held_s": time.monotonic() - t0, "ticks_while_held": ticks[0] - before}
        time.sleep(3 * 0.2)  # the peers see beats after the hold, too
    else:
        time.sleep(hold_s + 3 * 0.2)
    dist.barrier()
    watch.stop()
    return result


def test_a_rank_holding_the_gil_past_the_timeout_is_not_taken_for_dead(capfd):
    """Rank 1 holds the GIL for 12 s, the heartbeat timeout is 4 s: a heartbeat thread would have stopped for 12 s
    and rank 0 would have stopped the job; the heartbeat process keeps beating and both ranks end normally."""
    _, held = spawn_ranks(gil_holding_rank, 2, 4.0, 12.0)
    err = capfd.readouterr().err
    assert "stopping" not in err, err
    assert held["held_s"] > 4.0 and held["ticks_while_held"] <= 1, held  # the GIL was held past the timeout


def lost_peer_rank(timeout_s: float) -> None:
    """Rank 1 dies silently; rank 0's next collective with it fails, and its failure handler finds the cause."""
    import os
    import time

    import torch
    import torch.distributed as dist

    from actfirst.parallel.context import init_parallel
    from actfirst.parallel.watchdog import PeerWatch

    ctx = init_parallel()
    watch = PeerWatch(ctx.rank, ctx.world_size, timeout_s=timeout_s, interval_s=0.2).start()
    dist.barrier()
    if ctx.rank == 1:
        time.sleep(0.5)
        os._exit(9)
    try:
        time.sleep(1.5)
        dist.all_reduce(torch.ones(1))  # gloo: the connection to the dead rank is reset
    except BaseException as e:
        watch.fail(e)  # exits naming rank 1 when it sees rank 1's heartbeat stopped
        raise


def test_a_collective_failed_by_a_lost_peer_names_the_peer(capfd):
    """Across nodes the rank that notices first is the one whose collective failed: it must blame the peer whose
    heartbeat stopped, not itself (the peer watch's own timeout, 60 s here, is not what stops it: its message would
    lack what rank 0's collective got)."""
    from actfirst.parallel.launch import PEER_STOPPED_EXIT

    procs, _ = start_ranks(lost_peer_rank, 2, 60.0)
    assert _finish(procs) == [PEER_STOPPED_EXIT, 9]
    err = capfd.readouterr().err
    assert "[rank 0] stopping: rank 1 stopped responding (rank 0 then got" in err, err

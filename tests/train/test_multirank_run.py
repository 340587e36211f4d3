"""Several ranks through the product's command, on this CPU: real vLLM engines (one per rank, vLLM's
external_launcher), generated ALFWorld games, tiny models, gloo.

- ``python -m actfirst.run --nproc-per-node 2`` starts two ranks through PyTorch's elastic launcher: after each
  weight sync both engines answer a fixed probe alike, the trainer's log-probs match the engine's, the checkpoint
  holds both ranks' state; ``--resume`` continues it on one rank, and then on two again.
- A rank killed with SIGKILL ends the whole run, failed, with a line naming it; ``--resume`` finishes it (under
  ``pipeline: inflight``: the weights entering both engines mid-collection, the engines' check waiting for it).
- Two torchrun agents on this machine, as two nodes of one rank each, run the same command (with rollouts
  overlapping the update and the teacher sharded).
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
import yaml
from test_loop import check_tokens
from train_helpers import free_port

RUN_TIMEOUT_S = 420
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}


def write_config(base: dict, root, **changes):
    out_dir = root / "run"
    path = root / "train.yaml"
    path.write_text(yaml.safe_dump({**base, **changes, "out_dir": str(out_dir)}))
    return path, out_dir


@pytest.fixture(scope="module")
def base(tiny_run_config):
    return {**tiny_run_config, "probe_contexts": 2, "evaluation": None, "checkpoint_every": 1}


def run(*args, timeout=RUN_TIMEOUT_S):
    return subprocess.run([sys.executable, "-m", "actfirst.run", *args], env=ENV, capture_output=True, text=True,
                          timeout=timeout)


def rows(out_dir):
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def test_two_ranks_sync_their_engines_and_resume_on_one(base, tmp_path):
    # serial: update 2 then trains on samples the engines generated after the first sync (with async, the default,
    # they were collected during update 1, before it; the async case is the two-node test's)
    config, out_dir = write_config(base, tmp_path, num_updates=2, pipeline="serial")
    proc = run("--config", str(config), "--nproc-per-node", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "done: 2 updates on 2 rank(s)" in proc.stdout
    series = rows(out_dir)
    assert [r["update"] for r in series] == [1, 2] and {r["world_size"] for r in series} == {2}
    assert [r["weight_version"] for r in series] == [1, 2]
    # Both engines answer the fixed probe with the same tokens and log-probs after every sync ...
    assert all(r["sync/engine_tokens_agree"] == 1 and r["sync/engine_logprob_spread"] <= 1e-6 for r in series), \
        [(r["sync/engine_tokens_agree"], r["sync/engine_logprob_spread"]) for r in series]
    # ... and hold the trainer's weights: log pi_old of samples generated after a sync match the trainer's.
    synced = [r["mismatch_mean"] for r in series[1:] if r["mismatch_mean"] is not None]
    assert series[0]["mismatch_mean"] < 1e-4 and series[0]["version_lag_mean"] == 0
    assert synced and max(synced) < 1e-4, [r["mismatch_mean"] for r in series]
    assert all(len(r["ranks"]["transitions"]) == 2 and sum(r["ranks"]["transitions"]) == r["transitions"]
               for r in series)
    # the phase seconds are the slowest rank's, each rank's kept
    assert all(r[k] == max(r["ranks"][k]) and len(r["ranks"][k]) == 2 and min(r["ranks"][k]) > 0
               for r in series for k in ("score_s", "update_s", "sync_s")), [r["ranks"] for r in series]
    ckpt = out_dir / "checkpoints" / "update_000002"
    assert {"rank_00000.pt", "rank_00001.pt", "trainer_state.pt", "model.safetensors"} <= {
        p.name for p in ckpt.iterdir()} and any((ckpt / "optimizer").iterdir())
    # vLLM's own lines go to the run's log files, not to the console.
    console = proc.stdout + proc.stderr
    assert "Successfully reset prefix cache" not in console and "Failed to load weights" not in console
    assert "RotaryEmbedding: Failed to load weights" in (out_dir / "logs" / "vllm_rank1.log").read_text()

    proc = run("--config", str(config), "--resume", "num_updates=3")  # one rank (a CPU's default)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"resume: {ckpt} (update 2, weight version 2); 2 -> 1 ranks" in proc.stdout
    series = rows(out_dir)
    assert [(r["update"], r["world_size"], r["weight_version"]) for r in series] == [(1, 2, 1), (2, 2, 2), (3, 1, 3)]
    assert series[2]["lr"] == series[1]["lr"] and series[2]["skipped"] == 0

    proc = run("--config", str(config), "--resume", "--nproc-per-node", "2", "num_updates=4")  # and back to two
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "(update 3, weight version 3); 1 -> 2 ranks" in proc.stdout
    series = rows(out_dir)
    assert [(r["update"], r["world_size"]) for r in series] == [(1, 2), (2, 2), (3, 1), (4, 2)]
    assert series[3]["sync/engine_tokens_agree"] == 1 and series[3]["skipped"] == 0


def rank_pid(launcher: psutil.Process, rank: int) -> int | None:
    for child in launcher.children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank) and "actfirst.run" in " ".join(child.cmdline()):
                return child.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def test_a_killed_rank_ends_the_run_naming_it_and_resume_finishes(base, tmp_path):
    """Under ``pipeline: inflight`` with neither probe nor checkpoint at updates 1 and 3, only the engines' check,
    which waits for the collection ahead: it does not run beside it (before: it did, its time taken out of the
    training time while rollouts ran; ``probe/beside_collection`` was 1)."""
    config, out_dir = write_config(base, tmp_path, num_updates=4, pipeline="inflight", probe_contexts=0,
                                   checkpoint_every=2)
    log = tmp_path / "killed.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "actfirst.run", "--config", str(config), "--nproc-per-node",
                                 "2"], env=ENV, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    launcher = psutil.Process(proc.pid)
    deadline = time.perf_counter() + RUN_TIMEOUT_S
    latest = out_dir / "checkpoints" / "latest"
    while not (latest.exists() and latest.read_text().strip() == "update_000002"):
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.perf_counter() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    victim = rank_pid(launcher, 1)
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    code = proc.wait(timeout=300)  # a bound, not the assertion: the run ends, failed, naming the rank
    output = log.read_text()
    assert code == 1, output[-3000:]
    assert re.search(rf"\[launch\] rank 1 \(pid {victim}\) was killed by signal 9 \(SIGKILL\)", output), output[-3000:]
    gone_by = time.perf_counter() + 120  # environment workers exit when their rank's pipe closes
    while (left := [p for p in psutil.process_iter() if _in_group(p, proc.pid)]) and time.perf_counter() < gone_by:
        time.sleep(0.1)
    assert not left, f"alive 120 s after the run ended: {[_describe(p) for p in left]}"

    resumed = run("--config", str(config), "--resume", "--nproc-per-node", "2")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "done: 4 updates on 2 rank(s)" in resumed.stdout
    series = rows(out_dir)
    assert [r["update"] for r in series] == [1, 2, 3, 4] and [r["weight_version"] for r in series] == [1, 2, 3, 4]
    # inflight on two ranks: both engines agree after every sync, B.4's bound holds, nothing is discarded, and the
    # updates count their own requests' tokens only (the engines' check's left out, the collections' kept)
    assert all(r["pipeline"] == "inflight" and r["world_size"] == 2 for r in series)
    assert all(r["sync/engine_tokens_agree"] == 1 and r["sync/engine_logprob_spread"] <= 1e-6 for r in series)
    assert all(r["pipeline/max_staleness"] <= 1 and r["skipped"] == 0 for r in series)
    # the engines' check ran on a quiet engine every time, also at updates 1 and 3 where nothing else waited for it
    assert [r["probe/beside_collection"] for r in series] == [0.0] * 4, [r["probe/beside_collection"] for r in series]
    check_tokens(series, per_update=False)  # (before: the check's tokens taken out with rollout tokens beside them)


def _describe(process: psutil.Process) -> str:
    try:
        return f"{process.pid}: {' '.join(process.cmdline())[:200]}"
    except psutil.NoSuchProcess:
        return f"{process.pid}: gone"


def _in_group(process: psutil.Process, pgid: int) -> bool:
    try:
        return os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE
    except (ProcessLookupError, psutil.NoSuchProcess):
        return False


def test_two_torchrun_agents_as_two_nodes(base, tmp_path):
    """Also the paths a node run may take that the other tests do not: rollouts collected during the update (async),
    and a teacher sharded over the ranks."""
    config, out_dir = write_config(base, tmp_path, num_updates=2, pipeline="async",
                                   parallel={"teacher": "shard", "compute_dtype": "float32"})
    endpoint = f"127.0.0.1:{free_port()}"
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts",
         "0", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "two-nodes", "-m", "actfirst.run",
         "--config", str(config)], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)]
    outputs = [a.communicate(timeout=RUN_TIMEOUT_S)[0] for a in agents]
    assert [a.returncode for a in agents] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    assert any("done: 2 updates on 2 rank(s)" in o for o in outputs)
    series = rows(out_dir)
    assert [r["update"] for r in series] == [1, 2] and {r["world_size"] for r in series} == {2}
    assert all(r["sync/engine_tokens_agree"] == 1 and r["sync/engine_logprob_spread"] <= 1e-6 for r in series)
    assert all(0 <= r["version_lag_mean"] <= 1 for r in series) and series[0]["pipeline/overlapped"]

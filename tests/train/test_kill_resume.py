"""A whole training run (``python -m actfirst.run``: the real loop, its in-process vLLM engine, its ALFWorld env
workers) killed with SIGKILL, process group and all, during a checkpoint write and between checkpoint writes, then
resumed with ``--resume``: the checkpoint left behind is intact (the trainer state loads, transformers loads the
model), no ``.tmp-`` leftover is trusted and the next save removes them, the metrics series continues without a gap
or a duplicate, the counters (weight version, transitions, elapsed time) continue from the checkpoint, and the
updates lost are exactly those logged after the checkpoint: at most one with a checkpoint every update.

(``test_checkpoint.py`` kills ``save_checkpoint`` alone in a miniature loop; here it is the real run's process.)"""

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from actfirst.train.checkpoint import latest_checkpoint, load_checkpoint

POLL_S = 0.005
RUN_TIMEOUT_S = 300
WRITE_KILL_ATTEMPTS = 3


@pytest.fixture(scope="module")
def base_config(tiny_run_config):
    """The tiny run of ``tiny_run_config`` (tests/train/conftest.py), without evaluations."""
    return {**tiny_run_config, "probe_contexts": 1,
            "evaluation": None}  # the kills are about training and its checkpoints


def write_config(base: dict, tmp_path: Path, **changes) -> tuple[Path, Path]:
    out_dir = tmp_path / "run"
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump({**base, **changes, "out_dir": str(out_dir)}))
    return path, out_dir


def as_a_foreground_job() -> None:
    """In the child before exec: SIGINT at its default, as a terminal's foreground job has it, even when the tests
    run in a shell's background job, whose commands start with SIGINT ignored (Python then keeps it ignored, and
    Ctrl-C would reach no handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Run:
    """One ``python -m actfirst.run`` process in a session of its own (its env workers share its process group),
    with SIGINT at its default (:func:`as_a_foreground_job`); stdout and stderr go, unbuffered, to ``log``."""

    def __init__(self, config: Path, log: Path, *args: str) -> None:
        self.log = log
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        with open(log, "w") as f:
            self.proc = subprocess.Popen([sys.executable, "-m", "actfirst.run", "--config", str(config), *args],
                                         stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                         preexec_fn=as_a_foreground_job)
        self.pgid = self.proc.pid  # start_new_session: the process leads its own group
        self.started = time.perf_counter()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def group(self) -> list[psutil.Process]:
        """The live (non-zombie) processes of this run's process group."""
        members = []
        for p in psutil.process_iter(["status"]):
            try:
                if os.getpgid(p.pid) == self.pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                    members.append(p)
            except (ProcessLookupError, psutil.NoSuchProcess):
                pass
        return members

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            pytest.fail(f"the run exited by itself with {self.proc.returncode} before the kill:\n"
                        f"{self.output()[-4000:]}")
        if time.perf_counter() - self.started > RUN_TIMEOUT_S:
            self.kill()
            pytest.fail(f"nothing to kill for within {RUN_TIMEOUT_S} s:\n{self.output()[-4000:]}")

    def kill(self) -> int:
        """SIGKILL the whole process group; wait until none of it is left alive. Returns the group's size."""
        size = len(self.group())
        os.killpg(self.pgid, signal.SIGKILL)
        assert self.proc.wait(timeout=30) == -signal.SIGKILL
        self.wait_group_gone("SIGKILL")
        return size

    def wait_group_gone(self, after: str, timeout: float = 30) -> None:
        deadline = time.perf_counter() + timeout
        while left := self.group():
            if time.perf_counter() > deadline:
                alive = []
                for p in left:
                    try:
                        alive.append(f"{p.pid}: {' '.join(p.cmdline())[:200]}")
                    except psutil.NoSuchProcess:
                        pass
                assert not alive, f"alive {timeout} s after {after} of the run (process group {self.pgid}): {alive}"
            time.sleep(0.05)

    def finish(self) -> str:
        """Wait for a normal end (exit status 0); the output."""
        try:
            code = self.proc.wait(timeout=max(1.0, RUN_TIMEOUT_S - (time.perf_counter() - self.started)))
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the run did not finish within {RUN_TIMEOUT_S} s:\n{self.output()[-4000:]}")
        assert code == 0, self.output()[-4000:]
        self.wait_group_gone("the end")
        return self.output()


def tmp_entries(out_dir: Path) -> list[str]:
    root = out_dir / "checkpoints"
    return sorted(n for n in os.listdir(root) if n.startswith(".tmp-")) if root.is_dir() else []


def checkpoint_state(out_dir: Path) -> dict | None:
    """The trainer state of the checkpoint a resume would start from (None: none), after checking it is intact:
    complete as its checkpoint.json lists it, never a ``.tmp-`` entry, its model loaded by transformers."""
    ckpt = latest_checkpoint(out_dir)
    if ckpt is None:
        return None
    assert not ckpt.name.startswith(".tmp-")
    state = load_checkpoint(ckpt)
    meta = json.loads((ckpt / "checkpoint.json").read_text())
    assert state["update"] == meta["update"] == int(ckpt.name.removeprefix("update_"))
    assert ({str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file()}
            >= set(meta["files"]) | {"checkpoint.json"})
    assert all((ckpt / name).stat().st_size == size for name, size in meta["files"].items())
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    return state


def metrics_lines(out_dir: Path) -> dict[int, str]:
    """The complete lines of metrics.jsonl by update (each update at most once)."""
    path = out_dir / "metrics.jsonl"
    lines: dict[int, str] = {}
    if path.exists():
        for line in path.read_text().split("\n")[:-1]:
            update = json.loads(line)["update"]
            assert update not in lines, f"update {update} logged twice"
            lines[update] = line
    return lines


def after_kill(out_dir: Path, what: str, size: int, **facts) -> dict:
    """What the kill left: the checkpoint (checked intact; its counters are those the series logged for its update),
    the updates logged, the ``.tmp-`` entries; printed."""
    logged = metrics_lines(out_dir)
    state = checkpoint_state(out_dir)
    kill = {"ckpt": state["update"] if state else 0, "logged": max(logged, default=0), "lines": logged,
            "tmp": tmp_entries(out_dir), **facts}
    if state is not None:
        row = json.loads(logged[state["update"]])
        kill["weight_version"], kill["total_transitions"] = state["weight_version"], state["clock"]["total_transitions"]
        assert (row["weight_version"], row["total_transitions"]) == (kill["weight_version"], kill["total_transitions"])
    print(f"killed ({what}): group of {size} processes; {facts}; last update logged {kill['logged']}, "
          f"latest checkpoint update {kill['ckpt']}, left in checkpoints/: {kill['tmp'] or 'no .tmp- entry'}")
    assert size > 1, "the run's env workers were not in its process group"
    return kill


def check_resumed(out_dir: Path, output: str, kill: dict, resumed_lines: dict[int, str]) -> None:
    """The resumed run started from the checkpoint the kill left, right after it, with the same counters."""
    ckpt = kill["ckpt"]
    if ckpt:
        line = f"resume: {out_dir / 'checkpoints' / f'update_{ckpt:06d}'} (update {ckpt}, weight version " \
            f"{kill['weight_version']})"
    else:  # killed before the first checkpoint was committed: the run starts over
        line = f"resume: no checkpoint in {out_dir}; starting from update 1"
    assert line in output, output[-4000:]
    first = int(re.search(r"\bupdate +(\d+) \| loss", output)[1])
    assert first == ckpt + 1, f"the resumed run's first update is {first}, its checkpoint's {ckpt}"
    # The series up to the checkpoint is kept as it was; what was logged after it was dropped and redone.
    assert {u: resumed_lines[u] for u in kill["lines"] if u <= ckpt} == \
        {u: line for u, line in kill["lines"].items() if u <= ckpt}
    for u in range(ckpt + 1, kill["logged"] + 1):
        assert resumed_lines[u] != kill["lines"][u], f"update {u}'s line of the killed run was kept"


def check_series(out_dir: Path, num_updates: int) -> None:
    """The final series: updates 1..num_updates once each, counters continuing; the final checkpoint intact."""
    rows = [json.loads(line) for line in metrics_lines(out_dir).values()]
    assert [r["update"] for r in rows] == list(range(1, num_updates + 1))
    assert all(r["skipped"] == 0 for r in rows)
    assert [r["weight_version"] for r in rows] == list(range(1, num_updates + 1))
    totals = [r["total_transitions"] for r in rows]
    assert totals[0] == rows[0]["transitions"] > 0
    for prev, row in itertools.pairwise(rows):
        assert row["total_transitions"] == prev["total_transitions"] + row["transitions"], (prev, row)
        assert row["elapsed_s"] > prev["elapsed_s"]
    state = checkpoint_state(out_dir)
    assert (state["update"], state["weight_version"], state["clock"]["total_transitions"]) == \
        (num_updates, num_updates, totals[-1])
    assert not tmp_entries(out_dir), "the last save left .tmp- entries"
    print(f"series 1..{num_updates}: weight versions {[r['weight_version'] for r in rows]}, "
          f"total transitions {totals}")


def check_wall_clock(out_dir: Path, lives: list[float]) -> None:
    """The wall-clock adds up across the sessions (``actfirst.train.clock``): every part >= 0, the parts sum to
    ``total_s``, which is no more than the processes' lifetimes as this test measured them; the updates the killed
    sessions had done past their checkpoint are ``lost_s``, not training."""
    wall = json.loads((out_dir / "wall_clock.json").read_text())
    parts = ("prepare_s", "train_s", "eval_s", "probe_s", "lost_s", "other_s")
    print(f"wall-clock over {wall['sessions']} sessions (lifetimes {[round(x, 1) for x in lives]} s): "
          + ", ".join(f"{k} {wall[k]:.1f}" for k in ("total_s", *parts)))
    assert wall["sessions"] == len(lives) and wall["speedup_uses"] == "train_s"
    assert all(wall[k] >= 0 for k in parts)
    assert sum(wall[k] for k in parts) == pytest.approx(wall["total_s"], abs=1e-6)
    assert wall["total_s"] <= sum(lives) + 1.0
    assert (wall["lost_s"] > 0) == (len(lives) > 1)
    summary = json.loads((out_dir / "run_summary.json").read_text())
    assert summary["wall_clock"]["total_s"] == wall["total_s"]


def test_sigkill_during_a_checkpoint_write_loses_at_most_one_update(base_config, tmp_path):
    """A checkpoint every update; the run is killed as soon as the write of a checkpoint after the first shows its
    ``.tmp-update_`` directory (a kill that lands after the commit is a kill between writes: the next attempt, in
    the resumed run, tries again). Every kill loses at most the update in flight."""
    num_updates = 4
    config, out_dir = write_config(base_config, tmp_path, num_updates=num_updates, checkpoint_every=1)
    root = out_dir / "checkpoints"
    kills: list[tuple[dict, Run]] = []
    for attempt in range(WRITE_KILL_ATTEMPTS):
        resume = ["--resume"] if kills else []
        run = Run(config, tmp_path / f"attempt{attempt}.log", *resume)
        if kills:
            kills[-1] = (kills[-1][0], run)
        after = kills[-1][0]["ckpt"] if kills else 0
        while True:
            if run.proc.poll() == 0:  # every remaining write was missed: the run is done, nothing left to try
                break
            run.check_alive()
            names = os.listdir(root) if root.is_dir() else []
            writing = [int(m[1]) for n in names if (m := re.fullmatch(r"\.tmp-update_(\d+)-\d+", n))]
            if writing and max(writing) > after:
                break
            time.sleep(POLL_S)
        if run.proc.returncode == 0:
            run.finish()
            break
        seen = max(writing)
        t_seen = time.perf_counter() - run.started
        size = run.kill()
        kill = after_kill(out_dir, "during a write", size, attempt=attempt, write_seen=seen,
                          seen_after_s=round(t_seen, 1))
        kill["during_write"] = kill["ckpt"] < seen  # the write seen was never committed
        print(f"  the write of update {seen} was {'interrupted' if kill['during_write'] else 'already committed'}")
        # At most the update in flight is lost: the checkpoint is the update being written or the one before.
        assert kill["logged"] == seen and kill["ckpt"] in (seen - 1, seen)
        assert kill["logged"] - kill["ckpt"] <= 1
        kills.append((kill, None))
        if kill["during_write"]:
            break
    assert any(k["during_write"] for k, _ in kills), \
        f"none of {len(kills)} kills landed inside a checkpoint write: {[k['write_seen'] for k, _ in kills]}"

    run = Run(config, tmp_path / "final.log", "--resume")
    kills[-1] = (kills[-1][0], run)
    run.finish()
    for kill, resumed in kills:
        check_resumed(out_dir, resumed.output(), kill, metrics_lines(out_dir))
    assert f"done: {num_updates} updates" in run.output()
    check_series(out_dir, num_updates)


def test_sigkill_between_checkpoint_writes_redoes_the_updates_since_the_checkpoint(base_config, tmp_path):
    """A checkpoint every 2 updates; the run is killed right after update 3's metrics line, before update 4's: no
    write is in flight, the checkpoint is update 2's, and the resumed run redoes update 3 (what the loop guarantees:
    the updates since the last checkpoint, at most ``checkpoint_every``, are redone; the series keeps none twice)."""
    num_updates, every, kill_after = 5, 2, 3
    config, out_dir = write_config(base_config, tmp_path, num_updates=num_updates, checkpoint_every=every)
    run = Run(config, tmp_path / "killed.log")
    while kill_after not in metrics_lines(out_dir):
        run.check_alive()
        time.sleep(POLL_S)
    t_seen = time.perf_counter() - run.started
    size = run.kill()
    life = time.perf_counter() - run.started
    kill = after_kill(out_dir, "between writes", size, metrics_line_seen=kill_after, seen_after_s=round(t_seen, 1))
    assert kill["logged"] == kill_after and not kill["tmp"], "a write was in flight"
    assert kill["ckpt"] == kill_after // every * every == 2
    assert 0 < kill["logged"] - kill["ckpt"] <= every

    resumed = Run(config, tmp_path / "resumed.log", "--resume")
    out = resumed.finish()
    check_resumed(out_dir, out, kill, metrics_lines(out_dir))
    assert f"done: {num_updates} updates" in out and "over 2 sessions" in out
    check_series(out_dir, num_updates)
    check_wall_clock(out_dir, [life, time.perf_counter() - resumed.started])


def test_sigkill_during_the_first_checkpoint_write_resumes_from_update_1(base_config, tmp_path):
    """Killed inside the first checkpoint write: nothing is committed, so the resumed run starts over from update 1
    ("resume: no checkpoint"), dropping the killed run's metrics line, and the series is 1..num_updates."""
    num_updates = 1
    config, out_dir = write_config(base_config, tmp_path, num_updates=num_updates, checkpoint_every=1)
    run = Run(config, tmp_path / "killed.log")
    while not any(n.startswith(".tmp-update_000001-") for n in tmp_entries(out_dir)):
        run.check_alive()
        time.sleep(POLL_S)
    size = run.kill()
    kill = after_kill(out_dir, "during the first write", size, write_seen=1)
    if kill["ckpt"]:
        pytest.skip("the kill landed after update 1's checkpoint was committed")
    assert kill["logged"] == 1

    resumed = Run(config, tmp_path / "resumed.log", "--resume")
    out = resumed.finish()
    assert f"resume: no checkpoint in {out_dir}" in out
    check_series(out_dir, num_updates)

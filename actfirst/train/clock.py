"""A run's wall-clock: :class:`RunClock` on every rank of a session, and the figures across its processes, which add
up to the whole after any number of kills and ``--resume``.

:class:`RunClock` is one rank's clock of a training run, held by the trainer: the training time (C.3) from the
trainer's initialization, evaluation and the probe left out, the checkpointed run's before a resume added; the kept
figures below; C.5's throughput window (Eq. 37) and the rollout batches' times summed over the run. Its
:meth:`~RunClock.state_dict` goes into the checkpoint's trainer state.

Rank 0 of every process that runs the trainer (a *session*) appends a line to ``<out_dir>/clock.jsonl`` when it
starts training, after every update and evaluation, and at its end: when the session started (the launching
process's start, preparation included), now, its preparation time, and the run's *kept* figures so far:

- ``train_s``: training time (Appendix C.3) of the updates the run keeps: the checkpointed run's before a resume plus
  this session's since; every session's initialization counts (C.3 is initialization to shutdown);
- ``eval_s``: the evaluations the run keeps (the sum of ``evals.jsonl``'s ``eval_wall_s``);
- ``probe_s``: our diagnostic's time (the probe and the engines' agreement check), kept like the training.

A session resumes from ``base_s``, the kept train + eval + probe time of the checkpoint it continues (an evaluation
recorded after that checkpoint is kept, and not redone). What a killed session measured beyond the next session's
base was done again: its *lost* time. :func:`account` then gives ``total_s`` (the sessions' wall-clock, each to its
last line: a killed process's time after its last line, at most one update or evaluation, is not seen),
``prepare_s``, ``train_s``, ``eval_s``, ``probe_s``, ``lost_s``, and ``other_s`` = the rest (process start-up
before the trainer, writing the summary): every part >= 0 and the parts sum to ``total_s``. Speedups use
``train_s``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from actfirst.core.files import write_atomically
from actfirst.train.plots import WALL_CLOCK
from actfirst.train.speedup import FIELDS as SPEEDUP_FIELDS
from actfirst.train.speedup import run_figures

CLOCK = "clock.jsonl"
PARTS = ("prepare_s", "train_s", "eval_s", "probe_s", "lost_s", "other_s")
"""The figures of :func:`account` that sum to ``total_s``."""
SPEEDUP_FIGURE = "train_s"
"""The figure every speedup is computed from (C.3's training wall-clock)."""
EARLY_WINDOW_S = 600.0
"""C.5's early throughput window: the first 600 s from the first rollout batch's start (Table 9)."""
LAUNCH_ENV = "ACTFIRST_LAUNCH"
"""What the launching process (``actfirst.run``) tells its ranks (JSON): when the session started and what
preparation took."""


def launch_info() -> dict[str, Any]:
    """The launching process's ``started`` (unix time), ``prepare_s`` and ``prepare_stages_s``; empty when this
    process was not started by ``actfirst.run`` (``actfirst.compare``, a test)."""
    return json.loads(os.environ.get(LAUNCH_ENV, "{}"))


@dataclasses.dataclass(slots=True)
class SessionClock:
    """One session's lines in ``clock.jsonl`` (written by rank 0 only; ``path`` None elsewhere)."""

    path: Path | None
    started: float
    """Unix time the session started (its launching process; see ``actfirst.run``)."""
    prepare_s: float
    base_s: float
    """The kept train + eval + probe time this session resumed from (0 for a new run)."""

    def beat(self, *, train_s: float, eval_s: float, probe_s: float) -> None:
        """Append the run's kept figures as of now."""
        if self.path is None:
            return
        line = {"started": self.started, "now": time.time(), "prepare_s": self.prepare_s,
                "base_s": self.base_s, "train_s": train_s, "eval_s": eval_s, "probe_s": probe_s}
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()


class RunClock:
    """One rank's clock of a training run (see the module docstring); created when the trainer starts initializing.
    Rank 0 opens the session's lines in ``clock.jsonl`` (:meth:`open_session`) and :meth:`beat` appends to them."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        """This process's trainer initialization (C.3: training time starts here)."""
        self.eval_s = self.probe_s = 0.0
        """This session's evaluation and probe time (what :meth:`elapsed` leaves out)."""
        self.train_before = self.probe_before = 0.0
        """The checkpointed run's training and probe time (0 for a new run)."""
        self.eval_kept = 0.0
        """The kept evaluations' time (rank 0's: ``evals.jsonl``'s sum, then this session's evaluations)."""
        self.window_origin: float | None = None
        """C.5's throughput window starts here, on the training clock (:meth:`elapsed`): the first rollout batch."""
        self.total_transitions = 0
        """Transitions of every rank over the run."""
        self.early_transitions = 0
        """Transitions of every rank completed within :data:`EARLY_WINDOW_S` of the window's origin."""
        self.rollout_times = dict.fromkeys(SPEEDUP_FIELDS, 0.0)
        """The rollout batches' times of every rank summed over the run (``actfirst.train.speedup``)."""
        self.session: SessionClock | None = None

    def elapsed(self) -> float:
        """Training wall-clock so far (C.3), the runs before a resume included, evaluation and probe excluded."""
        return self.train_before + time.perf_counter() - self.started - self.eval_s - self.probe_s

    @property
    def kept_probe_s(self) -> float:
        """The run's probe time: the checkpointed run's and this session's."""
        return self.probe_before + self.probe_s

    def exclude_probe(self, seconds: float) -> None:
        """Leave ``seconds`` of probe (and engine check) out of the training time."""
        self.probe_s += seconds

    def exclude_evaluation(self, seconds: float, *, kept: float) -> None:
        """Leave ``seconds`` of evaluation out of the training time; ``kept``: the evaluation's time as the run keeps
        it (its ``eval_wall_s``, the slowest rank's)."""
        self.eval_s += seconds
        self.eval_kept += kept

    def open_session(self, path: Path, *, kept_evaluations: float) -> None:
        """Rank 0: start this session's lines in ``path`` (``clock.jsonl``), resuming from the checkpoint's kept
        figures and ``kept_evaluations`` (the evaluations the run keeps: ``evals.jsonl``'s sum)."""
        self.eval_kept = kept_evaluations
        launch = launch_info()
        started = launch.get("started", time.time() - (time.perf_counter() - self.started))
        self.session = SessionClock(path, started=started, prepare_s=launch.get("prepare_s", 0.0),
                                    base_s=self.train_before + self.probe_before + self.eval_kept)
        self.beat()

    def beat(self) -> None:
        """Rank 0: the run's kept wall-clock figures as of now into ``clock.jsonl`` (nothing on other ranks)."""
        if self.session is not None:
            self.session.beat(train_s=self.elapsed(), eval_s=self.eval_kept, probe_s=self.kept_probe_s)

    def open_window(self) -> None:
        """Start the throughput window now, unless it has started (the run's first rollout batch)."""
        if self.window_origin is None:
            self.window_origin = self.elapsed()

    def count_early(self, instants: Iterable[float]) -> int:
        """How many of ``instants`` (``time.perf_counter`` readings since the last evaluation or probe: a rollout
        batch's transitions) lie within the first :data:`EARLY_WINDOW_S` of the throughput window."""
        to_window = self.elapsed() - time.perf_counter() - self.window_origin
        return sum(t + to_window <= EARLY_WINDOW_S for t in instants)

    def count(self, *, transitions: int, early: int, rollout_times: dict[str, float]) -> None:
        """Add an update's transitions, early ones and rollout times (every rank's)."""
        self.total_transitions += transitions
        self.early_transitions += early
        self.rollout_times = {k: self.rollout_times[k] + rollout_times[k] for k in SPEEDUP_FIELDS}

    def throughput(self) -> dict[str, float]:
        """C.5's environment-transition throughput (Eq. 37, Table 9) so far: transitions over the window from the
        first rollout batch to now (after the last update: the full-training window), and within its first
        :data:`EARLY_WINDOW_S` (while that window is open: over the time so far); on this rank's training clock."""
        window = self.elapsed() - self.window_origin
        early = min(window, EARLY_WINDOW_S)
        return {"throughput/window_s": window,
                "throughput/full_window": self.total_transitions / window if window > 0 else math.nan,
                "throughput/first_600s": self.early_transitions / early if early > 0 else math.nan}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the training and probe time so far, the throughput window and the counts."""
        return {"elapsed_s": self.elapsed(), "probe_s": self.kept_probe_s, "window_origin_s": self.window_origin,
                "total_transitions": self.total_transitions, "early_transitions": self.early_transitions,
                "rollout_times": dict(self.rollout_times)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's :meth:`state_dict` (the keys a checkpoint of an earlier version lacks start
        at zero, its window afresh)."""
        self.train_before, self.probe_before = state["elapsed_s"], state.get("probe_s", 0.0)
        self.window_origin = state.get("window_origin_s")
        self.total_transitions = state["total_transitions"]
        self.early_transitions = state.get("early_transitions", 0)
        self.rollout_times.update(state.get("rollout_times", {}))


def read_sessions(path: Path) -> list[list[dict[str, Any]]]:
    """The lines of ``clock.jsonl`` grouped by session (its ``started``), in the order the sessions started (a line
    cut short by a kill is skipped)."""
    sessions: dict[float, list[dict[str, Any]]] = {}
    if path.is_file():
        for text in path.read_text().splitlines():
            try:
                line = json.loads(text)
            except json.JSONDecodeError:
                continue
            sessions.setdefault(line["started"], []).append(line)
    return [sessions[key] for key in sorted(sessions)]


def account(path: Path) -> dict[str, Any]:
    """The run's wall-clock from ``clock.jsonl`` (see the module docstring); zeros when it has no line."""
    sessions = read_sessions(path)
    out: dict[str, Any] = dict.fromkeys(("total_s", *PARTS), 0.0)
    out.update(sessions=len(sessions), speedup_uses=SPEEDUP_FIGURE)
    if not sessions:
        return out
    last = sessions[-1][-1]
    out["total_s"] = sum(s[-1]["now"] - s[0]["started"] for s in sessions)
    out["prepare_s"] = sum(s[0]["prepare_s"] for s in sessions)
    out.update({k: last[k] for k in ("train_s", "eval_s", "probe_s")})
    kept = [s[-1]["train_s"] + s[-1]["eval_s"] + s[-1]["probe_s"] for s in sessions]
    out["lost_s"] = sum(max(0.0, kept[i] - sessions[i + 1][0]["base_s"]) for i in range(len(sessions) - 1))
    parts = sum(out[k] for k in PARTS if k != "other_s")
    out["other_s"] = max(0.0, out["total_s"] - parts)
    return out


def write_wall_clock(out_dir: Path, clock: RunClock, *, updates: int) -> None:
    """Rank 0 at a session's end: the run's wall-clock (:func:`account` of ``clock.jsonl``, after a last beat) and
    its rollout figures into ``<out_dir>/wall_clock.json``."""
    clock.beat()
    write_atomically(out_dir / WALL_CLOCK, json.dumps({
        **account(out_dir / CLOCK), "updates": updates,
        "rollout_model": {**run_figures(clock.rollout_times), "sums": dict(clock.rollout_times)},
        "definition": f"{SPEEDUP_FIGURE} (every speedup's figure) follows Appendix C.3: the trainer's "
        "initialization to its shutdown, evaluation and the probe excluded, summed over the sessions of a "
        "resumed run without the updates they did again (lost_s); teacher training and reference "
        "construction are not in the trainer. The parts (prepare, train, eval, probe, lost, other) sum to "
        "total_s, every session's wall-clock from its launch."}, indent=1))

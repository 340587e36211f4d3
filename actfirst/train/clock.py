"""A run's wall-clock across its processes: what each figure holds, so that the parts add up to the whole after any
number of kills and ``--resume``.

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
import os
import time
from pathlib import Path
from typing import Any

CLOCK = "clock.jsonl"
PARTS = ("prepare_s", "train_s", "eval_s", "probe_s", "lost_s", "other_s")
"""The figures of :func:`account` that sum to ``total_s``."""
SPEEDUP_FIGURE = "train_s"
"""The figure every speedup is computed from (C.3's training wall-clock)."""
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

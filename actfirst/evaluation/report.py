"""The evaluation report (Appendix C.1, C.4): per-seed SR / Score / Round, mean and sample SD across seeds, overall
and per task type, a pooled Wilson interval of the success rate, a JSON form and a printed markdown table.

Everything here is pure arithmetic on :class:`EpisodeRecord` rows; :func:`actfirst.evaluation.evaluate.evaluate`
produces them. The statistics (mean and SD, the Wilson interval, the paired and unpaired difference intervals of the
SR change) are those of :mod:`actfirst.evaluation.stats`.

- Per seed r (Eq. 33): SR_r = 100 x mean success, Score_r = mean final score on [0, 100], Round_r = mean executed
  turns (invalid action attempts included), over the episodes of that seed (overall) or of one task type.
- Across seeds (Eq. 34): the mean of M_r and the sample SD (n - 1 in the denominator; NaN for a single seed).
- Success-rate interval: a 95% Wilson score interval of the success proportion pooled over every episode of every
  seed. The seeds replay the same tasks, so the pooled episodes are not independent draws of tasks: the interval
  describes sampling noise on this task set, not task-sampling uncertainty.
- Score is reported only where the benchmark has partial scores (``Benchmark.partial_score``: ScienceWorld, WebShop;
  C.1: not ALFWorld).
- Splits: where the benchmark reports evaluation splits apart (ALFWorld's valid_seen and valid_unseen, C.1), each
  episode carries its split and every summary can be restricted to one; the overall and per-type rows pool them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from actfirst.core.files import json_safe
from actfirst.envs.benchmarks import BENCHMARKS
from actfirst.evaluation.stats import difference_interval, mean_sd, paired_difference_interval, wilson_interval

OVERALL = "overall"
TEACHER_EVAL = "actfirst_eval.json"
"""A built teacher's evaluation report, in its directory (``actfirst.preparation.build`` writes it)."""


@dataclasses.dataclass(slots=True)
class EpisodeRecord:
    """One evaluation episode, reduced to what the report needs."""

    seed: int
    """The evaluation seed (42, 43, 44)."""
    index: int
    """The task's position in the evaluated task list."""
    task: str
    task_type: str
    success: bool
    """C.1 success of the final transition; False for a failed episode."""
    score: float
    """The final score on [0, 100]."""
    turns: int
    """Executed turns, invalid action attempts included (Round)."""
    invalid_turns: int
    actions: list[str]
    response_tokens: list[int]
    """Tokens of each turn's full response (sampled plus inserted)."""
    response_hashes: list[str]
    """A short hash of each turn's full-response token ids (:func:`response_hash`): two runs sampled the same
    responses when these agree."""
    truncated_responses: int
    """Full responses that ended at the budget without a closed action field (B.3)."""
    failure: str | None = None
    """Why the episode was cut short (a worker died, the environment raised), else None."""
    split: str | None = None
    """The evaluation split the task is reported under (``Benchmark.task_split``: ALFWorld's valid_seen or
    valid_unseen), else None; reports stored before splits were recorded load with None."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def response_hash(token_ids: Sequence[int]) -> str:
    """16 hex digits identifying a token sequence."""
    return hashlib.blake2b(",".join(map(str, token_ids)).encode(), digest_size=8).hexdigest()


def paired_table(first: Sequence[EpisodeRecord], second: Sequence[EpisodeRecord]) -> tuple[int, int, int, int]:
    """The paired 2x2 table of two evaluations' successes, episodes matched by (seed, task index): (both,
    first only, second only, neither). Raises unless the two played the same episodes."""
    a = {(r.seed, r.index): r.success for r in first}
    b = {(r.seed, r.index): r.success for r in second}
    if a.keys() != b.keys() or len(a) != len(first) or len(b) != len(second):
        raise ValueError(f"the evaluations played different episodes ({len(a)} and {len(b)} (seed, task) pairs, "
                         f"{len(a.keys() & b.keys())} shared): they are not paired")
    pairs = [(a[key], b[key]) for key in a]
    return (sum(x and y for x, y in pairs), sum(x and not y for x, y in pairs),
            sum(y and not x for x, y in pairs), sum(not x and not y for x, y in pairs))


def sr_change(first: Sequence[EpisodeRecord], last: Sequence[EpisodeRecord]) -> dict[str, Any] | None:
    """The SR change from one evaluation to another of the same episodes, in points: the paired 95% interval
    (:func:`paired_difference_interval`, the one that decides ``beyond_noise``) and the unpaired one
    (:func:`difference_interval`, conservative here) beside it, with the paired table. None for an empty one."""
    if not first or not last:
        return None
    table = paired_table(first, last)
    d, lo, hi = paired_difference_interval(*table)
    _, ulo, uhi = difference_interval(table[0] + table[1], len(first), table[0] + table[2], len(last))
    return {"points": 100 * d, "ci95": [100 * lo, 100 * hi], "beyond_noise": lo > 0 or hi < 0,
            "method": "paired: Newcombe (1998) method 10, episodes matched by (seed, task)",
            "ci95_unpaired": [100 * ulo, 100 * uhi], "table": dict(zip(("both", "first_only", "last_only",
                                                                          "neither"), table, strict=True))}


def load_episodes(path: str | Path) -> list[EpisodeRecord]:
    """The episodes of a stored evaluation report (:meth:`EvalReport.to_json`)."""
    return [EpisodeRecord(**e) for e in json.loads(Path(path).read_text())["episodes"]]


def load_report(path: str | Path) -> EvalReport:
    """A stored evaluation report (:meth:`EvalReport.to_json`) as the report it was."""
    data = json.loads(Path(path).read_text())
    return EvalReport(benchmark=data["benchmark"], seeds=data["seeds"], task_types=data["rows"][1:],
                      episodes=[EpisodeRecord(**e) for e in data["episodes"]], meta=data["meta"])


def episode_metrics(records: Sequence[EpisodeRecord]) -> dict[str, float]:
    """Eq. 33 over ``records``: SR (percent), Score, Round, and the episode count n."""
    n = len(records)
    if n == 0:
        return {"SR": math.nan, "Score": math.nan, "Round": math.nan, "n": 0}
    return {"SR": 100.0 * sum(r.success for r in records) / n, "Score": sum(r.score for r in records) / n,
            "Round": sum(r.turns for r in records) / n, "n": n}


@dataclasses.dataclass(slots=True)
class EvalReport:
    """An evaluation of one checkpoint on one benchmark under several seeds."""

    benchmark: str
    seeds: list[int]
    task_types: list[str]
    """The per-type rows, in report order."""
    episodes: list[EpisodeRecord]
    """Every episode of every seed, ordered by seed then task index."""
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    """How the evaluation ran (configs, wall time); copied into the JSON."""

    @property
    def metrics(self) -> tuple[str, ...]:
        """The reported metrics (C.1: Score only where the benchmark has partial scores, ScienceWorld and WebShop)."""
        return ("SR", "Score", "Round") if BENCHMARKS[self.benchmark].partial_score else ("SR", "Round")

    @property
    def rows(self) -> list[str]:
        return [OVERALL, *self.task_types]

    @property
    def failures(self) -> list[EpisodeRecord]:
        """Episodes cut short by a dead worker or an environment error (counted as failures)."""
        return [r for r in self.episodes if r.failure is not None]

    @property
    def splits(self) -> list[str]:
        """The evaluation splits the episodes carry, sorted (none where the benchmark reports no splits apart)."""
        return sorted({r.split for r in self.episodes if r.split is not None})

    def records(self, row: str = OVERALL, seed: int | None = None, split: str | None = None) -> list[EpisodeRecord]:
        """``row``'s episodes (of ``seed`` and of ``split`` when given)."""
        return [r for r in self.episodes if (row == OVERALL or r.task_type == row) and (seed is None or r.seed == seed)
                and (split is None or r.split == split)]

    def per_seed(self, row: str = OVERALL, split: str | None = None) -> dict[int, dict[str, float]]:
        """Eq. 33 for each seed, on ``row``'s episodes (of ``split`` when given)."""
        return {seed: episode_metrics(self.records(row, seed, split)) for seed in self.seeds}

    def summary(self, row: str = OVERALL, split: str | None = None) -> dict[str, Any]:
        """``row``'s metrics across seeds (Eq. 34) with their per-seed values, and the pooled Wilson interval; of
        ``split``'s episodes alone when given."""
        per_seed = self.per_seed(row, split)
        pooled = self.records(row, split=split)
        successes = sum(r.success for r in pooled)
        lo, hi = wilson_interval(successes, len(pooled))
        out: dict[str, Any] = {"tasks": len({r.index for r in pooled}), "episodes": len(pooled),
                               "successes": successes}
        for metric in self.metrics:
            values = [per_seed[s][metric] for s in self.seeds]
            mean, sd = mean_sd(values)
            out[metric] = {"mean": mean, "sd": sd, "per_seed": values}
        out["SR_ci95_pooled"] = [100 * lo, 100 * hi]
        return out

    def responses(self) -> dict[str, float]:
        """Full-response lengths and truncation over all turns of all episodes (is the budget binding?)."""
        lengths = [n for r in self.episodes for n in r.response_tokens]
        truncated = sum(r.truncated_responses for r in self.episodes)
        return {"count": len(lengths), "mean_tokens": sum(lengths) / len(lengths) if lengths else math.nan,
                "max_tokens": max(lengths, default=0),
                "truncated_frac": truncated / len(lengths) if lengths else math.nan}

    def to_dict(self) -> dict[str, Any]:
        return json_safe({
            "benchmark": self.benchmark, "seeds": list(self.seeds), "metrics": list(self.metrics),
            "rows": self.rows, "summary": {row: self.summary(row) for row in self.rows},
            "splits": {split: self.summary(split=split) for split in self.splits},
            "responses": self.responses(),
            "failures": [{"seed": r.seed, "index": r.index, "task": r.task, "reason": r.failure}
                         for r in self.failures],
            "meta": self.meta, "episodes": [r.to_dict() for r in self.episodes],
        })

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str, allow_nan=False)

    def table(self) -> str:
        """A markdown table: overall, each split (where the episodes carry one) and each task type; each metric as
        mean ± sample SD over the seeds."""
        lines = [f"{self.benchmark}: {len(self.seeds)} seed(s) {', '.join(map(str, self.seeds))} x "
                 f"{len(self.records(OVERALL, self.seeds[0])) if self.seeds else 0} tasks; mean ± SD over seeds",
                 "", "| Task type | Tasks | " + " | ".join(self.metrics) + " | SR 95% CI (pooled) |",
                 "|---|---:|" + "---:|" * len(self.metrics) + "---:|"]
        entries = [("Overall", self.summary()), *((split, self.summary(split=split)) for split in self.splits),
                   *((row, self.summary(row)) for row in self.task_types)]
        for name, s in entries:
            cells = [_pm(s[m]["mean"], s[m]["sd"]) for m in self.metrics]
            lo, hi = s["SR_ci95_pooled"]
            lines.append(f"| {name} | {s['tasks']} | " + " | ".join(cells) + f" | [{lo:.1f}, {hi:.1f}] |")
        lines.append("")
        lines.append(f"Episodes: {len(self.episodes)}, failed (worker died or environment error): "
                     f"{len(self.failures)}")
        return "\n".join(lines)


def _pm(mean: float, sd: float) -> str:
    if math.isnan(mean):
        return "n/a"
    return f"{mean:.1f} ± {'n/a' if math.isnan(sd) else f'{sd:.1f}'}"


def teacher_summary(teacher: str | Path) -> dict[str, Any] | None:
    """The overall summary of a built teacher's stored evaluation (None when it has none)."""
    path = Path(teacher) / TEACHER_EVAL
    if not path.is_file():
        return None
    return json.loads(path.read_text())["summary"]["overall"]

"""Training metrics: rollout statistics (Appendix F's reference alignment, fallbacks, throughput) and the sink that
writes them (JSONL always, and the trackers of ``report_to``), and the terminal's line per update."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from actfirst.core.files import json_safe
from actfirst.rollout.runner import EpisodeResult
from actfirst.rollout.strategies import ActionSource
from actfirst.train.trackers import Tracker

ALIGNMENT_WINDOW = 10
"""Appendix F: windowed rates aggregate the latest 10 completed rollout batches."""


def rollout_counts(episodes: Sequence[EpisodeResult]) -> dict[str, float]:
    """The numerators and denominators of :func:`rollout_rates` over ``episodes``: sums, so that windows and ranks
    add up before the rates are taken."""
    guided = [e for e in episodes if e.guided]
    started = [e for e in guided if e.turns]
    fallbacks = [e.fallback_turn for e in guided if e.fallback_turn is not None]
    return {
        "episodes": len(episodes), "won": sum(e.won for e in episodes), "turns": sum(e.num_turns for e in episodes),
        "guided": len(guided), "started": len(started),
        "first_aligned": sum(e.turns[0].check == "passed" for e in started),
        "fully_aligned": sum(e.fully_aligned for e in guided), "aligned_turns": sum(e.aligned_turns for e in guided),
        "fallbacks": len(fallbacks), "fallback_turns": sum(fallbacks),
        "nap_retries": sum(t.proposal is not None for e in episodes for t in e.turns),
        "replayed": sum(t.source is ActionSource.REFERENCE for e in episodes for t in e.turns),
        "prompts_over_budget": sum(e.prompts.over_budget for e in episodes),
        "id_overflow_naps": sum(e.prompts.id_overflow_naps for e in episodes),
    }


def rollout_rates(counts: dict[str, float]) -> dict[str, float]:
    """Appendix F's rates from summed :func:`rollout_counts` (the latest ``ALIGNMENT_WINDOW`` rollout batches):
    first-action and full-trajectory alignment over guided episodes, aligned-turn coverage over all executed turns,
    the fallback rate and the mean turn of the first fallback, the rollouts' success rate and turns, and the reference
    actions replayed per episode (Reference-Prefix Replay, TCOD-B2F's prefix)."""
    c = counts

    def ratio(num: str, den: str, when: bool = True) -> float:
        return c[num] / c[den] if when and c[den] else float("nan")

    return {
        "rollout/success_rate": ratio("won", "episodes"),
        "rollout/mean_turns": ratio("turns", "episodes"),
        "align/first_action": ratio("first_aligned", "started"),
        "align/full_trajectory": ratio("fully_aligned", "guided"),
        "align/turn_coverage": ratio("aligned_turns", "turns", when=c["guided"] > 0),
        "fallback/rate": ratio("fallbacks", "guided"),
        "fallback/mean_turn": ratio("fallback_turns", "fallbacks"),
        "rollout/nap_retries": c["nap_retries"],
        "rollout/replayed_turns": ratio("replayed", "episodes"),
        "prompt/over_budget": c["prompts_over_budget"],
        "prompt/id_overflow_naps": c["id_overflow_naps"],
    }


class MetricsSink:
    """Writes one record per update to ``<out_dir>/metrics.jsonl`` (appending, so a resumed run continues the
    series; always) and its finite scalars to each tracker of ``report_to`` (``actfirst.train.trackers``)."""

    def __init__(self, out_dir: str | Path, trackers: Sequence[Tracker] = ()) -> None:
        self.path = Path(out_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")
        self.trackers = list(trackers)

    def log(self, update: int, record: dict[str, Any]) -> None:
        record = {"update": update, **record}
        self._file.write(json.dumps(json_safe(record), default=str) + "\n")
        self._file.flush()
        scalars = scalar_metrics(record)
        for tracker in self.trackers:
            tracker.log(update, scalars)

    def log_evaluation(self, update: int, row: dict[str, Any]) -> None:
        """Give every tracker an evaluation's figures (``evals.jsonl``'s row, written there by the trainer) under
        ``eval/`` at the update it evaluated: SR, Score and Round as mean and SD over seeds, per split too."""
        scalars = scalar_metrics({"eval": {"eval_wall_s": row["eval_wall_s"], **row["summary"],
                                           **{f"split/{k}": v for k, v in row["splits"].items()}}})
        for tracker in self.trackers:
            tracker.log(update, scalars)

    def log_image(self, update: int, key: str, path: str | Path | None) -> None:
        """Give every tracker the PNG at ``path`` (None: nothing was drawn)."""
        if path is not None:
            for tracker in self.trackers:
                tracker.log_image(update, key, Path(path))

    def close(self) -> None:
        self._file.close()
        for tracker in self.trackers:
            tracker.close()


def scalar_metrics(record: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of ``record``, nested keys as ``a/b`` (what the trackers receive; booleans, strings,
    lists, NaN and inf are left out)."""
    return {key: value for key, value in _flat(record).items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)}


def _flat(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as ``a/b`` keys."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def summary_line(update: int, record: dict[str, Any]) -> str:
    """The terminal line of one update."""

    def f(key: str, fmt: str) -> str:
        value = record.get(key)
        return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)

    return (f"update {update:4d} | loss {f('loss', '+.4f')} | gap {f('teacher_minus_old', '+.3f')} "
            f"| probe gap {f('probe/gap', '+.3f')} | mismatch {f('mismatch_mean', '.1e')} "
            f"| clip {f('clip_frac', '.3f')}/{f('dual_clip_frac', '.3f')} | SR {f('rollout/success_rate', '.2f')} "
            f"| env {f('env_steps_per_s', '.2f')}/s | v{record.get('weight_version', '-')} "
            f"| {f('update_wall_s', '.1f')} s")

"""Rollout quality (Appendix C.5, Figure 4): unproductive action repetition over one episode's record, and the
per-strategy metrics of Eq. 38-40, pure functions over played episodes.

An executed action is *valid* when it was parsed and, stripped of surrounding whitespace, is exactly an entry of
the admissible-action list (``Benchmark.executed_valid``). A valid action at turn t is an *unproductive repetition*
when

1. the same (state, normalized action) pair was executed validly before,
2. no new observation has appeared since the end of that pair's most recent valid execution, and
3. the action at t produces no new observation either.

An observation is new when its normalized text (B.5's :func:`~actfirst.envs.checks.normalize_text`: NFKC, case
folding, whitespace) has not appeared earlier in the rollout's observation record: o_1 and the feedback of every
executed action, invalid ones included; never a reference observation or a model output. States are whatever the
environment's ``TextEnv.state`` holds (ALFWorld: the positive facts and the success flag), compared for equality.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Hashable, Sequence
from typing import Any

from actfirst.envs.checks import normalize_text
from actfirst.rollout.strategies import STRATEGIES

STRATEGY_LABELS = {name: STRATEGIES[name].rollout_label or STRATEGIES[name].label
                   for name in ("vanilla", "no_id", "actfirst")}
"""The strategies Figure 4 compares, by ``rollout.strategy`` name, in its order, with the names C.5 gives their ways
of acting (think-then-act, direct action without references, ActFirst-OPD)."""


@dataclasses.dataclass(frozen=True, slots=True)
class TraceTurn:
    """One executed turn of an episode's record."""

    state: Hashable
    """The environment state the action was executed in."""
    action: str
    valid: bool
    observation: str
    """The feedback the action produced."""


@dataclasses.dataclass(frozen=True, slots=True)
class EpisodeTrace:
    """What repetition detection reads of one episode: o_1 and the executed turns in order."""

    first_observation: str
    turns: tuple[TraceTurn, ...]


def unproductive_repetitions(trace: EpisodeTrace) -> list[int]:
    """The turns (0-based) of ``trace`` that are unproductive repetitions (see the module docstring)."""
    seen = {normalize_text(trace.first_observation)}
    latest_new = 0  # index in the observation record (o_1: 0, turn t's feedback: t + 1) of the latest new one
    ended: dict[tuple[Hashable, str], int] = {}  # pair -> record index of its latest valid execution's feedback
    repetitions = []
    for t, turn in enumerate(trace.turns):
        observation = normalize_text(turn.observation)
        new = observation not in seen
        seen.add(observation)
        if turn.valid:
            pair = (turn.state, normalize_text(turn.action))
            if pair in ended and latest_new <= ended[pair] and not new:
                repetitions.append(t)
            ended[pair] = t + 1
        if new:
            latest_new = t + 1
    return repetitions


@dataclasses.dataclass(kw_only=True, slots=True)
class QualityEpisode:
    """One strategy's episode of one task."""

    strategy: str
    index: int
    """The task's position in the measured task list (its sampling seeds derive from it)."""
    task: str
    task_type: str
    success: bool
    turns: int
    """Executed interaction turns T_i, invalid attempts included."""
    invalid_turns: int
    repetitions: list[int]
    """Turns (0-based) that are unproductive repetitions."""
    seeds: list[int | None]
    """Each turn's sampling seed of the request whose action was executed."""
    full_responses: int
    """Full responses generated: one per think-then-act turn, none for fast actions (C.5 omits them)."""
    fallback_turn: int | None
    """ActFirst-OPD: the turn whose transition check failed first (NAP from the next turn on)."""
    failure: str | None
    """Why the episode was cut short (a worker died, the environment raised); counted as a failed task."""


def strategy_summary(episodes: Sequence[QualityEpisode]) -> dict[str, Any]:
    """Eq. 38-40 over one strategy's episodes: Repeat (%), the share of tasks with at least one unproductive
    repetition; Yield, successful trajectories per 100 environment transitions, 100 sum u_i / sum T_i; mean turns;
    SR (%); and the counts they come from."""
    n = len(episodes)
    if n == 0:
        raise ValueError("no episodes to summarize")
    repeated = sum(bool(e.repetitions) for e in episodes)
    successes = sum(e.success for e in episodes)
    transitions = sum(e.turns for e in episodes)
    return {"tasks": n, "repeat_pct": 100 * repeated / n,
            "yield_per_100": 100 * successes / transitions if transitions else None,
            "mean_turns": transitions / n, "SR": 100 * successes / n, "tasks_with_repetition": repeated,
            "repetitions": sum(len(e.repetitions) for e in episodes), "successes": successes,
            "transitions": transitions, "invalid_turns": sum(e.invalid_turns for e in episodes),
            "failures": sum(e.failure is not None for e in episodes)}


@dataclasses.dataclass(kw_only=True, slots=True)
class QualityReport:
    """Every strategy's episodes on the same tasks, with the run's settings in ``meta``."""

    benchmark: str
    strategies: list[str]
    episodes: list[QualityEpisode]
    meta: dict[str, Any]

    def records(self, strategy: str) -> list[QualityEpisode]:
        """``strategy``'s episodes in task order."""
        return sorted((e for e in self.episodes if e.strategy == strategy), key=lambda e: e.index)

    def summary(self) -> dict[str, dict[str, Any]]:
        """:func:`strategy_summary` of each strategy."""
        return {name: strategy_summary(self.records(name)) for name in self.strategies}

    def to_json(self) -> str:
        return json.dumps({"benchmark": self.benchmark, "strategies": self.strategies, "summary": self.summary(),
                           "episodes": [dataclasses.asdict(e) for e in self.episodes], "meta": self.meta}, indent=1)

    def table(self) -> str:
        """The summary as a markdown table, one row per strategy (Figure 4's three panels and SR)."""
        header = ("| Strategy | Tasks | Repeat (%) | Yield (per 100 transitions) | Mean turns | SR (%) | Tasks with "
                  "repetition | Successes | Transitions | Failed |")
        lines = [header, "|---|" + "---:|" * 9]
        for name, s in self.summary().items():
            yield_text = "n/a" if s["yield_per_100"] is None else f"{s['yield_per_100']:.2f}"
            lines.append(f"| {STRATEGY_LABELS.get(name, name)} | {s['tasks']} | {s['repeat_pct']:.1f} | {yield_text} | "
                         f"{s['mean_turns']:.2f} | {s['SR']:.1f} | {s['tasks_with_repetition']} | {s['successes']} | "
                         f"{s['transitions']} | {s['failures']} |")
        return "\n".join(lines)

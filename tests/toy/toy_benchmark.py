"""A toy benchmark defined outside ``actfirst/``, registered through the public registry: the proof that a benchmark
is one unit (``tests/toy/test_toy_benchmark.py`` drives it through a rollout, a training run of
``python -m actfirst.run`` on ``train.yaml`` and an evaluation).

A corridor of rooms 0, 1, 2, ...; the agent starts in room 0 and wins by reaching the task's goal room. Actions are
``forward``, ``back`` and ``wait`` (``back`` only beyond room 0); anything else is an invalid action that still
counts as a turn. Every step is deterministic, so a replayed reference passes its own transition check: the default
one (``Benchmark._check``: a valid action, the reference's termination flag and next observation).
"""

from __future__ import annotations

import dataclasses

from actfirst.core.schema import check
from actfirst.envs.base import TextEnv, Transition
from actfirst.envs.benchmarks import Benchmark, register_benchmark
from actfirst.rollout.prompts import HISTORY, NO_HISTORY, REFERENCE, Mode

# -- config -----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(kw_only=True, slots=True)
class ToyConfig:
    """The toy's ``env:`` section (default file: ``tests/toy/toy.yaml``)."""

    max_turns: int = 4
    tasks: int = 4
    """Tasks per split; task i has goal room 1 + i % 2 (types "near" and "far")."""

    def __post_init__(self) -> None:
        check(self.max_turns >= 1, "max_turns", self.max_turns, "must be >= 1")
        check(self.tasks >= 1, "tasks", self.tasks, "must be >= 1")


# -- environment --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ToyTask:
    index: int
    goal: int


class ToyEnv(TextEnv):
    """The corridor: one episode at a time, in the calling process (or a worker)."""

    benchmark = "toy"

    def __init__(self, max_turns: int) -> None:
        self.max_turns = max_turns
        self.task: ToyTask | None = None
        self.room = self.turn = 0

    def _transition(self, *, valid: bool = True) -> Transition:
        done = self.room == self.task.goal
        return Transition(observation=f"You are in room {self.room}.", admissible=self._admissible(),
                          score=100.0 if done else 0.0, done=done, won=done, valid=valid, turn=self.turn,
                          truncated=self._truncated(self.turn, done), task_description=f"reach room {self.task.goal}")

    def _admissible(self) -> tuple[str, ...]:
        return ("forward", "back", "wait") if self.room > 0 else ("forward", "wait")

    def reset(self, task: ToyTask, admissible: bool = True) -> Transition:
        self.task, self.room, self.turn = task, 0, 0
        return self._transition()

    def step(self, action: str) -> Transition:
        action = action.strip()
        valid = action in self._admissible()
        self.turn += 1
        if valid:
            self.room += {"forward": 1, "back": -1, "wait": 0}[action]
        return self._transition(valid=valid)

    def close(self) -> None:
        pass


# -- prompt templates -------------------------------------------------------------------------------------------

_HEAD = "You walk a corridor of rooms. Your task is to: {task_description}\n"
_ACTIONS = "Your admissible actions are: [{actions}].\n"
_FULL = ("\nThink step by step within <think> </think> tags, then give one admissible action within "
         "<action> </action> tags.")
_NAP = "\nGive one admissible action within <action> </action> tags."
_ID = (REFERENCE.format(terminal="state") + _ACTIONS
       + "\nPredict the MISSING CURRENT ACTION and give it within <action> </action> tags.")
TEMPLATES = {
    Mode.FULL_RESPONSE: (_HEAD, HISTORY, NO_HISTORY, _ACTIONS + _FULL),
    Mode.NEXT_ACTION: (_HEAD, HISTORY, NO_HISTORY, _ACTIONS + _NAP),
    Mode.INVERSE_DYNAMICS: (_HEAD, HISTORY, NO_HISTORY, _ID),
}


# -- the benchmark --------------------------------------------------------------------------------------------


@register_benchmark
class ToyBenchmark(Benchmark):
    name = "toy"
    config_class = ToyConfig
    templates = TEMPLATES
    fast_actions = True

    def make_env(self) -> TextEnv:
        return ToyEnv(self.config.max_turns)

    def prompt_fields(self, current: Transition) -> dict[str, str]:
        return {"actions": ", ".join(current.admissible)}

    def valid_action(self, action: str, current: Transition) -> bool:
        return action.strip() in current.admissible

    def task_key(self, task: ToyTask) -> str:
        return f"task{task.index}"

    def task_type(self, task: ToyTask) -> str:
        return "near" if task.goal == 1 else "far"

    def _tasks(self, split: str) -> list:
        first = 0 if split == "train" else self.config.tasks
        return [ToyTask(i, 1 + i % 2) for i in range(first, first + self.config.tasks)]

    async def candidates(self, worker, task: ToyTask) -> list[tuple[str, list[str]]]:
        """The shortest solution: ``forward`` to the goal."""
        return [("solution", ["forward"] * task.goal)]

"""ScienceWorld's config section (``env:`` of a ScienceWorld run; ``actfirst/envs/scienceworld/scienceworld.yaml``)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from actfirst.core.schema import check


@dataclasses.dataclass(kw_only=True, slots=True)
class ScienceWorldConfig:
    """ScienceWorld as Appendix C.1 sets it up (easy preset, 30-turn limit in training)."""

    train_task_types: list[str]
    """The 17 trained task types (the paper does not name them; see actfirst/envs/scienceworld/scienceworld.yaml)."""
    simplification: str = "easy"
    """The simulator's simplifications, comma-separated ("easy": all of them, as the paper uses; "": none)."""
    max_turns: int = 30
    eval_task_types: list[str] | None = None
    """The evaluated task types (None: all 30, as C.1 evaluates)."""
    eval_variations: int = 5
    """Evaluation instances per type: its last N variations (C.1: 5)."""
    EVALUATION_ONLY: ClassVar[tuple[str, ...]] = ("eval_task_types", "eval_variations")
    """Keys that do not shape a training task's transitions (a reference cache does not depend on them)."""

    def __post_init__(self) -> None:
        from actfirst.envs.scienceworld.tasks import SIMPLIFICATIONS, TASK_TYPES

        unknown = [s for s in self.simplification.split(",") if s and s not in SIMPLIFICATIONS]
        check(not unknown, "simplification", self.simplification, f"{unknown} not among {list(SIMPLIFICATIONS)}")
        unknown = [t for t in self.train_task_types if t not in TASK_TYPES]
        check(not unknown, "train_task_types", unknown, "not ScienceWorld task types")
        check(len(set(self.train_task_types)) == len(self.train_task_types), "train_task_types",
               self.train_task_types, "has duplicates")
        check(self.max_turns >= 1, "max_turns", self.max_turns, "must be >= 1")
        unknown = [t for t in self.eval_task_types or () if t not in TASK_TYPES]
        check(not unknown and self.eval_task_types != [], "eval_task_types", self.eval_task_types,
               "must be ScienceWorld task types (or null: all 30)")
        check(self.eval_variations >= 1, "eval_variations", self.eval_variations, "must be >= 1")

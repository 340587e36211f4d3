"""ScienceWorld task types and the paper's splits (Appendix C.1).

Training uses the first half of the variations of 17 task types; evaluation uses the last five variations of
each of all 30 types (85 instances from the trained types, 65 from the other 13). The paper does not name the 17;
ours are in ``actfirst/envs/scienceworld/scienceworld.yaml``.
"""

from __future__ import annotations

import dataclasses

# The 30 task types of scienceworld 1.2.3 (tests check this list against the simulator).
TASK_TYPES = (
    "boil", "change-the-state-of-matter-of", "chemistry-mix", "chemistry-mix-paint-secondary-color",
    "chemistry-mix-paint-tertiary-color", "find-animal", "find-living-thing", "find-non-living-thing", "find-plant",
    "freeze", "grow-fruit", "grow-plant", "identify-life-stages-1", "identify-life-stages-2",
    "inclined-plane-determine-angle", "inclined-plane-friction-named-surfaces",
    "inclined-plane-friction-unnamed-surfaces", "lifespan-longest-lived", "lifespan-longest-lived-then-shortest-lived",
    "lifespan-shortest-lived", "measure-melting-point-known-substance", "measure-melting-point-unknown-substance",
    "melt", "mendelian-genetics-known-plant", "mendelian-genetics-unknown-plant", "power-component",
    "power-component-renewable-vs-nonrenewable-energy", "test-conductivity", "test-conductivity-of-unknown-substances",
    "use-thermometer",
)
EVAL_VARIATIONS_PER_TYPE = 5
# The simulator's simplifications ("easy": all five; tests check this list against the simulator).
SIMPLIFICATIONS = ("easy", "teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors",
                   "noElectricalAction")


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class ScienceWorldTask:
    """One task instance: a task type and one of its variations."""

    task_type: str
    variation: int


def scienceworld_max_variations() -> dict[str, int]:
    """Number of variations of every task type, read from the simulator (starts and stops one JVM; one that cannot
    start raises ``EnvStartError``)."""
    from actfirst.envs.scienceworld.simulator import start_simulator

    env = start_simulator(step_limit=10)
    try:
        return {t: env.get_max_variations(t) for t in TASK_TYPES}
    finally:
        env.close()


def scienceworld_splits(train_types: list[str], max_variations: dict[str, int], *,
                        eval_types: list[str] | None = None, eval_variations: int = EVAL_VARIATIONS_PER_TYPE
                        ) -> tuple[list[ScienceWorldTask], list[ScienceWorldTask]]:
    """(training tasks, evaluation tasks) as Appendix C.1 defines them.

    Args:
        train_types: the trained task types (validated by ``ScienceWorldConfig``).
        max_variations: number of variations of every task type (from the simulator).
        eval_types: the evaluated types (None: all 30, as C.1).
        eval_variations: the last N variations of each evaluated type (C.1: 5).
    """
    missing = sorted(set(TASK_TYPES) - set(max_variations))
    if missing:
        raise ValueError(f"max_variations: no count for {missing}")
    train = [ScienceWorldTask(t, v) for t in train_types for v in range(max_variations[t] // 2)]
    evaluation = [ScienceWorldTask(t, v) for t in (eval_types or TASK_TYPES)
                  for v in range(max(0, max_variations[t] - eval_variations), max_variations[t])]
    if set(train) & set(evaluation):
        raise ValueError(f"eval_variations={eval_variations}: training and evaluation instances overlap (training "
                         f"takes the first half of a type's variations)")
    return train, evaluation

"""ScienceWorld (Appendix C.1) as one benchmark: its config, environment (the simulator, imported when an
environment is made), transition check and prompt templates, registered as ``scienceworld``."""

from __future__ import annotations

import dataclasses

from actfirst.envs.base import TextEnv, Transition
from actfirst.envs.benchmarks import Benchmark, register_benchmark
from actfirst.envs.checks import PASSED, CheckResult, normalize_set
from actfirst.envs.scienceworld.checks import normalize_scienceworld_observation, scienceworld_action_valid
from actfirst.envs.scienceworld.config import ScienceWorldConfig
from actfirst.envs.scienceworld.data import ScienceWorldData
from actfirst.envs.scienceworld.prompts import TEMPLATES
from actfirst.envs.scienceworld.transition import ScienceWorldTransition


@register_benchmark
class ScienceWorldBenchmark(Benchmark):
    """ScienceWorld (C.1): the configured preset, 17 trained task types, 150 evaluation instances."""

    name = "scienceworld"
    config_class = ScienceWorldConfig
    transition_class = ScienceWorldTransition
    data = ScienceWorldData()
    worker_mib = 269  # bench/RESULTS.md, environment throughput: 16 workers, each with its JVM
    templates = TEMPLATES
    fast_actions = True
    partial_score = True
    shortens_candidates = True
    state_source = "look-around and inventory text (a stand-in: no facts) and the task-success flag"

    @classmethod
    def environment_text(cls) -> list[str]:
        """A line of its B.1 prompt."""
        return ["Your ScienceWorld task is: Your task is to boil water. Available action commands: [open OBJ, move OBJ "
                "to OBJ, focus on OBJ, look around, teleport to LOC]. Available objects you can interact with: [stove, "
                "water, kitchen, thermometer]."]

    def __init__(self, config: ScienceWorldConfig):
        super().__init__(config)
        self._max_variations: dict[str, int] | None = None

    def make_env(self) -> TextEnv:
        from actfirst.envs.scienceworld.env import ScienceWorldTextEnv

        return ScienceWorldTextEnv(max_turns=self.config.max_turns, simplification=self.config.simplification)

    def prompt_fields(self, current: ScienceWorldTransition) -> dict[str, str]:
        return {"action_templates": ", ".join(current.templates), "objects": ", ".join(current.objects)}

    def action_commands(self, current: ScienceWorldTransition) -> tuple[str, ...]:
        """Its action templates."""
        return current.templates

    def valid_action(self, action: str, current: Transition) -> bool:
        return scienceworld_action_valid(action, current.admissible)

    def normalize_observation(self, observation: str) -> str:
        """B.5's ScienceWorld normalization: enumerations and lines sorted."""
        return normalize_scienceworld_observation(observation)

    def _check_next(self, next: ScienceWorldTransition, ref_next: ScienceWorldTransition) -> CheckResult:
        """B.5: the action-template sets are equal, terminal transitions included. Possible-object lists (aliases),
        room descriptions, inventory, reward and score are not compared."""
        if normalize_set(next.templates) != normalize_set(ref_next.templates):
            return CheckResult(False, "action templates mismatch")
        return PASSED

    def task_key(self, task) -> str:
        return f"{task.task_type}/{task.variation}"

    def task_type(self, task) -> str:
        return task.task_type

    def _tasks(self, split: str) -> list:
        """train: the first half of the variations of the configured types; eval: the last ``eval_variations`` (C.1:
        five) of ``eval_task_types`` (C.1: all 30)."""
        from actfirst.envs.scienceworld.tasks import scienceworld_max_variations, scienceworld_splits

        if self._max_variations is None:  # read once from the simulator (starts a JVM)
            self._max_variations = scienceworld_max_variations()
        train, evaluation = scienceworld_splits(self.config.train_task_types, self._max_variations,
                                                eval_types=self.config.eval_task_types,
                                                eval_variations=self.config.eval_variations)
        return train if split == "train" else evaluation

    async def candidates(self, worker, task) -> list[tuple[str, list[str]]]:
        """The simulator's gold path."""
        return [("gold", await worker.acall("gold_path", task))]

    async def shorten(self, worker, task, actions: list[str]) -> list[str]:
        """Drop actions one at a time (from the end, each tried once) while the replay still succeeds, through
        the environment's fast success-only replay."""
        i = len(actions) - 1
        while i >= 0:
            trial = actions[:i] + actions[i + 1:]
            if await worker.acall("succeeds", task, trial):
                actions = trial
            i -= 1
        return actions

    def slim(self, transition: ScienceWorldTransition) -> ScienceWorldTransition:
        """The admissible list and object aliases are not compared by the checks (B.5) and are large: dropped."""
        return dataclasses.replace(transition, admissible=(), objects=())

"""ALFWorld (Appendix C.1) as one benchmark: its config, environment (TextWorld's ALFWorld games, imported when an
environment is made), transition check and prompt templates, registered as ``alfworld``."""

from __future__ import annotations

import importlib.resources
import re
from pathlib import Path

from actfirst.envs.alfworld.checks import alfworld_action_valid
from actfirst.envs.alfworld.config import ALFWorldConfig
from actfirst.envs.alfworld.data import ALFWorldData, check_real_games, split_dir
from actfirst.envs.alfworld.prompts import TEMPLATES, UOPD_PROMPTS
from actfirst.envs.base import TextEnv, Transition
from actfirst.envs.benchmarks import Benchmark, register_benchmark
from actfirst.envs.checks import PASSED, CheckResult, normalize_set


@register_benchmark
class ALFWorldBenchmark(Benchmark):
    """ALFWorld (C.1): its json_2.1.1 games (``games: real``) or games generated offline (``games: generated``)."""

    name = "alfworld"
    config_class = ALFWorldConfig
    templates = TEMPLATES
    uopd_prompts = UOPD_PROMPTS
    fast_actions = True
    state_source = "positive facts and the task-success flag"
    data = ALFWorldData()
    worker_mib = 103  # bench/RESULTS.md, environment throughput: 16 workers on generated games
    TASK_TYPES = {"pick_and_place_simple": "Pick", "look_at_obj_in_light": "Look",
                  "pick_clean_then_place_in_recep": "Clean", "pick_heat_then_place_in_recep": "Heat",
                  "pick_cool_then_place_in_recep": "Cool", "pick_two_obj_and_place": "Pick2"}
    """ALFRED task type -> the name Table 1 reports it under."""
    EVAL_SPLITS = ("valid_seen", "valid_unseen")
    """The evaluation splits, reported apart (C.1) and pooled in the overall and per-type rows."""

    @classmethod
    def environment_text(cls) -> list[str]:
        """ALFWorld's grammar and goal templates (shipped with its package), then the B.1 prompt lines every request
        carries."""
        texts: list[str] = []
        grammar = importlib.resources.files("alfworld").joinpath("data", "alfred.twl2").read_text()
        texts += [s.replace("\\n", "\n") for s in re.findall(r'"rhs": "(.*?)"', grammar)]
        goals = importlib.resources.files("alfworld").joinpath("gen", "goal_library.py").read_text()
        texts += re.findall(r"'([^'\n]{8,})'", goals) + re.findall(r'"([^"\n]{8,})"', goals)
        return texts + [
            "Your admissible actions of the current situation are: [go to countertop 1, open fridge 1, take apple 1]",
            "Now it's your turn to take an action. You should first reason step-by-step about the current situation "
            "within <think> </think> tags. Once you've finished your reasoning, you should choose an admissible "
            "action for current step and present it within <action> </action> tags.",
            "Complete the missing current action in this reference transition: Current observation "
            "-[MISSING CURRENT ACTION]-> reference next observation.",
        ]

    def make_env(self) -> TextEnv:
        from actfirst.envs.alfworld.env import ALFWorldTextEnv

        return ALFWorldTextEnv(max_turns=self.config.max_turns)

    def prompt_fields(self, current: Transition) -> dict[str, str]:
        return {"admissible_actions": ", ".join(f"'{a}'" for a in current.admissible)}

    def valid_action(self, action: str, current: Transition) -> bool:
        return alfworld_action_valid(action, current.admissible)

    def _check_next(self, next: Transition, ref_next: Transition) -> CheckResult:
        """B.5: for non-terminal transitions, the next admissible-action sets are equal."""
        if not next.done and normalize_set(next.admissible) != normalize_set(ref_next.admissible):
            return CheckResult(False, "admissible actions mismatch")
        return PASSED

    def task_key(self, task) -> str:
        return Path(task.game_file).parent.name

    def task_type(self, task) -> str:
        if task.task_type not in self.TASK_TYPES:
            raise ValueError(f"task_type={task.task_type!r} ({task.game_file}): not one of {list(self.TASK_TYPES)}")
        return self.TASK_TYPES[task.task_type]

    def task_split(self, task) -> str | None:
        """valid_seen or valid_unseen: the split folder that holds the game (``json_2.1.1/<split>/...`` or the
        generated ``<generated_dir>/<split>/...``); None for a game outside them (a training game)."""
        return next((part for part in reversed(Path(task.game_file).parts) if part in self.EVAL_SPLITS), None)

    def made_at_start(self) -> str | None:
        """With ``games: generated``: the games still to be generated (none with ``games: real``)."""
        if self.config.games != "generated":
            return None
        from actfirst.envs.alfworld.games import SPLITS, missing_games

        missing = sum(missing_games(Path(self.config.generated_dir) / split, self.config.games_per_type)
                      for split in SPLITS)
        if not missing:
            return None
        return (f"{missing} games generated offline into {self.config.generated_dir} at start "
                f"({self.config.games_per_type} per task type and split; not the paper's games)")

    def _tasks(self, split: str) -> list:
        """train: ALFWorld's train split; eval: valid_seen and valid_unseen, in that order (C.1). From the official
        games or generated ones, as ``games`` says (never one for the other)."""
        names = ["train"] if split == "train" else list(self.EVAL_SPLITS)
        if self.config.games == "real":
            from actfirst.envs.alfworld.env import alfworld_tasks

            check_real_games(self.config.data_dir)
            return [task for name in names for task in alfworld_tasks(split_dir(self.config.data_dir, name))]
        from actfirst.envs.alfworld.games import generated_split

        return [task for name in names for task in generated_split(
            name, self.config.generated_dir, per_type=self.config.games_per_type, seed=self.config.seed)]

    async def candidates(self, worker, task) -> list[tuple[str, list[str]]]:
        """The planner's walkthrough stored with the game."""
        from actfirst.envs.alfworld.env import walkthrough

        return [("walkthrough", walkthrough(task))]

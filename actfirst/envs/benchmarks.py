"""One object per benchmark: its environment, prompt fields, transition check, task keys, splits and success.

Everything that differs between ALFWorld, ScienceWorld and WebShop lives in a ``Benchmark`` subclass, built from the
benchmark's typed config (``configs/envs/<name>.yaml``)::

    benchmark = get_benchmark("scienceworld")              # or get_benchmark("alfworld", ALFWorldConfig(...))
    env = benchmark.make_env()                              # exactly the configured environment
    with EnvPool(benchmark.env_spec(), size=16) as pool:    # the same environment in worker processes
        ...
    result = benchmark.check(reference, t, action=a, current=cur, next=nxt, previous=result)   # Appendix B.5
"""

from __future__ import annotations

import abc
import dataclasses
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from actfirst.config import ALFWorldConfig, ConfigError, ScienceWorldConfig, SearchConfig, WebShopConfig
from actfirst.envs.base import Outcome, Reference, TextEnv, Transition
from actfirst.envs.checks import (
    SEARCH_MISMATCH_ALLOWED,
    CheckResult,
    alfworld_action_valid,
    alfworld_check,
    scienceworld_action_valid,
    scienceworld_check,
    webshop_action_valid,
    webshop_check,
    webshop_reference_product,
)
from actfirst.envs.response_format import ACTION_TAGS, ResponseFormat
from actfirst.envs.search_text import SEARCH_RESPONSES
from actfirst.schema import load_config

if TYPE_CHECKING:
    from actfirst.envs.workers import EnvWorker

EnvConfig = ALFWorldConfig | ScienceWorldConfig | WebShopConfig | SearchConfig
SPLITS = ("train", "eval")
CONFIG_DIR = Path(__file__).parents[2] / "configs" / "envs"


@dataclasses.dataclass(frozen=True, slots=True)
class EnvSpec:
    """What a worker process needs to build a benchmark's environment (picklable): the benchmark and its config.

    There is no turn-limit override for the reference builder: an environment's turn limit only marks a step
    ``truncated`` and never ends an episode (ScienceWorld's own step limit is 10 x max_turns + 100), so references
    are replayed in full (C.2) under exactly the training configuration.
    """

    benchmark: str
    config: EnvConfig

    def __post_init__(self) -> None:
        get_benchmark(self.benchmark, self.config)  # an unknown name or a config of the wrong class fails here

    def make_env(self) -> TextEnv:
        """Build the environment (in the calling process)."""
        return get_benchmark(self.benchmark, self.config).make_env()


class Benchmark(abc.ABC):
    """A benchmark under one typed config: the single place for everything benchmark-specific."""

    name: ClassVar[str]
    config_class: ClassVar[type]
    shortens_candidates: ClassVar[bool] = False
    """Whether reference candidates are shortened while their replay still succeeds (C.2: ScienceWorld)."""
    response_format: ClassVar[ResponseFormat] = ACTION_TAGS
    """How full responses end and where their action is (B.1/B.3's ``<action>`` field; Search: E.3's tags)."""
    prompt_is_observation: ClassVar[bool] = False
    """Whether the observation is the whole prompt, sent without a chat template (Search, E.3) instead of B.1's
    templates with B.2's history."""
    forced_answer_turn: ClassVar[bool] = False
    """Whether evaluation gives an episode truncated at the turn limit one more turn (the environment's
    ``force_answer``; Search, D.5)."""
    state_source: ClassVar[str | None] = None
    """What the environment's state (``TextEnv.state``) holds for C.5's state-action pairs; None: no state, so no
    rollout-quality measurement."""

    def __init__(self, config: EnvConfig):
        if not isinstance(config, self.config_class):
            raise ValueError(f"config={config!r}: benchmark {self.name!r} needs a {self.config_class.__name__}, "
                             f"got a {type(config).__name__}")
        self.config = config

    @property
    def max_turns(self) -> int:
        """The turn limit of an episode (C.1: 30, 30, 15)."""
        return self.config.max_turns

    @abc.abstractmethod
    def make_env(self) -> TextEnv:
        """Exactly the configured environment, in the calling process."""

    def env_spec(self) -> EnvSpec:
        """What a worker process needs to build ``make_env()``'s environment."""
        return EnvSpec(self.name, self.config)

    @abc.abstractmethod
    def prompt_fields(self, current: Transition) -> dict[str, str]:
        """The admissible-action fields of this benchmark's B.1 templates, from the current transition."""

    def reference_observation(self, observation: str) -> str:
        """A reference next observation as the inverse-dynamics prompt shows it (unchanged but on WebShop)."""
        return observation

    @abc.abstractmethod
    def valid_action(self, action: str, current: Transition) -> bool:
        """B.5's validity of ``action`` in ``current`` (what the check requires first; an invalid inverse-dynamics
        proposal is replaced before execution)."""

    def executed_valid(self, action: str, current: Transition) -> bool:
        """C.5's validity of an executed action (rollout quality): parsed (not the empty action) and, stripped of
        surrounding whitespace, exactly an entry of the admissible-action list (of the benchmarks with a
        ``state_source``: their admissible lists hold whole actions)."""
        action = action.strip()
        return bool(action) and action in current.admissible

    def check(self, reference: Reference, t: int, *, action: str, current: Transition, next: Transition,
              previous: CheckResult | None = None) -> CheckResult:
        """The B.5 check of the student's turn ``t`` (0-based: from ``current`` by ``action`` to ``next``) against
        the reference's turn ``t``; ``previous`` is this episode's previous check result. Past the reference's last
        action there is nothing to match: the check fails with reason "reference exhausted"."""
        if t >= len(reference.actions):
            return CheckResult(False, "reference exhausted")
        return self._check(reference, t, action=action, current=current, next=next, previous=previous)

    @abc.abstractmethod
    def _check(self, reference: Reference, t: int, *, action: str, current: Transition, next: Transition,
               previous: CheckResult | None) -> CheckResult:
        """``check`` for a turn the reference covers."""

    @abc.abstractmethod
    def task_key(self, task: Any) -> str:
        """The stable name of a task in caches and candidate files."""

    @abc.abstractmethod
    def task_type(self, task: Any) -> str:
        """The task's type, for per-type reporting and selection."""

    def task_split(self, task: Any) -> str | None:
        """The evaluation split the task is reported under apart from the others (None: the benchmark reports its
        evaluation tasks together)."""
        return None

    def tasks(self, split: str) -> list:
        """The tasks of ``split``: "train" or "eval" (Appendix C.1)."""
        if split not in SPLITS:
            raise ValueError(f"split={split!r}: not one of {list(SPLITS)}")
        return self._tasks(split)

    @abc.abstractmethod
    def _tasks(self, split: str) -> list:
        """``tasks`` for a known split."""

    def succeeded(self, transition: Transition) -> bool:
        """C.1 success of an episode's final transition (each environment sets ``won`` by C.1's rule)."""
        return transition.won

    def accepts_reference(self, final: Outcome) -> bool:
        """Whether a candidate ending in ``final`` (a replay's last transition, or a played episode) may become the
        task's reference (C.2): success."""
        return final.won

    async def candidates(self, worker: EnvWorker, task: Any) -> list[tuple[str, list[str]]]:
        """The benchmark's own reference candidates for ``task`` as (source, actions), next to user candidates."""
        return []

    async def shorten(self, worker: EnvWorker, task: Any, actions: list[str]) -> list[str]:
        """``actions`` shortened while their replay still succeeds (only where ``shortens_candidates``)."""
        raise NotImplementedError(f"benchmark {self.name!r} does not shorten reference candidates")

    def rank(self, reference: Reference) -> tuple:
        """Reference selection order, lowest first (C.2: the fewest actions)."""
        return (len(reference.actions),)

    def slim(self, transition: Transition) -> Transition:
        """What a reference cache keeps of a transition (all of it, unless a benchmark says otherwise)."""
        return transition


class ALFWorldBenchmark(Benchmark):
    """ALFWorld (C.1): $ALFWORLD_DATA's json_2.1.1 games when downloaded, else games generated offline."""

    name = "alfworld"
    config_class = ALFWorldConfig
    state_source = "positive facts and the task-success flag"
    TASK_TYPES = {"pick_and_place_simple": "Pick", "look_at_obj_in_light": "Look",
                  "pick_clean_then_place_in_recep": "Clean", "pick_heat_then_place_in_recep": "Heat",
                  "pick_cool_then_place_in_recep": "Cool", "pick_two_obj_and_place": "Pick2"}
    """ALFRED task type -> the name Table 1 reports it under."""
    EVAL_SPLITS = ("valid_seen", "valid_unseen")
    """The evaluation splits, reported apart (C.1) and pooled in the overall and per-type rows."""

    def make_env(self) -> TextEnv:
        from actfirst.envs.alfworld_env import ALFWorldTextEnv

        return ALFWorldTextEnv(max_turns=self.config.max_turns)

    def prompt_fields(self, current: Transition) -> dict[str, str]:
        return {"admissible_actions": ", ".join(f"'{a}'" for a in current.admissible)}

    def valid_action(self, action: str, current: Transition) -> bool:
        return alfworld_action_valid(action, current.admissible)

    def _check(self, reference, t, *, action, current, next, previous):
        ref = reference.transitions[t + 1]
        return alfworld_check(action=action, admissible=current.admissible, done=next.done, ref_done=ref.done,
                              next_observation=next.observation, ref_next_observation=ref.observation,
                              next_admissible=next.admissible, ref_next_admissible=ref.admissible)

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

    def _tasks(self, split: str) -> list:
        """train: ALFWorld's train split; eval: valid_seen and valid_unseen, in that order (C.1)."""
        from actfirst.envs.alfworld_games import alfworld_split

        names = ["train"] if split == "train" else list(self.EVAL_SPLITS)
        return [task for name in names for task in alfworld_split(
            name, self.config.generated_dir, per_type=self.config.games_per_type, seed=self.config.seed)]

    async def candidates(self, worker, task) -> list[tuple[str, list[str]]]:
        """The planner's walkthrough stored with the game."""
        from actfirst.envs.alfworld_env import walkthrough

        return [("walkthrough", walkthrough(task))]


class ScienceWorldBenchmark(Benchmark):
    """ScienceWorld (C.1): the configured preset, 17 trained task types, 150 evaluation instances."""

    name = "scienceworld"
    config_class = ScienceWorldConfig
    shortens_candidates = True
    state_source = "look-around and inventory text (a stand-in: no facts) and the task-success flag"

    def __init__(self, config: ScienceWorldConfig):
        super().__init__(config)
        self._max_variations: dict[str, int] | None = None

    def make_env(self) -> TextEnv:
        from actfirst.envs.scienceworld_env import ScienceWorldTextEnv

        return ScienceWorldTextEnv(max_turns=self.config.max_turns, simplification=self.config.simplification)

    def prompt_fields(self, current: Transition) -> dict[str, str]:
        return {"action_templates": ", ".join(current.templates), "objects": ", ".join(current.objects)}

    def valid_action(self, action: str, current: Transition) -> bool:
        return scienceworld_action_valid(action, current.admissible)

    def _check(self, reference, t, *, action, current, next, previous):
        ref = reference.transitions[t + 1]
        return scienceworld_check(action=action, admissible=current.admissible, done=next.done, ref_done=ref.done,
                                  next_observation=next.observation, ref_next_observation=ref.observation,
                                  next_templates=next.templates, ref_next_templates=ref.templates)

    def task_key(self, task) -> str:
        return f"{task.task_type}/{task.variation}"

    def task_type(self, task) -> str:
        return task.task_type

    def _tasks(self, split: str) -> list:
        """train: the first half of the variations of the configured types; eval: the last ``eval_variations`` (C.1:
        five) of ``eval_task_types`` (C.1: all 30)."""
        from actfirst.envs.scienceworld_tasks import scienceworld_max_variations, scienceworld_splits

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

    def slim(self, transition: Transition) -> Transition:
        """The admissible list and object aliases are not compared by the checks (B.5) and are large: dropped."""
        return dataclasses.replace(transition, admissible=(), objects=())


class WebShopBenchmark(Benchmark):
    """WebShop (C.1): text interface, goals 0-4095 train and 4096-4195 evaluation."""

    name = "webshop"
    config_class = WebShopConfig

    def make_env(self) -> TextEnv:
        from actfirst.envs.webshop_env import WebShopTextEnv

        return WebShopTextEnv(self.config)

    def prompt_fields(self, current: Transition) -> dict[str, str]:
        actions = ["search[<your query>]"] if current.has_search_bar else []
        actions += [f"click[{c}]" for c in current.admissible]
        return {"available_actions": ",\n".join(f"'{a}'" for a in actions)}

    def reference_observation(self, observation: str) -> str:
        """The page without its repeated instruction block (B.5: removed only in the inverse-dynamics prompt)."""
        from actfirst.envs.webshop_env import strip_instruction

        return strip_instruction(observation)

    def valid_action(self, action: str, current: Transition) -> bool:
        return webshop_action_valid(action, has_search_bar=current.has_search_bar, clickables=current.admissible)

    def _check(self, reference, t, *, action, current, next, previous):
        """B.5 with the search-results exception: after a turn that passed through it, this turn checks the product
        of that turn's search (``t - 1``), else the product of a search at ``t``."""
        ref = reference.transitions[t + 1]
        after = previous is not None and previous.reason == SEARCH_MISMATCH_ALLOWED
        return webshop_check(
            action=action, has_search_bar=current.has_search_bar, clickables=current.admissible, done=next.done,
            ref_done=ref.done, next_observation=next.observation, ref_next_observation=ref.observation,
            next_clickables=next.admissible, ref_next_clickables=ref.admissible,
            next_has_search_bar=next.has_search_bar, ref_next_has_search_bar=ref.has_search_bar,
            ref_action=reference.actions[t],
            ref_product=webshop_reference_product(reference.actions, t - 1 if after else t),
            after_search_mismatch=after)

    def task_key(self, task) -> str:
        return str(task.goal_idx)

    def task_type(self, task) -> str:
        return "all"

    def _tasks(self, split: str) -> list:
        from actfirst.envs.webshop_env import webshop_split

        return webshop_split(split)

    def accepts_reference(self, final: Outcome) -> bool:
        """Any purchase with a positive score: C.2 ranks WebShop candidates by score, so a partial score may be
        the best a task has."""
        return final.done and final.score > 0

    async def candidates(self, worker, task) -> list[tuple[str, list[str]]]:
        """C.2's oracle solution built from the task's goal (``oracle_actions``), on the results page that lists
        the goal product after the oracle's search (found by replaying the search and its next pages); none when
        the search does not return the product."""
        from actfirst.envs.webshop_env import NEXT_PAGE, RESULT_PAGES, oracle_actions

        goal = await worker.acall("goal", task)
        product = goal.asin.lower()
        await worker.areset(task)
        page = await worker.astep(oracle_actions(goal)[0])
        for number in range(1, RESULT_PAGES + 1):
            if product in page.admissible:
                return [("oracle", oracle_actions(goal, result_page=number))]
            if number == RESULT_PAGES or "next >" not in page.admissible:
                break
            page = await worker.astep(NEXT_PAGE)
        return []

    def rank(self, reference: Reference) -> tuple:
        """C.2: the highest score first, then the fewest actions."""
        return (-reference.score, len(reference.actions))


class SearchBenchmark(Benchmark):
    """Search (UOPD, D.1, D.5, E.3): Search-R1's questions, answered with a retrieval tool; scored by exact match.

    Think-then-act only: there are no B.1 next-action or inverse-dynamics templates and no reference trajectories,
    so the B.5 checks and the reference builder do not apply."""

    name = "search"
    config_class = SearchConfig
    response_format = SEARCH_RESPONSES
    prompt_is_observation = True
    forced_answer_turn = True

    def make_env(self) -> TextEnv:
        from actfirst.envs.search_env import SearchTextEnv

        return SearchTextEnv(self.config)

    def prompt_fields(self, current: Transition) -> dict[str, str]:
        """None: the observation is the whole prompt (E.3)."""
        return {}

    def valid_action(self, action: str, current: Transition) -> bool:
        """A complete search or answer (E.3)."""
        return SEARCH_RESPONSES.has_action(action)

    def _check(self, reference, t, *, action, current, next, previous):
        raise NotImplementedError("benchmark 'search' has no reference trajectories to check against (B.5)")

    def task_key(self, task) -> str:
        return task.key

    def task_type(self, task) -> str:
        """The question's ``data_source`` (nq, hotpotqa, 2wikimultihopqa, musique, bamboogle): EM per dataset."""
        return task.data_source

    def _tasks(self, split: str) -> list:
        """train: ``train_file``; eval: ``test_files`` (D.1)."""
        from actfirst.envs.search_env import load_questions

        if split == "train":
            return load_questions([self.config.train_file], "train_file")
        return load_questions(self.config.test_files, "test_files")


BENCHMARKS: dict[str, type[Benchmark]] = {b.name: b for b in (ALFWorldBenchmark, ScienceWorldBenchmark,
                                                               WebShopBenchmark, SearchBenchmark)}


def config_path(name: str) -> Path:
    """The default config file of benchmark ``name``: ``configs/envs/<name>.yaml``."""
    return CONFIG_DIR / f"{name}.yaml"


def benchmark_class(name: str) -> type[Benchmark]:
    """The ``Benchmark`` subclass called ``name``; an unknown name is a ``ValueError`` naming the known ones."""
    if name not in BENCHMARKS:
        raise ValueError(f"benchmark={name!r}: not one of {sorted(BENCHMARKS)}")
    return BENCHMARKS[name]


def get_benchmark(name: str, config: EnvConfig | None = None) -> Benchmark:
    """Benchmark ``name`` under ``config`` (None: ``configs/envs/<name>.yaml``). An unknown name or a config of
    another benchmark's class is a ``ValueError``."""
    return load_benchmark(name) if config is None else benchmark_class(name)(config)


def load_benchmark(name: str, path: str | Path | None = None, overrides: list[str] | None = None) -> Benchmark:
    """Benchmark ``name`` with its config read from ``path`` (None: the default file) plus dotted overrides."""
    cls = benchmark_class(name)
    return cls(load_config(cls.config_class, config_path(name) if path is None else path, overrides))


def select_tasks(benchmark: Benchmark, tasks: list, task_types: Sequence[str] | None = None,
                 per_type: int = 0) -> list:
    """``tasks`` narrowed to ``task_types`` (as ``benchmark.task_type`` names them) and to the first ``per_type``
    of each type (0: all); a type no task has is an error naming it."""
    if task_types:
        known = {benchmark.task_type(t) for t in tasks}
        unknown = sorted(set(task_types) - known)
        if unknown:
            raise ConfigError(f"--task-types={unknown}: no {benchmark.name} tasks of these types "
                             f"(known: {sorted(known)})")
        tasks = [t for t in tasks if benchmark.task_type(t) in task_types]
    if per_type:
        seen: Counter[str] = Counter()
        kept = []
        for task in tasks:
            seen[benchmark.task_type(task)] += 1
            if seen[benchmark.task_type(task)] <= per_type:
                kept.append(task)
        tasks = kept
    return tasks

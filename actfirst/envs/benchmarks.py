"""The benchmark API: the ``Benchmark`` base class, the registry of benchmarks by name, ``EnvSpec`` and task selection.

A benchmark is one package, ``actfirst.envs.<name>`` (alfworld, scienceworld, webshop, search): its typed config
(default file: ``<name>.yaml`` in the package, package data), environment, transition check, prompt templates and its
``Benchmark`` subclass, which the package registers with :func:`register_benchmark`. Everything that differs between
benchmarks lives in that subclass::

    benchmark = get_benchmark("scienceworld")              # or get_benchmark("alfworld", ALFWorldConfig(...))
    env = benchmark.make_env()                              # exactly the configured environment
    with EnvPool(benchmark.env_spec(), size=16) as pool:    # the same environment in worker processes
        ...
    result = benchmark.check(reference, t, action=a, current=cur, next=nxt, previous=result)   # Appendix B.5

A benchmark defined elsewhere (a test's, a user's) registers the same way and is then known by name everywhere
(``benchmark:`` in a training config, ``get_benchmark``) once its module is imported: a training config names that
module in ``benchmark_module:`` (:func:`import_benchmark_module`), which every process of the run imports; its worker
processes receive its class by reference, which imports the module there before the environment is built.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import inspect
import logging
import os
import pkgutil
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from actfirst.core.schema import load_config
from actfirst.core.user_input import ConfigError
from actfirst.envs.base import Outcome, Reference, TextEnv, Transition
from actfirst.envs.checks import PASSED, CheckResult, normalize_text
from actfirst.envs.response_format import ACTION_TAGS, ResponseFormat
from actfirst.preparation.downloads import BenchmarkData

if TYPE_CHECKING:
    from actfirst.envs.workers import EnvWorker

logger = logging.getLogger(__name__)

SPLITS = ("train", "eval")
FORMER_CONFIG_DIR = ("configs", "envs")
"""Where the built-in benchmarks' files were before they moved into their packages: ``configs/envs/<name>.yaml`` and
``configs/envs/<name>/<file>`` (WebShop's goal pools), now ``actfirst/envs/<name>/`` (:func:`moved_file`)."""


@dataclasses.dataclass(frozen=True, slots=True)
class EnvSpec:
    """What a worker process needs to build a benchmark's environment (picklable): the benchmark, its class (pickled
    by reference: a spawned worker imports the module that defines it, and needs no registry of its own) and its
    config.

    There is no turn-limit override for the reference builder: an environment's turn limit only marks a step
    ``truncated`` and never ends an episode (ScienceWorld's own step limit is 10 x max_turns + 100), so references
    are replayed in full (C.2) under exactly the training configuration.
    """

    benchmark: str
    config: Any
    benchmark_class: type[Benchmark] | None = None
    """None: the registered class of ``benchmark``."""

    def __post_init__(self) -> None:
        cls = self.benchmark_class or benchmark_class(self.benchmark)  # an unknown name fails here
        if cls.name != self.benchmark:
            raise ValueError(f"benchmark={self.benchmark!r}: {cls.__name__} is benchmark {cls.name!r}")
        object.__setattr__(self, "benchmark_class", cls)
        cls(self.config)  # a config of the wrong class fails here

    def make_env(self) -> TextEnv:
        """Build the environment (in the calling process)."""
        return self.benchmark_class(self.config).make_env()


class Benchmark(abc.ABC):
    """A benchmark under one typed config: the single place for everything benchmark-specific."""

    name: ClassVar[str]
    """The benchmark's name (``benchmark:`` in a training config)."""
    config_class: ClassVar[type]
    """Its config section (``env:`` in a training config): a ``kw_only`` dataclass checked in ``__post_init__``."""
    transition_class: ClassVar[type[Transition]] = Transition
    """What its environment's reset and step return, and what its reference cache's transitions are read back as: a
    subclass of ``Transition`` where the benchmark has per-step data of its own (ScienceWorld's action templates)."""
    templates: ClassVar[Mapping[Any, tuple[str, str, str, str]]] = {}
    """B.1's prompt templates per ``actfirst.rollout.prompts.Mode``: (head, with-history block, no-history block, tail),
    the admissible-action fields filled from :meth:`prompt_fields` (none where the observation is the whole prompt)."""
    uopd_prompts: ClassVar[Any] = None
    """The UOPD paper's think-then-act prompts (003 Appendix E.1/E.2; ``rollout.prompts: uopd``), an
    ``actfirst.rollout.prompts.RecentStepsPrompts``; None: 003 gives none for this benchmark (Search's one prompt,
    E.3's, is its observation)."""
    fast_actions: ClassVar[bool] = False
    """Whether B.1's next-action-prediction and inverse-dynamics templates and reference trajectories exist (the
    strategies that need them run only where they do)."""
    partial_score: ClassVar[bool] = False
    """Whether an episode can score between failure and success, so that reports give the Score column (C.1)."""
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
    worker_mib: ClassVar[int | None] = None
    """Resident host memory of one environment worker (its process and what it starts, ScienceWorld's JVM), MiB, as
    measured with 16 workers (``bench/env_throughput.py``, bench/RESULTS.md); None: not measured. A run holds one
    worker per episode in flight (``actfirst.parallel.host_memory``)."""
    data: ClassVar[BenchmarkData | None] = None
    """What ``python -m actfirst.data <name>`` fetches and where it puts it (``actfirst/envs/<name>/data.py``); None:
    the benchmark declares no data."""

    @classmethod
    def environment_text(cls) -> list[str]:
        """Text of this benchmark's environment and prompts for the small ``env-bpe`` tokenizer of models built from
        scratch (``actfirst.models.build.environment_corpus``), read from what its simulator's package ships (no
        download); none by default."""
        return []

    def __init__(self, config: Any):
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
        return EnvSpec(self.name, self.config, type(self))

    @abc.abstractmethod
    def prompt_fields(self, current: Transition) -> dict[str, str]:
        """The admissible-action fields of this benchmark's B.1 templates, from the current transition."""

    def action_commands(self, current: Transition) -> tuple[str, ...]:
        """The action commands its prompt lists apart from the admissible actions, the same at every step of an
        episode (ScienceWorld's action templates); none by default."""
        return ()

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
        action there is nothing to match: the check fails with reason "reference exhausted". A benchmark without
        reference trajectories (no ``fast_actions``) has nothing to check against: ``NotImplementedError``."""
        if not self.fast_actions:
            raise NotImplementedError(f"benchmark {self.name!r} has no reference trajectories to check against (B.5)")
        if t >= len(reference.actions):
            return CheckResult(False, "reference exhausted")
        return self._check(reference, t, action=action, current=current, next=next, previous=previous)

    def _check(self, reference: Reference, t: int, *, action: str, current: Transition, next: Transition,
               previous: CheckResult | None) -> CheckResult:
        """``check`` for a turn the reference covers: B.5's conditions in order, each failure named. The action is
        valid in ``current`` (:meth:`valid_action`); the termination flags agree; the next observations are equal
        under :meth:`normalize_observation`; then the benchmark's own conditions (:meth:`_check_next`). A benchmark
        whose check departs from this order (WebShop's search-results exception) overrides it."""
        ref_next = reference.transitions[t + 1]
        if not self.valid_action(action, current):
            return CheckResult(False, "invalid action")
        if next.done != ref_next.done:
            return CheckResult(False, "termination mismatch")
        if self.normalize_observation(next.observation) != self.normalize_observation(ref_next.observation):
            return CheckResult(False, "observation mismatch")
        return self._check_next(next, ref_next)

    def normalize_observation(self, observation: str) -> str:
        """An observation as the check compares it: B.5's normalization (``normalize_text``), unless the benchmark
        adds its own rules (ScienceWorld's sorted enumerations)."""
        return normalize_text(observation)

    def _check_next(self, next: Transition, ref_next: Transition) -> CheckResult:
        """The benchmark's own B.5 conditions on the student's and the reference's next transitions, once the common
        ones hold (ALFWorld: the admissible sets; ScienceWorld: the action templates); none by default."""
        return PASSED

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

    def made_at_start(self) -> str | None:
        """What the run makes of this benchmark's tasks before it can list them (games generated offline), in one
        line for a dry run, which lists tasks only where nothing is to be made; None: nothing."""
        return None

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


class Registry(Mapping[str, type[Benchmark]]):
    """Benchmark name -> ``Benchmark`` subclass: the built-in packages (every subpackage of ``actfirst.envs``,
    imported on the first read, so that a benchmark package may import this module) and whatever else registered."""

    def __init__(self) -> None:
        self._classes: dict[str, type[Benchmark]] = {}
        self._builtins_loaded = False

    def add(self, cls: type[Benchmark]) -> None:
        """Register ``cls`` under ``cls.name`` (again: nothing); another class of that name is a ``ValueError``."""
        if not (isinstance(cls, type) and issubclass(cls, Benchmark)):
            raise TypeError(f"{cls!r}: a benchmark is a subclass of actfirst.envs.benchmarks.Benchmark")
        name = getattr(cls, "name", None)
        if not (isinstance(name, str) and name.isidentifier()):
            raise TypeError(f"{cls.__qualname__}.name={name!r}: must be an identifier (a config value)")
        if not dataclasses.is_dataclass(getattr(cls, "config_class", None)):
            raise TypeError(f"{cls.__qualname__}.config_class: must be a dataclass (the benchmark's env: section)")
        known = self._classes.get(name)
        if known is not None and known is not cls:
            raise ValueError(f"benchmark {name!r}: registered already, by {known.__module__}.{known.__qualname__}")
        self._classes[name] = cls

    def _load_builtins(self) -> None:
        if not self._builtins_loaded:
            self._builtins_loaded = True
            for package in pkgutil.iter_modules([str(Path(__file__).parent)]):
                if package.ispkg:
                    importlib.import_module(f"{__package__}.{package.name}")

    def __getitem__(self, name: str) -> type[Benchmark]:
        self._load_builtins()
        return self._classes[name]

    def __iter__(self) -> Iterator[str]:
        self._load_builtins()
        return iter(self._classes)

    def __len__(self) -> int:
        self._load_builtins()
        return len(self._classes)


BENCHMARKS = Registry()
"""Every known benchmark by name."""


def import_benchmark_module(module: str | None, key: str = "benchmark_module") -> None:
    """Import ``module`` (a dotted module name, found on ``sys.path``: the working directory of ``python -m``, or
    ``PYTHONPATH``), which registers a benchmark defined outside ``actfirst/envs`` (None: nothing). One that cannot be
    imported is a :class:`ConfigError` naming ``key`` and the error."""
    if module is None:
        return
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"{key}={module!r}: cannot import it ({type(e).__name__}: {e}); give a module importable "
                          f"from the working directory or PYTHONPATH") from None


def register_benchmark(cls: type[Benchmark]) -> type[Benchmark]:
    """Make ``cls`` known by its name (a class decorator; a benchmark package applies it to its ``Benchmark``)."""
    BENCHMARKS.add(cls)
    return cls


def config_path(name: str) -> Path:
    """The default config file of benchmark ``name``: ``<name>.yaml`` beside the module that defines its class (a
    built-in benchmark's package data: ``actfirst/envs/<name>/<name>.yaml``)."""
    return Path(inspect.getfile(benchmark_class(name))).parent / f"{name}.yaml"


def moved_file(path: str | os.PathLike) -> Path:
    """``path``; or, where it names a file under ``configs/envs/`` that is no longer there, the same file where it is
    now, in its benchmark's package (``configs/envs/alfworld.yaml`` -> ``actfirst/envs/alfworld/alfworld.yaml``,
    ``configs/envs/webshop/003-train.txt`` -> ``actfirst/envs/webshop/003-train.txt``), so that configs and command
    lines written before the move still work; a warning names the new place."""
    given = Path(path)
    parts = given.parts
    at = next((i for i in range(len(parts) - 2) if parts[i:i + 2] == FORMER_CONFIG_DIR), None)
    if given.exists() or at is None:
        return given
    rest = parts[at + 2:]
    here = Path(__file__).parent
    moved = here / Path(rest[0]).stem / rest[0] if len(rest) == 1 else here.joinpath(*rest)
    if not moved.is_file():
        return given
    logger.warning("%s: moved into its benchmark's package, read from %s (name that path instead)", path, moved)
    return moved


def benchmark_class(name: str) -> type[Benchmark]:
    """The ``Benchmark`` subclass called ``name``; an unknown name is a ``ValueError`` naming the known ones."""
    if name not in BENCHMARKS:
        raise ValueError(f"benchmark={name!r}: not one of {sorted(BENCHMARKS)}")
    return BENCHMARKS[name]


def get_benchmark(name: str, config: Any = None) -> Benchmark:
    """Benchmark ``name`` under ``config`` (None: its default config file). An unknown name or a config of another
    benchmark's class is a ``ValueError``."""
    return load_benchmark(name) if config is None else benchmark_class(name)(config)


def load_benchmark(name: str, path: str | Path | None = None, overrides: list[str] | None = None) -> Benchmark:
    """Benchmark ``name`` with its config read from ``path`` (None: the default file; a former ``configs/envs/``
    path: :func:`moved_file`) plus dotted overrides."""
    cls = benchmark_class(name)
    return cls(load_config(cls.config_class, config_path(name) if path is None else moved_file(path), overrides))


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

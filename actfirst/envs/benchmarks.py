"""The benchmark API: the ``Benchmark`` base class, the registry of benchmarks by name, ``EnvSpec`` and task selection.

A benchmark is one package, ``actfirst.envs.<name>`` (alfworld, scienceworld, webshop, search): its typed config
(``configs/envs/<name>.yaml``), environment, transition check, prompt templates and its ``Benchmark`` subclass,
which the package registers with :func:`register_benchmark`. Everything that differs between benchmarks lives in
that subclass::

    benchmark = get_benchmark("scienceworld")              # or get_benchmark("alfworld", ALFWorldConfig(...))
    env = benchmark.make_env()                              # exactly the configured environment
    with EnvPool(benchmark.env_spec(), size=16) as pool:    # the same environment in worker processes
        ...
    result = benchmark.check(reference, t, action=a, current=cur, next=nxt, previous=result)   # Appendix B.5

A benchmark defined elsewhere (a test's, a user's) registers the same way and is then known by name everywhere
(``benchmark:`` in a training config, ``get_benchmark``); its worker processes receive its class by reference.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import pkgutil
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from actfirst.core.schema import load_config
from actfirst.core.user_input import ConfigError
from actfirst.envs.base import Outcome, Reference, TextEnv, Transition
from actfirst.envs.checks import CheckResult
from actfirst.envs.response_format import ACTION_TAGS, ResponseFormat
from actfirst.preparation.downloads import BenchmarkData

if TYPE_CHECKING:
    from actfirst.envs.workers import EnvWorker

SPLITS = ("train", "eval")
CONFIG_DIR = Path(__file__).parents[2] / "configs" / "envs"


@dataclasses.dataclass(frozen=True, slots=True)
class EnvSpec:
    """What a worker process needs to build a benchmark's environment (picklable): the benchmark, its class (pickled
    by reference, so that a spawned worker needs no registry of its own) and its config.

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
    config_dir: ClassVar[Path] = CONFIG_DIR
    """Where its default config file ``<name>.yaml`` is."""
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


def register_benchmark(cls: type[Benchmark]) -> type[Benchmark]:
    """Make ``cls`` known by its name (a class decorator; a benchmark package applies it to its ``Benchmark``)."""
    BENCHMARKS.add(cls)
    return cls


def config_path(name: str) -> Path:
    """The default config file of benchmark ``name``: ``<config_dir>/<name>.yaml`` (``configs/envs/<name>.yaml``)."""
    return benchmark_class(name).config_dir / f"{name}.yaml"


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

"""The environment interface every benchmark implements (ALFWorld, ScienceWorld, WebShop).

``reset(task)`` and ``step(action)`` both return a ``Transition``: the observation, what the prompts show as
admissible-action information (Appendix B.1), what the transition checks compare (Appendix B.5), and the episode's
score so far. Environments are plain synchronous objects; ``actfirst.envs.workers`` runs them in worker processes
(built there from an :class:`EnvFactory`). A :class:`Reference` is a task's cached trajectory (Appendix C.2), what
the transition checks compare a student turn with.
"""

from __future__ import annotations

import abc
import dataclasses
import json
from typing import Any, Protocol


@dataclasses.dataclass(frozen=True, slots=True)
class Transition:
    """What one reset or step returns.

    ``admissible`` is the full list used for action validation (ALFWorld: without help; WebShop: the clickable
    targets, lowercased); None where the episode was reset with ``admissible=False`` and the environment left it out
    (ScienceWorld: ``TextEnv.admissible`` builds it when asked). What only one benchmark has (ScienceWorld's action
    templates, WebShop's search bar) is in that benchmark's subclass, its ``Benchmark.transition_class``.
    """

    observation: str
    admissible: tuple[str, ...] | None
    score: float
    """Episode score so far on [0, 100] (Appendix C.1: ALFWorld 0/100, ScienceWorld the highest score reached,
    WebShop the purchase reward x 100)."""
    done: bool
    """The environment's termination flag (what the transition checks compare; the turn limit is not termination)."""
    won: bool
    valid: bool | None = True
    """Whether the executed action was valid (Appendix B.5's validity rule); True after reset; None where the
    admissible list of the state it left was never built (an episode reset with ``admissible=False``)."""
    turn: int = 0
    """Executed actions so far in the episode, invalid ones included."""
    truncated: bool = False
    """The turn limit was reached without termination."""
    task_description: str = ""

    @property
    def finished(self) -> bool:
        return self.done or self.truncated

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Transition:
        """The transition of ``to_dict``'s mapping; keys this class does not have are left out (a reference cache
        written when every transition carried every benchmark's fields)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names})


@dataclasses.dataclass(frozen=True, slots=True)
class EnvState:
    """The environment state that C.5's state-action pairs compare (rollout quality): what the simulator holds, as
    its benchmark's ``Benchmark.state_source`` describes it, and the task-success flag."""

    content: tuple[str, ...]
    """ALFWorld: the positive facts, sorted; ScienceWorld (no facts): its look-around and inventory text."""
    won: bool


class TextEnv(abc.ABC):
    """One benchmark environment instance: one episode at a time."""

    benchmark: str
    max_turns: int

    @abc.abstractmethod
    def reset(self, task: Any, admissible: bool = True) -> Transition:
        """Start an episode of ``task`` (the benchmark's task object); returns the first observation.
        ``admissible=False``: the caller needs neither the admissible lists nor the validity flags but where it asks
        (``admissible()``); an environment whose lists cost a step's worth of time and are not shown in its prompts
        (ScienceWorld) leaves them out, the others ignore it."""

    @abc.abstractmethod
    def step(self, action: str) -> Transition:
        """Execute ``action`` (any text; an invalid action still counts as a turn)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the simulator (JVM, game process)."""

    def admissible(self) -> tuple[str, ...]:
        """The current state's full admissible-action list, for a transition that left it out (None)."""
        raise NotImplementedError(f"benchmark {self.benchmark!r} gives its admissible list with every transition")

    def state(self) -> EnvState:
        """The state after the last reset or step (C.5's state equality), read from what that call already
        returned; only the benchmarks with a ``Benchmark.state_source`` have one."""
        raise NotImplementedError(f"benchmark {self.benchmark!r} exposes no environment state")

    def _truncated(self, turn: int, done: bool) -> bool:
        """Whether the turn limit truncates this step's episode."""
        return not done and turn >= self.max_turns


class Outcome(Protocol):
    """How an episode ended, as a ``Transition`` or a played episode reports it (what reference selection reads)."""

    @property
    def done(self) -> bool: ...

    @property
    def won(self) -> bool: ...

    @property
    def score(self) -> float: ...


class EnvFactory(Protocol):
    """What a worker process builds its environment from (picklable; ``Benchmark.env_spec()`` gives one)."""

    def make_env(self) -> TextEnv: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Reference:
    """One task's selected trajectory: actions a_1..a_T and transitions o_1..o_{T+1} (index 0 is the reset)."""

    task: str
    actions: list[str]
    transitions: list[Transition]
    source: str

    @property
    def score(self) -> float:
        return self.transitions[-1].score

    def to_json(self) -> str:
        return json.dumps({"task": self.task, "actions": self.actions, "source": self.source,
                           "transitions": [t.to_dict() for t in self.transitions]})

    @classmethod
    def from_json(cls, line: str, transition_class: type[Transition] = Transition) -> Reference:
        return cls.from_dict(json.loads(line), transition_class)

    @classmethod
    def from_dict(cls, data: dict, transition_class: type[Transition] = Transition) -> Reference:
        """The reference of one cache line's object, its transitions of ``transition_class`` (its benchmark's
        ``Benchmark.transition_class``); ``KeyError``/``TypeError`` when it is not one."""
        if not isinstance(data["actions"], list) or not isinstance(data["transitions"], list):
            raise TypeError("actions and transitions must be lists")
        return cls(str(data["task"]), data["actions"],
                   [transition_class.from_dict(t) for t in data["transitions"]], data["source"])

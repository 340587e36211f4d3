"""The environment interface every benchmark implements (ALFWorld, ScienceWorld, WebShop).

``reset(task)`` and ``step(action)`` both return a ``Transition``: the observation, what the prompts show as
admissible-action information (Appendix B.1), what the transition checks compare (Appendix B.5), and the episode's
score so far. Environments are plain synchronous objects; ``actfirst.envs.workers`` runs them in worker processes.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True)
class Transition:
    """What one reset or step returns.

    ``admissible`` is the full list used for action validation (ALFWorld: without help; WebShop: the clickable
    targets, lowercased, plus ``search[...]`` availability in ``has_search_bar``). ``templates``/``objects`` are
    ScienceWorld's action templates and possible objects shown in its prompts.
    """

    observation: str
    admissible: tuple[str, ...]
    score: float
    """Episode score so far on [0, 100] (Appendix C.1: ALFWorld 0/100, ScienceWorld the highest score reached,
    WebShop the purchase reward x 100)."""
    done: bool
    """The environment's termination flag (what the transition checks compare; the turn limit is not termination)."""
    won: bool
    valid: bool = True
    """Whether the executed action was valid (Appendix B.5's validity rule); True after reset."""
    turn: int = 0
    """Executed actions so far in the episode, invalid ones included."""
    truncated: bool = False
    """The turn limit was reached without termination."""
    task_description: str = ""
    templates: tuple[str, ...] = ()
    objects: tuple[str, ...] = ()
    has_search_bar: bool = False

    @property
    def finished(self) -> bool:
        return self.done or self.truncated

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Transition:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names})


class TextEnv(abc.ABC):
    """One benchmark environment instance: one episode at a time."""

    benchmark: str
    max_turns: int

    @abc.abstractmethod
    def reset(self, task: Any) -> Transition:
        """Start an episode of ``task`` (the benchmark's task object); returns the first observation."""

    @abc.abstractmethod
    def step(self, action: str) -> Transition:
        """Execute ``action`` (any text; an invalid action still counts as a turn)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the simulator (JVM, game process)."""

    def _truncated(self, turn: int, done: bool) -> bool:
        """Whether the turn limit truncates this step's episode."""
        return not done and turn >= self.max_turns

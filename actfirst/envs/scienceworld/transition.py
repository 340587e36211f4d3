"""ScienceWorld's transition: the shared record plus what only ScienceWorld shows and checks."""

from __future__ import annotations

import dataclasses

from actfirst.envs.base import Transition


@dataclasses.dataclass(frozen=True, slots=True)
class ScienceWorldTransition(Transition):
    """A ScienceWorld reset or step: the shared fields, its action templates and its possible objects."""

    templates: tuple[str, ...] = ()
    """The simulator's action templates (``get_possible_actions``): shown in B.1's prompts, compared by B.5's check."""
    objects: tuple[str, ...] = ()
    """The simulator's possible objects (``get_possible_objects``): shown in B.1's prompts only (a reference cache
    drops them)."""

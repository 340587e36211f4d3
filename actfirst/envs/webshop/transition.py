"""WebShop's transition: the shared record plus whether the page has a search bar."""

from __future__ import annotations

import dataclasses

from actfirst.envs.base import Transition


@dataclasses.dataclass(frozen=True, slots=True)
class WebShopTransition(Transition):
    """A WebShop reset or step: the shared fields (``admissible``: the clickable targets, lowercased) and the
    availability of ``search[...]``."""

    has_search_bar: bool = False
    """Whether the page has a search bar (WebShop's available-actions dictionary): a search is valid only there."""

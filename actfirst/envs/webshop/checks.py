"""WebShop's transition check (Appendix B.5), with its search-results exception."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from actfirst.envs.checks import PASSED, CheckResult, normalize_text

SEARCH_MISMATCH_ALLOWED = "search-results mismatch allowed"
"""The reason of a WebShop pass through the search-results exception (the next turn may use it too)."""

_ACTION = re.compile(r"^\s*(search|click)\[(.*)\]\s*$", re.DOTALL | re.IGNORECASE)
_CLICK_NOTIFICATION = "you have clicked "
_RESULTS_MARKER = "total results:"
WEBSHOP_PAGE_BUTTONS = frozenset({"back to search", "next >", "< prev"})
"""The clickables of a WebShop search-results page that are not products."""


def parse_webshop_action(action: str) -> tuple[str, str] | None:
    """``("search", query)`` or ``("click", target)`` from ``search[...]``/``click[...]`` text, else None."""
    match = _ACTION.match(action)
    if match is None:
        return None
    return match.group(1).lower(), match.group(2).strip()


def _kind(action: str) -> str | None:
    parsed = parse_webshop_action(action)
    return None if parsed is None else parsed[0]


def webshop_action_valid(action: str, *, has_search_bar: bool, clickables: Iterable[str]) -> bool:
    """B.5: a search is valid with a nonempty query and a search bar; a click is valid when its lowercased target
    is among the current clickable elements."""
    parsed = parse_webshop_action(action)
    if parsed is None:
        return False
    kind, arg = parsed
    if kind == "search":
        return bool(arg) and has_search_bar
    return arg.lower() in {c.lower() for c in clickables}


def normalize_webshop_observation(text: str) -> str:
    """B.5 normalization with click-notification lines ("You have clicked ...") removed; the instruction block is
    kept (its removal applies only to the reference shown in the inverse-dynamics prompt)."""
    return "\n".join(line for line in normalize_text(text).split("\n") if not line.startswith(_CLICK_NOTIFICATION))


def _sorted_actions(clickables: Iterable[str], has_search_bar: bool) -> list[str]:
    return sorted([normalize_text(c) for c in clickables] + (["search[<query>]"] if has_search_bar else []))


def is_search_results(observation: str) -> bool:
    """Whether a WebShop page is a search-results page ("Page 1 (Total results: 50)")."""
    return _RESULTS_MARKER in normalize_text(observation)


def webshop_reference_product(ref_actions: Sequence[str], search_turn: int) -> str | None:
    """B.5's reference product of the reference's search at ``search_turn``: the product identifier (lowercased) in
    the reference's immediately following click action. None when that action is not a search, or the following
    action is not a click on a product (a page button such as "Next >" names no product)."""
    if not 0 <= search_turn < len(ref_actions) - 1 or _kind(ref_actions[search_turn]) != "search":
        return None
    parsed = parse_webshop_action(ref_actions[search_turn + 1])
    if parsed is None or parsed[0] != "click" or parsed[1].lower() in WEBSHOP_PAGE_BUTTONS:
        return None
    return parsed[1].lower()


def webshop_check(*, action: str, has_search_bar: bool, clickables: Iterable[str], done: bool, ref_done: bool,
                  next_observation: str, ref_next_observation: str, next_clickables: Iterable[str],
                  ref_next_clickables: Iterable[str], next_has_search_bar: bool, ref_next_has_search_bar: bool,
                  ref_action: str, ref_product: str | None, after_search_mismatch: bool = False) -> CheckResult:
    """WebShop (B.5). Valid action; termination flags agree; normalized next observations equal (click
    notifications removed) and, for non-terminal transitions, the sorted available-action lists equal.

    The search-results exception. At the search's turn: non-terminal search-results pages may differ when both the
    student's and the reference's actions are searches and the reference product (``ref_product``: see
    :func:`webshop_reference_product`) is clickable on the student's page; such a pass has
    ``reason=SEARCH_MISMATCH_ALLOWED``. At the next turn (``after_search_mismatch``: the previous turn passed so,
    and ``ref_product`` is still that search's product) the student's page still differs from the reference's,
    which is allowed provided that the reference product remains clickable on it; the transition of this turn (the
    click that follows) must satisfy the ordinary rules.
    """
    clickables = [c.lower() for c in clickables]
    next_clickables = [c.lower() for c in next_clickables]
    if not webshop_action_valid(action, has_search_bar=has_search_bar, clickables=clickables):
        return CheckResult(False, "invalid action")
    if after_search_mismatch and ref_product not in clickables:
        return CheckResult(False, "reference product not clickable")
    if done != ref_done:
        return CheckResult(False, "termination mismatch")
    same_observation = normalize_webshop_observation(next_observation) == normalize_webshop_observation(
        ref_next_observation)
    if done:
        return PASSED if same_observation else CheckResult(False, "observation mismatch")
    same_actions = (_sorted_actions(next_clickables, next_has_search_bar)
                    == _sorted_actions(ref_next_clickables, ref_next_has_search_bar))
    if same_observation and same_actions:
        return PASSED
    if (_kind(action) == "search" == _kind(ref_action) and ref_product is not None
            and is_search_results(next_observation) and is_search_results(ref_next_observation)
            and ref_product in next_clickables):
        return CheckResult(True, SEARCH_MISMATCH_ALLOWED)
    return CheckResult(False, "observation mismatch" if not same_observation else "available actions mismatch")

"""Transition consistency checks (paper Sec. 4.2, Appendix B.5) for ALFWorld, ScienceWorld and WebShop.

After a reference-conditioned fast action executes, the check decides whether the observed transition matches the
reference one; the first failure disables reference guidance for the rest of the rollout (the NAP fallback).
The checks compare observable text, not simulator state, and never require the action to equal the reference
action. Retaining guidance requires a valid action, the same termination flag as the reference, and the
benchmark's own conditions below.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections.abc import Iterable, Sequence


@dataclasses.dataclass(frozen=True, slots=True)
class CheckResult:
    """Outcome of one transition check; ``reason`` names the first failed condition ("" when it passed)."""

    passed: bool
    reason: str = ""


PASSED = CheckResult(True)
SEARCH_MISMATCH_ALLOWED = "search-results mismatch allowed"
"""The reason of a WebShop pass through the search-results exception (the next turn may use it too)."""


def normalize_text(text: str) -> str:
    """B.5 normalization: NFKC, case folding, standard line endings, whitespace collapsed within each line,
    empty lines removed; line order kept."""
    text = unicodedata.normalize("NFKC", text).casefold().replace("\r\n", "\n").replace("\r", "\n")
    lines = (" ".join(line.split()) for line in text.split("\n"))
    return "\n".join(line for line in lines if line)


def normalize_set(items: Iterable[str]) -> frozenset[str]:
    """Normalized, deduplicated, order-free set of action strings (admissible actions, action templates)."""
    return frozenset(normalize_text(item) for item in items)


# -- ScienceWorld observation normalization ---------------------------------------------------------------------

_CONTAINING = re.compile(r"\(containing ([^()]*)\)")  # non-nested "(containing ...)" expressions
_IS = " is: "


def _split_enumeration(text: str) -> list[str]:
    """Split on commas outside parentheses; a clause starting with "which" or "that" stays with its item."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    items.append(text[start:].strip())
    merged: list[str] = []
    for item in items:
        if merged and (item.startswith("which ") or item.startswith("that ")):
            merged[-1] = f"{merged[-1]}, {item}"
        else:
            merged.append(item)
    return merged


def _sort_enumeration(text: str) -> str:
    tail = "." if text.endswith(".") else ""
    body = text[: len(text) - len(tail)]
    return ", ".join(sorted(_split_enumeration(body))) + tail


def _sort_line_enumerations(line: str) -> str:
    line = _CONTAINING.sub(lambda m: f"(containing {_sort_enumeration(m.group(1))})", line)
    cut = line.rfind(_IS)
    if cut >= 0:
        line = line[: cut + len(_IS)] + _sort_enumeration(line[cut + len(_IS):])
    return line


def normalize_scienceworld_observation(text: str) -> str:
    """B.5 ScienceWorld normalization: the common normalization, then enumerations inside non-nested
    "(containing ...)" and after the last " is: " of each line sorted, then the lines sorted."""
    return "\n".join(sorted(_sort_line_enumerations(line) for line in normalize_text(text).split("\n")))


# -- The checks ---------------------------------------------------------------------------------------------------


def alfworld_action_valid(action: str, admissible: Iterable[str]) -> bool:
    """B.5: the normalized action is in the current admissible-action set, help excluded."""
    return normalize_text(action) in normalize_set(a for a in admissible if normalize_text(a) != "help")


def scienceworld_action_valid(action: str, admissible: Iterable[str]) -> bool:
    """B.5: the normalized action is in the current full admissible-action list."""
    return normalize_text(action) in normalize_set(admissible)


def alfworld_check(*, action: str, admissible: Iterable[str], done: bool, ref_done: bool, next_observation: str,
                   ref_next_observation: str, next_admissible: Iterable[str],
                   ref_next_admissible: Iterable[str]) -> CheckResult:
    """ALFWorld (B.5): the action is admissible (help excluded); termination flags agree; normalized next
    observations are equal; for non-terminal transitions the next admissible-action sets are equal."""
    if not alfworld_action_valid(action, admissible):
        return CheckResult(False, "invalid action")
    if done != ref_done:
        return CheckResult(False, "termination mismatch")
    if normalize_text(next_observation) != normalize_text(ref_next_observation):
        return CheckResult(False, "observation mismatch")
    if not done and normalize_set(next_admissible) != normalize_set(ref_next_admissible):
        return CheckResult(False, "admissible actions mismatch")
    return PASSED


def scienceworld_check(*, action: str, admissible: Iterable[str], done: bool, ref_done: bool, next_observation: str,
                       ref_next_observation: str, next_templates: Iterable[str],
                       ref_next_templates: Iterable[str]) -> CheckResult:
    """ScienceWorld (B.5): the action is in the full admissible list; termination flags agree; normalized (sorted)
    next observations are equal; action-template sets are equal, terminal transitions included. Possible-object
    lists (aliases), room descriptions, inventory, reward and score are not compared."""
    if not scienceworld_action_valid(action, admissible):
        return CheckResult(False, "invalid action")
    if done != ref_done:
        return CheckResult(False, "termination mismatch")
    if normalize_scienceworld_observation(next_observation) != normalize_scienceworld_observation(ref_next_observation):
        return CheckResult(False, "observation mismatch")
    if normalize_set(next_templates) != normalize_set(ref_next_templates):
        return CheckResult(False, "action templates mismatch")
    return PASSED


# -- WebShop ------------------------------------------------------------------------------------------------------

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

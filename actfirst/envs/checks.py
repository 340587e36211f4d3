"""Transition consistency checks (paper Sec. 4.2, Appendix B.5) for ALFWorld and ScienceWorld.

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
from collections.abc import Iterable


@dataclasses.dataclass(frozen=True, slots=True)
class CheckResult:
    """Outcome of one transition check; ``reason`` names the first failed condition ("" when it passed)."""

    passed: bool
    reason: str = ""


PASSED = CheckResult(True)


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


def alfworld_check(*, action: str, admissible: Iterable[str], done: bool, ref_done: bool, next_observation: str,
                   ref_next_observation: str, next_admissible: Iterable[str],
                   ref_next_admissible: Iterable[str]) -> CheckResult:
    """ALFWorld (B.5): the action is admissible (help excluded); termination flags agree; normalized next
    observations are equal; for non-terminal transitions the next admissible-action sets are equal."""
    valid = normalize_set(a for a in admissible if normalize_text(a) != "help")
    if normalize_text(action) not in valid:
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
    if normalize_text(action) not in normalize_set(admissible):
        return CheckResult(False, "invalid action")
    if done != ref_done:
        return CheckResult(False, "termination mismatch")
    if normalize_scienceworld_observation(next_observation) != normalize_scienceworld_observation(ref_next_observation):
        return CheckResult(False, "observation mismatch")
    if normalize_set(next_templates) != normalize_set(ref_next_templates):
        return CheckResult(False, "action templates mismatch")
    return PASSED

"""ScienceWorld's observation normalization and action validity (Appendix B.5; its check is ``Benchmark._check``
with these and ``ScienceWorldBenchmark._check_next``)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from actfirst.envs.checks import normalize_set, normalize_text

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


def scienceworld_action_valid(action: str, admissible: Iterable[str]) -> bool:
    """B.5: the normalized action is in the current full admissible-action list."""
    return normalize_text(action) in normalize_set(admissible)


"""Transition consistency checks (paper Sec. 4.2, Appendix B.5): the result and the normalization every benchmark's
check shares (the check itself is ``Benchmark.check``, with each benchmark's own conditions in its package).

After a reference-conditioned fast action executes, the check decides whether the observed transition matches the
reference one; the first failure disables reference guidance for the rest of the rollout (the NAP fallback).
The checks compare observable text, not simulator state, and never require the action to equal the reference
action. Retaining guidance requires a valid action, the same termination flag and the same normalized next
observation as the reference (``Benchmark._check``, every benchmark's default), and the benchmark's own conditions
(``Benchmark._check_next``; WebShop's search-results exception overrides ``_check``).
"""

from __future__ import annotations

import dataclasses
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

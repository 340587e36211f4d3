"""ALFWorld's action validity (Appendix B.5; the rest of its check is ``ALFWorldBenchmark._check_next``)."""

from __future__ import annotations

from collections.abc import Iterable

from actfirst.envs.checks import normalize_set, normalize_text


def alfworld_action_valid(action: str, admissible: Iterable[str]) -> bool:
    """B.5: the normalized action is in the current admissible-action set, help excluded."""
    return normalize_text(action) in normalize_set(a for a in admissible if normalize_text(a) != "help")


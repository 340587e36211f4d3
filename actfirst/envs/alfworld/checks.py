"""ALFWorld's transition check (Appendix B.5)."""

from __future__ import annotations

from collections.abc import Iterable

from actfirst.envs.checks import PASSED, CheckResult, normalize_set, normalize_text


def alfworld_action_valid(action: str, admissible: Iterable[str]) -> bool:
    """B.5: the normalized action is in the current admissible-action set, help excluded."""
    return normalize_text(action) in normalize_set(a for a in admissible if normalize_text(a) != "help")


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

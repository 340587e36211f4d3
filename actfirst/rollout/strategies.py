"""Rollout strategies: how each turn's executed action is chosen (Sec. 4, Sec. 5.3).

Every strategy submits one full response per visited context (Sec. 4.3); they differ in what the environment
executes:

- ``vanilla`` (Vanilla OPD): think-then-act; the turn waits for its full response and executes its action.
- ``actfirst`` (ActFirst-OPD, Eq. 6-7): a fast action by reference-conditioned inverse dynamics while the
  transition checks pass; after the first failed check, next-action prediction (the NAP fallback) for the rest of
  the episode, without a reset. An invalid inverse-dynamics proposal triggers one NAP request from the unchanged
  context before anything is executed (B.5).
- ``no_id`` (w/o ID): NAP fast actions from the first turn, no reference.
- ``no_nap`` (w/o NAP fallback): as ``actfirst``, but the episode ends at the first failed check. The one NAP
  request that replaces an invalid proposal before execution (B.5) is kept: it is not a fallback after a failed
  check, which is what Sec. 5.3 removes (our reading; the paper does not say).
- ``ref_prefix_50`` / ``ref_prefix_100`` (Reference-Prefix Replay): the first 50% or all of the reference actions
  are executed as they are, then NAP. 50% of an odd count is rounded up (our choice; the paper does not say), so a
  one-action reference is replayed.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import math

from actfirst.envs.checks import CheckResult


class ActionSource(enum.Enum):
    """Where an executed action came from."""

    FULL_RESPONSE = "full_response"
    """The action of the turn's full response (think-then-act)."""
    INVERSE_DYNAMICS = "inverse_dynamics"
    """A fast action conditioned on the reference next observation (Eq. 6)."""
    NEXT_ACTION = "next_action"
    """A fast action from the context alone (Eq. 7)."""
    NAP_RETRY = "nap_retry"
    """The NAP request that replaced an invalid inverse-dynamics proposal (B.5)."""
    REFERENCE = "reference"
    """A reference action replayed as it is (Reference-Prefix Replay)."""


@dataclasses.dataclass(slots=True)
class Guidance:
    """An episode's reference guidance: whether it still holds, and what its checks said."""

    active: bool
    fallback_turn: int | None = None
    """Turn (0-based) whose check failed first; NAP from the next turn on."""
    previous: CheckResult | None = None
    aligned_turns: int = 0
    """Executed turns whose transition passed the check."""


class RolloutStrategy(abc.ABC):
    """How a turn's action is chosen; the episode runner asks, executes and reports back."""

    name: str
    think_then_act: bool = False
    """Execute the full response's action (the turn waits for it)."""
    uses_references: bool = False

    def start(self) -> Guidance:
        """The guidance an episode starts with."""
        return Guidance(active=self.uses_references)

    @abc.abstractmethod
    def source(self, guidance: Guidance, turn: int, reference_length: int) -> ActionSource:
        """Where the action of ``turn`` comes from."""

    def after_check(self, guidance: Guidance, turn: int, result: CheckResult) -> bool:
        """Record a guided turn's check; returns whether the episode goes on."""
        guidance.previous = result
        if result.passed:
            guidance.aligned_turns += 1
            return True
        guidance.active = False
        guidance.fallback_turn = turn
        return True


class ThinkThenAct(RolloutStrategy):
    name = "vanilla"
    think_then_act = True

    def source(self, guidance: Guidance, turn: int, reference_length: int) -> ActionSource:
        return ActionSource.FULL_RESPONSE


class ActFirst(RolloutStrategy):
    """Inverse dynamics while guidance holds, then NAP; ``nap_fallback=False`` ends the episode instead."""

    uses_references = True

    def __init__(self, name: str = "actfirst", nap_fallback: bool = True) -> None:
        self.name = name
        self.nap_fallback = nap_fallback

    def source(self, guidance: Guidance, turn: int, reference_length: int) -> ActionSource:
        return ActionSource.INVERSE_DYNAMICS if guidance.active else ActionSource.NEXT_ACTION

    def after_check(self, guidance: Guidance, turn: int, result: CheckResult) -> bool:
        super().after_check(guidance, turn, result)
        return result.passed or self.nap_fallback


class NextActionOnly(RolloutStrategy):
    """w/o ID: direct action generation without reference next observations."""

    name = "no_id"

    def source(self, guidance: Guidance, turn: int, reference_length: int) -> ActionSource:
        return ActionSource.NEXT_ACTION


class ReferencePrefixReplay(RolloutStrategy):
    """The first ``fraction`` of the reference actions (rounded up), then NAP."""

    uses_references = True

    def __init__(self, name: str, fraction: float) -> None:
        self.name = name
        self.fraction = fraction

    def start(self) -> Guidance:
        return Guidance(active=False)  # reference actions are executed, not checked

    def prefix_length(self, reference_length: int) -> int:
        return math.ceil(self.fraction * reference_length)

    def source(self, guidance: Guidance, turn: int, reference_length: int) -> ActionSource:
        return ActionSource.REFERENCE if turn < self.prefix_length(reference_length) else ActionSource.NEXT_ACTION


def make_strategy(name: str) -> RolloutStrategy:
    """The strategy ``rollout.strategy`` names."""
    strategies = {
        "vanilla": ThinkThenAct,
        "actfirst": lambda: ActFirst("actfirst", nap_fallback=True),
        "no_id": NextActionOnly,
        "no_nap": lambda: ActFirst("no_nap", nap_fallback=False),
        "ref_prefix_50": lambda: ReferencePrefixReplay("ref_prefix_50", 0.5),
        "ref_prefix_100": lambda: ReferencePrefixReplay("ref_prefix_100", 1.0),
    }
    if name not in strategies:
        raise ValueError(f"rollout.strategy={name!r}: not one of {sorted(strategies)}")
    return strategies[name]()

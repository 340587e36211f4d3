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

The UOPD paper's methods (003, Sec. 4.2 and Appendix D.3) are think-then-act; n is the episode's rollout batch
(0-based, counted over the run and across ``--resume``):

- ``f2b`` (TCOD-F2B): the student plays only the first W_n = min(1 + floor(n / eta), T_max) turns, then the
  episode ends.
- ``b2f`` (TCOD-B2F): the first P_n = clamp(L - 1 - floor(n / eta), 0, L - 1) reference actions (L: the
  reference's length) are replayed; those contexts get no full response and produce no sample ("the prefix carries
  no loss"); then the student plays.
- ``uopd``: the student's full response is its proposal; ``actfirst.rollout.intervention`` decides whether the
  teacher's action is executed in its place.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import math

from actfirst.config import TCODConfig
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
    """A reference action replayed as it is (Reference-Prefix Replay, TCOD-B2F's prefix)."""
    TEACHER = "teacher"
    """The teacher's full response's action, executed in place of the student's proposal (UOPD)."""


@dataclasses.dataclass(slots=True)
class Guidance:
    """An episode's reference guidance: whether it still holds, and what its checks said."""

    active: bool
    batch: int = 0
    """The episode's rollout batch n (0-based), which the curricula read."""
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
    samples_replayed: bool = True
    """Whether a replayed reference action's context gets a full response (a training sample)."""
    intervenes: bool = False
    """Whether the teacher may act in the student's place (UOPD)."""

    def start(self, batch: int = 0) -> Guidance:
        """The guidance an episode of rollout batch ``batch`` starts with."""
        return Guidance(active=self.uses_references, batch=batch)

    def horizon(self, guidance: Guidance, max_turns: int) -> int:
        """How many turns the episode may take (the benchmark's limit ``max_turns`` unless a curriculum cuts it)."""
        return max_turns

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

    def start(self, batch: int = 0) -> Guidance:
        return Guidance(active=False, batch=batch)  # reference actions are executed, not checked

    def prefix_length(self, reference_length: int) -> int:
        return math.ceil(self.fraction * reference_length)

    def source(self, guidance: Guidance, turn: int, reference_length: int) -> ActionSource:
        return ActionSource.REFERENCE if turn < self.prefix_length(reference_length) else ActionSource.NEXT_ACTION


def curriculum_stage(batch: int, eta: int) -> int:
    """floor(n / eta): the curriculum stage of rollout batch n (003, Appendix D.3)."""
    return batch // eta


class ForwardToBackward(ThinkThenAct):
    """TCOD-F2B: W_n = min(1 + floor(n / eta), T_max) student turns, then the episode ends."""

    name = "f2b"

    def __init__(self, eta: int, max_turns: int = 0) -> None:
        self.eta, self.max_turns = eta, max_turns

    def horizon(self, guidance: Guidance, max_turns: int) -> int:
        t_max = self.max_turns or max_turns
        return min(1 + curriculum_stage(guidance.batch, self.eta), t_max, max_turns)


class BackwardToForward(ThinkThenAct):
    """TCOD-B2F: P_n = clamp(L - 1 - floor(n / eta), 0, L - 1) replayed reference actions without samples, then
    the student plays."""

    name = "b2f"
    uses_references = True
    samples_replayed = False

    def __init__(self, eta: int) -> None:
        self.eta = eta

    def start(self, batch: int = 0) -> Guidance:
        return Guidance(active=False, batch=batch)  # reference actions are executed, not checked

    def prefix_length(self, reference_length: int, batch: int) -> int:
        length = reference_length - 1 - curriculum_stage(batch, self.eta)
        return min(max(length, 0), max(reference_length - 1, 0))

    def source(self, guidance: Guidance, turn: int, reference_length: int) -> ActionSource:
        replayed = turn < self.prefix_length(reference_length, guidance.batch)
        return ActionSource.REFERENCE if replayed else ActionSource.FULL_RESPONSE


class UncertaintyIntervention(ThinkThenAct):
    """UOPD: think-then-act, and the teacher may replace the student's proposal (``actfirst.rollout.intervention``)."""

    name = "uopd"
    intervenes = True


TCOD_ETA = {"f2b": 6, "b2f": 5}
"""The paper's eta on ALFWorld (003, Appendix D.3)."""


def make_strategy(name: str, tcod: TCODConfig | None = None) -> RolloutStrategy:
    """The strategy ``rollout.strategy`` names (``tcod``: the curricula's section; default values without it)."""
    tcod = tcod or TCODConfig()
    strategies = {
        "vanilla": ThinkThenAct,
        "actfirst": lambda: ActFirst("actfirst", nap_fallback=True),
        "no_id": NextActionOnly,
        "no_nap": lambda: ActFirst("no_nap", nap_fallback=False),
        "ref_prefix_50": lambda: ReferencePrefixReplay("ref_prefix_50", 0.5),
        "ref_prefix_100": lambda: ReferencePrefixReplay("ref_prefix_100", 1.0),
        "f2b": lambda: ForwardToBackward(tcod.eta or TCOD_ETA["f2b"], tcod.max_turns),
        "b2f": lambda: BackwardToForward(tcod.eta or TCOD_ETA["b2f"]),
        "uopd": UncertaintyIntervention,
    }
    if name not in strategies:
        raise ValueError(f"rollout.strategy={name!r}: not one of {sorted(strategies)}")
    return strategies[name]()

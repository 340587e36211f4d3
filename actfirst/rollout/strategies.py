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

A strategy is one class: a subclass of :class:`RolloutStrategy` that declares its ``name`` (the ``rollout.strategy``
value) and ``label`` registers itself in :data:`STRATEGIES`, from which every list of strategies is read (the
config's allowed values, the comparison's method names). It declares what it needs (B.1's fast-action prompts,
references, its config section) and overrides the hooks the episode runner and the trainer call; the defaults are
think-then-act's. Its config section's dataclass lives here, beside it (``TrainConfig`` holds it under the same
top-level key).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Literal

from actfirst.core.schema import check
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


STRATEGIES: dict[str, type[RolloutStrategy]] = {}
"""Every rollout strategy class by its ``rollout.strategy`` name, in the order they were declared (each subclass of
:class:`RolloutStrategy` that declares a ``name`` adds itself)."""


class RolloutStrategy:
    """How a turn's action is chosen; the episode runner asks, executes and reports back. The defaults are
    think-then-act's (Vanilla OPD): every turn executes its full response's action."""

    name: ClassVar[str]
    """The ``rollout.strategy`` value."""
    label: ClassVar[str]
    """The paper's name of the method (the comparison's tables)."""
    rollout_label: ClassVar[str | None] = None
    """How C.5's rollout-quality comparison names the way it acts, where that differs from ``label``."""
    fast_actions: ClassVar[bool] = False
    """Whether it executes fast actions (B.1's next-action-prediction or inverse-dynamics prompts)."""
    uses_references: ClassVar[bool] = False
    """Whether its episodes read the reference cache (each task needs a reference)."""
    intervenes: ClassVar[bool] = False
    """Whether the teacher may act in the student's place (UOPD; ``actfirst.rollout.intervention``)."""
    section: ClassVar[str | None] = None
    """The config section it is built from: ``TrainConfig.<section>``, a top-level YAML key (None: none)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in vars(cls):
            return  # a family's common part (ReferencePrefixReplay, TemporalCurriculum): its members declare names
        if "label" not in vars(cls):
            raise TypeError(f"{cls.__qualname__} (rollout.strategy {cls.name!r}): declares no label")
        if cls.name in STRATEGIES:
            raise TypeError(f"{cls.__qualname__}: rollout.strategy {cls.name!r} is already "
                            f"{STRATEGIES[cls.name].__qualname__}")
        STRATEGIES[cls.name] = cls

    @classmethod
    def from_section(cls, section: Any) -> RolloutStrategy:
        """The strategy built from its config section (``TrainConfig.<section>``; None: the section's defaults)."""
        return cls()

    @classmethod
    def needs_fast_action_benchmark(cls) -> bool:
        """Whether it runs only on a benchmark with B.1's fast-action prompts and reference trajectories."""
        return cls.fast_actions or cls.uses_references

    @classmethod
    def check_config(cls, cfg: Any) -> None:
        """Refuse, by key and value (``actfirst.core.schema.check``), a training config (``TrainConfig``) this strategy
        cannot run; its section checks its own values."""

    def start(self, batch: int = 0) -> Guidance:
        """The guidance an episode of rollout batch ``batch`` starts with (active: its transitions are checked)."""
        return Guidance(active=False, batch=batch)

    def horizon(self, batch: int, max_turns: int) -> int:
        """How many turns an episode of rollout batch ``batch`` may take (the benchmark's limit ``max_turns`` unless
        a curriculum cuts it)."""
        return max_turns

    def source(self, guidance: Guidance, turn: int, reference_length: int) -> ActionSource:
        """Where the action of ``turn`` comes from (what the turn executes)."""
        return ActionSource.FULL_RESPONSE

    def samples(self, source: ActionSource) -> bool:
        """Whether a context whose executed action comes from ``source`` gets a full response (a training sample)."""
        return True

    def after_check(self, guidance: Guidance, turn: int, result: CheckResult) -> bool:
        """Record a guided turn's check; returns whether the episode goes on (a failed check ends the guidance)."""
        guidance.previous = result
        if result.passed:
            guidance.aligned_turns += 1
            return True
        guidance.active = False
        guidance.fallback_turn = turn
        return True


class StrategyLabels(Mapping[str, str]):
    """Every registered strategy's ``label`` by name, read from :data:`STRATEGIES` when asked."""

    def __getitem__(self, name: str) -> str:
        return STRATEGIES[name].label

    def __iter__(self) -> Iterator[str]:
        return iter(STRATEGIES)

    def __len__(self) -> int:
        return len(STRATEGIES)


def make_strategy(name: str, section: Any = None) -> RolloutStrategy:
    """The strategy ``rollout.strategy`` names, built from its config section (``section``: the one its class's
    ``section`` names, e.g. ``TrainConfig.tcod``; None: that section's defaults)."""
    if name not in STRATEGIES:
        raise ValueError(f"rollout.strategy={name!r}: not one of {list(STRATEGIES)}")
    return STRATEGIES[name].from_section(section)


class ThinkThenAct(RolloutStrategy):
    """Vanilla OPD: every turn waits for its full response and executes its action (the default hooks)."""

    name = "vanilla"
    label = "Vanilla OPD"
    rollout_label = "Think-then-act"


class ActFirst(RolloutStrategy):
    """Inverse dynamics while guidance holds, then NAP (the NAP fallback)."""

    name = "actfirst"
    label = "ActFirst-OPD"
    fast_actions = True
    uses_references = True
    nap_fallback: ClassVar[bool] = True
    """Whether a failed transition check switches to NAP (False: it ends the episode)."""

    def start(self, batch: int = 0) -> Guidance:
        return Guidance(active=True, batch=batch)

    def source(self, guidance: Guidance, turn: int, reference_length: int) -> ActionSource:
        return ActionSource.INVERSE_DYNAMICS if guidance.active else ActionSource.NEXT_ACTION

    def after_check(self, guidance: Guidance, turn: int, result: CheckResult) -> bool:
        super().after_check(guidance, turn, result)
        return result.passed or self.nap_fallback


class NextActionOnly(RolloutStrategy):
    """w/o ID: direct action generation without reference next observations."""

    name = "no_id"
    label = "w/o ID"
    rollout_label = "Direct action (no reference)"
    fast_actions = True

    def source(self, guidance: Guidance, turn: int, reference_length: int) -> ActionSource:
        return ActionSource.NEXT_ACTION


class WithoutNAPFallback(ActFirst):
    """w/o NAP fallback: ActFirst-OPD whose episode ends at the first failed transition check."""

    name = "no_nap"
    label = "w/o NAP fallback"
    nap_fallback = False


class ReferencePrefixReplay(RolloutStrategy):
    """The first ``fraction`` of the reference actions (rounded up), executed as they are (not checked), then NAP."""

    fast_actions = True
    uses_references = True
    fraction: ClassVar[float]

    def prefix_length(self, reference_length: int) -> int:
        return math.ceil(self.fraction * reference_length)

    def source(self, guidance: Guidance, turn: int, reference_length: int) -> ActionSource:
        return ActionSource.REFERENCE if turn < self.prefix_length(reference_length) else ActionSource.NEXT_ACTION


class ReferencePrefixReplay50(ReferencePrefixReplay):
    name = "ref_prefix_50"
    label = "Reference-Prefix Replay (50%)"
    fraction = 0.5


class ReferencePrefixReplay100(ReferencePrefixReplay):
    name = "ref_prefix_100"
    label = "Reference-Prefix Replay (100%)"
    fraction = 1.0


@dataclasses.dataclass(kw_only=True, slots=True)
class TCODConfig:
    """TCOD's temporal curricula over the rollout horizon (UOPD paper, Appendix D.3), advanced every ``eta`` rollout
    batches n: F2B plays W_n = min(1 + floor(n / eta), T_max) student turns, then ends the episode; B2F replays
    P_n = clamp(L - 1 - floor(n / eta), 0, L - 1) reference actions (L: the reference's length), which carry no
    loss, then the student plays."""

    eta: int | None = None
    """Rollout batches per curriculum stage (None: the paper's ALFWorld value, 6 for F2B and 5 for B2F)."""
    max_turns: int = 0
    """F2B's T_max (0: the benchmark's turn limit)."""

    def __post_init__(self) -> None:
        check(self.eta is None or self.eta >= 1, "eta", self.eta, "must be >= 1 (or null: the paper's value)")
        check(self.max_turns >= 0, "max_turns", self.max_turns, "must be >= 0 (0: the benchmark's turn limit)")


def curriculum_stage(batch: int, eta: int) -> int:
    """floor(n / eta): the curriculum stage of rollout batch n (003, Appendix D.3)."""
    return batch // eta


class TemporalCurriculum(RolloutStrategy):
    """TCOD's curricula (section ``tcod``): think-then-act, advanced a stage every ``eta`` rollout batches."""

    section = "tcod"
    paper_eta: ClassVar[int]
    """The paper's eta on ALFWorld (003, Appendix D.3), when ``tcod.eta`` is null."""

    def __init__(self, tcod: TCODConfig) -> None:
        self.eta = tcod.eta or self.paper_eta

    @classmethod
    def from_section(cls, section: TCODConfig | None) -> RolloutStrategy:
        return cls(section or TCODConfig())


class ForwardToBackward(TemporalCurriculum):
    """TCOD-F2B: W_n = min(1 + floor(n / eta), T_max) student turns, then the episode ends."""

    name = "f2b"
    label = "TCOD-F2B"
    paper_eta = 6

    def __init__(self, tcod: TCODConfig) -> None:
        super().__init__(tcod)
        self.max_turns = tcod.max_turns

    def horizon(self, batch: int, max_turns: int) -> int:
        t_max = self.max_turns or max_turns
        return min(1 + curriculum_stage(batch, self.eta), t_max, max_turns)


class BackwardToForward(TemporalCurriculum):
    """TCOD-B2F: P_n = clamp(L - 1 - floor(n / eta), 0, L - 1) replayed reference actions (not checked) without
    samples, then the student plays."""

    name = "b2f"
    label = "TCOD-B2F"
    uses_references = True
    paper_eta = 5

    def prefix_length(self, reference_length: int, batch: int) -> int:
        length = reference_length - 1 - curriculum_stage(batch, self.eta)
        return min(max(length, 0), max(reference_length - 1, 0))

    def source(self, guidance: Guidance, turn: int, reference_length: int) -> ActionSource:
        replayed = turn < self.prefix_length(reference_length, guidance.batch)
        return ActionSource.REFERENCE if replayed else ActionSource.FULL_RESPONSE

    def samples(self, source: ActionSource) -> bool:
        return source is not ActionSource.REFERENCE  # the prefix carries no loss


@dataclasses.dataclass(kw_only=True, slots=True)
class UOPDConfig:
    """UOPD's intervention rule and loss (UOPD paper, Sec. 4.2, Sec. 5.3, Appendix D.4); see
    ``actfirst.rollout.intervention``."""

    score: Literal["teacher_confidence", "logprob_gap"] = "teacher_confidence"
    """The uncertainty score of a student proposal: ``teacher_confidence`` (the paper's default on ALFWorld and
    WebShop) or ``logprob_gap`` (the length-normalized student-teacher log-prob gap)."""
    selection: Literal["uncertainty", "random"] = "uncertainty"
    """``random``: Sec. 5.3's ablation, each turn intervened with probability r_n."""
    rate: tuple[float, float] = (0.30, 0.05)
    """The target intervention rate r_n, linear from the first to the second value over the updates (Sec. 5.3's
    presets: [0.30, 0.05] and [0.50, 0.30]; a constant 15%: [0.15, 0.15])."""
    buffer_size: int = 512
    """Recent uncertainty scores D_n the threshold is the (1 - r_n) quantile of."""
    min_scores: int = 16
    """Until the buffer holds this many scores, turns are intervened at random with probability r_n."""
    sft_weight: float = 1.0
    """beta: the weight of the SFT loss on intervened turns' teacher responses (0: Sec. 5.3's "w/o SFT")."""
    teacher_execution: bool = True
    """Execute the teacher's action in place of the student's (false: Sec. 5.3's SFT target only)."""
    teacher_gpu_memory_utilization: float = 0.2
    """GPU only: the teacher engine's share of GPU memory (it lives beside the student's engine)."""

    def __post_init__(self) -> None:
        check(all(0.0 <= r <= 1.0 for r in self.rate), "rate", self.rate, "must be two rates in [0, 1]")
        check(self.buffer_size >= 1, "buffer_size", self.buffer_size, "must be >= 1")
        check(1 <= self.min_scores <= self.buffer_size, "min_scores", self.min_scores,
               f"must be in [1, buffer_size={self.buffer_size}]")
        check(self.sft_weight >= 0.0, "sft_weight", self.sft_weight, "must be >= 0")
        check(0.0 < self.teacher_gpu_memory_utilization < 1.0, "teacher_gpu_memory_utilization",
               self.teacher_gpu_memory_utilization, "must be in (0, 1)")


class UncertaintyIntervention(RolloutStrategy):
    """UOPD: think-then-act, and the teacher may replace the student's proposal (``actfirst.rollout.intervention``,
    section ``uopd``)."""

    name = "uopd"
    label = "UOPD"
    intervenes = True
    section = "uopd"

    @classmethod
    def check_config(cls, cfg: Any) -> None:
        check(cfg.parallel.teacher == "replicate", "parallel.teacher", cfg.parallel.teacher,
              "must be 'replicate' with rollout.strategy='uopd' (each rank's rollouts score proposals with the "
              "teacher on their own, outside any collective)")
        check(cfg.student.sleep_level == 0, "student.sleep_level", cfg.student.sleep_level,
              "must be 0 with rollout.strategy='uopd' (the teacher's engine may share the student engine's rotary "
              "cache, which a sleeping student moves off the GPU: docs/engine.md, two engines in one process)")
        check(cfg.uopd.teacher_gpu_memory_utilization + cfg.student.gpu_memory_utilization < 1.0,
              "uopd.teacher_gpu_memory_utilization", cfg.uopd.teacher_gpu_memory_utilization,
              f"+ student.gpu_memory_utilization={cfg.student.gpu_memory_utilization} must be < 1")

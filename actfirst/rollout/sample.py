"""Turn-level samples: one full response y_t = (z_t, a_t) at one visited context c_t (Sec. 3, Appendix B.4), and
what scores them. Below both the rollout (which makes samples) and the training (which consumes them)."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch


@dataclasses.dataclass(slots=True)
class Sample:
    """What the teacher scores and the update consumes.

    ``response_ids`` holds every response token in order, sampled and inserted (B.3's early-stop text);
    ``loss_mask`` is 1 for a sampled token and 0 for an inserted one (B.4: inserted tokens stay in the context but
    count neither in the loss nor in its normalization); ``logprobs`` is log pi_old of each sampled token (0.0 at
    inserted positions), from the engine that sampled it, at the sampling temperature.
    """

    context_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    weight_version: int
    """The oldest weight version that generated any of its tokens (what the staleness rule of B.4 reads)."""
    task: str
    turn: int
    """0-based turn of the context in its episode."""
    strategy: str
    teacher_logprobs: list[float] | None = None
    """log pi_teacher of each response token, filled by the teacher scorer."""
    sft_weight: float = 0.0
    """0: an OPD sample (the student's own response, Eq. 29-32). > 0: an SFT target (UOPD's teacher response at an
    intervened turn, 003 Sec. 4.2) whose sampled tokens' negative log-likelihood enters the loss with this weight
    (beta), token-mean per sample like Eq. 32; its ``logprobs`` are the teacher's and go unused."""
    token_versions: list[int] = dataclasses.field(default_factory=list)
    """The weight version that generated each response token (an inserted token: that of the token before it),
    several when a ``keep_in_flight`` weight update fell inside the response; its minimum is ``weight_version``.
    Empty: every token is of ``weight_version`` (samples no engine generated: SFT data, UOPD's SFT targets)."""

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if not (len(self.loss_mask) == len(self.logprobs) == n):
            raise ValueError(f"response_ids ({n}), loss_mask ({len(self.loss_mask)}) and logprobs "
                             f"({len(self.logprobs)}) must have one entry per response token")
        if self.token_versions and (len(self.token_versions) != n or min(self.token_versions) != self.weight_version):
            raise ValueError(f"token_versions ({len(self.token_versions)} entries, oldest "
                             f"{min(self.token_versions)}) must have one entry per response token ({n}) and its "
                             f"oldest must be weight_version={self.weight_version}")
        if not self.context_ids:
            raise ValueError("context_ids=[]: a sample needs its context")
        if not (self.sft_weight >= 0 and math.isfinite(self.sft_weight)):
            raise ValueError(f"sft_weight={self.sft_weight!r}: must be a finite number >= 0")

    @property
    def num_tokens(self) -> int:
        """Context plus response tokens (what one forward pass over the sample costs)."""
        return len(self.context_ids) + len(self.response_ids)

    @property
    def num_supervised(self) -> int:
        return sum(self.loss_mask)


class SampleScorer(Protocol):
    """What the rollout needs of the frozen teacher (UOPD's uncertainty score, ``actfirst.rollout.intervention``): it
    fills ``Sample.teacher_logprobs`` on its ``device``. ``actfirst.train.teacher.TeacherScorer`` is one."""

    device: torch.device

    def score(self, samples: list[Sample]) -> None:
        """Set each sample's ``teacher_logprobs``; safe from several threads at once (one forward at a time: the
        rollout's calls and the update's share the teacher's activation memory)."""

"""The rollout-speedup benchmark's config (``bench/rollout_speedup.py``; its files are
``bench/configs/rollout_speedup_*.yaml``)::

    cfg = load_config(RolloutSpeedupConfig, "bench/configs/rollout_speedup_cpu.yaml", ["scheduler.b_max=64"])
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from actfirst.core.config import EngineConfig, SchedulerConfig
from actfirst.core.schema import check
from actfirst.envs.alfworld.config import ALFWorldConfig


@dataclasses.dataclass(kw_only=True, slots=True)
class RolloutSpeedupConfig:
    """The rollout-efficiency experiment (paper Sec. 5.4, Appendix C.5, Table 8, Figure 3a/b)."""

    engine: EngineConfig
    scheduler: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
    num_tasks: int = 16
    """N, tasks per batch."""
    num_batches: int = 1
    """Batches of N tasks per repeat (the paper uses 64 batches of 16 = 1,024 contexts)."""
    contexts: Literal["synthetic", "alfworld"] = "synthetic"
    """``alfworld``: the first turn of ALFWorld training games, proportional by type (Fig. 3(a); ``alfworld``
    says which games); ``synthetic``: ALFWorld-like text of ``context_tokens`` tokens (a quick check)."""
    alfworld: ALFWorldConfig | None = None
    """With ``contexts: alfworld``: which games (``games: real`` or ``generated``)."""
    context_tokens: tuple[int, int] = (300, 600)
    """Range of context lengths (tokens) drawn for ``synthetic`` contexts."""
    fast_action_tokens: int = 16
    full_response_tokens: list[int] = dataclasses.field(default_factory=lambda: [128, 512])
    b_max: list[int] = dataclasses.field(default_factory=lambda: [16, 32, 64, 128, 256])
    turns: list[int] = dataclasses.field(default_factory=lambda: [4])
    """Virtual turns T swept for Figure 3a (every b_max) ..."""
    turns_sweep: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 4, 8])
    """... and T swept at the largest b_max for Figure 3b."""
    repeats: int = 3
    """Paired repeats, strategy order alternated."""
    admission_policies: list[str] = dataclasses.field(default_factory=lambda: ["wait", "reserve", "preempt"])
    """Fast-action admission policies compared (at every b_max, the first full-response length, T = turns[0])."""
    concurrency_sweep: list[int] = dataclasses.field(default_factory=lambda: [1, 4, 16, 64, 128, 256])
    """Concurrencies of the peak-decode-rate sweep behind the throughput bound."""
    temperature: float = 1.0
    seed: int = 42
    out_dir: str = "runs/rollout_speedup"

    def __post_init__(self) -> None:
        for name in ("num_tasks", "num_batches", "fast_action_tokens", "repeats"):
            check(getattr(self, name) >= 1, name, getattr(self, name), "must be >= 1")
        lo, hi = self.context_tokens
        check(1 <= lo <= hi, "context_tokens", self.context_tokens, "must be (lo, hi) with 1 <= lo <= hi")
        for name in ("full_response_tokens", "b_max", "turns", "turns_sweep", "concurrency_sweep"):
            values = getattr(self, name)
            check(len(values) > 0 and all(v >= 1 for v in values), name, values,
                  "must be a non-empty list of ints >= 1")
        for policy in self.admission_policies:
            check(policy in ("wait", "reserve", "preempt"), "admission_policies", self.admission_policies,
                   "entries must be 'wait', 'reserve' or 'preempt'")
        check(max(self.b_max) <= self.engine.max_num_seqs, "b_max", self.b_max,
               f"must not exceed engine.max_num_seqs={self.engine.max_num_seqs}")
        check(max(self.concurrency_sweep) <= self.engine.max_num_seqs, "concurrency_sweep", self.concurrency_sweep,
               f"must not exceed engine.max_num_seqs={self.engine.max_num_seqs}")
        need = hi + max(self.full_response_tokens) + 1
        check(need <= self.engine.max_model_len, "full_response_tokens", self.full_response_tokens,
               f"context_tokens[1] + full response = {need} exceeds engine.max_model_len={self.engine.max_model_len}")
        check(self.temperature > 0, "temperature", self.temperature, "must be > 0")
        check(self.contexts != "alfworld" or self.alfworld is not None, "alfworld", self.alfworld,
               "contexts: alfworld needs an alfworld: section saying which games (games: real or generated)")

"""The student update of Appendix B.4: the dual-clipped PPO surrogate of the reverse KL (Eq. 29-32).

Per supervised token (m_{b,j} = 1) of full response b, with the stored sampling log-prob log pi_old:

    A   = sg(log pi_T - log pi_old)                            (Eq. 29; no rewards, no normalization)
    rho = exp(clip(log pi_theta - log pi_old, -20, 20))        (Eq. 30)
    l_DC = dual-clipped PPO token loss, delta, kappa           (Eq. 31)
    L   = 1/|B| sum_b sum_j m l_DC / (sum_j m + eps)           (Eq. 32, seq-mean-token-mean)

log pi_theta is taken at the sampling temperature, like log pi_old (the engine's processed log-probs), so that
rho = 1 at theta = theta_old. Inserted tokens (m = 0) stay in the context but count in neither sum; no entropy,
KL or auxiliary term is added (B.4). A batch is split into mini-batches (one AdamW step each, Eq. 32 over the
mini-batch) and those into packed micro-batches (gradient accumulation; samples are never split, so each
micro-batch's share of Eq. 32 is exact).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import torch

from actfirst.config import LossConfig, OptimConfig
from actfirst.kernels.dispatch import logprob_gather, ppo_loss_from_hidden
from actfirst.train.packing import MicroBatch, final_hidden, pack
from actfirst.train.sample import Sample


def learning_rate(optim: OptimConfig, update: int, num_updates: int) -> float:
    """The learning rate of update ``update`` (0-based): linear warm-up lr (u + 1) / W over the first W updates,
    then ``constant`` lr, or ``cosine`` from lr down to min_lr_ratio * lr, reached at the last update."""
    warm = optim.warmup_updates
    if update < warm:
        return optim.lr * (update + 1) / warm
    if optim.schedule == "constant":
        return optim.lr
    progress = min(1.0, (update - warm) / max(1, num_updates - warm - 1))
    floor = optim.min_lr_ratio * optim.lr
    return floor + (optim.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclasses.dataclass(slots=True)
class GradStats:
    """What one forward/backward pass over a mini-batch measured (sums, to be combined over mini-batches)."""

    loss: float = 0.0
    """Eq. 32 over the mini-batch."""
    num_clipped: int = 0
    num_dual_clipped: int = 0
    num_tokens: int = 0
    mismatch: list[torch.Tensor] = dataclasses.field(default_factory=list)
    """|log pi_theta - log pi_old| at supervised tokens of the samples of weight version ``current_version``."""


class StudentUpdater:
    """One B.4 update per call of :meth:`update`: AdamW, gradient-norm clipping, a per-update learning rate."""

    def __init__(self, model: torch.nn.Module, *, optim: OptimConfig, loss: LossConfig, temperature: float,
                 num_updates: int, num_minibatches: int = 1, micro_batch_tokens: int = 8192) -> None:
        if not temperature > 0:
            raise ValueError(f"temperature={temperature!r}: must be > 0 (the sampling temperature)")
        for name, value in (("num_updates", num_updates), ("num_minibatches", num_minibatches),
                            ("micro_batch_tokens", micro_batch_tokens)):
            if value < 1:
                raise ValueError(f"{name}={value!r}: must be >= 1")
        self.model = model
        self.optim_cfg, self.loss_cfg = optim, loss
        self.temperature = float(temperature)
        self.num_updates, self.num_minibatches = num_updates, num_minibatches
        self.micro_batch_tokens = micro_batch_tokens
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=optim.lr, betas=tuple(optim.betas),
                                           weight_decay=optim.weight_decay)
        self.updates_done = 0
        """Updates run so far: the index of the next update in the learning-rate schedule."""

    @property
    def device(self) -> torch.device:
        return self.params[0].device

    def accumulate_gradients(self, samples: list[Sample], current_version: int) -> GradStats:
        """Forward and backward of Eq. 32 over ``samples`` (one mini-batch, |B| = len(samples)) in packed
        micro-batches; gradients add into the parameters' ``.grad``."""
        weight = self.model.get_output_embeddings().weight
        stats = GradStats()
        for mb in pack(samples, self.micro_batch_tokens):
            mb = mb.to(self.device)
            loss, logp, clip_frac, dual_frac = ppo_loss_from_hidden(
                final_hidden(self.model, mb), weight, mb.targets, mb.logp_old, mb.logp_teacher, mb.mask,
                mb.sample_idx, len(samples), temperature=self.temperature, clip_eps=self.loss_cfg.clip_eps,
                dual_clip=self.loss_cfg.dual_clip, eps=self.loss_cfg.eps)
            loss.backward()
            n_sup = int((mb.mask > 0).sum())
            stats.loss += float(loss.detach())
            stats.num_clipped += round(float(clip_frac) * n_sup)  # the ops return fractions of n_sup
            stats.num_dual_clipped += round(float(dual_frac) * n_sup)
            stats.num_tokens += mb.num_tokens
            stats.mismatch.append(self._mismatch(samples, mb, logp, current_version))
        return stats

    @torch.no_grad()
    def _mismatch_only(self, samples: list[Sample], current_version: int) -> list[torch.Tensor]:
        """|log pi_theta - log pi_old| without gradients (mini-batches after the first, before any step)."""
        current = [s for s in samples if s.weight_version == current_version]
        weight = self.model.get_output_embeddings().weight
        out = []
        for mb in pack(current, self.micro_batch_tokens):
            mb = mb.to(self.device)
            logp, _ = logprob_gather(final_hidden(self.model, mb), weight, mb.targets, self.temperature)
            out.append(self._mismatch(current, mb, logp, current_version))
        return out

    @staticmethod
    def _mismatch(samples: list[Sample], mb: MicroBatch, logp: torch.Tensor, current_version: int) -> torch.Tensor:
        is_current = torch.tensor([s.weight_version == current_version for s in samples], device=logp.device)
        keep = (mb.mask > 0) & is_current[mb.sample_idx]
        return (logp.detach() - mb.logp_old)[keep].abs().double().cpu()

    def update(self, samples: list[Sample], current_version: int) -> dict[str, float]:
        """One update of B.4 over the batch ``samples`` (scored by the teacher); returns its metrics.

        The batch is split, in order, into ``num_minibatches`` contiguous mini-batches, one AdamW step each. Metrics:
        ``loss`` Eq. 32 over the batch (each mini-batch's at the parameters it was computed with); ``grad_norm``
        the mean pre-clip norm over steps; ``clip_frac``/``dual_clip_frac`` over supervised tokens;
        ``mismatch_mean``/``mismatch_max`` |log pi_theta - log pi_old| before the first step, over supervised tokens
        of samples generated by ``current_version`` (NaN when none); ``skipped`` the steps skipped for a non-finite
        loss or gradient norm (their gradients are discarded); ``teacher_minus_old`` the mean advantage (Eq. 29);
        ``version_lag_mean`` the mean of current_version - weight_version; ``lr``, ``num_tokens``,
        ``num_supervised``, ``update_s``.
        """
        start = time.perf_counter()
        if len(samples) < self.num_minibatches:
            raise ValueError(f"len(samples)={len(samples)}: fewer than num_minibatches={self.num_minibatches}")
        for i, s in enumerate(samples):
            if s.teacher_logprobs is None:
                raise ValueError(f"teacher_logprobs=None for sample {i} (task {s.task!r}, turn {s.turn}): "
                                 "score the batch with the teacher first")
        lr = learning_rate(self.optim_cfg, self.updates_done, self.num_updates)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        size, extra = divmod(len(samples), self.num_minibatches)
        bounds = [0]
        for k in range(self.num_minibatches):
            bounds.append(bounds[-1] + size + (k < extra))
        minibatches = [samples[a:b] for a, b in zip(bounds, bounds[1:])]
        mismatch = [t for mb in minibatches[1:] for t in self._mismatch_only(mb, current_version)]
        loss, clipped, dual = 0.0, 0, 0
        grad_norms, skipped, num_tokens = [], 0, 0
        for k, minibatch in enumerate(minibatches):
            self.optimizer.zero_grad(set_to_none=True)
            stats = self.accumulate_gradients(minibatch, current_version)
            if k == 0:
                mismatch += stats.mismatch
            loss += stats.loss * len(minibatch) / len(samples)
            clipped += stats.num_clipped
            dual += stats.num_dual_clipped
            num_tokens += stats.num_tokens
            grads = [p.grad for p in self.params if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
            grad_norms.append(float(norm))
            if not (math.isfinite(stats.loss) and math.isfinite(float(norm))):
                skipped += 1
            else:
                if self.optim_cfg.grad_clip > 0:
                    torch.nn.utils.clip_grads_with_norm_(self.params, self.optim_cfg.grad_clip, norm)
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.updates_done += 1
        diffs = torch.cat(mismatch) if mismatch else torch.zeros(0, dtype=torch.float64)
        gaps = [t - o for s in samples for m, t, o in zip(s.loss_mask, s.teacher_logprobs, s.logprobs) if m]
        n_sup = len(gaps)
        return {
            "loss": loss,
            "grad_norm": sum(grad_norms) / len(grad_norms),
            "clip_frac": clipped / n_sup if n_sup else 0.0,
            "dual_clip_frac": dual / n_sup if n_sup else 0.0,
            "mismatch_mean": float(diffs.mean()) if diffs.numel() else math.nan,
            "mismatch_max": float(diffs.max()) if diffs.numel() else math.nan,
            "lr": lr,
            "skipped": float(skipped),
            "num_tokens": float(num_tokens),
            "num_supervised": float(n_sup),
            "teacher_minus_old": sum(gaps) / n_sup if n_sup else math.nan,
            "version_lag_mean": sum(current_version - s.weight_version for s in samples) / len(samples),
            "update_s": time.perf_counter() - start,
        }

    def state_dict(self) -> dict[str, Any]:
        """The optimizer and the schedule position (the model's weights are checkpointed by the caller)."""
        return {"optimizer": self.optimizer.state_dict(), "updates_done": self.updates_done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates_done = int(state["updates_done"])

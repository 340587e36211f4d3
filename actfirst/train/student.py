"""The student update of Appendix B.4: the dual-clipped PPO surrogate of the reverse KL (Eq. 29-32).

Per supervised token (m_{b,j} = 1) of full response b, with the stored sampling log-prob log pi_old:

    A   = sg(log pi_T - log pi_old)                            (Eq. 29; no rewards, no normalization)
    rho = exp(clip(log pi_theta - log pi_old, -20, 20))        (Eq. 30)
    l_DC = dual-clipped PPO token loss, delta, kappa           (Eq. 31)
    L   = 1/|B| sum_b sum_j m l_DC / (sum_j m + eps)           (Eq. 32, seq-mean-token-mean)
    L   = sum_b sum_j m l_DC / sum_b sum_j m                   (``loss.aggregation: token_mean``, 003 D.3)

log pi_theta is taken at the sampling temperature, like log pi_old (the engine's processed log-probs), so that
rho = 1 at theta = theta_old. Inserted tokens (m = 0) stay in the context but count in neither sum; no entropy,
KL or auxiliary term is added (B.4).

UOPD (003, Sec. 4.2) adds one term: an SFT target b (``Sample.sft_weight`` = beta > 0, the teacher's response at an
intervened turn) contributes beta / |B| * 1/n_b sum_j -log pi_theta(y_j | c_b) over its n_b sampled tokens, at
temperature 1 (pi_theta itself), in place of a PPO term; |B| counts both kinds, so that Eq. 32 keeps its form.
Under ``token_mean`` each of its n_b sampled tokens is one token of the mean: beta * -log pi_theta(y_j | c_b) over
the mini-batch's supervised tokens of both kinds.

A batch is split into mini-batches (one AdamW step each, Eq. 32 over the mini-batch) and those into packed
micro-batches (gradient accumulation; samples are never split, so each micro-batch's share of Eq. 32 is exact).

With several ranks each holds its share of every mini-batch; |B| in Eq. 32 is the mini-batch over all ranks, and
FSDP2 sums (does not average) the gradients, so an update on R ranks equals one on a single rank over the union of
their samples (mini-batch k of it being the union of every rank's k-th mini-batch). Every rank runs as many
micro-batches (empty ones pad the shorter lists: every FSDP2 forward and backward is a collective), and the metrics
are reduced over ranks: every rank returns the same global figures.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from typing import Any

import torch

from actfirst.core.config import LossConfig, OptimConfig
from actfirst.kernels.dispatch import logprob_gather, ppo_loss_from_hidden
from actfirst.parallel.context import reduce_max, reduce_sum
from actfirst.parallel.fsdp import total_grad_norm
from actfirst.rollout.sample import Sample
from actfirst.train.head import LMHeadModel
from actfirst.train.packing import MicroBatch, pack, pad_across_ranks


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
class Mismatch:
    """|log pi_theta - log pi_old| at supervised tokens of samples of the current weight version: sum, count, max."""

    total: float = 0.0
    count: int = 0
    max: float = 0.0

    def add(self, diffs: torch.Tensor) -> None:
        if diffs.numel():
            self.total += float(diffs.sum())
            self.count += diffs.numel()
            self.max = max(self.max, float(diffs.max()))

    def merge(self, other: Mismatch) -> None:
        self.total, self.count, self.max = self.total + other.total, self.count + other.count, max(self.max, other.max)


@dataclasses.dataclass(frozen=True, slots=True)
class BatchTotals:
    """A mini-batch's size over all ranks: what ``loss.aggregation`` divides by."""

    samples: int
    """|B| of Eq. 32: responses (and SFT targets)."""
    tokens: int
    """Supervised tokens (sampled tokens of the responses and of the SFT targets): token_mean's denominator."""

    @classmethod
    def of(cls, samples: list[Sample]) -> BatchTotals:
        """The totals of ``samples`` alone (one rank)."""
        return cls(len(samples), sum(s.num_supervised for s in samples))


@dataclasses.dataclass(slots=True)
class GradStats:
    """What this rank's forward/backward passes over its share of a mini-batch measured (sums)."""

    loss: float = 0.0
    """This rank's share of the mini-batch's loss (Eq. 32 or token_mean; the shares sum to it)."""
    sft_loss: float = 0.0
    """The SFT targets' part of ``loss`` (UOPD)."""
    num_clipped: int = 0
    num_dual_clipped: int = 0
    num_tokens: int = 0
    mismatch: Mismatch = dataclasses.field(default_factory=Mismatch)


class StudentUpdater:
    """One B.4 update per call of :meth:`update` on this rank's share of the batch: AdamW on the (FSDP2-sharded)
    student, gradient-norm clipping over all ranks, a per-update learning rate."""

    def __init__(self, policy: LMHeadModel, *, optim: OptimConfig, loss: LossConfig, temperature: float,
                 num_updates: int, num_minibatches: int = 1, micro_batch_tokens: int = 8192) -> None:
        if not temperature > 0:
            raise ValueError(f"temperature={temperature!r}: must be > 0 (the sampling temperature)")
        for name, value in (("num_updates", num_updates), ("num_minibatches", num_minibatches),
                            ("micro_batch_tokens", micro_batch_tokens)):
            if value < 1:
                raise ValueError(f"{name}={value!r}: must be >= 1")
        self.policy = policy
        self.optim_cfg, self.loss_cfg = optim, loss
        self.temperature = float(temperature)
        self.num_updates, self.num_minibatches = num_updates, num_minibatches
        self.micro_batch_tokens = micro_batch_tokens
        self.params = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=optim.lr, betas=tuple(optim.betas),
                                           weight_decay=optim.weight_decay)
        self.updates_done = 0
        """Updates run so far: the index of the next update in the learning-rate schedule."""

    @property
    def device(self) -> torch.device:
        return self.params[0].device

    def _micro_batches(self, samples: list[Sample]) -> list[MicroBatch]:
        micro_batches = pack(samples, self.micro_batch_tokens, self.policy.layout)
        return [mb.to(self.device) for mb in pad_across_ranks(micro_batches)]

    def accumulate_gradients(self, samples: list[Sample], current_version: int,
                             totals: BatchTotals | None = None) -> GradStats:
        """Forward and backward of this rank's share of the mini-batch's loss (``totals``: the mini-batch over all
        ranks; default: ``samples`` alone, one rank) in packed micro-batches; gradients add into the parameters'
        ``.grad`` (summed over ranks)."""
        totals = BatchTotals.of(samples) if totals is None else totals
        stats = GradStats()
        for mb in self._micro_batches(samples):
            loss, logp, clip_frac, dual_frac, sft = self.policy(mb, lambda hidden, weight, mb=mb: self._loss(
                hidden, weight, mb, totals))
            loss.backward()
            n_sup = int((mb.mask > 0).sum())
            stats.loss += float(loss.detach())
            stats.sft_loss += float(sft)
            stats.num_clipped += round(float(clip_frac) * n_sup)  # the ops return fractions of n_sup
            stats.num_dual_clipped += round(float(dual_frac) * n_sup)
            stats.num_tokens += mb.num_tokens
            stats.mismatch.add(self._mismatch(samples, mb, logp, current_version))
        return stats

    def _loss(self, hidden: torch.Tensor, weight: torch.Tensor, mb: MicroBatch, totals: BatchTotals) -> tuple:
        """(loss, logp, clip fraction, dual-clip fraction, SFT term) of a micro-batch: its share of the PPO term and
        of the SFT targets' term, aggregated as ``loss.aggregation`` says (see the module docstring)."""
        cfg = self.loss_cfg
        token_mean = cfg.aggregation == "token_mean"
        if token_mean:  # the fused op's Eq. 32 over one "response" (the row), rescaled to the batch's token mean
            groups, num_groups = torch.zeros_like(mb.sample_idx), 1
            scale = (float(mb.mask.sum()) + cfg.eps) / max(1, totals.tokens)
        else:
            groups, num_groups, scale = mb.sample_idx, totals.samples, 1.0
        loss, logp, clip_frac, dual_frac = ppo_loss_from_hidden(
            hidden, weight, mb.targets, mb.logp_old, mb.logp_teacher, mb.mask, groups, num_groups,
            temperature=self.temperature, clip_eps=cfg.clip_eps, dual_clip=cfg.dual_clip, eps=cfg.eps)
        loss = loss * scale  # the op's gradients scale with it (kernels/dispatch.py: a multiple of the loss)
        sft_tokens = (mb.sft_weight > 0).nonzero().squeeze(1)
        if sft_tokens.numel() == 0:
            return loss, logp, clip_frac, dual_frac, 0.0
        logp_sft, _ = logprob_gather(hidden[sft_tokens], weight, mb.targets[sft_tokens])
        beta = mb.sft_weight[sft_tokens]
        if token_mean:
            beta = beta / max(1, totals.tokens)
        else:  # beta / |B| * its token mean
            owner = mb.sample_idx[sft_tokens]
            beta = beta / torch.bincount(owner)[owner] / totals.samples
        sft = -(logp_sft * beta).sum()
        return loss + sft, logp, clip_frac, dual_frac, sft.detach()

    @torch.no_grad()
    def _mismatch_only(self, samples: list[Sample], current_version: int) -> Mismatch:
        """|log pi_theta - log pi_old| without gradients (mini-batches after the first, before any step)."""
        current = [s for s in samples if s.weight_version == current_version]
        out = Mismatch()
        for mb in self._micro_batches(current):
            logp, _ = self.policy(mb, lambda hidden, weight, mb=mb: logprob_gather(hidden, weight, mb.targets,
                                                                                   self.temperature))
            out.add(self._mismatch(current, mb, logp, current_version))
        return out

    @staticmethod
    def _mismatch(samples: list[Sample], mb: MicroBatch, logp: torch.Tensor, current_version: int) -> torch.Tensor:
        if not mb.samples:  # padding
            return torch.zeros(0, dtype=torch.float64)
        is_current = torch.tensor([s.weight_version == current_version for s in samples], device=logp.device)
        keep = (mb.mask > 0) & is_current[mb.sample_idx]
        return (logp.detach() - mb.logp_old)[keep].abs().double().cpu()

    def _step(self, stats: GradStats) -> tuple[float, float, bool]:
        """(mini-batch loss over all ranks, gradient norm before clipping, stepped): an AdamW step unless the loss or
        the norm is not finite (every rank sees the same global figures, so all skip or all step)."""
        loss = reduce_sum([stats.loss])[0]
        norm = total_grad_norm(self.params)
        if not (math.isfinite(loss) and math.isfinite(float(norm))):
            return loss, float(norm), False
        if self.optim_cfg.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.optim_cfg.grad_clip, norm)
        self.optimizer.step()
        return loss, float(norm), True

    def update(self, samples: list[Sample], current_version: int) -> dict[str, float]:
        """One update of B.4 over the batch (this rank's ``samples``, scored by the teacher; every rank calls it);
        returns the metrics of the whole batch over all ranks.

        This rank's samples are split, in order, into ``num_minibatches`` contiguous mini-batches, one AdamW step
        each (with every rank's same-numbered mini-batch). Metrics: ``loss`` the loss (``loss.aggregation``) over
        the batch (each mini-batch's at the parameters it was computed with); ``grad_norm`` the mean pre-clip norm
        over steps;
        ``clip_frac``/``dual_clip_frac`` over supervised tokens; ``mismatch_mean``/``mismatch_max`` |log pi_theta -
        log pi_old| before the first step, over supervised tokens of samples generated by ``current_version`` (NaN
        when none); ``skipped`` the steps skipped for a non-finite loss or gradient norm (their gradients are
        discarded); ``teacher_minus_old`` the mean advantage (Eq. 29) over OPD samples; ``sft_loss``
        the SFT targets' part of ``loss`` and ``sft_samples`` their number (UOPD); ``version_lag_mean`` the mean of
        current_version - weight_version; ``lr``, ``num_tokens``, ``num_supervised``, ``num_samples``, ``update_s``.
        """
        start = time.perf_counter()
        for i, s in enumerate(samples):
            if s.teacher_logprobs is None:
                raise ValueError(f"teacher_logprobs=None for sample {i} (task {s.task!r}, turn {s.turn}): "
                                 "score the batch with the teacher first")
        lr = learning_rate(self.optim_cfg, self.updates_done, self.num_updates)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        minibatches = split_evenly(samples, self.num_minibatches)
        counts = reduce_sum([len(m) for m in minibatches] + [sum(s.num_supervised for s in m) for m in minibatches])
        sizes, num_supervised = counts[:len(minibatches)], counts[len(minibatches):]
        # the metric's mean over mini-batches, each weighted by what its loss is a mean over
        weights = num_supervised if self.loss_cfg.aggregation == "token_mean" else sizes
        if min(sizes) < 1:
            raise ValueError(f"{int(sum(sizes))} samples over all ranks: fewer than num_minibatches="
                             f"{self.num_minibatches}")
        mismatch = Mismatch()
        for minibatch in minibatches[1:]:
            mismatch.merge(self._mismatch_only(minibatch, current_version))
        loss, sft, clipped, dual, tokens, norms, skipped = 0.0, 0.0, 0, 0, 0, [], 0
        for k, minibatch in enumerate(minibatches):
            self.optimizer.zero_grad(set_to_none=True)
            stats = self.accumulate_gradients(minibatch, current_version,
                                              BatchTotals(int(sizes[k]), int(num_supervised[k])))
            if k == 0:
                mismatch.merge(stats.mismatch)
            step_loss, norm, stepped = self._step(stats)
            share = weights[k] / sum(weights) if sum(weights) else 1.0 / len(weights)
            loss += step_loss * share
            sft += reduce_sum([stats.sft_loss])[0] * share
            clipped, dual, tokens = (clipped + stats.num_clipped, dual + stats.num_dual_clipped,
                                     tokens + stats.num_tokens)
            norms.append(norm)
            skipped += not stepped
            self.optimizer.zero_grad(set_to_none=True)
        self.updates_done += 1
        metrics = self._metrics(samples, current_version, lr, loss, norms, skipped, clipped, dual, tokens, mismatch,
                                start)
        metrics["sft_loss"] = sft
        return metrics

    def _metrics(self, samples: list[Sample], current_version: int, lr: float, loss: float, norms: list[float],
                 skipped: int, clipped: int, dual: int, tokens: int, mismatch: Mismatch, start: float
                 ) -> dict[str, float]:
        """The update's figures over all ranks."""
        opd = [s for s in samples if s.sft_weight == 0]
        gaps = [t - o for s in opd for m, t, o in zip(s.loss_mask, s.teacher_logprobs, s.logprobs, strict=True) if m]
        lag = sum(current_version - s.weight_version for s in samples)
        (n_sup, gap_sum, n_samples, lag_sum, clipped, dual, tokens, mism_sum, mism_n, n_sft) = reduce_sum(
            [len(gaps), sum(gaps), len(samples), lag, clipped, dual, tokens, mismatch.total, mismatch.count,
             len(samples) - len(opd)])
        mism_max = reduce_max([mismatch.max])[0]
        return {
            "loss": loss,
            "grad_norm": sum(norms) / len(norms),
            "clip_frac": clipped / n_sup if n_sup else 0.0,
            "dual_clip_frac": dual / n_sup if n_sup else 0.0,
            "mismatch_mean": mism_sum / mism_n if mism_n else math.nan,
            "mismatch_max": mism_max if mism_n else math.nan,
            "lr": lr,
            "skipped": float(skipped),
            "num_tokens": float(tokens),
            "num_supervised": float(n_sup),
            "num_samples": float(n_samples),
            "teacher_minus_old": gap_sum / n_sup if n_sup else math.nan,
            "version_lag_mean": lag_sum / n_samples if n_samples else math.nan,
            "sft_samples": float(n_sft),
            "update_s": time.perf_counter() - start,
        }

    def state_dict(self) -> dict[str, Any]:
        """The schedule position (the optimizer's sharded state is checkpointed with the model, by DCP)."""
        return {"updates_done": self.updates_done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates_done = int(state["updates_done"])


def split_evenly(samples: list[Sample], parts: int) -> list[list[Sample]]:
    """``samples`` in order as ``parts`` contiguous lists whose sizes differ by at most one (the first ones longer)."""
    size, extra = divmod(len(samples), parts)
    bounds = [0]
    for k in range(parts):
        bounds.append(bounds[-1] + size + (k < extra))
    return [samples[a:b] for a, b in itertools.pairwise(bounds)]

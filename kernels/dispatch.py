"""The one entry point for ActFirst's fused ops: Triton on CUDA, the native op on the CPU, torch as fallback.

Teacher scoring and the student update call only :func:`logprob_gather` and :func:`ppo_loss`. ``backend=``
forces a path (tests and benchmarks compare them); otherwise it is chosen from the inputs' device.
"""

from __future__ import annotations

import functools
import logging
from typing import Literal

import torch

from actfirst.kernels import logprob_gather as lg
from actfirst.kernels import ppo_loss as pl

Backend = Literal["triton", "native", "torch"]
log = logging.getLogger(__name__)


@functools.cache
def native_ops():
    """The compiled ``actfirst._C`` module, or None (said once) when the build did not run."""
    try:
        from actfirst import _C
    except ImportError as exc:
        log.warning("actfirst: native CPU ops unavailable (%s); using the torch fallback", exc)
        return None
    return _C


def pick_backend(device: torch.device, backend: Backend | None = None) -> Backend:
    """The backend for tensors on ``device``: Triton on CUDA, native on the CPU, else torch."""
    if backend is not None:
        if backend not in ("triton", "native", "torch"):
            raise ValueError(f"backend={backend!r}: must be 'triton', 'native' or 'torch'")
        if backend == "native" and native_ops() is None:
            raise RuntimeError("backend='native': actfirst._C was not built (see setup.py output)")
        if backend == "triton" and lg.triton is None:
            raise RuntimeError("backend='triton': triton is not installed")
        return backend
    if device.type == "cuda" and lg.triton is not None:
        return "triton"
    if device.type == "cpu" and native_ops() is not None:
        return "native"
    return "torch"


class _LogprobGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, backend, tile):
        if backend == "triton":
            logp, lse, ent = lg.logprob_gather_forward_triton(hidden, weight, targets, temperature)
        else:
            logp, lse, ent = native_ops().logprob_gather_forward(hidden, weight, targets, temperature, tile)
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.temperature, ctx.backend, ctx.tile = temperature, backend, tile
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        hidden, weight, targets, lse = ctx.saved_tensors
        need_w = ctx.needs_input_grad[1]
        if ctx.backend == "triton":
            grad_h, grad_w = lg.logprob_gather_backward_triton(hidden, weight, targets, lse, grad_logp,
                                                               ctx.temperature, need_w)
        else:
            grad_h, grad_w = native_ops().logprob_gather_backward(hidden, weight, targets, lse, grad_logp,
                                                                  ctx.temperature, ctx.tile, need_w)
        return grad_h, (grad_w if need_w else None), None, None, None, None


def logprob_gather(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, *,
                   backend: Backend | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(hidden @ weight.T / temperature)[targets] and the entropy, without [N, V] logits.

    Args:
        hidden: [N, H] bf16, fp16 or fp32.  weight: [V, H] LM head.  targets: [N] token ids.
    Returns:
        (logp [N] fp32, entropy [N] fp32, no gradient). logp is differentiable in hidden and weight.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden {tuple(hidden.shape)} and weight {tuple(weight.shape)}: need [N, H] and [V, H]")
    if targets.shape != (hidden.shape[0],):
        raise ValueError(f"targets {tuple(targets.shape)}: need [{hidden.shape[0]}]")
    if temperature <= 0:
        raise ValueError(f"temperature={temperature!r}: must be > 0")
    chosen = pick_backend(hidden.device, backend)
    if chosen == "torch":
        logp, ent = lg.logprob_gather_reference(hidden, weight, targets, temperature)
        return logp.float(), ent.float()
    targets = targets.long().contiguous()
    tile = lg.vocab_tile(hidden.shape[0], weight.shape[0])
    return _LogprobGather.apply(hidden.contiguous(), weight.contiguous(), targets, float(temperature), chosen, tile)


def ppo_loss(logp: torch.Tensor, logp_old: torch.Tensor, logp_teacher: torch.Tensor, mask: torch.Tensor,
             sample_idx: torch.Tensor, num_samples: int, *, clip_eps: float = 0.2, dual_clip: float = 3.0,
             eps: float = 1e-8, backend: Backend | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dual-clipped PPO token loss, seq-mean-token-mean (Eq. 29-32). Differentiable in ``logp``.

    Args:
        logp, logp_old, logp_teacher, mask: [N] flat over the batch's response tokens.
        sample_idx: [N] index of each token's full response in [0, num_samples).
    Returns:
        (loss [], clip fraction [], dual-clip fraction []), fractions over supervised tokens.
    """
    n = logp.shape[0]
    for name, t in (("logp_old", logp_old), ("logp_teacher", logp_teacher), ("mask", mask), ("sample_idx", sample_idx)):
        if t.shape != (n,):
            raise ValueError(f"{name} {tuple(t.shape)}: need [{n}] like logp")
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples!r}: must be >= 1")
    chosen = pick_backend(logp.device, backend)
    if chosen == "torch":
        # Computed in fp32 at least, like the kernels.
        dtype = torch.promote_types(logp.dtype, torch.float32)
        return pl.ppo_loss_reference(logp.to(dtype), logp_old.to(dtype), logp_teacher.to(dtype), mask, sample_idx,
                                     num_samples, clip_eps=clip_eps, dual_clip=dual_clip, eps=eps)
    weight = pl.token_weights(mask, sample_idx.long(), num_samples, eps)
    args = (logp.detach().contiguous(), logp_old.contiguous(), logp_teacher.contiguous(), weight)
    if chosen == "triton":
        loss, grad, n_clip, n_dual = pl.ppo_loss_forward_triton(*args, clip_eps, dual_clip)
    else:
        loss, grad, n_clip, n_dual = native_ops().ppo_loss_forward(*args, clip_eps, dual_clip)
    n_sup = (mask > 0).sum().clamp_min(1)
    return pl.PPOLossFunction.apply(logp, loss, grad), n_clip / n_sup, n_dual / n_sup


class _PPOLossFromHidden(torch.autograd.Function):
    """Native op 3: loss, logp and both gradients in one chunked pass; backward only scales the gradients."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, logp_old, logp_teacher, token_weight, clip_eps, dual_clip,
                chunk):
        loss, grad_h, grad_w, logp, n_clip, n_dual = native_ops().ppo_loss_from_hidden(
            hidden, weight, targets, temperature, logp_old, logp_teacher, token_weight, clip_eps, dual_clip, chunk)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.mark_non_differentiable(logp, n_clip, n_dual)
        return loss, logp, n_clip, n_dual

    @staticmethod
    def backward(ctx, grad_loss, *_):
        grad_h, grad_w = ctx.saved_tensors
        if not torch.equal(grad_loss, torch.ones_like(grad_loss)):  # the usual loss.backward() needs no copy
            grad_h, grad_w = grad_h * grad_loss.to(grad_h.dtype), grad_w * grad_loss.to(grad_w.dtype)
        return grad_h, grad_w, None, None, None, None, None, None, None, None


def ppo_loss_from_hidden(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, logp_old: torch.Tensor,
                         logp_teacher: torch.Tensor, mask: torch.Tensor, sample_idx: torch.Tensor, num_samples: int, *,
                         temperature: float = 1.0, clip_eps: float = 0.2, dual_clip: float = 3.0, eps: float = 1e-8,
                         backend: Backend | None = None):
    """The student update's loss straight from hidden states: logprob_gather then ppo_loss, fused (op 3).

    On the CPU the native op walks the tokens in chunks whose [chunk, V] logits fit 64 MiB and produces the
    gradients during the forward pass (no recomputation); elsewhere it composes the two ops.

    Returns:
        (loss [], logp [N] fp32 without gradient, clip fraction [], dual-clip fraction [])
    """
    chosen = pick_backend(hidden.device, backend)
    if chosen != "native":
        logp, _ = logprob_gather(hidden, weight, targets, temperature, backend=chosen)
        loss, clip_frac, dual_frac = ppo_loss(logp, logp_old, logp_teacher, mask, sample_idx, num_samples,
                                              clip_eps=clip_eps, dual_clip=dual_clip, eps=eps, backend=chosen)
        return loss, logp.detach(), clip_frac, dual_frac
    token_weight = pl.token_weights(mask, sample_idx.long(), num_samples, eps)
    chunk = max(1, (64 << 20) // (4 * weight.shape[0]))
    loss, logp, n_clip, n_dual = _PPOLossFromHidden.apply(hidden, weight, targets.long(), float(temperature), logp_old,
                                                         logp_teacher, token_weight, clip_eps, dual_clip, chunk)
    n_sup = (mask > 0).sum().clamp_min(1)
    return loss, logp, n_clip / n_sup, n_dual / n_sup

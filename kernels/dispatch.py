"""The one entry point for ActFirst's fused ops: Triton on CUDA, the native op on the CPU, torch as fallback.

Teacher scoring calls :func:`logprob_gather` (under no_grad), the student update :func:`ppo_loss_from_hidden`
(``loss.backward()`` on its loss) and :func:`ppo_loss`. ``backend=`` forces a backend (tests and benchmarks compare
them); otherwise it is chosen from the inputs' device.

On CUDA the two LM-head ops have two paths each, ``"fused"`` and ``"chunked"`` (kernels/logprob_gather.py,
kernels/ppo_loss_from_hidden.py), chosen per call by kernels/paths.py from the shape and the free device memory;
``path=`` forces one and ``chunk_bytes=`` sets the memory budget. ``head_grad_dtype=`` (``torch.float32`` or the
weight's dtype, the default) is the dtype the LM head's gradient accumulates in across row chunks.

The choice is visible for the metrics: ``last_path("logprob_gather")`` and ``last_path("ppo_loss_from_hidden")``
return the latest call's :class:`~actfirst.kernels.paths.Plan` (path, chunk rows, vocabulary block, budget, and the
cost model's estimate per path); ``str(plan.path)`` is what a training log needs.
"""

from __future__ import annotations

import functools
import logging
from typing import Literal

import torch

from actfirst.kernels import lm_head as lm
from actfirst.kernels import logprob_gather as lg
from actfirst.kernels import paths
from actfirst.kernels import ppo_loss as pl
from actfirst.kernels import ppo_loss_from_hidden as pfh
from actfirst.kernels.paths import Plan

Backend = Literal["triton", "native", "torch"]
Path = Literal["fused", "chunked"]
log = logging.getLogger(__name__)
_last_plans: dict[str, Plan] = {}


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


def last_path(op: str) -> Plan | None:
    """The :class:`Plan` of the latest call of ``op`` ("logprob_gather" or "ppo_loss_from_hidden"), or None."""
    return _last_plans.get(op)


def _plan(op: str, backend: Backend, hidden: torch.Tensor, weight: torch.Tensor, *, need_grad: bool,
          path: Path | None, chunk_bytes: int | None, head_grad_dtype: torch.dtype | None) -> Plan:
    """The decision for one call, recorded for :func:`last_path`."""
    if backend != "triton":
        if path is not None:
            raise ValueError(f"path={path!r} applies to backend 'triton' (CUDA), not {backend!r}")
        # The native op walks the vocabulary in tiles (op 1) or the rows in chunks (op 3) of 64 MiB of logits.
        n, v = hidden.shape[0], weight.shape[0]
        plan = Plan(backend) if backend == "torch" else \
            Plan(backend, chunk_rows=max(1, (64 << 20) // (4 * v)), vocab_block=lg.vocab_tile(n, v))
    else:
        if hidden.dtype != weight.dtype:
            raise ValueError(f"hidden {hidden.dtype} and weight {weight.dtype}: the Triton paths need one dtype")
        plan = paths.plan(hidden, weight, need_grad=need_grad, single_pass=op == "ppo_loss_from_hidden",
                          path=path, chunk_bytes=chunk_bytes, head_grad_dtype=head_grad_dtype)
    _last_plans[op] = plan
    return plan


class _LogprobGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, plan, head_grad_dtype):
        if plan.path == "native":
            logp, lse, ent = native_ops().logprob_gather_forward(hidden, weight, targets, temperature,
                                                                 plan.vocab_block)
        elif plan.path == "fused":
            logp, lse, ent = lg.logprob_gather_forward_fused(hidden, weight, targets, temperature)
        else:
            logp, lse, ent = lg.logprob_gather_forward_chunked(hidden, weight, targets, temperature, plan.chunk_rows)
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.temperature, ctx.plan, ctx.head_grad_dtype = temperature, plan, head_grad_dtype
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        hidden, weight, targets, lse = ctx.saved_tensors
        need_w, plan, g = ctx.needs_input_grad[1], ctx.plan, grad_logp.float().contiguous()
        if plan.path == "native":
            grad_h, grad_w = native_ops().logprob_gather_backward(hidden, weight, targets, lse, g, ctx.temperature,
                                                                  plan.vocab_block, need_w)
        elif plan.path == "fused":
            grad_h, grad_w = lm.grads_by_vocab_blocks(hidden, weight, targets, lse, g, ctx.temperature,
                                                      plan.vocab_block, need_weight_grad=need_w)
        else:
            grad_h, grad_w = lm.grads_by_row_chunks(hidden, weight, targets, lse, g, ctx.temperature,
                                                    plan.chunk_rows, head_grad_dtype=ctx.head_grad_dtype,
                                                    need_weight_grad=need_w)
        return grad_h, (grad_w if need_w else None), None, None, None, None


def _needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def logprob_gather(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, *,
                   backend: Backend | None = None, path: Path | None = None, chunk_bytes: int | None = None,
                   head_grad_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(hidden @ weight.T / temperature)[targets] and the entropy, without [N, V] logits.

    Args:
        hidden: [N, H] bf16, fp16 or fp32.  weight: [V, H] LM head.  targets: [N] token ids.
        path, chunk_bytes, head_grad_dtype: see the module docstring (CUDA paths only).
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
    plan = _plan("logprob_gather", chosen, hidden, weight, need_grad=_needs_grad(hidden, weight), path=path,
                 chunk_bytes=chunk_bytes, head_grad_dtype=head_grad_dtype)
    if chosen == "torch":
        logp, ent = lg.logprob_gather_reference(hidden, weight, targets, temperature)
        return logp.float(), ent.float()
    return _LogprobGather.apply(hidden.contiguous(), weight.contiguous(), targets.long().contiguous(),
                                float(temperature), plan, head_grad_dtype)


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
    if chosen == "triton":
        loss, grad, n_clip, n_dual, n_sup = pl.ppo_loss_forward_triton(
            logp.detach().contiguous(), logp_old.contiguous(), logp_teacher.contiguous(), mask.contiguous(),
            sample_idx.contiguous(), num_samples, clip_eps, dual_clip, eps)
    else:
        weight = pl.token_weights(mask, sample_idx.long(), num_samples, eps)
        loss, grad, n_clip, n_dual = native_ops().ppo_loss_forward(
            logp.detach().contiguous(), logp_old.contiguous(), logp_teacher.contiguous(), weight, clip_eps, dual_clip)
        n_sup = (mask > 0).sum()
    n_sup = n_sup.clamp_min(1)
    return pl.PPOLossFunction.apply(logp, loss, grad), n_clip / n_sup, n_dual / n_sup


class _PPOLossFromHidden(torch.autograd.Function):
    """Op 3: ``compute`` forms the loss, logp and both gradients in one forward; backward hands the gradients over."""

    @staticmethod
    def forward(ctx, hidden, weight, compute):
        loss, grad_h, grad_w, logp, n_clip, n_dual = compute(hidden, weight, ctx.needs_input_grad[1])
        ctx.grads = tuple(g if need else None
                          for g, need in zip((grad_h, grad_w), ctx.needs_input_grad[:2], strict=True))
        ctx.mark_non_differentiable(logp, n_clip, n_dual)
        return loss, logp, n_clip, n_dual

    @staticmethod
    def backward(ctx, grad_loss, *_):
        return *pl.hand_over_gradients(ctx, grad_loss), None


def _native_ppo_from_hidden(hidden, weight, need_weight_grad, *, targets, logp_old, logp_teacher, mask, sample_idx,
                            num_samples, temperature, clip_eps, dual_clip, eps, chunk_rows):
    """The native CPU op 3 (d W always formed, in fp32)."""
    token_weight = pl.token_weights(mask, sample_idx, num_samples, eps)
    loss, grad_h, grad_w, logp, n_clip, n_dual = native_ops().ppo_loss_from_hidden(
        hidden, weight, targets, temperature, logp_old, logp_teacher, token_weight, clip_eps, dual_clip, chunk_rows)
    return loss, grad_h, grad_w if need_weight_grad else None, logp, n_clip, n_dual


def _triton_ppo_from_hidden(hidden, weight, need_weight_grad, *, plan, head_grad_dtype, **kwargs):
    if plan.path == "chunked":
        return pfh.ppo_loss_from_hidden_chunked(hidden, weight, chunk_rows=plan.chunk_rows,
                                                head_grad_dtype=head_grad_dtype, need_weight_grad=need_weight_grad,
                                                **kwargs)
    return pfh.ppo_loss_from_hidden_fused(hidden, weight, block_cols=plan.vocab_block,
                                          need_weight_grad=need_weight_grad, **kwargs)


def ppo_loss_from_hidden(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, logp_old: torch.Tensor,
                         logp_teacher: torch.Tensor, mask: torch.Tensor, sample_idx: torch.Tensor, num_samples: int, *,
                         temperature: float = 1.0, clip_eps: float = 0.2, dual_clip: float = 3.0, eps: float = 1e-8,
                         backend: Backend | None = None, path: Path | None = None, chunk_bytes: int | None = None,
                         head_grad_dtype: torch.dtype | None = None):
    """The student update's loss straight from hidden states: logprob_gather then ppo_loss, fused (op 3).

    With gradients needed, both gradients are formed during the forward pass (kernels/ppo_loss_from_hidden.py):
    call ``backward()`` once on the loss (or on a multiple of it); they accumulate into ``.grad`` like any other.
    Without (no_grad, or nothing requires grad) only the forward runs. The native CPU op accumulates d W in fp32.

    Returns:
        (loss [], logp [N] fp32 without gradient, clip fraction [], dual-clip fraction [])
    """
    chosen = pick_backend(hidden.device, backend)
    if chosen == "torch" or not _needs_grad(hidden, weight):
        logp, _ = logprob_gather(hidden, weight, targets, temperature, backend=chosen, path=path,
                                 chunk_bytes=chunk_bytes)
        loss, clip_frac, dual_frac = ppo_loss(logp, logp_old, logp_teacher, mask, sample_idx, num_samples,
                                              clip_eps=clip_eps, dual_clip=dual_clip, eps=eps, backend=chosen)
        _last_plans["ppo_loss_from_hidden"] = _last_plans["logprob_gather"]
        return loss, logp.detach(), clip_frac, dual_frac
    plan = _plan("ppo_loss_from_hidden", chosen, hidden, weight, need_grad=True, path=path, chunk_bytes=chunk_bytes,
                 head_grad_dtype=head_grad_dtype)
    kwargs = dict(targets=targets.long().contiguous(), logp_old=logp_old, logp_teacher=logp_teacher, mask=mask,
                  sample_idx=sample_idx.long(), num_samples=num_samples, temperature=float(temperature),
                  clip_eps=clip_eps, dual_clip=dual_clip, eps=eps)
    if chosen == "native":
        compute = functools.partial(_native_ppo_from_hidden, chunk_rows=plan.chunk_rows, **kwargs)
    else:
        compute = functools.partial(_triton_ppo_from_hidden, plan=plan, head_grad_dtype=head_grad_dtype, **kwargs)
    loss, logp, n_clip, n_dual = _PPOLossFromHidden.apply(hidden.contiguous(), weight.contiguous(), compute)
    n_sup = (mask > 0).sum().clamp_min(1)
    return loss, logp, n_clip / n_sup, n_dual / n_sup

"""Dual-clipped PPO token loss with seq-mean-token-mean aggregation (paper Appendix B.4, Eq. 29-32).

Per supervised token j of full response b (m = 1), with r = clip(log pi_theta - log pi_old, -20, 20):

    A   = log pi_T - log pi_old                               (Eq. 29; 0 where m = 0)
    rho = exp(r)                                              (Eq. 30)
    l_clip = max(-rho A, -clip(rho, 1 - delta, 1 + delta) A)  (= -min{rho A, clip(rho) A}, Eq. 31)
    l_DC   = min(l_clip, -kappa A) if A < 0 else l_clip
    L = 1/|B| sum_b sum_j m l_DC / (sum_j m + eps)            (Eq. 32)

Branch ties are decided one way everywhere (reference, Triton, C++): the clipped branch is taken only when it is
strictly larger, the dual clip only when l_clip is strictly larger than -kappa A. clip() passes gradient on its
closed interval, as torch.clamp does.

The loss, d L / d log pi_theta for every token and the clip fractions (over supervised tokens) come from one pass
over the tokens after the per-sample mask sums M_b (on CUDA a first, run-length pass; elsewhere index_add); the
gradient is formed in the forward and handed over by the backward (:func:`hand_over_gradients`).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs without triton use the native op or the reference
    triton = None

LOG_RATIO_CLAMP = 20.0
# The Triton launches (checked for spills by kernels/compile_check.py): 16 tokens per thread, so that each program
# keeps 64 KiB of loads in flight; one partial-sum row per program instead of same-address atomics.
PPO_BLOCK, PPO_NUM_WARPS = 4096, 8


def ppo_loss_reference(logp, logp_old, logp_teacher, mask, sample_idx, num_samples: int, *, clip_eps: float = 0.2,
                       dual_clip: float = 3.0, eps: float = 1e-8):
    """Torch reference (the test oracle and the last fallback). Differentiable in ``logp``.

    Args:
        logp, logp_old, logp_teacher: [N] log-probs of the sampled tokens under pi_theta, pi_old and the teacher.
        mask: [N] 1 for supervised tokens, 0 for inserted tokens and padding.
        sample_idx: [N] int64 index of each token's full response in [0, num_samples).
    Returns:
        (loss [] , clip_fraction [], dual_clip_fraction [])
    """
    m = mask.to(logp.dtype)
    adv = (logp_teacher - logp_old).to(logp.dtype) * m
    ratio = torch.exp(torch.clamp(logp - logp_old, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)
    take_clipped = clipped > unclipped
    l_clip = torch.where(take_clipped, clipped, unclipped)
    take_dual = (adv < 0) & (l_clip > -dual_clip * adv)
    loss_tok = torch.where(take_dual, -dual_clip * adv, l_clip)
    per_sample = torch.zeros(num_samples, dtype=logp.dtype, device=logp.device).index_add(0, sample_idx, loss_tok * m)
    count = torch.zeros(num_samples, dtype=logp.dtype, device=logp.device).index_add(0, sample_idx, m)
    loss = (per_sample / (count + eps)).sum() / num_samples
    n_sup = m.sum().clamp_min(1)
    return loss, ((take_clipped & (m > 0)).sum() / n_sup).detach(), ((take_dual & (m > 0)).sum() / n_sup).detach()


def token_weights(mask: torch.Tensor, sample_idx: torch.Tensor, num_samples: int, eps: float = 1e-8) -> torch.Tensor:
    """m_j / (|B| (sum of m over j's response + eps)): each token's weight in Eq. 32. Fixed for a batch."""
    m = mask.to(torch.float32)
    count = torch.zeros(num_samples, dtype=torch.float32, device=mask.device).index_add(0, sample_idx, m)
    return m / ((count + eps) * num_samples)[sample_idx]


if triton is not None:

    @triton.jit
    def ppo_token(logp, old, teacher, sup, clip_eps, dual_clip):
        """One token of Eq. 29-31, unweighted: (loss, d loss / d logp, took the clipped branch, took the dual clip).
        ``sup``: the token is supervised (the advantage is 0 otherwise). Shared with the from-hidden epilogue."""
        adv = tl.where(sup, teacher - old, 0.0)
        log_ratio = logp - old
        ratio = tl.exp(tl.minimum(tl.maximum(log_ratio, -20.0), 20.0))
        unclipped = -adv * ratio
        clipped = -adv * tl.minimum(tl.maximum(ratio, 1.0 - clip_eps), 1.0 + clip_eps)
        take_clipped = clipped > unclipped
        l_clip = tl.where(take_clipped, clipped, unclipped)
        take_dual = (adv < 0) & (l_clip > -dual_clip * adv)
        loss = tl.where(take_dual, -dual_clip * adv, l_clip)
        # d l / d logp: -A rho on the unclipped branch, -A rho on the clipped branch while rho is inside the closed
        # clip interval (else 0), 0 under the dual clip; times d r / d logp (1 inside [-20, 20]).
        in_clip = (ratio >= 1.0 - clip_eps) & (ratio <= 1.0 + clip_eps)
        no_grad = (take_clipped & ~in_clip) | take_dual | (log_ratio < -20.0) | (log_ratio > 20.0)
        return loss, tl.where(no_grad, 0.0, -adv * ratio), take_clipped, take_dual

    @triton.jit
    def _sample_counts_kernel(
        mask_ptr,  # [N] mask (any dtype)
        idx_ptr,  # [N] int sample index of each token
        count_ptr,  # [num_samples] fp32 out, zeroed: sum of the mask over each sample's tokens
        N,
        BLOCK: tl.constexpr,
    ):
        """Per-sample mask sums with one atomic pair per run of equal indices in a block (runs are long when tokens
        are packed sample by sample; any order stays correct): a run [a, b] adds S_b and subtracts S_a - m_a, with S
        the block's inclusive prefix sum."""
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        valid = offs < N
        m = tl.load(mask_ptr + offs, mask=valid, other=0).to(tl.float32)
        idx = tl.load(idx_ptr + offs, mask=valid, other=0)
        prev = tl.load(idx_ptr + offs - 1, mask=valid & (tl.arange(0, BLOCK) > 0), other=-1)
        after = tl.load(idx_ptr + offs + 1, mask=(offs + 1 < N) & (tl.arange(0, BLOCK) < BLOCK - 1), other=-1)
        inclusive = tl.cumsum(m, 0)
        tl.atomic_add(count_ptr + idx, inclusive, mask=valid & (idx != after))
        tl.atomic_add(count_ptr + idx, m - inclusive, mask=valid & (idx != prev))

    @triton.jit
    def _ppo_loss_kernel(
        logp_ptr,  # [N] log pi_theta (any float dtype)
        logp_old_ptr,  # [N] log pi_old
        logp_t_ptr,  # [N] log pi_teacher
        mask_ptr,  # [N] mask (any dtype)
        idx_ptr,  # [N] int sample index of each token
        count_ptr,  # [num_samples] fp32: the mask summed over each sample (_sample_counts_kernel)
        grad_ptr,  # [N] fp32 out: d L / d logp
        part_ptr,  # [programs, 4] fp32 out: per program, weighted loss, clipped, dual-clipped, supervised counts
        N,
        num_samples,
        clip_eps,
        dual_clip,
        eps,
        BLOCK: tl.constexpr,
    ):
        pid = tl.program_id(0).to(tl.int64)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        valid = offs < N
        logp = tl.load(logp_ptr + offs, mask=valid, other=0.0).to(tl.float32)
        old = tl.load(logp_old_ptr + offs, mask=valid, other=0.0).to(tl.float32)
        teacher = tl.load(logp_t_ptr + offs, mask=valid, other=0.0).to(tl.float32)
        m = tl.load(mask_ptr + offs, mask=valid, other=0).to(tl.float32)
        idx = tl.load(idx_ptr + offs, mask=valid, other=0)
        count = tl.load(count_ptr + idx, mask=valid, other=1.0)
        w = m / ((count + eps) * num_samples)  # m_j / (|B| (M_b + eps)), Eq. 32
        sup = m > 0
        loss, g, clipped, dual = ppo_token(logp, old, teacher, sup, clip_eps, dual_clip)
        tl.store(grad_ptr + offs, g * w, mask=valid)
        tl.store(part_ptr + pid * 4, tl.sum(tl.where(valid, loss * w, 0.0), axis=0))
        tl.store(part_ptr + pid * 4 + 1, tl.sum(tl.where(valid & sup & clipped, 1.0, 0.0), axis=0))
        tl.store(part_ptr + pid * 4 + 2, tl.sum(tl.where(valid & sup & dual, 1.0, 0.0), axis=0))
        tl.store(part_ptr + pid * 4 + 3, tl.sum(tl.where(valid & sup, 1.0, 0.0), axis=0))


def ppo_loss_forward_triton(logp, logp_old, logp_teacher, mask, sample_idx, num_samples: int, clip_eps: float,
                            dual_clip: float, eps: float):
    """Loss, d loss / d logp [N] fp32, and the clipped, dual-clipped and supervised token counts ([] each).

    Two passes over the tokens: per-sample mask sums (12 bytes a token with an fp32 mask and int64 indices), then
    the loss pass (28 bytes in, 4 out); the sums over programs are deterministic.
    """
    n = logp.numel()
    grad = torch.empty(n, dtype=torch.float32, device=logp.device)
    programs = triton.cdiv(n, PPO_BLOCK)
    counts = torch.zeros(num_samples, dtype=torch.float32, device=logp.device)
    parts = torch.empty(programs, 4, dtype=torch.float32, device=logp.device)
    if n:
        _sample_counts_kernel[(programs,)](mask, sample_idx, counts, n, BLOCK=PPO_BLOCK, num_warps=PPO_NUM_WARPS)
        _ppo_loss_kernel[(programs,)](logp, logp_old, logp_teacher, mask, sample_idx, counts, grad, parts, n,
                                      num_samples, clip_eps, dual_clip, eps, BLOCK=PPO_BLOCK,
                                      num_warps=PPO_NUM_WARPS)
    loss, n_clip, n_dual, n_sup = parts.sum(0)
    return loss, grad, n_clip, n_dual, n_sup


def hand_over_gradients(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Backward of an op whose gradients were formed in its forward pass (``ctx.grads``): hands them over once,
    scaled in place by ``grad_out`` unless it is 1 (the usual ``loss.backward()``: no copy, no pass over them).

    They are kept on ``ctx`` rather than saved for backward so that autograd can take them as ``.grad`` without a
    copy; a second backward through the same graph (``retain_graph=True``) therefore raises.
    """
    grads = ctx.__dict__.pop("grads", None)
    if grads is None:
        raise RuntimeError("this loss formed its gradients in the forward pass and handed them over in the first "
                           "backward; call the op again instead of backward twice (retain_graph)")
    if not torch.equal(grad_out, torch.ones_like(grad_out)):
        grads = tuple(None if g is None else g.mul_(grad_out.to(g.dtype)) for g in grads)
    return grads


class PPOLossFunction(torch.autograd.Function):
    """Autograd glue around a one-pass forward that already produced d loss / d logp."""

    @staticmethod
    def forward(ctx, logp, loss, grad):
        ctx.grads = (grad.to(logp.dtype),)
        return loss

    @staticmethod
    def backward(ctx, grad_out):
        return *hand_over_gradients(ctx, grad_out), None, None

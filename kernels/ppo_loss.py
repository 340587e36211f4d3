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

One pass computes the loss, d L / d log pi_theta for every token, and the clip fractions (over supervised tokens).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs without triton use the native op or the reference
    triton = None

LOG_RATIO_CLAMP = 20.0
# The Triton launch (checked for spills by kernels/compile_check.py): 8 tokens per thread.
PPO_BLOCK, PPO_NUM_WARPS = 1024, 4


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
    def _ppo_loss_kernel(
        logp_ptr,  # [N] log pi_theta (any float dtype)
        logp_old_ptr,  # [N] log pi_old
        logp_t_ptr,  # [N] log pi_teacher
        weight_ptr,  # [N] fp32 token weight m / (|B| (M_b + eps)) (0 where masked)
        grad_ptr,  # [N] fp32 out: d L / d logp
        stats_ptr,  # [3] fp32 out (atomic): loss, clipped-token count, dual-clipped-token count
        N,
        clip_eps,
        dual_clip,
        BLOCK: tl.constexpr,
    ):
        pid = tl.program_id(0).to(tl.int64)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        valid = offs < N
        logp = tl.load(logp_ptr + offs, mask=valid, other=0.0).to(tl.float32)
        old = tl.load(logp_old_ptr + offs, mask=valid, other=0.0).to(tl.float32)
        teacher = tl.load(logp_t_ptr + offs, mask=valid, other=0.0).to(tl.float32)
        w = tl.load(weight_ptr + offs, mask=valid, other=0.0)
        sup = w > 0
        adv = tl.where(sup, teacher - old, 0.0)
        log_ratio = logp - old
        r = tl.minimum(tl.maximum(log_ratio, -20.0), 20.0)
        ratio = tl.exp(r)
        ratio_c = tl.minimum(tl.maximum(ratio, 1.0 - clip_eps), 1.0 + clip_eps)
        unclipped = -adv * ratio
        clipped = -adv * ratio_c
        take_clipped = clipped > unclipped
        l_clip = tl.where(take_clipped, clipped, unclipped)
        take_dual = (adv < 0) & (l_clip > -dual_clip * adv)
        loss_tok = tl.where(take_dual, -dual_clip * adv, l_clip)
        # d l / d logp: -A rho on the unclipped branch, -A rho on the clipped branch while rho is inside the
        # closed clip interval (else 0), 0 under the dual clip; times d r / d logp (1 inside [-20, 20]).
        in_clip = (ratio >= 1.0 - clip_eps) & (ratio <= 1.0 + clip_eps)
        g = tl.where(take_clipped & (~in_clip), 0.0, -adv * ratio)
        g = tl.where(take_dual, 0.0, g)
        g = tl.where((log_ratio >= -20.0) & (log_ratio <= 20.0), g, 0.0)
        tl.store(grad_ptr + offs, g * w, mask=valid)
        tl.atomic_add(stats_ptr + 0, tl.sum(tl.where(valid, loss_tok * w, 0.0), axis=0))
        tl.atomic_add(stats_ptr + 1, tl.sum(tl.where(valid & sup & take_clipped, 1.0, 0.0), axis=0))
        tl.atomic_add(stats_ptr + 2, tl.sum(tl.where(valid & sup & take_dual, 1.0, 0.0), axis=0))


def ppo_loss_forward_triton(logp, logp_old, logp_teacher, weight, clip_eps: float, dual_clip: float):
    """Loss, d loss / d logp [N] fp32, and the (clipped, dual-clipped) token counts, in one pass."""
    n = logp.numel()
    grad = torch.empty(n, dtype=torch.float32, device=logp.device)
    stats = torch.zeros(3, dtype=torch.float32, device=logp.device)
    _ppo_loss_kernel[(triton.cdiv(n, PPO_BLOCK),)](logp, logp_old, logp_teacher, weight, grad, stats, n, clip_eps,
                                                   dual_clip, BLOCK=PPO_BLOCK, num_warps=PPO_NUM_WARPS)
    return stats[0], grad, stats[1], stats[2]


class PPOLossFunction(torch.autograd.Function):
    """Autograd glue around a one-pass forward that already produced d loss / d logp."""

    @staticmethod
    def forward(ctx, logp, loss, grad):
        ctx.save_for_backward(grad)
        ctx.logp_dtype = logp.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_out):
        (grad,) = ctx.saved_tensors
        return (grad * grad_out).to(ctx.logp_dtype), None, None

"""Op 3: the student's dual-clipped PPO loss straight from hidden states, with its gradients formed in the same pass.

    logp = log softmax(h W^T / tau)[y]          (kernels/logprob_gather.py)
    L, d L / d logp                             (kernels/ppo_loss.py, Eq. 29-32)
    d L / d h, d L / d W                        (kernels/lm_head.py, with g = d L / d logp)

The loss is the final scalar of the update (``loss.backward()`` is called on it directly), so, as Liger-Kernel does
for cross-entropy, both gradients are formed in the forward pass and backward only hands them over (scaled when the
upstream gradient is not 1). Two paths on CUDA:

- chunked (one pass, 3 products): per row chunk, cuBLAS writes the fp32 logits; one Triton program per row finds
  the log-sum-exp and logp, the PPO token loss and d L / d logp, then writes G over the logits; cuBLAS forms
  d h of the chunk and adds G^T h into d W (accumulated in the weight's dtype or in fp32).
- fused (4 products, least memory): the fused forward (no logits in memory), the PPO kernel, then the gradients by
  vocabulary blocks (d W of a block written once).

Cost when the caller never calls backward with grad enabled: the two gradient products (twice the forward's matmul
work) and d h, d W held until the graph is freed. Under ``torch.no_grad()`` or when neither h nor W requires grad the
dispatcher takes the forward only, at no extra cost.
"""

from __future__ import annotations

import torch

from actfirst.kernels import lm_head as lm
from actfirst.kernels import logprob_gather as lg
from actfirst.kernels import ppo_loss as pl

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None


def ppo_loss_from_hidden_reference(hidden, weight, targets, logp_old, logp_teacher, mask, sample_idx,
                                   num_samples: int, *, temperature: float = 1.0, clip_eps: float = 0.2,
                                   dual_clip: float = 3.0, eps: float = 1e-8):
    """Torch reference, composed (materializes the logits): (loss [], logp [N], clip fraction [], dual fraction [])."""
    logp, _ = lg.logprob_gather_reference(hidden, weight, targets, temperature)
    loss, clip_frac, dual_frac = pl.ppo_loss_reference(logp, logp_old.to(logp.dtype), logp_teacher.to(logp.dtype),
                                                       mask, sample_idx, num_samples, clip_eps=clip_eps,
                                                       dual_clip=dual_clip, eps=eps)
    return loss, logp.detach(), clip_frac, dual_frac


if triton is not None:
    from actfirst.kernels.lm_head import row_logp, write_row_grad
    from actfirst.kernels.ppo_loss import ppo_token

    @triton.jit
    def _ppo_rows_kernel(
        z_ptr,  # [C, V] fp32 logits h W^T of a chunk (unscaled), row stride stride_zn
        gz_ptr,  # the same storage in G's dtype, row stride stride_gn: G out
        y_ptr,  # [C] int64 targets
        old_ptr,  # [C] fp32 log pi_old
        teacher_ptr,  # [C] fp32 log pi_teacher
        tw_ptr,  # [C] fp32 token weight m / (|B| (M_b + eps)) (0 where masked)
        logp_ptr,  # [C] fp32 out: log pi_theta (NaN for a target outside [0, V))
        stats_ptr,  # [3, *] fp32 out, row stride stride_s: weighted loss, clipped and dual-clipped flags per token
        V,
        stride_zn,
        stride_gn,
        stride_s,
        inv_temp,
        clip_eps,
        dual_clip,
        BLOCK_V: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        z_row = z_ptr + row * stride_zn
        y = tl.load(y_ptr + row)
        logp, lse, _ = row_logp(z_row, y, V, inv_temp, BLOCK_V)
        w = tl.load(tw_ptr + row)
        loss, g, clipped, dual = ppo_token(logp, tl.load(old_ptr + row), tl.load(teacher_ptr + row), w > 0,
                                           clip_eps, dual_clip)
        tl.store(logp_ptr + row, logp)
        tl.store(stats_ptr + row, loss * w)
        tl.store(stats_ptr + stride_s + row, tl.where((w > 0) & clipped, 1.0, 0.0))
        tl.store(stats_ptr + 2 * stride_s + row, tl.where((w > 0) & dual, 1.0, 0.0))
        write_row_grad(z_row, gz_ptr + row * stride_gn, V, y, lse, g * w * inv_temp, inv_temp, BLOCK_V)


def ppo_loss_from_hidden_chunked(hidden, weight, targets, logp_old, logp_teacher, mask, sample_idx,
                                 num_samples: int, *, temperature: float, clip_eps: float, dual_clip: float,
                                 eps: float, chunk_rows: int, head_grad_dtype: torch.dtype | None = None,
                                 need_weight_grad: bool = True):
    """One pass by row chunks: (loss, d hidden, d weight or None, logp, clipped count, dual-clipped count)."""
    n, v = hidden.shape[0], weight.shape[0]
    token_weight = pl.token_weights(mask, sample_idx, num_samples, eps)
    old, teacher = logp_old.float().contiguous(), logp_teacher.float().contiguous()
    logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
    stats = torch.empty(3, n, dtype=torch.float32, device=hidden.device)
    grad_h = torch.empty_like(hidden)
    grad_w = torch.zeros(weight.shape, dtype=head_grad_dtype or weight.dtype, device=weight.device) \
        if need_weight_grad else None
    buf = lm.logit_buffer(min(chunk_rows, n) * v, hidden.device)
    for r0 in range(0, n, chunk_rows):
        r1 = min(n, r0 + chunk_rows)
        z = lm.logits_into(buf, hidden[r0:r1], weight)
        grad = lm.grad_view(buf, r1 - r0, v, hidden.dtype)
        _ppo_rows_kernel[(r1 - r0,)](z, grad, targets[r0:r1], old[r0:r1], teacher[r0:r1], token_weight[r0:r1],
                                     logp[r0:r1], stats[:, r0:r1], v, z.stride(0), grad.stride(0), stats.stride(0),
                                     1.0 / temperature, clip_eps, dual_clip, BLOCK_V=lm.ROW_BLOCK_V,
                                     num_warps=lm.ROW_NUM_WARPS)
        lm.grad_products(grad, weight, hidden[r0:r1], grad_h[r0:r1], grad_w)
    loss, n_clip, n_dual = stats.sum(1)
    return loss, grad_h, None if grad_w is None else grad_w.to(weight.dtype), logp, n_clip, n_dual


def ppo_loss_from_hidden_fused(hidden, weight, targets, logp_old, logp_teacher, mask, sample_idx, num_samples: int,
                               *, temperature: float, clip_eps: float, dual_clip: float, eps: float, block_cols: int,
                               need_weight_grad: bool = True):
    """Fused forward, PPO kernel, gradients by vocabulary blocks: (loss, d hidden, d weight or None, logp, clipped
    count, dual-clipped count)."""
    logp, lse, _ = lg.logprob_gather_forward_fused(hidden, weight, targets, temperature)
    loss, g, n_clip, n_dual, _ = pl.ppo_loss_forward_triton(logp, logp_old.contiguous(), logp_teacher.contiguous(),
                                                            mask.contiguous(), sample_idx, num_samples, clip_eps,
                                                            dual_clip, eps)
    grad_h, grad_w = lm.grads_by_vocab_blocks(hidden, weight, targets, lse, g, temperature, block_cols,
                                              need_weight_grad=need_weight_grad)
    return loss, grad_h, grad_w, logp, n_clip, n_dual

"""Fused log-prob gather: log softmax(h W^T / tau)[y] (and the entropy) without the [N, V] logits.

For each token n with hidden state h_n [H], LM-head W [V, H], target y_n and temperature tau:

    z_nv  = h_n . W_v / tau
    lse_n = log sum_v exp(z_nv)                    online over vocabulary tiles: (m, s) -> running max, sum
    logp_n = z_{n, y_n} - lse_n
    H_n   = lse_n - sum_v p_nv z_nv                (entropy; t = sum exp(z - m) z rides along with s)

Backward, for an upstream gradient g_n of logp_n (the entropy output carries no gradient):

    d logp_n / d z_nv = 1[v = y_n] - p_nv,   p_nv = exp(z_nv - lse_n)
    grad_h_n = (g_n / tau) (W_{y_n} - sum_v p_nv W_v),    grad_W_v = sum_n (g_n / tau) (1[v = y_n] - p_nv) h_n

Forward on CUDA is one Triton kernel (tl.dot over H chunks, online log-sum-exp over V tiles). Backward walks
the vocabulary in tiles: per tile, z = h W_t^T on tensor cores, then a Triton kernel turns it into
G = (g / tau)(onehot - p) in place, then grad_h += G W_t and grad_W_t = G^T h. Memory beyond the inputs,
outputs and gradients is one [N, V_tile] tile, never [N, V].
"""

from __future__ import annotations

import os

import torch

# The Triton interpreter (TRITON_INTERPRET=1, CPU tests) computes bf16/fp16 tl.dot wrongly (errors of 1e10
# measured with triton 3.9); there the operands are upcast to fp32. Compiled kernels keep bf16/fp16 tensor-core dots.
_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None


def logprob_gather_reference(hidden, weight, targets, temperature: float = 1.0):
    """Torch reference (materializes the logits): returns (logp [N] fp32-or-wider, entropy [N])."""
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    logits = (hidden.to(dtype) @ weight.to(dtype).T) / temperature
    logz = torch.log_softmax(logits, dim=-1)
    logp = logz.gather(-1, targets[:, None].long())[:, 0]
    entropy = -(logz.exp() * logz).sum(-1)
    return logp, entropy.detach()


def vocab_tile(n: int, v: int, budget_bytes: int = 64 << 20) -> int:
    """Vocabulary tile so that one fp32 [n, tile] block fits in ``budget_bytes`` (at least 256, at most V)."""
    return int(max(256, min(v, budget_bytes // max(1, 4 * n))))


def _mm_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with fp32 output (fp32 accumulation, no bf16 rounding of logits)."""
    if a.dtype == torch.float32:
        return a @ b
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()


if triton is not None:

    @triton.jit
    def _logprob_gather_fwd_kernel(
        h_ptr,  # [N, H] hidden states
        w_ptr,  # [V, H] LM-head weight
        y_ptr,  # [N] int64 targets
        logp_ptr,  # [N] fp32 out
        lse_ptr,  # [N] fp32 out (saved for backward)
        ent_ptr,  # [N] fp32 out
        N,
        V,
        H,
        stride_hn,
        stride_wv,
        inv_temp,
        BLOCK_N: tl.constexpr,
        BLOCK_V: tl.constexpr,
        BLOCK_H: tl.constexpr,
        UPCAST_DOT: tl.constexpr,
    ):
        pid = tl.program_id(0).to(tl.int64)
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        y = tl.load(y_ptr + rows, mask=row_ok, other=0)
        m = tl.full((BLOCK_N,), float("-inf"), tl.float32)
        s = tl.zeros((BLOCK_N,), tl.float32)
        t = tl.zeros((BLOCK_N,), tl.float32)
        z_y = tl.zeros((BLOCK_N,), tl.float32)
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            col_ok = cols < V
            acc = tl.zeros((BLOCK_N, BLOCK_V), tl.float32)
            for h0 in range(0, H, BLOCK_H):
                ks = h0 + tl.arange(0, BLOCK_H)
                k_ok = ks < H
                a = tl.load(h_ptr + rows[:, None] * stride_hn + ks[None, :], mask=row_ok[:, None] & k_ok[None, :],
                            other=0.0)
                b = tl.load(w_ptr + cols[:, None] * stride_wv + ks[None, :], mask=col_ok[:, None] & k_ok[None, :],
                            other=0.0)
                if UPCAST_DOT:
                    a = a.to(tl.float32)
                    b = b.to(tl.float32)
                acc = tl.dot(a, tl.trans(b), acc)
            z = tl.where(col_ok[None, :], acc * inv_temp, float("-inf"))
            m_new = tl.maximum(m, tl.max(z, axis=1))
            scale = tl.exp(m - m_new)
            e = tl.exp(z - m_new[:, None])
            s = s * scale + tl.sum(e, axis=1)
            t = t * scale + tl.sum(e * tl.where(col_ok[None, :], z, 0.0), axis=1)
            m = m_new
            z_y += tl.sum(tl.where(cols[None, :] == y[:, None], z, 0.0), axis=1)
        lse = m + tl.log(s)
        tl.store(logp_ptr + rows, z_y - lse, mask=row_ok)
        tl.store(lse_ptr + rows, lse, mask=row_ok)
        tl.store(ent_ptr + rows, lse - t / s, mask=row_ok)

    @triton.jit
    def _logprob_gather_bwd_tile_kernel(
        z_ptr,  # [N, VT] fp32 in: h W_t^T (unscaled); out: G = (g / tau)(onehot - p), in place
        lse_ptr,  # [N] fp32
        g_ptr,  # [N] fp32 upstream gradient of logp
        y_ptr,  # [N] int64 targets
        N,
        VT,
        v0,
        stride_zn,
        inv_temp,
        BLOCK_V: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        lse = tl.load(lse_ptr + row)
        gs = tl.load(g_ptr + row) * inv_temp
        y = tl.load(y_ptr + row) - v0
        for c0 in range(0, VT, BLOCK_V):
            cols = c0 + tl.arange(0, BLOCK_V)
            ok = cols < VT
            z = tl.load(z_ptr + row * stride_zn + cols, mask=ok, other=0.0)
            p = tl.exp(z * inv_temp - lse)
            grad = gs * (tl.where(cols == y, 1.0, 0.0) - p)
            tl.store(z_ptr + row * stride_zn + cols, grad, mask=ok)


def logprob_gather_forward_triton(hidden, weight, targets, temperature: float, block_n: int = 64,
                                  block_v: int = 128, block_h: int = 64):
    """Triton forward: (logp, lse, entropy), each [N] fp32."""
    n, h = hidden.shape
    v = weight.shape[0]
    logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
    lse = torch.empty_like(logp)
    ent = torch.empty_like(logp)
    if n:
        _logprob_gather_fwd_kernel[(triton.cdiv(n, block_n),)](
            hidden, weight, targets, logp, lse, ent, n, v, h, hidden.stride(0), weight.stride(0), 1.0 / temperature,
            BLOCK_N=block_n, BLOCK_V=block_v, BLOCK_H=block_h, UPCAST_DOT=_INTERPRETER)
    return logp, lse, ent


def logprob_gather_backward_triton(hidden, weight, targets, lse, grad_logp, temperature: float,
                                   need_weight_grad: bool = True):
    """Tiled backward: (grad_hidden, grad_weight) with one [N, V_tile] fp32 tile alive at a time."""
    n, _ = hidden.shape
    v = weight.shape[0]
    grad_h = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight_grad else None
    g = grad_logp.float().contiguous()
    tile = vocab_tile(n, v)
    for v0 in range(0, v, tile):
        w_t = weight[v0:v0 + tile]
        z = _mm_fp32(hidden, w_t.T)  # [N, VT]
        _logprob_gather_bwd_tile_kernel[(n,)](z, lse, g, targets, n, z.shape[1], v0, z.stride(0),
                                              1.0 / temperature, BLOCK_V=1024)
        grad_h += _mm_fp32(z.to(weight.dtype), w_t) if weight.dtype != torch.float32 else z @ w_t
        if grad_w is not None:
            grad_w[v0:v0 + tile] = _mm_fp32(z.T.to(hidden.dtype), hidden) if hidden.dtype != torch.float32 \
                else z.T @ hidden
    return grad_h.to(hidden.dtype), None if grad_w is None else grad_w.to(weight.dtype)

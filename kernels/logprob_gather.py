"""Fused log-prob gather: log softmax(h W^T / tau)[y] (and the entropy) without the [N, V] logits.

For each token n with hidden state h_n [H], LM-head W [V, H], target y_n and temperature tau:

    z_nv  = h_n . W_v / tau
    lse_n = log sum_v exp(z_nv)                    online over vocabulary tiles: (m, s) -> running max, sum
    logp_n = z_{n, y_n} - lse_n
    H_n   = lse_n - sum_v p_nv z_nv                (entropy; t = sum exp(z - m) z rides along with s)

Backward, for an upstream gradient g_n of logp_n (the entropy output carries no gradient):

    d logp_n / d z_nv = 1[v = y_n] - p_nv,   p_nv = exp(z_nv - lse_n)
    grad_h_n = (g_n / tau) (W_{y_n} - sum_v p_nv W_v),    grad_W_v = sum_n (g_n / tau) (1[v = y_n] - p_nv) h_n

Forward on CUDA is two Triton kernels. The first runs a grid of (row blocks, vocabulary splits): each program
walks its split of the vocabulary in tiles (tl.dot over H chunks, online log-sum-exp) and writes the split's
(m, s, t). When the rows alone fill the GPU there is one split; at small N the vocabulary is split so that the
grid fills the SMs. The second kernel combines the splits per row and adds the target logit h_n . W_{y_n}.
Backward walks the vocabulary in tiles: per tile, z = h W_t^T on tensor cores, then a Triton kernel turns it into
G = (g / tau)(onehot - p) in place, then grad_h += G W_t and grad_W_t = G^T h. Memory beyond the inputs,
outputs and gradients is one [N, V_tile] tile (forward: [3, splits, N]), never [N, V].

Launch configurations are per architecture (FWD_CONFIGS), each checked ahead of time for register spills and
shared memory by ``python -m actfirst.kernels.compile_check``; on a GPU the forward autotunes over its short list.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch

# The Triton interpreter (TRITON_INTERPRET=1, CPU tests) computes bf16/fp16 tl.dot wrongly (errors of 1e10
# measured with triton 3.9); there the operands are upcast to fp32. Compiled kernels keep bf16/fp16 tensor-core dots.
_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None


@dataclass(frozen=True)
class FwdConfig:
    """One launch configuration of the forward kernel."""

    block_n: int
    block_v: int
    block_h: int
    num_warps: int
    num_stages: int

    def __str__(self) -> str:
        return f"N{self.block_n} V{self.block_v} H{self.block_h} w{self.num_warps} s{self.num_stages}"


# The forward's autotune list per (architecture, input width); the first entry is the default, and the vocabulary
# split count is sized for it. Architecture 90 is Hopper (227 KB of shared memory per block); 80 serves every other
# GPU and is held to 99 KB (sm_86/sm_89). kernels/compile_check.py compiles every entry for its architecture, with
# and without Triton's divisibility hints, and fails on a register spill or on shared memory beyond the limit.
FWD_CONFIGS: dict[tuple[int, str], tuple[FwdConfig, ...]] = {
    (80, "16-bit"): (FwdConfig(64, 128, 32, 8, 4), FwdConfig(128, 128, 32, 8, 3)),
    (80, "fp32"): (FwdConfig(64, 64, 16, 8, 4),),
    (90, "16-bit"): (FwdConfig(64, 128, 64, 8, 3), FwdConfig(128, 128, 32, 8, 4)),
    (90, "fp32"): (FwdConfig(64, 64, 32, 8, 3),),
}
# Under the interpreter (CPU tests): small blocks, so that small test shapes cross H chunks and vocabulary tiles.
INTERPRETER_CONFIG = FwdConfig(16, 32, 16, 1, 1)
COMBINE_BLOCK_N, COMBINE_BLOCK_H, COMBINE_NUM_WARPS = 16, 128, 4
BWD_BLOCK_V, BWD_NUM_WARPS = 1024, 4


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


def arch_of(capability: tuple[int, int]) -> int:
    """The checked architecture whose FWD_CONFIGS a GPU of this compute capability gets: 90 for Hopper, else 80."""
    return 90 if capability[0] == 9 else 80


def width_of(dtype: torch.dtype) -> str:
    """The FWD_CONFIGS input-width key of a hidden/weight dtype."""
    return "fp32" if dtype == torch.float32 else "16-bit"


def vocab_splits(row_blocks: int, v_tiles: int, num_sms: int) -> int:
    """Vocabulary splits per row block: 1 when the row blocks alone fill the SMs; else the fewest splits whose grid,
    run in waves of ``num_sms`` programs, is within 5% of the best fill (at most ``v_tiles`` and 8 waves)."""
    if row_blocks >= num_sms:
        return 1
    candidates = range(1, max(1, min(v_tiles, 8 * num_sms // row_blocks)) + 1)
    waves = {s: math.ceil(row_blocks * s / num_sms) / s for s in candidates}  # run time, in whole-vocabulary walks
    best = min(waves.values())
    return next(s for s in candidates if waves[s] <= 1.05 * best)


if triton is not None:

    @triton.jit
    def _logprob_gather_fwd_kernel(
        h_ptr,  # [N, H] hidden states
        w_ptr,  # [V, H] LM-head weight
        part_ptr,  # [3, S, N] fp32 out: per vocabulary split, running max m, sum exp(z - m), sum exp(z - m) z
        N,
        V,
        H,
        V_PER_SPLIT,
        stride_hn,
        stride_wv,
        inv_temp,
        BLOCK_N: tl.constexpr,
        BLOCK_V: tl.constexpr,
        BLOCK_H: tl.constexpr,
        UPCAST_DOT: tl.constexpr,
    ):
        pid = tl.program_id(0).to(tl.int64)
        split = tl.program_id(1)
        num_splits = tl.num_programs(1)
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        v_start = split * V_PER_SPLIT
        v_end = tl.minimum(v_start + V_PER_SPLIT, V)
        m = tl.full((BLOCK_N,), float("-inf"), tl.float32)
        s = tl.zeros((BLOCK_N,), tl.float32)
        t = tl.zeros((BLOCK_N,), tl.float32)
        for v0 in range(v_start, v_end, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            col_ok = cols < v_end
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
                # fp32 inputs: 3xTF32, about fp32's accuracy on tensor cores (plain TF32's 10-bit mantissa puts
                # 1e-3 errors in the logits); 16-bit inputs ignore it.
                acc = tl.dot(a, tl.trans(b), acc, input_precision="tf32x3")
            z = tl.where(col_ok[None, :], acc * inv_temp, float("-inf"))
            m_new = tl.maximum(m, tl.max(z, axis=1))
            scale = tl.exp(m - m_new)
            e = tl.exp(z - m_new[:, None])
            s = s * scale + tl.sum(e, axis=1)
            t = t * scale + tl.sum(e * tl.where(col_ok[None, :], z, 0.0), axis=1)
            m = m_new
        out = part_ptr + split * N + rows
        tl.store(out, m, mask=row_ok)
        tl.store(out + num_splits * N, s, mask=row_ok)
        tl.store(out + 2 * num_splits * N, t, mask=row_ok)

    @triton.jit
    def _logprob_gather_combine_kernel(
        part_ptr,  # [3, S, N] fp32: the forward kernel's per-split (m, s, t)
        h_ptr,  # [N, H] hidden states
        w_ptr,  # [V, H] LM-head weight
        y_ptr,  # [N] int64 targets
        logp_ptr,  # [N] fp32 out (NaN for a target outside [0, V))
        lse_ptr,  # [N] fp32 out (saved for backward)
        ent_ptr,  # [N] fp32 out
        N,
        V,
        H,
        S,
        stride_hn,
        stride_wv,
        inv_temp,
        BLOCK_N: tl.constexpr,
        BLOCK_H: tl.constexpr,
    ):
        rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        m = tl.full((BLOCK_N,), float("-inf"), tl.float32)
        s = tl.zeros((BLOCK_N,), tl.float32)
        t = tl.zeros((BLOCK_N,), tl.float32)
        for k in range(0, S):
            m_k = tl.load(part_ptr + k * N + rows, mask=row_ok, other=0.0)
            s_k = tl.load(part_ptr + (S + k) * N + rows, mask=row_ok, other=1.0)  # 1: no log(0) on masked rows
            t_k = tl.load(part_ptr + (2 * S + k) * N + rows, mask=row_ok, other=0.0)
            m_new = tl.maximum(m, m_k)
            a = tl.exp(m - m_new)
            b = tl.exp(m_k - m_new)
            s = s * a + s_k * b
            t = t * a + t_k * b
            m = m_new
        # Target logit h_n . W_{y_n} / tau, in fp32 (one row of W per token: 1/V of the forward's work).
        y = tl.load(y_ptr + rows, mask=row_ok, other=0)
        y_ok = row_ok & (y >= 0) & (y < V)
        z_y = tl.zeros((BLOCK_N,), tl.float32)
        for h0 in range(0, H, BLOCK_H):
            ks = h0 + tl.arange(0, BLOCK_H)
            k_ok = ks < H
            a = tl.load(h_ptr + rows[:, None] * stride_hn + ks[None, :], mask=row_ok[:, None] & k_ok[None, :],
                        other=0.0)
            b = tl.load(w_ptr + y[:, None] * stride_wv + ks[None, :], mask=y_ok[:, None] & k_ok[None, :], other=0.0)
            z_y += tl.sum(a.to(tl.float32) * b.to(tl.float32), axis=1)
        lse = m + tl.log(s)
        tl.store(logp_ptr + rows, tl.where(y_ok, z_y * inv_temp - lse, float("nan")), mask=row_ok)
        tl.store(lse_ptr + rows, lse, mask=row_ok)
        tl.store(ent_ptr + rows, lse - t / s, mask=row_ok)

    @triton.jit
    def _logprob_gather_bwd_tile_kernel(
        z_ptr,  # [N, VT] fp32 in: h W_t^T (unscaled); out: G = (g / tau)(onehot - p), in place
        lse_ptr,  # [N] fp32
        g_ptr,  # [N] fp32 upstream gradient of logp
        y_ptr,  # [N] int64 targets
        VT,
        v0,
        stride_zn,
        inv_temp,
        BLOCK_V: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
        ok = cols < VT
        lse = tl.load(lse_ptr + row)
        gs = tl.load(g_ptr + row) * inv_temp
        y = tl.load(y_ptr + row) - v0
        z = tl.load(z_ptr + row * stride_zn + cols, mask=ok, other=0.0)
        p = tl.exp(z * inv_temp - lse)
        grad = gs * (tl.where(cols == y, 1.0, 0.0) - p)
        tl.store(z_ptr + row * stride_zn + cols, grad, mask=ok)

    @functools.cache
    def _tuned_fwd_kernel(arch: int, width: str):
        """The forward kernel autotuned over FWD_CONFIGS[(arch, width)], once per (V, H, split length)."""
        configs = [triton.Config({"BLOCK_N": c.block_n, "BLOCK_V": c.block_v, "BLOCK_H": c.block_h},
                                 num_warps=c.num_warps, num_stages=c.num_stages) for c in FWD_CONFIGS[(arch, width)]]
        return triton.autotune(configs=configs, key=["V", "H", "V_PER_SPLIT"])(_logprob_gather_fwd_kernel)


@functools.cache
def _num_sms(device: torch.device) -> int:
    """SMs of a CUDA device; 1 elsewhere (the interpreter runs one program at a time)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def logprob_gather_forward_triton(hidden, weight, targets, temperature: float, splits: int | None = None):
    """Triton forward: (logp, lse, entropy), each [N] fp32.

    ``splits`` fixes the number of vocabulary splits (tests); by default it comes from :func:`vocab_splits`.
    """
    n, h = hidden.shape
    v = weight.shape[0]
    logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
    lse = torch.empty_like(logp)
    ent = torch.empty_like(logp)
    if not n:
        return logp, lse, ent
    if v * weight.stride(0) >= 2**31:  # 32-bit W offsets keep the inner loop within its registers
        raise ValueError(f"weight {tuple(weight.shape)}: the Triton forward needs V * H < 2^31")
    if _INTERPRETER:
        configs, kernel = (INTERPRETER_CONFIG,), _logprob_gather_fwd_kernel
        meta = {"BLOCK_N": INTERPRETER_CONFIG.block_n, "BLOCK_V": INTERPRETER_CONFIG.block_v,
                "BLOCK_H": INTERPRETER_CONFIG.block_h}
    else:
        key = (arch_of(torch.cuda.get_device_capability(hidden.device)), width_of(hidden.dtype))
        configs, kernel, meta = FWD_CONFIGS[key], _tuned_fwd_kernel(*key), {}
    if splits is None:
        splits = vocab_splits(triton.cdiv(n, configs[0].block_n), triton.cdiv(v, configs[0].block_v),
                              _num_sms(hidden.device))
    align = max(c.block_v for c in configs)  # a split is whole tiles for every config in the list
    v_per_split = triton.cdiv(triton.cdiv(v, splits), align) * align
    splits = triton.cdiv(v, v_per_split)
    part = torch.empty(3, splits, n, dtype=torch.float32, device=hidden.device)
    kernel[lambda cfg: (triton.cdiv(n, cfg["BLOCK_N"]), splits)](
        hidden, weight, part, n, v, h, v_per_split, hidden.stride(0), weight.stride(0), 1.0 / temperature,
        UPCAST_DOT=_INTERPRETER, **meta)
    _logprob_gather_combine_kernel[(triton.cdiv(n, COMBINE_BLOCK_N),)](
        part, hidden, weight, targets, logp, lse, ent, n, v, h, splits, hidden.stride(0), weight.stride(0),
        1.0 / temperature, BLOCK_N=COMBINE_BLOCK_N, BLOCK_H=COMBINE_BLOCK_H, num_warps=COMBINE_NUM_WARPS)
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
        _logprob_gather_bwd_tile_kernel[(n, triton.cdiv(z.shape[1], BWD_BLOCK_V))](
            z, lse, g, targets, z.shape[1], v0, z.stride(0), 1.0 / temperature, BLOCK_V=BWD_BLOCK_V,
            num_warps=BWD_NUM_WARPS)
        grad_h += _mm_fp32(z.to(weight.dtype), w_t) if weight.dtype != torch.float32 else z @ w_t
        if grad_w is not None:
            grad_w[v0:v0 + tile] = _mm_fp32(z.T.to(hidden.dtype), hidden) if hidden.dtype != torch.float32 \
                else z.T @ hidden
    return grad_h.to(hidden.dtype), None if grad_w is None else grad_w.to(weight.dtype)

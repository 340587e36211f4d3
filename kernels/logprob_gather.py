"""Fused log-prob gather: log softmax(h W^T / tau)[y] (and the entropy) without the [N, V] logits.

For each token n with hidden state h_n [H], LM-head W [V, H], target y_n and temperature tau:

    z_nv  = h_n . W_v / tau
    lse_n = log sum_v exp(z_nv)                    online over vocabulary tiles: (m, s) -> running max, sum
    logp_n = z_{n, y_n} - lse_n
    H_n   = lse_n - sum_v p_nv z_nv                (entropy; t = sum exp(z - m) z rides along with s)

Backward, for an upstream gradient g_n of logp_n (the entropy output carries no gradient):

    d logp_n / d z_nv = 1[v = y_n] - p_nv,   p_nv = exp(z_nv - lse_n)
    grad_h_n = (g_n / tau) (W_{y_n} - sum_v p_nv W_v),    grad_W_v = sum_n (g_n / tau) (1[v = y_n] - p_nv) h_n

Two forward paths on CUDA (the dispatcher picks one by shape and free memory; kernels/paths.py):

- fused: the logits never leave the chip. One Triton kernel on a grid of (row block, vocabulary split) programs,
  numbered in groups of GROUP row blocks so that the programs running at once share their hidden rows and LM-head
  tiles in L2 (as a GEMM's tile swizzle does). Each program walks its split in tiles (tl.dot over H chunks, online
  log-sum-exp) and writes the split's (m, s, t); a second kernel combines the splits per row and adds the target
  logit h_n . W_{y_n}. Memory: [3, splits, N] fp32.
- chunked: rows in chunks; per chunk cuBLAS writes the fp32 logits [chunk, V] into one reused buffer and a Triton
  kernel reduces each row (one program per row). Memory: the buffer.

The backward is in kernels/lm_head.py (by row chunks after the chunked forward, by vocabulary blocks after the fused
one). Launch configurations are per architecture (FWD_CONFIGS), each checked ahead of time for register spills and
shared memory by ``python -m actfirst.kernels.compile_check``; on a GPU the fused forward autotunes over its list.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch

from actfirst.kernels import lm_head as lm

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
    """One launch configuration of the fused forward kernel."""

    block_n: int
    block_v: int
    block_h: int
    num_warps: int
    num_stages: int
    group: int = 8  # row blocks per group of the program numbering

    def __str__(self) -> str:
        return f"N{self.block_n} V{self.block_v} H{self.block_h} w{self.num_warps} s{self.num_stages}"


# The fused forward's autotune list per (architecture, input width, aligned); the first entry is the default, and the
# vocabulary split count is sized for it. "Aligned": H, V, the row strides and the pointers are multiples of 16 (every
# real model), which lets Triton vectorize the loads and pipeline them into shared memory; odd H (tests) gets its own
# list, since the large tiles spill without that. Architecture 90 is Hopper (227 KB of shared memory per block):
# tiles of 128 rows (two warpgroups of wgmma, checked in the PTX) and K chunks of 64, 3-4 stages. 80 serves every
# other GPU and is held to 99 KB (sm_86/sm_89). kernels/compile_check.py compiles every entry for its architecture,
# with the hints its key promises, and fails on a register spill or on shared memory beyond the limit.
_SM80_16BIT = (FwdConfig(64, 128, 32, 8, 4), FwdConfig(128, 128, 32, 8, 3))
_SM90_FP32 = (FwdConfig(64, 64, 32, 8, 3),)
FWD_CONFIGS: dict[tuple[int, str, bool], tuple[FwdConfig, ...]] = {
    (80, "16-bit", True): _SM80_16BIT,
    (80, "16-bit", False): _SM80_16BIT,
    (80, "fp32", True): (FwdConfig(64, 64, 16, 8, 4),),
    (80, "fp32", False): (FwdConfig(64, 64, 16, 8, 4),),
    (90, "16-bit", True): (FwdConfig(128, 128, 64, 8, 4), FwdConfig(128, 128, 64, 8, 3),
                           FwdConfig(64, 256, 64, 8, 3), FwdConfig(128, 128, 128, 8, 2)),
    (90, "16-bit", False): (FwdConfig(64, 128, 64, 8, 3),),
    (90, "fp32", True): _SM90_FP32,
    (90, "fp32", False): _SM90_FP32,
}
# Under the interpreter (CPU tests): small blocks and groups, so that small test shapes cross H chunks, vocabulary
# tiles and groups.
INTERPRETER_CONFIG = FwdConfig(16, 32, 16, 1, 1, group=2)
# Vocabulary columns a fused-forward program walks at most: enough splits that the programs running at once share
# hidden rows (one group) rather than each streaming its own through L2; [3, splits, N] fp32 stays small.
SPLIT_COLUMNS = 4096
COMBINE_BLOCK_N, COMBINE_BLOCK_H, COMBINE_NUM_WARPS = 16, 128, 4


def logprob_gather_reference(hidden, weight, targets, temperature: float = 1.0):
    """Torch reference (materializes the logits): returns (logp [N] fp32-or-wider, entropy [N])."""
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    logits = (hidden.to(dtype) @ weight.to(dtype).T) / temperature
    logz = torch.log_softmax(logits, dim=-1)
    logp = logz.gather(-1, targets[:, None].long())[:, 0]
    entropy = -(logz.exp() * logz).sum(-1)
    return logp, entropy.detach()


def vocab_tile(n: int, v: int, budget_bytes: int = 64 << 20) -> int:
    """Vocabulary tile of the native CPU op so that one fp32 [n, tile] block fits in ``budget_bytes``."""
    return int(max(256, min(v, budget_bytes // max(1, 4 * n))))


def arch_of(capability: tuple[int, int]) -> int:
    """The checked architecture whose FWD_CONFIGS a GPU of this compute capability gets: 90 for Hopper, else 80."""
    return 90 if capability[0] == 9 else 80


def width_of(dtype: torch.dtype) -> str:
    """The FWD_CONFIGS input-width key of a hidden/weight dtype."""
    return "fp32" if dtype == torch.float32 else "16-bit"


def is_aligned(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a launch gets Triton's divisibility-by-16 hints on H, V, the row strides and the pointers."""
    return all(x % 16 == 0 for x in (hidden.shape[1], weight.shape[0], hidden.stride(0), weight.stride(0),
                                     hidden.data_ptr(), weight.data_ptr()))


def vocab_splits(row_blocks: int, v_tiles: int, num_sms: int, min_splits: int = 1) -> int:
    """Vocabulary splits per row block: the fewest, from ``min_splits``, whose grid, run in waves of ``num_sms``
    programs, is within 5% of the best fill (at most ``v_tiles``, and no more than 8 waves are considered)."""
    lo = min(min_splits, v_tiles)
    candidates = range(lo, max(lo, min(v_tiles, 8 * num_sms // row_blocks)) + 1)
    waves = {s: math.ceil(row_blocks * s / num_sms) / s for s in candidates}  # run time, in whole-vocabulary walks
    best = min(waves.values())
    return next(s for s in candidates if waves[s] <= 1.05 * best)


if triton is not None:
    from actfirst.kernels.lm_head import row_logp

    @triton.jit
    def _logprob_gather_fwd_kernel(
        h_ptr,  # [N, H] hidden states
        w_ptr,  # [V, H] LM-head weight
        part_ptr,  # [3, S, N] fp32 out: per vocabulary split, running max m, sum exp(z - m), sum exp(z - m) z
        N,
        V,
        H,
        V_PER_SPLIT,
        S,
        stride_hn,
        stride_wv,
        inv_temp,
        BLOCK_N: tl.constexpr,
        BLOCK_V: tl.constexpr,
        BLOCK_H: tl.constexpr,
        GROUP: tl.constexpr,
        UPCAST_DOT: tl.constexpr,
    ):
        # Program numbering in groups of GROUP row blocks, splits inside a group: the programs in flight work on
        # GROUP row blocks (kept in L2) and share each LM-head tile among them.
        pid = tl.program_id(0)
        first = pid // (GROUP * S) * GROUP
        size = tl.minimum(tl.cdiv(N, BLOCK_N) - first, GROUP)
        local = pid % (GROUP * S)
        row_block = (first + local % size).to(tl.int64)
        split = local // size
        rows = row_block * BLOCK_N + tl.arange(0, BLOCK_N)
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
        tl.store(out + S * N, s, mask=row_ok)
        tl.store(out + 2 * S * N, t, mask=row_ok)

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
    def _logprob_rows_kernel(
        z_ptr,  # [C, V] fp32 logits h W^T of a chunk (unscaled), row stride stride_zn
        y_ptr,  # [C] int64 targets
        logp_ptr,  # [C] fp32 out (NaN for a target outside [0, V))
        lse_ptr,  # [C] fp32 out
        ent_ptr,  # [C] fp32 out
        V,
        stride_zn,
        inv_temp,
        BLOCK_V: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        logp, lse, ent = row_logp(z_ptr + row * stride_zn, tl.load(y_ptr + row), V, inv_temp, BLOCK_V)
        tl.store(logp_ptr + row, logp)
        tl.store(lse_ptr + row, lse)
        tl.store(ent_ptr + row, ent)

    @functools.cache
    def _tuned_fwd_kernel(key: tuple[int, str, bool]):
        """The fused forward kernel autotuned over FWD_CONFIGS[key], once per (V, H, split length)."""
        configs = [triton.Config({"BLOCK_N": c.block_n, "BLOCK_V": c.block_v, "BLOCK_H": c.block_h,
                                  "GROUP": c.group}, num_warps=c.num_warps, num_stages=c.num_stages)
                   for c in FWD_CONFIGS[key]]
        return triton.autotune(configs=configs, key=["V", "H", "V_PER_SPLIT"])(_logprob_gather_fwd_kernel)


@functools.cache
def _num_sms(device: torch.device) -> int:
    """SMs of a CUDA device; 1 elsewhere (the interpreter runs one program at a time)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def _fwd_launch(hidden: torch.Tensor, weight: torch.Tensor):
    """(configs, kernel, fixed meta-parameters) of the fused forward on this device."""
    if _INTERPRETER:
        c = INTERPRETER_CONFIG
        meta = {"BLOCK_N": c.block_n, "BLOCK_V": c.block_v, "BLOCK_H": c.block_h, "GROUP": c.group}
        return (c,), _logprob_gather_fwd_kernel, meta
    key = (arch_of(torch.cuda.get_device_capability(hidden.device)), width_of(hidden.dtype),
           is_aligned(hidden, weight))
    return FWD_CONFIGS[key], _tuned_fwd_kernel(key), {}


def _empty_outputs(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return tuple(torch.empty(n, dtype=torch.float32, device=device) for _ in range(3))


def logprob_gather_forward_fused(hidden, weight, targets, temperature: float, splits: int | None = None):
    """Fused Triton forward: (logp, lse, entropy), each [N] fp32.

    ``splits`` fixes the number of vocabulary splits (tests); by default it comes from :func:`vocab_splits`.
    """
    n, h = hidden.shape
    v = weight.shape[0]
    logp, lse, ent = _empty_outputs(n, hidden.device)
    if not n:
        return logp, lse, ent
    if v * weight.stride(0) >= 2**31:  # 32-bit W offsets keep the inner loop within its registers
        raise ValueError(f"weight {tuple(weight.shape)}: the fused Triton forward needs V * H < 2^31")
    configs, kernel, meta = _fwd_launch(hidden, weight)
    if splits is None:
        splits = vocab_splits(triton.cdiv(n, configs[0].block_n), triton.cdiv(v, configs[0].block_v),
                              _num_sms(hidden.device), min_splits=triton.cdiv(v, SPLIT_COLUMNS))
    align = max(c.block_v for c in configs)  # a split is whole tiles for every config in the list
    v_per_split = triton.cdiv(triton.cdiv(v, splits), align) * align
    splits = triton.cdiv(v, v_per_split)
    part = torch.empty(3, splits, n, dtype=torch.float32, device=hidden.device)
    kernel[lambda cfg: (triton.cdiv(n, cfg["BLOCK_N"]) * splits,)](
        hidden, weight, part, n, v, h, v_per_split, splits, hidden.stride(0), weight.stride(0), 1.0 / temperature,
        UPCAST_DOT=_INTERPRETER, **meta)
    _logprob_gather_combine_kernel[(triton.cdiv(n, COMBINE_BLOCK_N),)](
        part, hidden, weight, targets, logp, lse, ent, n, v, h, splits, hidden.stride(0), weight.stride(0),
        1.0 / temperature, BLOCK_N=COMBINE_BLOCK_N, BLOCK_H=COMBINE_BLOCK_H, num_warps=COMBINE_NUM_WARPS)
    return logp, lse, ent


def logprob_gather_forward_chunked(hidden, weight, targets, temperature: float, chunk_rows: int):
    """Chunked forward: (logp, lse, entropy), each [N] fp32, with one fp32 [chunk_rows, V] buffer of logits
    (cuBLAS) reduced row by row by a Triton kernel."""
    n, v = hidden.shape[0], weight.shape[0]
    logp, lse, ent = _empty_outputs(n, hidden.device)
    buf = lm.logit_buffer(min(chunk_rows, n) * v, hidden.device)
    for r0 in range(0, n, chunk_rows):
        r1 = min(n, r0 + chunk_rows)
        z = lm.logits_into(buf, hidden[r0:r1], weight)
        _logprob_rows_kernel[(r1 - r0,)](z, targets[r0:r1], logp[r0:r1], lse[r0:r1], ent[r0:r1], v, z.stride(0),
                                         1.0 / temperature, BLOCK_V=lm.ROW_BLOCK_V, num_warps=lm.ROW_NUM_WARPS)
    return logp, lse, ent

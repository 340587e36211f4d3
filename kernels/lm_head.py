"""The LM-head products shared by the chunked and vocabulary-blocked paths: fp32 logits on cuBLAS into one reused
buffer, the logit gradient written in place over them by a Triton kernel, and the two gradient products.

For rows h (a chunk of tokens), LM-head rows W (the vocabulary or a block of it), and per row the log-sum-exp lse,
the upstream gradient g = d loss / d logp and the target y:

    z = h W^T                                        cuBLAS, fp32 out (fp32 accumulation; no 16-bit logits)
    G = (g / tau) (onehot(y) - exp(z / tau - lse))   Triton, written over z in the inputs' dtype
    d hidden = G W,   d W = G^T h                    cuBLAS (fp32 accumulation inside each product)

The buffer holds z or G, never both: in 16 bits, row r of G (2 bytes a column) is stored at the start of row r of z
(4 bytes a column), and a row is converted front to back, so a store only overwrites logits that are already read.
Only the first block's stores overlap its own loads; a barrier separates them. The gradient products read G as a
strided matrix (leading dimension 2 x columns), so there is no copy.

Two ways to walk [N, V] (memory: one buffer of ``budget`` bytes, never [N, V]):
- by row chunks (:func:`grads_by_row_chunks`): d hidden of a chunk is complete in one product; d W accumulates over
  chunks, in the weight's dtype or in fp32 (``head_grad_dtype``);
- by vocabulary blocks (:func:`grads_by_vocab_blocks`): d W of a block is complete in one product (fp32 inside
  cuBLAS, rounded once); d hidden accumulates over blocks in fp32 ([N, H], small when N is).
"""

from __future__ import annotations

import functools

import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

# Launch of the row kernels (the logit gradient here, the epilogues in logprob_gather.py and
# ppo_loss_from_hidden.py): one program per row, 8 columns per thread; checked by kernels/compile_check.py.
ROW_BLOCK_V, ROW_NUM_WARPS = 2048, 8
# Rows of an fp32 accumulator per product when this torch's addmm cannot add 16-bit products into it directly.
ACC_SLICE_BYTES = 64 << 20


def logit_buffer(numel: int, device: torch.device) -> torch.Tensor:
    """The flat fp32 buffer that a chunk's logits, then their gradient, live in."""
    return torch.empty(numel, dtype=torch.float32, device=device)


def _mm_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b in fp32 from 16-bit operands (the CPU has no mixed-dtype mm: tests only)."""
    return torch.mm(a, b, out_dtype=torch.float32) if a.is_cuda else a.float() @ b.float()


@functools.cache
def _addmm_takes_fp32_accumulator(device: torch.device) -> bool:
    """Whether this torch's addmm(out_dtype=fp32) adds 16-bit products into an fp32 accumulator (recent releases);
    earlier ones with the same API require the accumulator in the operands' dtype."""
    acc, a = torch.zeros(1, 1, device=device), torch.zeros(1, 1, dtype=torch.bfloat16, device=device)
    try:
        torch.addmm(acc, a, a, out_dtype=torch.float32, out=acc)
    except RuntimeError:
        return False
    return True


def mm_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """out = a @ b with fp32 accumulation, stored in out's dtype (fp32 out from 16-bit inputs on cuBLAS)."""
    if out.dtype == a.dtype:
        return torch.mm(a, b, out=out)
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=out.dtype, out=out)
    return out.copy_(_mm_fp32(a, b))


def addmm_into(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """acc += a @ b: fp32 accumulation inside the product, one rounding to acc's dtype per call. An fp32
    accumulator of 16-bit products takes one cuBLAS call where torch allows it, else slices of ACC_SLICE_BYTES."""
    if acc.dtype == a.dtype:
        return acc.addmm_(a, b)
    if a.is_cuda and _addmm_takes_fp32_accumulator(a.device):
        return torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    rows = max(1, ACC_SLICE_BYTES // (4 * acc.shape[1]))
    for r0 in range(0, acc.shape[0], rows):
        acc[r0:r0 + rows] += _mm_fp32(a[r0:r0 + rows], b)
    return acc


def logits_into(buf: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """z = h w^T in fp32, [rows, cols] contiguous at the start of ``buf``."""
    z = buf[: h.shape[0] * w.shape[0]].view(h.shape[0], w.shape[0])
    return mm_into(z, h, w.T)


def grad_view(buf: torch.Tensor, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """G [rows, cols] in ``dtype`` over the same storage as :func:`logits_into`'s z (see the module docstring)."""
    if dtype == torch.float32:
        return buf[: rows * cols].view(rows, cols)
    per = 4 // torch.empty((), dtype=dtype).element_size()  # 16-bit: 2 elements per fp32 slot
    return buf[: rows * cols].view(dtype).view(rows, per * cols)[:, :cols]


if triton is not None:

    @triton.jit
    def row_softmax_stats(z_row_ptr, V, inv_temp, BLOCK_V: tl.constexpr):
        """(m, s, t) of one row of logits z / tau, online over blocks: the max, sum exp(z - m), sum exp(z - m) z."""
        m = float("-inf")
        s = 0.0
        t = 0.0
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            ok = cols < V
            z = tl.load(z_row_ptr + cols, mask=ok, other=float("-inf")) * inv_temp
            m_new = tl.maximum(m, tl.max(z, axis=0))
            scale = tl.exp(m - m_new)
            e = tl.exp(z - m_new)
            s = s * scale + tl.sum(e, axis=0)
            t = t * scale + tl.sum(e * tl.where(ok, z, 0.0), axis=0)
            m = m_new
        return m, s, t

    @triton.jit
    def row_logp(z_row_ptr, y, V, inv_temp, BLOCK_V: tl.constexpr):
        """(log-prob of target y, NaN outside [0, V); lse; entropy) of one row of logits z / tau."""
        m, s, t = row_softmax_stats(z_row_ptr, V, inv_temp, BLOCK_V)
        lse = m + tl.log(s)
        y_ok = (y >= 0) & (y < V)
        z_y = tl.load(z_row_ptr + y, mask=y_ok, other=0.0) * inv_temp
        return tl.where(y_ok, z_y - lse, float("nan")), lse, lse - t / s

    @triton.jit
    def _grad_block(z_row_ptr, cols, V, y, lse, gs, inv_temp):
        """One block of G = gs (onehot(y) - exp(z / tau - lse)) and its column mask."""
        ok = cols < V
        z = tl.load(z_row_ptr + cols, mask=ok, other=0.0)
        return gs * (tl.where(cols == y, 1.0, 0.0) - tl.exp(z * inv_temp - lse)), ok

    @triton.jit
    def write_row_grad(z_row_ptr, g_row_ptr, V, y, lse, gs, inv_temp, BLOCK_V: tl.constexpr):
        """G of one row, front to back, over its logits (``g_row_ptr``: the same row start, in G's dtype)."""
        cols = tl.arange(0, BLOCK_V)
        grad, ok = _grad_block(z_row_ptr, cols, V, y, lse, gs, inv_temp)
        tl.debug_barrier()  # 16-bit G: this block's stores overlap its own loads (by other threads)
        tl.store(g_row_ptr + cols, grad.to(g_row_ptr.dtype.element_ty), mask=ok)
        for v0 in range(BLOCK_V, V, BLOCK_V):
            grad, ok = _grad_block(z_row_ptr, v0 + cols, V, y, lse, gs, inv_temp)
            tl.store(g_row_ptr + v0 + cols, grad.to(g_row_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def _logit_grad_kernel(
        z_ptr,  # [C, VB] fp32 in: logits h W_b^T (unscaled), row stride stride_zn
        gz_ptr,  # the same storage in G's dtype, row stride stride_gn: G out
        lse_ptr,  # [C] fp32
        g_ptr,  # [C] fp32 upstream gradient of logp
        y_ptr,  # [C] int64 targets
        VB,
        v0,  # first vocabulary row of the block (targets are absolute)
        stride_zn,
        stride_gn,
        inv_temp,
        BLOCK_V: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        y = tl.load(y_ptr + row) - v0
        gs = tl.load(g_ptr + row) * inv_temp
        write_row_grad(z_ptr + row * stride_zn, gz_ptr + row * stride_gn, VB, y, tl.load(lse_ptr + row), gs,
                       inv_temp, BLOCK_V)


def write_logit_grad(buf: torch.Tensor, z: torch.Tensor, lse: torch.Tensor, g: torch.Tensor, targets: torch.Tensor,
                     v0: int, temperature: float, dtype: torch.dtype) -> torch.Tensor:
    """G over z (rows of ``buf``) for vocabulary rows [v0, v0 + z.shape[1]): the [rows, cols] view in ``dtype``."""
    rows, cols = z.shape
    grad = grad_view(buf, rows, cols, dtype)
    if rows:
        _logit_grad_kernel[(rows,)](z, grad, lse, g, targets, cols, v0, z.stride(0), grad.stride(0),
                                    1.0 / temperature, BLOCK_V=ROW_BLOCK_V, num_warps=ROW_NUM_WARPS)
    return grad


def grad_products(grad: torch.Tensor, w: torch.Tensor, h: torch.Tensor, grad_h_out: torch.Tensor,
                  grad_w_acc: torch.Tensor | None) -> None:
    """Row-chunk products: grad_h_out = G w (complete for these rows), grad_w_acc += G^T h."""
    mm_into(grad_h_out, grad, w)
    if grad_w_acc is not None:
        addmm_into(grad_w_acc, grad.T, h)


def grads_by_row_chunks(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor,
                        g: torch.Tensor, temperature: float, chunk_rows: int, *,
                        head_grad_dtype: torch.dtype | None = None,
                        need_weight_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(d hidden, d weight or None) for upstream ``g``, recomputing logits chunk by chunk: 3 products a chunk.
    ``head_grad_dtype``: the dtype d weight accumulates in across chunks (default: the weight's)."""
    n, v = hidden.shape[0], weight.shape[0]
    grad_h = torch.empty_like(hidden)
    grad_w = torch.zeros(weight.shape, dtype=head_grad_dtype or weight.dtype, device=weight.device) \
        if need_weight_grad else None
    buf = logit_buffer(min(chunk_rows, n) * v, hidden.device)
    for r0 in range(0, n, chunk_rows):
        r1 = min(n, r0 + chunk_rows)
        z = logits_into(buf, hidden[r0:r1], weight)
        grad = write_logit_grad(buf, z, lse[r0:r1], g[r0:r1], targets[r0:r1], 0, temperature, hidden.dtype)
        grad_products(grad, weight, hidden[r0:r1], grad_h[r0:r1], grad_w)
    return grad_h, None if grad_w is None else grad_w.to(weight.dtype)


def grads_by_vocab_blocks(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor,
                          g: torch.Tensor, temperature: float, block_cols: int, *,
                          need_weight_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(d hidden, d weight or None) for upstream ``g``, recomputing logits block by block of the vocabulary:
    3 products a block; d weight of a block is written once, d hidden accumulates in fp32."""
    n, v = hidden.shape[0], weight.shape[0]
    grad_h = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    grad_w = torch.empty_like(weight) if need_weight_grad else None
    buf = logit_buffer(n * min(block_cols, v), hidden.device)
    for v0 in range(0, v, block_cols):
        v1 = min(v, v0 + block_cols)
        z = logits_into(buf, hidden, weight[v0:v1])
        grad = write_logit_grad(buf, z, lse, g, targets, v0, temperature, hidden.dtype)
        addmm_into(grad_h, grad, weight[v0:v1])
        if grad_w is not None:
            mm_into(grad_w[v0:v1], grad.T, hidden)
    return grad_h.to(hidden.dtype), grad_w

"""Which CUDA path the dispatcher takes for the two LM-head ops, and how much memory a chunk gets.

Memory budget (bytes for one fp32 buffer of logits): twice the hidden states' bytes (Liger-Kernel sizes its logit
chunks to about the hidden states' size), at least 32 MiB, and at most half of the free device memory (the driver's
free memory plus PyTorch's cached, unallocated blocks). A row chunk gets budget / (4 V) rows; a vocabulary block
budget / (4 N) columns (rounded down to a multiple of 128).

Path: a cost model of each path's matmuls (max of compute and traffic, per product) and of its passes over the logits
(fp32 written, read, and G written over them) on the machine's measured matmul rate and bandwidth; the cheaper path
is taken, and both estimates are kept in the :class:`Plan` for the metrics and the benchmark:

- fused: the Triton forward at ``fused_efficiency`` of the matmul rate, no logits in memory; gradients (when needed)
  by vocabulary blocks [N, block]: one more product than chunked, d hidden accumulated in fp32 per block.
- chunked: cuBLAS logits per row chunk plus their fp32 round trip (8 bytes a logit in the forward, 12-14 with the
  gradient); gradients by the same row chunks, d W read and written once per chunk.

At small H the round trip costs as much as a large part of the matmul (2H FLOPs a logit), so the fused forward
wins; at large N with gradients, chunks are large and the extra product of the vocabulary blocks loses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from actfirst.kernels.logprob_gather import arch_of

PATHS = ("fused", "chunked")
MIN_BUDGET_BYTES = 32 << 20
BUDGET_PER_HIDDEN_BYTE = 2


@dataclass(frozen=True)
class Machine:
    """What the cost model knows about a GPU architecture."""

    matmul_flops: float  # dense 16-bit matmul, FLOP/s
    bandwidth: float  # device copy, bytes/s counting read and write
    fused_efficiency: float  # the fused Triton forward's rate against matmul_flops


# sm_90: the H200's 4096^3 bf16 matmul and 256 MiB copy (bench/RESULTS.md, "H200 (device check)"). sm_80: A100
# datasheet (312 TFLOP/s, 2.0 TB/s) x 0.8, not measured. fused_efficiency: 0.7 is an assumption until the device
# check measures the new kernel (the old one reached 0.50-0.54 of the matmul at N = 65,536, Cut Cross-Entropy's
# fused kernels 0.64-0.77).
MACHINES = {90: Machine(717.9e12, 3746.8e9, 0.70), 80: Machine(250e12, 1.6e12, 0.70)}


@dataclass(frozen=True)
class Plan:
    """One dispatch decision, as :func:`actfirst.kernels.dispatch.last_path` reports it."""

    path: str  # "fused" or "chunked" on CUDA (and the interpreter); "native" or "torch" elsewhere
    chunk_rows: int = 0  # chunked: rows per chunk
    vocab_block: int = 0  # fused with gradients: vocabulary columns per block (native: its vocabulary tile)
    budget_bytes: int = 0  # the memory budget the sizes come from
    estimate_ms: dict[str, float] = field(default_factory=dict)  # the cost model's time per path


@dataclass(frozen=True)
class _Shape:
    n: int
    h: int
    v: int
    e: int  # bytes per input element


def free_device_bytes(device: torch.device) -> int | None:
    """Memory a new buffer can take on a CUDA device: the driver's free memory plus PyTorch's cached, unallocated
    blocks. None off CUDA."""
    if device.type != "cuda":
        return None
    free = torch.cuda.mem_get_info(device)[0]
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def memory_budget(hidden: torch.Tensor, chunk_bytes: int | None = None) -> int:
    """Bytes for one fp32 buffer of logits (see the module docstring); ``chunk_bytes`` overrides it."""
    if chunk_bytes is not None:
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes={chunk_bytes!r}: must be >= 1")
        return chunk_bytes
    want = max(MIN_BUDGET_BYTES, BUDGET_PER_HIDDEN_BYTE * hidden.numel() * hidden.element_size())
    free = free_device_bytes(hidden.device)
    return max(1, want if free is None else min(want, free // 2))


def _gemm_s(m: float, n: float, k: float, io_bytes: float, mc: Machine) -> float:
    return max(2.0 * m * n * k / mc.matmul_flops, io_bytes / mc.bandwidth)


def _logits_s(s: _Shape, rows: float, cols: float, mc: Machine) -> float:
    """[rows, cols] fp32 logits on cuBLAS."""
    return _gemm_s(rows, cols, s.h, s.e * (rows + cols) * s.h + 4 * rows * cols, mc)


def _row_products_s(s: _Shape, c: float, acc_bytes: int, mc: Machine) -> float:
    """d hidden of a chunk of c rows, and G^T h added into d W (read and written in acc_bytes)."""
    return (_gemm_s(c, s.h, s.v, s.e * (c * s.v + s.v * s.h + c * s.h), mc)
            + _gemm_s(s.v, s.h, c, s.e * (c * s.v + c * s.h) + 2 * acc_bytes * s.v * s.h, mc))


def _estimates_s(s: _Shape, c: int, b: int, need_grad: bool, single_pass: bool, acc_bytes: int,
                 mc: Machine) -> dict[str, float]:
    """Seconds per path. ``single_pass``: the chunked path forms the gradient in its forward (op 3)."""
    chunks, blocks = s.n / c, s.v / b
    fused = 2.0 * s.n * s.v * s.h / (mc.matmul_flops * mc.fused_efficiency)
    chunked = chunks * (_logits_s(s, c, s.v, mc) + 4 * c * s.v / mc.bandwidth)
    if need_grad:
        fused += blocks * (_logits_s(s, s.n, b, mc) + (4 + s.e) * s.n * b / mc.bandwidth
                           + _gemm_s(s.n, s.h, b, s.e * (s.n * b + b * s.h) + 8 * s.n * s.h, mc)
                           + _gemm_s(b, s.h, s.n, s.e * (s.n * b + s.n * s.h + b * s.h), mc))
        # One pass: the epilogue reads the logits a second time and writes G; recomputing: the logits again.
        again = (4 + s.e) * c * s.v / mc.bandwidth + (0 if single_pass else _logits_s(s, c, s.v, mc))
        chunked += chunks * (again + _row_products_s(s, c, acc_bytes, mc))
    return {"fused": fused, "chunked": chunked}


def cheapest(estimates: dict[str, float]) -> str:
    """The path with the lowest estimate; ties go to fused, the one with less memory."""
    return min(PATHS, key=estimates.__getitem__)


def plan(hidden: torch.Tensor, weight: torch.Tensor, *, need_grad: bool, single_pass: bool = False,
         path: str | None = None, chunk_bytes: int | None = None,
         head_grad_dtype: torch.dtype | None = None) -> Plan:
    """The CUDA path and sizes for hidden [N, H] and weight [V, H]; ``path`` forces the path (sizes still from the
    budget). ``single_pass``: op 3's chunked path (gradients in the forward); ``head_grad_dtype``: d W's
    accumulation dtype in the chunked path."""
    if path is not None and path not in PATHS:
        raise ValueError(f"path={path!r}: must be one of {PATHS}")
    n, h = hidden.shape
    v = weight.shape[0]
    budget = memory_budget(hidden, chunk_bytes)
    chunk_rows = max(1, min(n, budget // (4 * v)))
    block = max(1, min(v, budget // (4 * max(n, 1))))
    block = block // 128 * 128 if block >= 128 else block
    arch = arch_of(torch.cuda.get_device_capability(hidden.device)) if hidden.is_cuda else 90
    acc_bytes = torch.empty((), dtype=head_grad_dtype or weight.dtype).element_size()
    seconds = _estimates_s(_Shape(max(n, 1), h, v, hidden.element_size()), chunk_rows, block, need_grad,
                           single_pass, acc_bytes, MACHINES[arch])
    chosen = path or cheapest(seconds)
    return Plan(chosen, chunk_rows=chunk_rows, vocab_block=block if need_grad else 0, budget_bytes=budget,
                estimate_ms={p: 1e3 * t for p, t in seconds.items()})

"""The student's new weights into this rank's own engine, in this process: no broadcast group, no files.

Every rank walks the parameters in the same order and gathers each full tensor from the shards (an all-gather of
the shard already cast to the engine's dtype, so the traffic is the engine's bytes), a bucket at a time: at most
``bucket_bytes`` of gathered tensors exist at once (a single larger parameter is gathered alone). The engine loads
them as they come (vLLM's ``reload_weights`` consumes the iterator layer by layer).

On a hybrid mesh (``parallel.mesh``) every node holds a whole replica, so the gather stays inside the node: each
parameter is ``(Replicate, Shard(0))`` and ``full_tensor`` all-gathers over the ``shard`` dimension only.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from actfirst.parallel.fsdp import full_tensor


def gathered_parameters(model: nn.Module, *, dtype: torch.dtype, bucket_bytes: int,
                        device: torch.device | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` for every parameter of ``model`` (Hugging Face names; tied weights once), cast to
    ``dtype`` and moved to ``device`` (default: where it was gathered), gathered ``bucket_bytes`` at a time.

    A collective on a sharded model: every rank must consume the whole iterator."""
    params = list(model.named_parameters())
    for bucket in plan_buckets([p.numel() * dtype.itemsize for _, p in params], bucket_bytes):
        yield from _gather([params[i] for i in bucket], dtype, device)


def plan_buckets(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Consecutive indices of ``sizes`` grouped so that no group exceeds ``bucket_bytes`` (a larger item alone)."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes={bucket_bytes!r}: must be >= 1")
    buckets: list[list[int]] = []
    total = 0
    for i, size in enumerate(sizes):
        if not buckets or total + size > bucket_bytes:
            buckets.append([])
            total = 0
        buckets[-1].append(i)
        total += size
    return buckets


def _gather(bucket: list[tuple[str, nn.Parameter]], dtype: torch.dtype,
            device: torch.device | None) -> Iterator[tuple[str, torch.Tensor]]:
    with torch.no_grad():
        tensors = [(name, full_tensor(param.detach().to(dtype))) for name, param in bucket]
    for name, tensor in tensors:
        yield name, tensor if device is None else tensor.to(device)

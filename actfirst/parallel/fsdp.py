"""FSDP2 (``torch.distributed.fsdp.fully_shard``) applied as a plain function, torchtitan's way.

Each transformer block is its own FSDP unit and the root takes the rest (embeddings, final norm, LM head), so a
forward all-gathers one block at a time and frees it after (``reshard_after_forward``). The parameters stay in
their loaded dtype, sharded over the ranks: for the student float32, the master weights that AdamW's state follows.
``param_dtype`` is the compute dtype: each unit's all-gathered copy is cast to it for the forward and the backward,
and gradients are reduce-scattered in ``reduce_dtype`` into float32 shards.

On a 2-D mesh ``("replicate", "shard")`` (``parallel.mesh: hybrid``, one replica per node) ``fully_shard`` is HSDP:
a unit's all-gather and its gradient reduce-scatter run over the ``shard`` dimension (the ranks of one node), and the
reduced gradient shard is then all-reduced over ``replicate`` (the same shard on every node), the only traffic that
crosses nodes.

Gradients are summed over ranks, not averaged: the student's loss is already normalized by the global batch (Eq. 32:
1/|B| over every rank's samples), so each rank's gradient is its share of the whole and the sum is the gradient of
the global loss (what a one-rank update on the same batch computes).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor


def apply_fsdp(root: nn.Module, blocks: Sequence[nn.Module], mesh: DeviceMesh, *,
               param_dtype: torch.dtype | None = None, reduce_dtype: torch.dtype = torch.float32) -> nn.Module:
    """Shard ``root`` over ``mesh`` (1-D: over every rank; 2-D ``(replicate, shard)``: within each replica, HSDP):
    every module of ``blocks`` (the transformer layers, inside ``root``) its own FSDP unit, the remaining parameters
    the root's; compute in ``param_dtype`` (None: the parameters' own dtype). Gradient reduction sums over ranks
    (over both dimensions of a 2-D mesh). Returns ``root`` (now an ``FSDPModule``)."""
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(root, mesh=mesh, mp_policy=policy)
    gloo = dist.get_backend(mesh.get_group(mesh.ndim - 1)) == "gloo"
    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            if gloo:  # gloo has no pre-multiplied sum (NCCL's PreMulSum): a plain SUM then
                module.set_force_sum_reduction_for_comms(True)
    return root


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a sharded (DTensor) parameter or gradient, gathered on every rank (a collective: every
    rank must call it, in the same order); a plain tensor as it is.

    Only the mesh dimensions whose placement is not ``Replicate`` communicate (DTensor's redistribute makes a step per
    changed dimension): a hybrid mesh's ``(Replicate, Shard(0))`` parameter is all-gathered over ``shard`` alone,
    inside a node."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def total_grad_norm(params: Sequence[nn.Parameter]) -> torch.Tensor:
    """The L2 norm of every parameter's gradient over all ranks (sharded gradients included), as a plain tensor."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return full_tensor(torch.nn.utils.get_total_norm(grads, norm_type=2.0))

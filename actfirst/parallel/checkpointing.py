"""Activation checkpointing per decoder block (``parallel.activation_checkpointing``), applied as a plain function.

A checkpointed block keeps only its input from the forward; the backward runs the block's forward again to get
what its own backward needs. The student's saved activations shrink from every block's to one block's at a time
(plus each block's input), for about one more forward per backward.

Each block gets torch's non-reentrant checkpoint before ``fully_shard`` (torchtitan applies its checkpoint wrapper,
then FSDP2, in the same order): FSDP2's pre-backward hook then all-gathers the block once for both the recompute and
its backward. The checkpoint is torch's composable one (hooks on the block, ``torch.distributed._composable``), not
``checkpoint_wrapper``: a wrapper module would put ``_checkpoint_wrapped_module.`` into every block parameter's name
as the model's ``named_parameters()`` walks it, the names that weight sync hands vLLM and ``save_pretrained`` writes.
Here the blocks stay the same modules under the same names.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn
from torch.distributed._composable import checkpoint
from torch.distributed.fsdp import FSDPModule


def apply_activation_checkpointing(model: nn.Module, blocks: Sequence[nn.Module]) -> nn.Module:
    """Recompute each module of ``blocks`` (the decoder layers, inside ``model``) in the backward instead of keeping
    its activations. Call it before :func:`actfirst.parallel.fsdp.apply_fsdp`. Returns ``model``."""
    inside = {id(m) for m in model.modules()}
    for i, block in enumerate(blocks):
        if id(block) not in inside:
            raise ValueError(f"block {i} ({type(block).__name__}) is not a module of the model given")
        if isinstance(block, FSDPModule):
            raise ValueError(f"block {i} is already sharded: apply activation checkpointing before fully_shard")
        checkpoint(block)
    return model

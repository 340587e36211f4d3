"""A causal LM whose forward ends in an op on its final hidden states and its LM-head weight, never in logits.

The fused ops (``actfirst.kernels.dispatch``) take the final hidden states and the head's weight and never form
[tokens x vocab] logits. Under FSDP2 the head (and the embeddings it may be tied to) belongs to the root unit,
whose parameters are whole only inside the root's forward: so the root is this module, and the op runs inside
its forward. The same module serves the student's loss, the train-inference mismatch and the teacher's scores.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from actfirst.models.loading import empty_model, load_weights
from actfirst.parallel.checkpointing import apply_activation_checkpointing
from actfirst.parallel.fsdp import apply_fsdp
from actfirst.train.packing import Layout, MicroBatch, final_hidden, layout_for

HeadOp = Callable[[torch.Tensor, torch.Tensor], Any]
"""``op(hidden [N, H], head weight [V, H])``: what a forward computes from the states that score its tokens."""


class LMHeadModel(nn.Module):
    """Wraps a Hugging Face causal LM (``model.model`` its decoder, ``model.model.layers`` its blocks)."""

    def __init__(self, model: nn.Module, layout: Layout | None = None) -> None:
        """``layout``: how its micro-batches are laid out (None: what the model's attention implementation calls for,
        ``packing.layout_for``)."""
        super().__init__()
        self.model = model
        self._layout = layout

    @property
    def layout(self) -> Layout:
        """The layout :func:`actfirst.train.packing.pack` gives this model's micro-batches."""
        return self._layout or layout_for(self.model.config._attn_implementation)

    @property
    def blocks(self) -> list[nn.Module]:
        """The transformer layers (one FSDP2 unit each)."""
        return list(self.model.model.layers)

    def forward(self, micro_batch: MicroBatch, op: HeadOp) -> Any:
        """``op`` on the final hidden states at ``micro_batch.positions`` and the LM-head weight."""
        return op(final_hidden(self.model, micro_batch), self.model.get_output_embeddings().weight)


def load_policy(model_dir: str | os.PathLike, *, mesh: Any, device: torch.device, compute_dtype: torch.dtype,
                attention: str | None = None, activation_checkpointing: bool = False,
                layout: Layout | None = None) -> LMHeadModel:
    """A trainable causal LM from ``model_dir`` as every trainer builds one: float32 master weights on the meta
    device, attention ``attention`` (an implementation name; None: as the config says), train mode, activation
    checkpointing per block (``actfirst.parallel.checkpointing``: before FSDP2), FSDP2 over ``mesh`` computing in
    ``compute_dtype``, then this rank's shard of the weights read onto ``device``. ``layout``: its micro-batches'
    (None: what its attention calls for)."""
    model = empty_model(model_dir, torch.float32)
    if attention is not None:
        model.set_attn_implementation(attention)
    model.train()
    policy = LMHeadModel(model, layout)
    if activation_checkpointing:
        apply_activation_checkpointing(policy, policy.blocks)
    apply_fsdp(policy, policy.blocks, mesh, param_dtype=compute_dtype)
    load_weights(model, model_dir, device)  # this rank's shard only, from the safetensors files
    return policy

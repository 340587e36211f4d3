"""A training checkpoint across ranks, written in one :func:`~actfirst.train.checkpoint.checkpoint_transaction`.

    update_000012/  config.json, model.safetensors, tokenizer files   the full student (float32), by rank 0: a
                                                                       Hugging Face directory vLLM and transformers
                                                                       load as is; every rank starts from it
                    optimizer/                                         AdamW's sharded state, a
                                                                       ``torch.distributed.checkpoint`` (DCP)
                    trainer_state.pt                                   rank 0: config, update, schedule, counters
                    rank_00000.pt, rank_00001.pt, ...                  each rank's buffer, task order, probe
                                                                       contexts, batch index and RNG states
                    checkpoint.json                                    written last (the commit)

DCP reshards the optimizer's state on load, so a run resumes on any number of ranks. On the same number every rank
takes back its own state exactly; on another number the buffered samples and probe contexts of all ranks are pooled
and dealt out again (rank r takes every R-th), the task order of each rank starts afresh from a seed derived from
(seed, rank, update), the rollout-batch counter continues from the largest, and Appendix F's metric window restarts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

from actfirst.parallel.context import ParallelContext
from actfirst.parallel.weight_sync import gathered_parameters
from actfirst.train.checkpoint import (
    TRAINER_STATE,
    CheckpointError,
    checkpoint_transaction,
    load_checkpoint,
    save_plain,
)
from actfirst.train.head import LMHeadModel

OPTIMIZER_DIR = "optimizer"
_GATHER_BYTES = 1 << 30
"""The full student is gathered for the Hugging Face files 1 GiB at a time."""


def rank_file(rank: int) -> str:
    """The name of a rank's own state in a checkpoint."""
    return f"rank_{rank:05d}.pt"


def save_training_checkpoint(out_dir: str | Path, *, update: int, keep: int, ctx: ParallelContext,
                             policy: LMHeadModel, optimizer: torch.optim.Optimizer, tokenizer: Any,
                             trainer_state: dict[str, Any], rank_state: dict[str, Any],
                             keep_best: bool = False) -> None:
    """Every rank calls it (see the module docstring); ``trainer_state`` is used on rank 0 only; ``keep``,
    ``keep_best``: which checkpoints stay (``checkpoint_transaction``). Raises ``CheckpointError`` on every rank when
    any part could not be written (the previous checkpoint stays)."""
    contents = {"world_size": ctx.world_size, "trainer_state": sorted(trainer_state)}
    with checkpoint_transaction(out_dir, update=update, keep=keep, keep_best=keep_best, contents=contents) as tmp:
        # The collectives first: a rank whose own write fails below meets the others in the transaction's verdict.
        (tmp / OPTIMIZER_DIR).mkdir(exist_ok=True)
        dcp.save({"optimizer": get_optimizer_state_dict(policy, optimizer)}, checkpoint_id=str(tmp / OPTIMIZER_DIR))
        full = {}
        for name, tensor in gathered_parameters(policy.model, dtype=torch.float32, bucket_bytes=_GATHER_BYTES):
            if ctx.lead:  # only rank 0 keeps the whole student (in host memory)
                full[name] = tensor.cpu()
        save_plain(tmp / rank_file(ctx.rank), rank_state)
        if ctx.lead:
            policy.model.save_pretrained(tmp, state_dict=full, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            save_plain(tmp / TRAINER_STATE, {**trainer_state, "update": update, "world_size": ctx.world_size})


def load_training_checkpoint(path: str | Path, *, ctx: ParallelContext, policy: LMHeadModel,
                             optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Load the optimizer's state into ``optimizer`` (resharded to this job's ranks; every rank calls it) and return
    (the trainer state, the rank states): this rank's own one when the world size is unchanged, else every saved
    rank's in rank order. The student's weights come from ``path`` itself (``from_pretrained``)."""
    path = Path(path)
    trainer_state = load_checkpoint(path)
    if "world_size" not in trainer_state or not (path / OPTIMIZER_DIR).is_dir():
        raise CheckpointError(f"{path}: written by a single-process trainer of an earlier version (no {OPTIMIZER_DIR}/ "
                              f"and no rank states); its model loads as student.model=... for a new run")
    state = {"optimizer": get_optimizer_state_dict(policy, optimizer)}
    dcp.load(state, checkpoint_id=str(path / OPTIMIZER_DIR))
    set_optimizer_state_dict(policy, optimizer, state["optimizer"])
    saved = int(trainer_state["world_size"])
    ranks = [ctx.rank] if saved == ctx.world_size else range(saved)  # (the caller compares the world sizes too)
    return trainer_state, [torch.load(path / rank_file(r), map_location="cpu", weights_only=True) for r in ranks]

"""One rank of ``python -m actfirst.make_teacher``: the SFT loop of ``actfirst.teacher.sft`` under FSDP2, its
checkpoints, its progress line and the published teacher (the layout and the arithmetic: that module's docstring).

The loss of an optimizer step is the mean negative log-likelihood of every response token of its samples on all
ranks, computed from the final hidden states by ``actfirst.kernels.dispatch.logprob_gather`` (no [tokens x vocab]
logits: Qwen3's vocabulary is 151,936).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any

import torch

from actfirst.core.schema import to_dict
from actfirst.kernels.dispatch import logprob_gather
from actfirst.parallel.context import ParallelContext, broadcast_object, init_parallel, reduce_sum
from actfirst.parallel.fsdp import total_grad_norm
from actfirst.teacher.data import Examples
from actfirst.teacher.sft import (
    DATA,
    EXAMPLES,
    TeacherSFTConfig,
    batch_plan,
    compute_dtype,
    ensure_examples,
    publish,
    rank_share,
    wait_for,
)
from actfirst.train.checkpoint import latest_checkpoint
from actfirst.train.head import load_policy
from actfirst.train.packing import MicroBatch, pack, pad_across_ranks
from actfirst.train.state import load_training_checkpoint, save_training_checkpoint
from actfirst.train.student import learning_rate

logger = logging.getLogger(__name__)


@dataclasses.dataclass(slots=True)
class Progress:
    """Where the run is: the optimizer steps done, their losses, the probe NLL before training."""

    step: int = 0
    losses: list[float] = dataclasses.field(default_factory=list)
    initial_nll: float | None = None

    def state(self) -> dict[str, Any]:
        return {"step": self.step, "losses": list(self.losses), "initial_nll": self.initial_nll}


class TeacherTrainer:
    """This rank's model shard, optimizer and data plan."""

    def __init__(self, cfg: TeacherSFTConfig, ctx: ParallelContext, examples: Examples) -> None:
        from transformers import AutoTokenizer

        self.cfg, self.ctx, self.examples = cfg, ctx, examples
        self.plan = batch_plan(examples.lengths, batch_tokens=cfg.batch_tokens, epochs=cfg.epochs, seed=cfg.seed)
        self.checkpoint = broadcast_object(latest_checkpoint(cfg.work_dir) if ctx.lead else None)  # one for all
        source = self.checkpoint or cfg.base_model
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.base_model)
        self.policy = load_policy(source, mesh=ctx.mesh, device=ctx.device,
                                  compute_dtype=compute_dtype(cfg, ctx.device),
                                  activation_checkpointing=cfg.activation_checkpointing)
        self.params = [p for p in self.policy.parameters() if p.requires_grad]
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(self.params, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
        self.progress = Progress()
        if self.checkpoint is not None:
            state, _ = load_training_checkpoint(self.checkpoint, ctx=ctx, policy=self.policy, optimizer=self.optimizer)
            self.progress = Progress(int(state["step"]), [float(x) for x in state["losses"]], state["initial_nll"])
        n = len(examples)
        self.probe = [[i * n // cfg.probe_samples for i in range(cfg.probe_samples)]] if cfg.probe_samples else []

    def _micro_batches(self, indices: list[int]) -> list[MicroBatch]:
        samples = [self.examples.sample(i) for i in indices]
        micro_batches = pack(samples, self.cfg.micro_batch_tokens, self.policy.layout)
        return [mb.to(self.ctx.device) for mb in pad_across_ranks(micro_batches)]

    def _nll_sum(self, indices: list[int], scale: float) -> float:
        """This rank's share of ``indices``: forward (and backward, with gradients on) of -sum log p / ``scale``."""
        total = 0.0
        share = rank_share(indices, self.examples.lengths, self.ctx.rank, self.ctx.world_size)
        for mb in self._micro_batches(share):
            logp = self.policy(mb, lambda hidden, weight, mb=mb: logprob_gather(hidden, weight, mb.targets)[0])
            loss = -(logp * mb.mask).sum() / scale
            if torch.is_grad_enabled():
                loss.backward()
            total += float(loss.detach())
        return total

    @torch.no_grad()
    def probe_nll(self) -> float | None:
        """The mean token NLL of the probe samples (every rank gets the same figure)."""
        if not self.probe:
            return None
        indices = self.probe[0]
        tokens = sum(self.examples.response_lengths[i] for i in indices)
        return reduce_sum([self._nll_sum(indices, tokens)])[0]

    def step(self) -> tuple[float, float]:
        """One optimizer step of the plan; returns (its loss over all ranks, the gradient norm before clipping)."""
        cfg, (_, indices) = self.cfg, self.plan[self.progress.step]
        lr = learning_rate(cfg.optim, self.progress.step, len(self.plan))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        tokens = sum(self.examples.response_lengths[i] for i in indices)
        loss = reduce_sum([self._nll_sum(indices, tokens)])[0]
        norm = total_grad_norm(self.params)
        if cfg.optim.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(self.params, cfg.optim.grad_clip, norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.progress.step += 1
        self.progress.losses.append(loss)
        return loss, float(norm)

    def save(self) -> None:
        """A checkpoint of the model, the optimizer and the data position (every rank calls it)."""
        save_training_checkpoint(self.cfg.work_dir, update=self.progress.step, keep=1, ctx=self.ctx,
                                 policy=self.policy, optimizer=self.optimizer, tokenizer=self.tokenizer,
                                 trainer_state=self.progress.state(), rank_state={})

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """The whole model's float32 parameters, on rank 0 (a collective; other ranks get an empty dict)."""
        from actfirst.parallel.weight_sync import gathered_parameters

        full = {}
        for name, tensor in gathered_parameters(self.policy.model, dtype=torch.float32, bucket_bytes=1 << 30):
            if self.ctx.lead:
                full[name] = tensor.cpu()
        return full


def train_rank(cfg: TeacherSFTConfig) -> int:
    """This rank's part of the run (see the module docstring); returns the exit status."""
    from actfirst.parallel.context import shutdown_parallel

    ctx = init_parallel()
    try:
        path = ensure_examples(cfg) if ctx.lead else cfg.work_dir / EXAMPLES
        wait_for(path)
        trainer = TeacherTrainer(cfg, ctx, Examples(path))
        _loop(trainer)
        final_nll = trainer.probe_nll()
        full = trainer.full_parameters()
        if ctx.lead:
            out = publish(cfg, trainer.policy.model, trainer.tokenizer, full, _record(trainer, final_nll))
            logger.info(f"[make_teacher] done: {out} (probe NLL {trainer.progress.initial_nll} -> {final_nll})")
    finally:
        shutdown_parallel()
    return 0


def _loop(trainer: TeacherTrainer) -> None:
    cfg, p, total = trainer.cfg, trainer.progress, len(trainer.plan)
    if trainer.checkpoint is not None:
        logger.info(f"[make_teacher] resume: {trainer.checkpoint} (step {p.step}/{total}) on "
                    f"{trainer.ctx.world_size} rank(s)")
    else:
        p.initial_nll = trainer.probe_nll()
        logger.info(f"[make_teacher] {len(trainer.examples)} samples, {total} optimizer steps on "
                    f"{trainer.ctx.world_size} rank(s); probe NLL {p.initial_nll}")
    started, first = time.perf_counter(), p.step
    last_log = 0.0
    while p.step < total:
        loss, norm = trainer.step()
        now = time.perf_counter() - started
        if now - last_log >= 10 or p.step in (first + 1, total):
            last_log = now
            eta = now / (p.step - first) * (total - p.step)
            logger.info(f"[make_teacher] step {p.step}/{total} loss {loss:.4f} grad norm {norm:.3f} | {_clock(now)} "
                        f"elapsed, ETA {_clock(eta)}")
        if p.step % cfg.checkpoint_every == 0 and p.step < total:
            trainer.save()


def _record(trainer: TeacherTrainer, final_nll: float | None) -> dict[str, Any]:
    """What ``actfirst_teacher_sft.json`` holds: the config, the data, the losses per step and per epoch, the probe."""
    p, cfg = trainer.progress, trainer.cfg
    by_epoch: dict[int, list[float]] = {}
    for loss, (epoch, _) in zip(p.losses, trainer.plan, strict=False):
        by_epoch.setdefault(epoch, []).append(loss)
    return {"config": to_dict(cfg), "data": json.loads((cfg.work_dir / DATA).read_text()),
            "optimizer_steps": len(trainer.plan), "step_losses": p.losses,
            "epoch_losses": [sum(v) / len(v) for _, v in sorted(by_epoch.items())],
            "probe_nll": {"before": p.initial_nll, "after": final_nll, "samples": cfg.probe_samples},
            "world_size": trainer.ctx.world_size}


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"



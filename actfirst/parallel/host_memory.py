"""Host memory for the environment workers of a run on one node: every episode in flight has its own worker process
(``actfirst.envs.workers``), so a stage holds its episodes in flight times the benchmark's measured resident memory
per worker (``Benchmark.worker_mib``)::

    stages = run_worker_stages(cfg, nproc=8, preparing=True)
    for line in check_host_memory(stages):        # raises ConfigError when the node cannot hold a stage
        print(line)                                # a warning: more than is free now

The stages of ``python -m actfirst.run``: preparation's teacher rollouts (``scheduler.b_max`` episodes per rank at
most; only while the reference cache is still to be built), then training (each rank's share of
``rollout.batch_tasks``, ``rollout.tasks_per_rank`` where set; its evaluations reuse those workers).
``python -m actfirst.eval``: ``evaluation.max_in_flight`` per rank. The models, engines and the trainer's own
memory come on top.
"""

from __future__ import annotations

import dataclasses
import math

from actfirst.core.config import TrainConfig
from actfirst.core.user_input import ConfigError
from actfirst.envs.benchmarks import BENCHMARKS

MIB = 2**20


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerStage:
    """One stage's environment workers on the node."""

    what: str
    """The stage ("preparation: the teacher's rollouts")."""
    key: str
    """The config key that sizes it (``scheduler.b_max``)."""
    value: int
    """That key's value."""
    per_rank: int
    """Workers per rank."""
    ranks: int
    benchmark: str

    @property
    def workers(self) -> int:
        """Workers on the node."""
        return self.per_rank * self.ranks

    @property
    def gib(self) -> float | None:
        """Their host memory in GiB (None: the benchmark's worker was not measured)."""
        mib = BENCHMARKS[self.benchmark].worker_mib
        return None if mib is None else self.workers * mib / 1024

    def line(self) -> str:
        """``preparation: the teacher's rollouts: 2,048 alfworld workers (256 per rank x 8 ranks,
        scheduler.b_max=256) x 103 MiB = 206 GiB``."""
        mib = BENCHMARKS[self.benchmark].worker_mib
        size = f"x {mib} MiB = {self.gib:,.1f} GiB" if mib is not None else "(MiB per worker not measured)"
        return (f"{self.what}: {self.workers:,} {self.benchmark} workers ({self.per_rank} per rank x {self.ranks} "
                f"rank(s), {self.key}={self.value}) {size}")


def run_worker_stages(cfg: TrainConfig, nproc: int, *, preparing: bool) -> list[WorkerStage]:
    """The worker stages of a training run on ``nproc`` ranks of this node; ``preparing``: the teacher's rollouts of
    preparation are still to be played."""
    first = preparation_stage(cfg, nproc) if preparing else None
    return [first, training_stage(cfg, nproc)] if first is not None else [training_stage(cfg, nproc)]


def preparation_stage(cfg: TrainConfig, nproc: int) -> WorkerStage | None:
    """The workers of preparation's teacher rollouts (None: ``prepare.teacher_rollouts`` is 0): each rank's engine
    plays up to ``scheduler.b_max`` episodes at once."""
    if not cfg.prepare.teacher_rollouts:
        return None
    return WorkerStage("preparation: the teacher's rollouts", "scheduler.b_max", cfg.scheduler.b_max,
                       cfg.scheduler.b_max, nproc, cfg.benchmark)


def training_stage(cfg: TrainConfig, nproc: int) -> WorkerStage:
    """The workers of training: each rank's share of the rollout batch (its evaluations reuse them)."""
    if cfg.rollout.tasks_per_rank is not None:
        key, value, share = "rollout.tasks_per_rank", cfg.rollout.tasks_per_rank, cfg.rollout.tasks_per_rank
    else:
        key, value, share = "rollout.batch_tasks", cfg.rollout.batch_tasks, math.ceil(cfg.rollout.batch_tasks / nproc)
    return WorkerStage("training (its evaluations on the same workers)", key, value, share, nproc, cfg.benchmark)


def eval_worker_stage(benchmark: str, max_in_flight: int, nproc: int) -> WorkerStage:
    """The workers of ``python -m actfirst.eval`` on ``nproc`` ranks (each plays up to ``max_in_flight`` at once)."""
    return WorkerStage("evaluation", "evaluation.max_in_flight", max_in_flight, max_in_flight, nproc, benchmark)


def node_memory() -> tuple[int, int]:
    """(total, available) host memory of this machine in bytes."""
    import psutil

    memory = psutil.virtual_memory()
    return memory.total, memory.available


def check_host_memory(stages: list[WorkerStage], memory: tuple[int, int] | None = None) -> list[str]:
    """Refuse (``ConfigError`` naming the key, what it needs and a value that fits) a stage whose workers need more
    than the node's whole memory; returns a warning line for a stage that needs more than is available now.
    ``memory``: (total, available) bytes (None: this machine's)."""
    total, available = memory if memory is not None else node_memory()
    warnings = []
    for stage in stages:
        need = stage.gib
        if need is None:
            continue
        mib = BENCHMARKS[stage.benchmark].worker_mib
        if need * 2**30 > total:
            fits = max(0, int(total / MIB / mib / stage.ranks))
            raise ConfigError(f"{stage.key}={stage.value}: {stage.line()}, more than this node's "
                              f"{total / 2**30:,.1f} GiB of host memory; {fits} workers per rank fit (lower "
                              f"{stage.key}, or start fewer ranks with --nproc-per-node)")
        if need * 2**30 > available:
            warnings.append(f"warning: {stage.line()}, more than the {available / 2**30:,.1f} GiB of host memory "
                            f"free now (of {total / 2**30:,.1f} GiB)")
    return warnings

"""The OPD trainer: environment -> rollout -> buffer -> teacher scoring -> update -> engine, on every rank.

    python -m actfirst.run --config configs/train/<setting>.yaml [key=value ...] [--resume]   (prepares, then this)

:meth:`Trainer.step` is one update (Appendix B.4, C.3), as named phases:

1. ``collect_rollouts``: rollout batches of this rank's share of ``rollout.batch_tasks`` tasks until its FIFO buffer
   holds its share of ``batch_samples`` full responses of the current or the immediately preceding weight version
   (``batch: rollout``: every sample of one rollout batch, 003's step);
2. ``score``: the frozen teacher scores every response token under the same context (fused log-prob gather);
3. ``update``: the student takes its dual-clipped PPO steps on the batch of all ranks (Eq. 32 over the global batch);
4. ``sync_weights``: each rank gathers the new full weights and loads them into its own engine, in this process;
5. ``probe``, ``log``, ``checkpoint``, ``evaluate``.

Each rank is one process with its own in-process vLLM engine, its environment workers, its shard of the student
(FSDP2) and the teacher (replicated or sharded): ranks meet only in the update's collectives, the weight gather,
the metrics reduction, the checkpoint and the evaluations (each rank plays its share of the episodes). Rank 0
writes the metrics, evaluations, plots and the Hugging Face checkpoint.

Scoring and the update run in a thread of their own (on the CPU with their own torch threads), so that the engine
keeps serving on the event loop. With ``pipeline: async`` (the default) the next update's samples are collected
during them, in rollout batches sized to what that update still lacks, and the new weights enter the engine when
that collection ends: nothing in flight is thrown away, the staleness rule bounds the lag to one version, and the
transitions per update stay those of ``serial`` (``actfirst.train.pipeline`` says how and why). With
``student.sleep_level`` (``serial`` only) the engine frees its GPU memory during scoring and the update instead.

Evaluations (C.1, C.4: think-then-act, the evaluation budget, seeds 42/43/44) run before the first update, every
``evaluation.every`` updates and after the last, on the training engines; their time is not training time.
Training wall-clock follows C.3: from the trainer's initialization (engine, models) to its shutdown (the last
checkpoint and the engine's shutdown included), evaluation excluded, and so is our own diagnostic (the per-update
probe and the engines' agreement check), reported apart as ``probe_s``. The final figures go to
``<out_dir>/wall_clock.json``; every speedup is computed from its ``train_s``.
Checkpoints (``actfirst.train.state``) every ``checkpoint_every`` updates and after the last; ``--resume``
continues from the latest one, losing at most the updates since it, on this or another number of ranks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import random
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm
from transformers import AutoTokenizer
from transformers.utils import logging as hf_logging

from actfirst.core.config import ConfigError, TrainConfig, check_resumable
from actfirst.core.files import write_atomically
from actfirst.core.logs import route_vllm_logs
from actfirst.core.schema import config_json, to_dict
from actfirst.engine.core import ActFirstEngine, RequestRecord, summarize_records
from actfirst.engine.request import RequestKind, SamplingSpec
from actfirst.envs.benchmarks import get_benchmark
from actfirst.envs.workers import EnvPool
from actfirst.evaluation.evaluate import merge_reports, run_evaluation
from actfirst.evaluation.report import teacher_summary
from actfirst.kernels.dispatch import last_path
from actfirst.models.loading import empty_model, host_peak_gib, load_weights
from actfirst.parallel.checkpointing import apply_activation_checkpointing
from actfirst.parallel.context import (
    ParallelContext,
    all_gather_objects,
    broadcast_object,
    init_parallel,
    reduce_max,
    reduce_sum,
    wait_for_ranks,
)
from actfirst.parallel.fsdp import apply_fsdp
from actfirst.parallel.weight_sync import gathered_parameters
from actfirst.preparation.reference_cache import load_references
from actfirst.rollout.intervention import Intervention, InterventionRecord, intervention_metrics
from actfirst.rollout.runner import RolloutBatch, RolloutRunner
from actfirst.rollout.sample import Sample
from actfirst.rollout.strategies import make_strategy
from actfirst.train.buffer import SampleBuffer
from actfirst.train.checkpoint import latest_checkpoint, record_best, restore_rng, rng_state, truncate_metrics
from actfirst.train.clock import CLOCK, SPEEDUP_FIGURE, RunClock, account
from actfirst.train.head import LMHeadModel
from actfirst.train.metrics import ALIGNMENT_WINDOW, MetricsSink, rollout_counts, rollout_rates, summary_line
from actfirst.train.packing import attention_implementation
from actfirst.train.pipeline import SampleYield, set_torch_threads, update_threads
from actfirst.train.plots import WALL_CLOCK, plot_training_curve, read_records
from actfirst.train.speedup import FIELDS as SPEEDUP_FIELDS
from actfirst.train.speedup import EpisodeLatencies, batch_times, run_figures, speedups
from actfirst.train.state import load_training_checkpoint, save_training_checkpoint
from actfirst.train.student import StudentUpdater
from actfirst.train.teacher import TeacherScorer
from actfirst.train.trackers import TrackedRun, open_trackers

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ENGINE_PROBE = "The same weights give the same log-probs on every rank."
"""The prompt each rank's engine answers after a weight sync (with several ranks): the engines must agree."""
PHASE_SECONDS = ("score_s", "update_s", "sync_s", "probe_s")
"""A step's phase times: the metrics line holds the slowest rank's, ``ranks`` (with several ranks) each rank's."""


@dataclasses.dataclass(slots=True)
class TrainResult:
    """What a finished run reports (every rank the same figures; ``evals`` on rank 0, empty elsewhere)."""

    out_dir: Path
    num_updates: int
    wall_s: float
    """Process-level training time: initialization to shutdown (Appendix C.3), evaluation and the probe excluded."""
    probe_s: float
    """The probe's and the engine check's time (a diagnostic, not the method's)."""
    num_transitions: int
    weight_version: int
    probe_gaps: list[float]
    evals: list[dict[str, Any]]
    """The run's evaluations (``evals.jsonl``, read by rank 0), the runs before a resume included."""


def train(cfg: TrainConfig, *, resume: bool = False) -> TrainResult:
    """Train ``cfg`` as this process's rank (torchrun's environment; otherwise a world of one)."""
    return Trainer(cfg, init_parallel(mesh=cfg.parallel.mesh), resume=resume).train()


class TaskStream:
    """This rank's training tasks, reshuffled every pass, handed out one rollout batch at a time."""

    def __init__(self, tasks: list[Any], seed: int) -> None:
        if not tasks:
            raise ValueError("no training tasks for this rank")
        self.tasks, self.rng, self.queue = tasks, random.Random(seed), deque()

    def next(self, n: int) -> list[Any]:
        """The next ``n`` tasks (a new shuffled pass begins when the queue runs short)."""
        while len(self.queue) < n:
            order = list(self.tasks)
            self.rng.shuffle(order)
            self.queue.extend(order)
        return [self.queue.popleft() for _ in range(n)]

    def state_dict(self, key: Callable[[Any], str]) -> dict[str, Any]:
        """The shuffle's RNG state and the tasks still queued (by ``key(task)``)."""
        return {"rng": self.rng.getstate(), "queue": [key(t) for t in self.queue]}

    def load_state_dict(self, state: dict[str, Any], key: Callable[[Any], str]) -> None:
        """Continue the shuffle and the queue of :meth:`state_dict` (tasks found by ``key``)."""
        by_key = {key(t): t for t in self.tasks}
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.queue = deque(by_key[k] for k in state["queue"])


def check_layout(cfg: TrainConfig, world_size: int) -> None:
    """Refuse a batch that does not divide over ``world_size`` ranks, by key and value (before anything starts)."""
    if cfg.batch == "turns" and cfg.batch_samples % (world_size * cfg.num_minibatches):
        raise ConfigError(f"batch_samples={cfg.batch_samples}: must be a multiple of the ranks ({world_size}) x "
                          f"num_minibatches ({cfg.num_minibatches}), so that every optimizer step takes an equal share "
                          f"from every rank")
    per_rank = cfg.rollout.tasks_per_rank
    if per_rank is not None and per_rank * world_size != cfg.rollout.batch_tasks:
        raise ConfigError(f"rollout.tasks_per_rank={per_rank}: {world_size} ranks x {per_rank} is not "
                          f"rollout.batch_tasks={cfg.rollout.batch_tasks}; set one of them for this number of ranks "
                          f"(or tasks_per_rank=null to deal the batch over the ranks)")
    if cfg.rollout.batch_tasks < world_size:
        raise ConfigError(f"rollout.batch_tasks={cfg.rollout.batch_tasks}: fewer than the {world_size} ranks (each "
                          f"rank plays its share of every rollout batch)")


def share(total: int, rank: int, world_size: int) -> int:
    """Rank ``rank``'s part of ``total`` items dealt round-robin over ``world_size`` ranks."""
    return len(range(rank, total, world_size))


@dataclasses.dataclass(slots=True)
class UpdateStats:
    """What one update did on this rank, up to its weight sync (the probes after it are not counted)."""

    rollout_s: float = 0.0
    transitions: int = 0
    batches: int = 0
    failures: list[str] = dataclasses.field(default_factory=list)
    overlapped: bool = False
    """Whether rollouts were collected while this update scored and updated."""
    ahead_s: float = 0.0
    """How long the next update's collection ran (from the start of scoring and the update: ``_collect_ahead``)."""
    wait_s: float = 0.0
    """How long the weight sync waited for the collection in flight after the update had finished."""
    staleness: int = 0
    """The most versions any sample of this update's batch was behind the weights it updated (B.4: at most 1)."""
    generated: int = 0
    """Tokens the engine generated (kept or discarded); counters start negative and :meth:`close` adds the end."""
    discarded: int = 0
    carried: int = 0
    """Tokens of requests in flight when ``pipeline: inflight`` loaded new weights, kept (the engine's count)."""
    dropped: int = 0
    """Samples the staleness rule dropped."""
    wall_s: float = 0.0
    early: int = 0
    """Transitions completed within the first ``actfirst.train.clock.EARLY_WINDOW_S`` of the throughput window."""
    times: dict[str, float] = dataclasses.field(default_factory=lambda: dict.fromkeys(SPEEDUP_FIELDS, 0.0))
    """The rollout batches' measured completion times and Eq. 25/36's (``actfirst.train.speedup``), summed."""
    records: list[RequestRecord] = dataclasses.field(default_factory=list)
    """The engine's requests (queue statistics)."""
    interventions: list[InterventionRecord] = dataclasses.field(default_factory=list)
    """UOPD's decisions at the student turns of this update's rollout batches."""

    def close(self, engine: ActFirstEngine, buffer: SampleBuffer, wall_s: float) -> None:
        """Take the counters' ends and the request records (the engine's list starts afresh)."""
        self.generated += engine.num_generated_tokens
        self.discarded += engine.num_discarded_tokens
        self.carried += engine.num_carried_tokens
        self.dropped += buffer.num_dropped
        self.wall_s = wall_s
        self.records, engine.records = engine.records, []


class Trainer:
    """One rank of a training run (see the module docstring); :meth:`train` runs it to the end."""

    def __init__(self, cfg: TrainConfig, ctx: ParallelContext, *, resume: bool) -> None:
        self.cfg, self.ctx, self.resume = cfg, ctx, resume
        self.out_dir = Path(cfg.out_dir)
        self.clock = RunClock()
        """Training time from here on (C.3), the throughput window, the run's counts; rank 0's ``clock.jsonl``."""
        check_layout(cfg, ctx.world_size)
        self.checkpoint = self._resume_point()
        self.benchmark = get_benchmark(cfg.benchmark, cfg.env)
        self.strategy = make_strategy(cfg.rollout.strategy, cfg.strategy_section)
        self.tasks = cfg.training_tasks(self.benchmark)[ctx.rank::ctx.world_size]
        self.references = self._references()
        self.model_dir = str(self.checkpoint) if self.checkpoint is not None else cfg.student.model
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.buffer = SampleBuffer()
        self.sample_yield = SampleYield()
        """Samples per episode of the latest rollout batches: the size of the batches collected ahead."""
        self.stream = TaskStream(self.tasks, cfg.seed + ctx.rank)
        self.batch_tasks = share(cfg.rollout.batch_tasks, ctx.rank, ctx.world_size)
        self.quota = cfg.batch_samples // ctx.world_size
        """Full responses this rank contributes to every update."""
        self.probe_contexts: list[list[int]] = []
        self.probe_gaps: list[float] = []
        self.recent: deque[dict[str, float]] = deque(maxlen=ALIGNMENT_WINDOW)  # Appendix F's window, counts
        self.batch_index, self.first_update = 0, 1
        self.pending: asyncio.Future | None = None
        """The collection ahead (``pipeline: async | inflight``): the next update's rollout batches in flight."""
        self.stats: UpdateStats | None = None
        """The open update's counters (:meth:`_open_stats`)."""
        self.engine: ActFirstEngine | None = None
        self.intervention: Intervention | None = None
        """UOPD's rule, with the teacher's own engine (``_build_intervention``)."""
        self.sink: MetricsSink | None = None

    # -- setup ----------------------------------------------------------------------------------------------------

    def _resume_point(self) -> Path | None:
        """The checkpoint to continue from (``--resume``), after checking that the run may start here."""
        checkpoint = latest_checkpoint(self.out_dir) if self.resume else None
        if self.resume and checkpoint is None and self.ctx.lead:
            print(f"resume: no checkpoint in {self.out_dir}; starting from update 1", flush=True)
        if checkpoint is None and not self.resume and (self.out_dir / "metrics.jsonl").exists():
            raise ConfigError(f"out_dir={str(self.out_dir)!r} holds a run's metrics.jsonl: pass --resume to "
                                  f"continue it, or choose another out_dir")
        return checkpoint

    def _references(self) -> dict | None:
        if not self.strategy.uses_references:
            return None
        return load_references(self.cfg.references, benchmark=self.benchmark,
                               tasks=[self.benchmark.task_key(t) for t in self.tasks])

    def _build_engine(self) -> ActFirstEngine:
        """This rank's engine (first: on a GPU vLLM takes its share of memory before the trainer's models)."""
        route_vllm_logs(self.out_dir / "logs" / f"vllm_rank{self.ctx.rank}.log", self.cfg.vllm_console_level)
        engine_cfg = dataclasses.replace(self.cfg.student, model=self.model_dir)
        return ActFirstEngine.from_config(engine_cfg, self.cfg.scheduler, world_size=self.ctx.world_size)

    def _build_models(self) -> None:
        """The frozen teacher (its tokenizer checked first) and the student's FSDP2 shard with its updater."""
        cfg, ctx = self.cfg, self.ctx
        attention = attention_implementation(cfg.parallel.attention, ctx.device, _DTYPES[cfg.parallel.compute_dtype],
                                             backward=True)  # refused before anything loads
        host_before = host_peak_gib()
        self.teacher = TeacherScorer.load(cfg.teacher, student_tokenizer=self.tokenizer, dtype=cfg.teacher_dtype,
                                          micro_batch_tokens=cfg.micro_batch_tokens, device=ctx.device,
                                          shard=ctx if cfg.parallel.teacher == "shard" else None,
                                          attention=cfg.parallel.attention)
        student = empty_model(self.model_dir, torch.float32)  # the master weights, on the meta device
        student.set_attn_implementation(attention)
        student.train()
        self.policy = LMHeadModel(student)
        if cfg.parallel.activation_checkpointing:  # before FSDP2 (see actfirst.parallel.checkpointing)
            apply_activation_checkpointing(self.policy, self.policy.blocks)
        apply_fsdp(self.policy, self.policy.blocks, ctx.mesh, param_dtype=_DTYPES[cfg.parallel.compute_dtype])
        load_weights(student, self.model_dir, ctx.device)  # this rank's shard only, from the safetensors files
        self.updater = StudentUpdater(self.policy, optim=cfg.optim, loss=cfg.loss, temperature=cfg.rollout.temperature,
                                      num_updates=cfg.num_updates, num_minibatches=cfg.num_minibatches,
                                      micro_batch_tokens=cfg.micro_batch_tokens)
        print(f"[rank {ctx.rank}] models built: host memory peak {host_peak_gib():.3f} GiB (VmHWM; "
              f"{host_before:.3f} before them)", flush=True)

    def _build_intervention(self) -> None:
        """UOPD: the teacher's in-process engine beside the student's, and the rule that calls it."""
        if not self.strategy.intervenes:
            return
        cfg = self.cfg
        engine_cfg = dataclasses.replace(cfg.student, model=cfg.teacher, sleep_level=0,
                                         gpu_memory_utilization=cfg.uopd.teacher_gpu_memory_utilization)
        teacher_engine = ActFirstEngine.from_config(engine_cfg, cfg.scheduler, world_size=self.ctx.world_size)
        self.intervention = Intervention(cfg.uopd, rollout=cfg.rollout, teacher_engine=teacher_engine,
                                         scorer=self.teacher, tokenizer=self.tokenizer, num_updates=cfg.num_updates,
                                         seed=cfg.seed * 7919 + 13 * self.ctx.rank + 1)

    def _restore(self) -> None:
        """Continue from ``self.checkpoint``: optimizer (resharded), schedule, counters, and this rank's state."""
        trainer_state, rank_states = load_training_checkpoint(self.checkpoint, ctx=self.ctx, policy=self.policy,
                                                              optimizer=self.updater.optimizer)
        check_resumable(trainer_state["config"], to_dict(self.cfg), "resume")
        self.updater.load_state_dict(trainer_state["updater"])
        self.probe_gaps = list(trainer_state["probe_gaps"])
        # A checkpoint written before the clock had its own state holds its figures at the top level.
        self.clock.load_state_dict(trainer_state.get("clock", trainer_state))
        self.first_update = trainer_state["update"] + 1
        self.engine.weight_version = trainer_state["weight_version"]  # the engine loaded the checkpoint's weights
        if trainer_state["world_size"] == self.ctx.world_size:  # the same ranks: this rank's state exactly
            state = rank_states[0]
            self.buffer.load_state_dict(state["buffer"])
            self.stream.load_state_dict(state["tasks"], self.benchmark.task_key)
            self.probe_contexts, self.batch_index = state["probe_contexts"], state["batch_index"]
            self.recent.extend(state["recent"])
            self.sample_yield.load_state_dict(state.get("sample_yield", []))  # none in an older checkpoint
            if self.intervention is not None:
                self.intervention.load_state_dict(state["intervention"])
            restore_rng(state)
        else:
            self._redeal(rank_states, trainer_state["update"])
        if self.ctx.lead:
            ranks = trainer_state["world_size"]
            moved = f"; {ranks} -> {self.ctx.world_size} ranks" if ranks != self.ctx.world_size else ""
            print(f"resume: {self.checkpoint} (update {trainer_state['update']}, weight version "
                  f"{self.engine.weight_version}){moved}", flush=True)

    def _redeal(self, rank_states: list[dict[str, Any]], update: int) -> None:
        """Resume on another number of ranks (see ``actfirst.train.state``)."""
        rank, world = self.ctx.rank, self.ctx.world_size
        pooled = [s for state in rank_states for s in state["buffer"]["samples"]]
        self.buffer.load_state_dict({"samples": pooled[rank::world], "num_added": 0, "num_consumed": 0,
                                     "num_dropped": 0})
        contexts = [c for state in rank_states for c in state["probe_contexts"]]
        self.probe_contexts = contexts[rank::world]
        self.batch_index = max(state["batch_index"] for state in rank_states)
        self.sample_yield.load_state_dict([x for state in rank_states for x in state.get("sample_yield", [])])
        seed = (self.cfg.seed * 1_000_003 + rank * 7_919 + update) % (1 << 31)
        self.stream = TaskStream(self.tasks, seed)
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        if self.intervention is not None:  # the score buffers pooled, dealt like the samples; a fresh stream
            scores = [x for state in rank_states for x in state["intervention"]["scores"]]
            self.intervention.scores.extend(scores[rank::world])
            self.intervention.rng.seed(seed)

    def _open_outputs(self) -> None:
        """Rank 0: the config, the metrics sink, and on resume the series cut back to the checkpoint."""
        if not self.ctx.lead:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "config.json").write_text(config_json(self.cfg))
        if self.resume:  # drop what the updates after the checkpoint (or before any checkpoint) logged
            truncate_metrics(self.out_dir / "metrics.jsonl", self.first_update - 1)
            truncate_metrics(self.out_dir / "evals.jsonl", self.first_update - 1)
        self.sink = MetricsSink(self.out_dir, open_trackers(self.cfg.report_to, TrackedRun(
            self.out_dir, self.cfg.tracker_project, json.loads(config_json(self.cfg)), self.first_update)))
        self.clock.open_session(self.out_dir / CLOCK, kept_evaluations=sum(
            r["eval_wall_s"] for r in read_records(self.out_dir / "evals.jsonl")))

    # -- the run ----------------------------------------------------------------------------------------------------

    def train(self) -> TrainResult:
        """Run the updates this run has not done yet; every rank returns the same result."""
        return asyncio.run(self._train())

    async def _train(self) -> TrainResult:
        torch.manual_seed(self.cfg.seed + self.ctx.rank)
        hf_logging.disable_progress_bar()  # the console is the updates' progress bar and lines
        self.engine = self._build_engine()
        self._build_models()
        self._build_intervention()
        if self.checkpoint is not None:
            self._restore()
        self._open_outputs()
        self.stats = self._open_stats()
        self.teacher_sr = (teacher_summary(self.cfg.teacher) or {}).get("SR", {}).get("mean")
        self.eval_plan = run_evaluation(self.cfg, self.benchmark) if self.cfg.evaluation is not None else None
        bar = tqdm(total=self.cfg.num_updates, initial=self.first_update - 1, desc="updates", unit="update",
                   disable=not self.ctx.lead, dynamic_ncols=True)
        try:
            with EnvPool(self.benchmark.env_spec(), size=self.batch_tasks,
                         call_timeout_s=self.cfg.rollout.env_timeout_s) as pool:
                self.pool = pool
                self.runner = RolloutRunner(engine=self.engine, tokenizer=self.tokenizer, benchmark=self.benchmark,
                                            pool=pool, strategy=self.strategy, cfg=self.cfg.rollout,
                                            references=self.references, seed=self.cfg.seed * 7919 + self.ctx.rank,
                                            intervention=self.intervention)
                await self.evaluate(self.first_update - 1, on_start=True)
                for update in range(self.first_update, self.cfg.num_updates + 1):
                    await self.step(update)
                    bar.update(1)
                if self.ctx.lead:
                    self._draw_curve(self.cfg.num_updates)
        finally:
            if self.pending is not None:
                self.pending.cancel()
            bar.close()
            if self.sink is not None:
                self.sink.close()
            if self.intervention is not None:
                await self.intervention.teacher_engine.shutdown()
            await self.engine.shutdown()
        wall, probe = self.clock.elapsed(), self.clock.kept_probe_s
        evals = read_records(self.out_dir / "evals.jsonl") if self.ctx.lead else []
        if self.ctx.lead:
            self.clock.beat()
            write_atomically(self.out_dir / WALL_CLOCK, json.dumps({
                **account(self.out_dir / CLOCK), "updates": self.cfg.num_updates,
                "rollout_model": {**run_figures(self.clock.rollout_times), "sums": dict(self.clock.rollout_times)},
                "definition": f"{SPEEDUP_FIGURE} (every speedup's figure) follows Appendix C.3: the trainer's "
                "initialization to its shutdown, evaluation and the probe excluded, summed over the sessions of a "
                "resumed run without the updates they did again (lost_s); teacher training and reference "
                "construction are not in the trainer. The parts (prepare, train, eval, probe, lost, other) sum to "
                "total_s, every session's wall-clock from its launch."}, indent=1))
        return TrainResult(self.out_dir, self.cfg.num_updates, wall, probe, self.clock.total_transitions,
                           self.engine.weight_version, self.probe_gaps, evals)

    async def step(self, update: int) -> None:
        """One update, phase by phase (see the module docstring)."""
        clock, stats = time.perf_counter(), self.stats
        samples = await self.collect_rollouts(stats, update)
        metrics = await self.score_and_update(samples)
        version = await self.sync_weights(metrics, stats)
        stats.close(self.engine, self.buffer, time.perf_counter() - clock)  # the probes below are not the update's
        self.stats = self._open_stats()
        if self._probe_due(update):  # inflight: the collection ahead must not run inside the probe's excluded time
            await self._await_collection(self.stats)
        t0 = time.perf_counter()
        metrics.update(await self.check_engines())
        metrics.update(await self.probe(update))
        metrics["probe_s"] = time.perf_counter() - t0
        self.clock.exclude_probe(metrics["probe_s"])
        self.engine.records.clear()
        self.log(update, metrics, stats, version)
        if self._checkpoint_due(update) or (self.cfg.evaluation is not None and self._eval_due(update)):
            await self._await_collection(self.stats)  # inflight: nothing in flight while state is saved or evaluated
        self.save_checkpoint(update)
        await self.evaluate(update)

    def _open_stats(self) -> UpdateStats:
        """The next update's counters, opened as the last one's close (with ``pipeline: inflight`` its collection
        ahead may still run: what it finishes from then on counts in the next update)."""
        return UpdateStats(generated=-self.engine.num_generated_tokens, discarded=-self.engine.num_discarded_tokens,
                           carried=-self.engine.num_carried_tokens, dropped=-self.buffer.num_dropped)

    # -- 1. rollouts ----------------------------------------------------------------------------------------------

    async def collect_rollouts(self, stats: UpdateStats, update: int) -> list[Sample]:
        """Rollout batches until this rank's buffer holds its share of the update's batch (current or preceding
        weight version); then, unless the pipeline is serial or this is the last update, the next update's
        collection starts (:meth:`_collect_ahead`)."""
        await self._await_collection(stats)  # inflight: the collection ahead may have outlasted the weight sync
        version = self.engine.weight_version
        while (need := self._still_needed(version)) > 0:
            tasks = self.batch_tasks if self.cfg.pipeline == "serial" else self._tasks_for(need)
            self._finish_batch(await self._run_batch(update, tasks), stats)
        rollout = self.cfg.batch == "rollout"  # 003's step: every sample of its one rollout batch
        samples = self.buffer.take(self.buffer.num_eligible(version) if rollout else self.quota, version)
        stats.staleness = version - min(s.weight_version for s in samples)
        if self.cfg.pipeline != "serial" and update < self.cfg.num_updates:  # nothing after the last
            self.pending = asyncio.ensure_future(self._collect_ahead(update + 1, version))
        return samples

    async def _collect_ahead(self, update: int, version: int) -> None:
        """The samples of ``update`` (the next), collected while this one scores and updates under weight version
        ``version``: with ``batch: turns``, rollout batches sized to what it still lacks until the buffer holds its
        share (see ``actfirst.train.pipeline``); with ``batch: rollout``, its one rollout batch. Each batch counts
        in the update open when it ends (``self.stats``: with ``inflight``, possibly the next)."""
        t0, ran = time.perf_counter(), False
        while (need := self._still_needed(version + 1)) > 0:
            self._finish_batch(await self._run_batch(update, self._tasks_for(need)), self.stats)
            ran = True
        self.stats.overlapped, self.stats.ahead_s = ran, time.perf_counter() - t0

    def _still_needed(self, version: int) -> int:
        """Samples the update that trains under ``version`` still lacks: its quota less the eligible buffered ones
        (``batch: rollout``: one batch's, so 1 until a rollout batch has given a sample)."""
        eligible = self.buffer.num_eligible(version)
        return (0 if eligible else 1) if self.cfg.batch == "rollout" else self.quota - eligible

    async def _await_collection(self, stats: UpdateStats) -> None:
        """Wait for the collection ahead in flight, if any (the wait adds to ``stats.wait_s``)."""
        if self.pending is None:
            return
        t0 = time.perf_counter()
        try:
            await self.pending
        finally:
            self.pending = None
        stats.wait_s += time.perf_counter() - t0

    def _tasks_for(self, need: int) -> int:
        """The tasks of a rollout batch expected to give ``need`` more samples (at most ``rollout.batch_tasks``;
        ``batch: rollout``: a whole rollout batch, 003's step)."""
        if self.cfg.batch == "rollout":
            return self.batch_tasks
        return self.sample_yield.tasks_for(need, self.batch_tasks)

    async def _run_batch(self, update: int, tasks: int) -> RolloutBatch:
        """A rollout batch of the stream's next ``tasks`` tasks, collected for ``update`` (UOPD's r_n is that
        update's)."""
        if self.intervention is not None:
            self.intervention.update = update - 1
        self.batch_index += 1
        self.clock.open_window()
        return await self.runner.run_batch(self.stream.next(tasks), self.batch_index)

    def _finish_batch(self, batch: RolloutBatch, stats: UpdateStats) -> None:
        self.buffer.add(batch.samples)
        self.sample_yield.add(len(batch.episodes), len(batch.samples))
        self.recent.append(rollout_counts(batch.episodes))
        stats.rollout_s += batch.wall_s
        stats.transitions += batch.num_transitions
        stats.early += self.clock.count_early(t.step_done for e in batch.episodes for t in e.turns)
        times = batch_times([EpisodeLatencies(e.num_turns, [r.latency_s for r in e.full_responses],
                                              [t.fast.latency_s for t in e.turns if t.fast is not None])
                             for e in batch.episodes], wall_s=batch.wall_s, b_max=self.cfg.scheduler.b_max)
        stats.times = {k: stats.times[k] + times[k] for k in SPEEDUP_FIELDS}
        stats.batches += 1
        stats.failures += [f"{e.task}: {e.failure}" for e in batch.episodes if e.failure]
        stats.interventions += [r for e in batch.episodes for r in e.interventions]
        want = share(self.cfg.probe_contexts, self.ctx.rank, self.ctx.world_size)
        if not self.probe_contexts and want:  # spread over the first batch's episodes and turns
            step = max(1, len(batch.samples) // want)
            self.probe_contexts = [s.context_ids for s in batch.samples[::step][:want]]

    # -- 2-3. teacher scoring and the update ------------------------------------------------------------------------

    async def score_and_update(self, samples: list[Sample]) -> dict[str, float]:
        """The teacher scores the batch, the student takes its steps (every rank together), in a thread of their
        own while the event loop keeps serving the rollouts in flight; on the CPU with their own torch threads
        (``parallel.cpu_update_threads``; ``actfirst.train.pipeline``)."""
        if self.cfg.student.sleep_level:
            self.engine.sleep()
        engine_threads = torch.get_num_threads()  # read in the event loop's thread: the engine's
        threads = None
        if self.ctx.device.type == "cpu":
            threads = update_threads(self.cfg.parallel.cpu_update_threads, engine_threads=engine_threads,
                                     ranks_here=int(os.environ.get("LOCAL_WORLD_SIZE", "1")))

        def work() -> dict[str, Any]:
            if self.ctx.device.type == "cuda":  # the current CUDA device is per thread
                torch.cuda.set_device(self.ctx.device)
            used = set_torch_threads(threads) if threads is not None else torch.get_num_threads()
            with self.engine.update_phase():  # CUDA: the update's own stream, finished on the GPU when it ends
                t0 = time.perf_counter()
                self.teacher.score(samples)
                t1 = time.perf_counter()
                metrics = self.updater.update(samples, self.engine.weight_version)
            return {**metrics, "score_s": t1 - t0, "update_s": time.perf_counter() - t1, **kernel_paths(),
                    "cpu/engine_threads": engine_threads, "cpu/update_threads": used}

        return await asyncio.to_thread(work)

    # -- 4. weight sync ---------------------------------------------------------------------------------------------

    async def sync_weights(self, metrics: dict[str, float], stats: UpdateStats) -> int:
        """The new weights into this rank's engine: with ``pipeline: async``, once the next update's collection in
        flight has ended (the wait for it: ``stats.wait_s``); with ``inflight``, at once, between two engine steps,
        the requests in flight continuing under them and keeping their tokens. When every step was skipped (a
        non-finite loss or gradient) the weights did not change and stay, unless the engine slept (then they are
        reloaded: its memory held none)."""
        inflight = self.cfg.pipeline == "inflight"
        if not inflight:
            await self._await_collection(stats)
        t0 = time.perf_counter()
        if metrics["skipped"] >= self.cfg.num_minibatches and not self.engine.asleep:
            if self.ctx.lead:
                tqdm.write("every step was skipped (non-finite loss or gradient); the weights stay")
            return self.engine.weight_version
        version = self.engine.update_weights(gathered_parameters(
            self.policy.model, dtype=_DTYPES[self.cfg.student.dtype],
            bucket_bytes=self.cfg.parallel.sync_bucket_mb << 20), keep_in_flight=inflight)
        metrics["sync_s"] = time.perf_counter() - t0
        return version

    async def check_engines(self) -> dict[str, float]:
        """With several ranks: every engine answers a fixed prompt with a fixed seed; engines that hold the same
        weights sample the same tokens with the same log-probs. Returns whether every rank's tokens equal rank 0's
        (``sync/engine_tokens_agree``) and the largest log-prob difference from rank 0's over the tokens up to the
        first that differs (``sync/engine_logprob_spread``)."""
        if self.ctx.world_size == 1:
            return {}
        prompt = self.tokenizer.encode(ENGINE_PROBE, add_special_tokens=False)
        result = await self.engine.generate(prompt, RequestKind.FULL_RESPONSE,
                                            SamplingSpec(max_tokens=8, temperature=1.0, seed=12_345, ignore_eos=True))
        answers = all_gather_objects((result.token_ids, result.logprobs))
        tokens, logps = answers[0]
        spread = 0.0
        for other_tokens, other_logps in answers[1:]:
            for t, u, a, b in zip(tokens, other_tokens, logps, other_logps, strict=False):
                spread = max(spread, abs(a - b))
                if t != u:
                    break
        return {"sync/engine_tokens_agree": float(all(t == tokens for t, _ in answers)),
                "sync/engine_logprob_spread": spread}

    # -- 5. probe, log, checkpoint, evaluate ------------------------------------------------------------------------

    async def probe(self, update: int) -> dict[str, float]:
        """Teacher-minus-student log-prob gap of fresh full responses at fixed contexts (every ``probe_every``
        updates and the last), over every rank's contexts: an estimate of -KL(student || teacher) there (Eq. 4-5)."""
        if not self._probe_due(update):
            return {}
        responses = await asyncio.gather(*(self.runner.full_response(c, seed=10_007 + 97 * self.ctx.rank + i)
                                           for i, c in enumerate(self.probe_contexts)))
        samples = [r.to_sample(c, task="probe", turn=0, strategy="probe")
                   for c, (r, _) in zip(self.probe_contexts, responses, strict=True)]
        self.teacher.score(samples)
        diffs = [t - s for x in samples
                 for t, s, m in zip(x.teacher_logprobs, x.logprobs, x.loss_mask, strict=True) if m]
        total, count = reduce_sum([sum(diffs), len(diffs)])
        gap = total / count if count else math.nan
        self.probe_gaps.append(gap)
        return {"probe/gap": gap}

    def _probe_due(self, update: int) -> bool:
        cfg = self.cfg
        return bool(cfg.probe_contexts) and (update % cfg.probe_every == 0 or update == cfg.num_updates)

    def log(self, update: int, metrics: dict[str, float], stats: UpdateStats, version: int) -> None:
        """Reduce this update's figures over the ranks; rank 0 writes the metrics line and the terminal line."""
        keys = sorted(rollout_counts([]))  # the same on every rank, whatever its window holds
        window = {k: sum(c.get(k, 0) for c in self.recent) for k in keys}  # a key newer than a checkpoint: 0
        counts = [stats.transitions, stats.batches, stats.generated, stats.discarded, stats.carried, len(self.buffer),
                  stats.dropped, stats.early]
        sums = reduce_sum([*counts, *[stats.times[k] for k in SPEEDUP_FIELDS],
                           *[window[k] for k in keys]])  # one collective for every count of the update
        n = len(counts)
        transitions, batches, generated, discarded, carried, buffered, dropped, early = (int(x) for x in sums[:n])
        times = dict(zip(SPEEDUP_FIELDS, sums[n:n + len(SPEEDUP_FIELDS)], strict=True))
        slowest = reduce_max([stats.rollout_s, stats.wall_s, stats.wait_s, stats.staleness, stats.ahead_s])
        per_rank = all_gather_objects({"rollout_s": stats.rollout_s, "transitions": stats.transitions,
                                       "failures": stats.failures, "records": stats.records,
                                       "interventions": stats.interventions, "batch_n": self.batch_index - 1,
                                       **{k: metrics.get(k, 0.0) for k in PHASE_SECONDS}})
        self.clock.count(transitions=transitions, early=early, rollout_times=times)
        if not self.ctx.lead:
            return
        failures = [f"rank {r}: {f}" if self.ctx.world_size > 1 else f for r, p in enumerate(per_rank)
                    for f in p["failures"]]
        phases = {k: max(p[k] for p in per_rank) for k in PHASE_SECONDS if k in metrics}  # the slowest rank's
        record = {
            **metrics, **phases, **rollout_rates(dict(zip(keys, sums[n + len(SPEEDUP_FIELDS):], strict=True))),
            **self.clock.throughput(),
            **{f"speedup/{k}": v for k, v in speedups(times).items()},
            **{f"speedup/run_{k}": v for k, v in speedups(self.clock.rollout_times).items()},
            "weight_version": version, "rollout_s": slowest[0], "rollout_batches": batches,
            "pipeline": self.cfg.pipeline, "pipeline/overlapped": stats.overlapped, "pipeline/wait_s": slowest[2],
            "pipeline/max_staleness": int(slowest[3]), "pipeline/ahead_s": slowest[4], "update_wall_s": slowest[1],
            "elapsed_s": self.clock.elapsed(),
            "env_steps_per_s": transitions / slowest[1] if slowest[1] > 0 else math.nan,
            "transitions": transitions, "total_transitions": self.clock.total_transitions,
            "failed_episodes": len(failures), "failures": failures,
            "generated_tokens": generated, "discarded_tokens": discarded, "carried_tokens": carried,
            "discarded_frac": discarded / generated if generated else 0.0,
            "buffer/size": buffered, "buffer/dropped": dropped, "world_size": self.ctx.world_size,
            "queue": summarize_records([r for p in per_rank for r in p["records"]]),
            "rollout/horizon": self.strategy.horizon(self.batch_index - 1, self.benchmark.max_turns),
            "rollout/batch_n": min(p["batch_n"] for p in per_rank),
            "rollout/batch_n_max": max(p["batch_n"] for p in per_rank),  # each rank counts its own rollout batches
        }
        if self.intervention is not None:
            record.update(intervention_metrics([r for p in per_rank for r in p["interventions"]]))
        if self.ctx.world_size > 1:
            record["ranks"] = {k: [p[k] for p in per_rank] for k in ("rollout_s", "transitions", *phases)}
        self.clock.beat()  # before the metrics line: whoever sees update N's line sees its time in clock.jsonl
        self.sink.log(update, record)
        tqdm.write(summary_line(update, record))
        for failure in failures:
            tqdm.write(f"  episode failed: {failure}")

    def _checkpoint_due(self, update: int) -> bool:
        cfg = self.cfg
        evaluated = cfg.keep_best and cfg.evaluation is not None and self._eval_due(update)
        return update % cfg.checkpoint_every == 0 or update == cfg.num_updates or evaluated

    def save_checkpoint(self, update: int) -> None:
        """Every ``checkpoint_every`` updates, after the last, and with ``keep_best`` at every evaluation (after the
        metrics: a kill between the two loses the update, never a line of the series)."""
        if not self._checkpoint_due(update):
            return
        cfg = self.cfg
        trainer_state = {
            "update": update, "config": to_dict(cfg), "updater": self.updater.state_dict(),
            "weight_version": self.engine.weight_version, "probe_gaps": self.probe_gaps,
            "clock": self.clock.state_dict()}
        rank_state = {
            "buffer": self.buffer.state_dict(), "tasks": self.stream.state_dict(self.benchmark.task_key),
            "probe_contexts": self.probe_contexts, "batch_index": self.batch_index, "recent": list(self.recent),
            "sample_yield": self.sample_yield.state_dict(), "rng": rng_state()}
        if self.intervention is not None:
            rank_state["intervention"] = self.intervention.state_dict()
        save_training_checkpoint(self.out_dir, update=update, keep=cfg.keep_checkpoints, ctx=self.ctx,
                                 policy=self.policy, optimizer=self.updater.optimizer, tokenizer=self.tokenizer,
                                 trainer_state=trainer_state, rank_state=rank_state, keep_best=cfg.keep_best)

    async def evaluate(self, update: int, on_start: bool = False) -> None:
        """Evaluate the engines' current weights when due (every rank plays its share of the episodes); rank 0
        stores the report, appends to ``evals.jsonl`` and redraws the training curve. ``on_start``: the evaluation
        of the starting weights, or the one a kill interrupted."""
        spec = self.cfg.evaluation
        if spec is None or not self._eval_due(update):
            return
        if on_start and broadcast_object(self.ctx.lead and update in {
                r["update"] for r in read_records(self.out_dir / "evals.jsonl")}):
            return  # already evaluated (a resume after the evaluation's record)
        t0, elapsed = time.perf_counter(), self.clock.elapsed()  # the training time it evaluates (its own excluded)
        if self.ctx.lead:
            tqdm.write(f"evaluation at update {update}: {len(self.eval_plan.tasks)} tasks x seeds {spec.seeds}")
        report = await self.eval_plan.play(self.engine, self.tokenizer, progress=False, pool=self.pool,
                                           shard=(self.ctx.rank, self.ctx.world_size))
        wait_for_ranks()  # shares may end hours apart: past the process group's timeout
        parts = all_gather_objects(report)
        self.engine.records.clear()  # the evaluation's requests are not the next update's queue statistics
        wall = reduce_max([time.perf_counter() - t0])[0]
        if self.ctx.lead:
            self._record_evaluation(update, merge_reports(parts, self.benchmark), wall, elapsed)
        self.clock.exclude_evaluation(time.perf_counter() - t0, kept=wall)  # its report and plot included
        self.clock.beat()

    def _eval_due(self, update: int) -> bool:
        spec = self.cfg.evaluation
        return ((update == 0 and spec.before) or update == self.cfg.num_updates
                or (spec.every > 0 and update > 0 and update % spec.every == 0))

    def _record_evaluation(self, update: int, report: Any, wall: float, elapsed: float) -> None:
        report.meta.update({"update": update, "weight_version": self.engine.weight_version,
                            "split": self.cfg.evaluation.split, "world_size": self.ctx.world_size})
        name = f"evals/update_{update:06d}.json"
        (self.out_dir / "evals").mkdir(exist_ok=True)
        (self.out_dir / name).write_text(report.to_json())
        summary = report.summary()
        row = {"update": update, "elapsed_s": elapsed, "eval_wall_s": wall, "report": name, "summary": summary,
               "splits": {split: report.summary(split=split) for split in report.splits}}
        with (self.out_dir / "evals.jsonl").open("a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        self.sink.log_evaluation(update, row)
        lo, hi = summary["SR_ci95_pooled"]
        best = self.cfg.keep_best and record_best(self.out_dir, update=update, sr=summary["SR"]["mean"],
                                                  keep=self.cfg.keep_checkpoints)
        tqdm.write(f"evaluation at update {update}: SR {summary['SR']['mean']:.1f} ± {summary['SR']['sd']:.1f} "
                   f"(95% CI [{lo:.1f}, {hi:.1f}], {summary['episodes']} episodes) in {wall:.0f} s"
                   f"{' (the best so far: kept)' if best else ''}")
        self._draw_curve(update)

    def _draw_curve(self, update: int) -> None:
        """Rank 0: redraw ``training_curve.png`` and give it to the trackers."""
        self.sink.log_image(update, "training_curve", plot_training_curve(self.out_dir, teacher_sr=self.teacher_sr))


def kernel_paths() -> dict[str, str]:
    """Which path the fused ops' dispatcher took last for scoring and for the update (``actfirst.kernels``)."""
    plans = {"kernel/score_path": last_path("logprob_gather"), "kernel/update_path": last_path("ppo_loss_from_hidden")}
    return {key: plan.path for key, plan in plans.items() if plan is not None}

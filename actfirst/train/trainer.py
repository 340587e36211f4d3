"""The OPD trainer: environment -> rollout -> buffer -> teacher scoring -> update -> engine, on every rank.

    python -m actfirst.run --config configs/train/<setting>.yaml [key=value ...] [--resume]   (prepares, then this)

:meth:`Trainer.step` is one update (Appendix B.4, C.3), as named phases:

1. ``collect``: rollout batches of this rank's share of ``rollout.batch_tasks`` tasks until its FIFO buffer holds
   its share of ``batch_samples`` full responses of the current or the immediately preceding weight version
   (``batch: rollout``: every sample of one rollout batch, 003's step): the pipeline's (``actfirst.train.pipeline``);
2. ``score``: the frozen teacher scores every response token under the same context (fused log-prob gather);
3. ``update``: the student takes its dual-clipped PPO steps on the batch of all ranks (Eq. 32 over the global batch);
4. ``sync_weights``: each rank gathers the new full weights and loads them into its own engine, in this process;
   the update's record closes (``actfirst.train.update_record``);
5. what is due (:class:`Due`, decided once): the probe and the engines' check, then the metrics line, a checkpoint,
   an evaluation. Whatever needs a quiet engine waits once for the collection ahead.

Each rank is one process with its own in-process vLLM engine, its environment workers, its shard of the student
(FSDP2) and the teacher (replicated or sharded): ranks meet only in the update's collectives, the weight gather,
the metrics reduction, the checkpoint and the evaluations (each rank plays its share of the episodes). Rank 0
writes the metrics, evaluations, plots and the Hugging Face checkpoint.

Scoring and the update run in a thread of their own (on the CPU with their own torch threads:
``actfirst.train.update_thread``), so that the engine keeps serving on the event loop. With ``pipeline: async`` (the
default) the next update's samples are collected during them, and the new weights enter the engine when that
collection ends; with ``inflight`` at once, the collection going on (``actfirst.train.pipeline`` says how and why).
With ``student.sleep_level`` (``serial`` only) the engine frees its GPU memory during scoring and the update instead.

Training wall-clock follows C.3 (``actfirst.train.clock``): from the trainer's initialization to its shutdown,
evaluations (``actfirst.train.evaluations``) excluded, and so is our own diagnostic (``actfirst.train.probe``),
reported apart as ``probe_s``. Checkpoints (``actfirst.train.state``) every ``checkpoint_every`` updates and after
the last; ``--resume`` continues from the latest one, losing at most the updates since it, on any number of ranks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm
from transformers import AutoTokenizer
from transformers.utils import logging as hf_logging

from actfirst.core.config import ConfigError, TrainConfig, check_resumable
from actfirst.core.logs import route_vllm_logs
from actfirst.core.schema import config_json, to_dict
from actfirst.engine.core import ActFirstEngine
from actfirst.envs.benchmarks import get_benchmark
from actfirst.envs.workers import EnvPool
from actfirst.kernels.dispatch import last_path
from actfirst.models.loading import host_peak_gib
from actfirst.parallel.context import ParallelContext, init_parallel
from actfirst.parallel.weight_sync import gathered_parameters
from actfirst.preparation.reference_cache import load_references
from actfirst.rollout.intervention import Intervention
from actfirst.rollout.runner import RolloutRunner
from actfirst.rollout.sample import Sample
from actfirst.rollout.strategies import make_strategy
from actfirst.train.checkpoint import latest_checkpoint, restore_rng, rng_state, truncate_metrics
from actfirst.train.clock import CLOCK, RunClock, write_wall_clock
from actfirst.train.evaluations import TrainingEvaluations
from actfirst.train.head import LMHeadModel, load_policy
from actfirst.train.metrics import MetricsSink
from actfirst.train.packing import attention_implementation
from actfirst.train.pipeline import check_layout, create_pipeline
from actfirst.train.plots import read_records
from actfirst.train.probe import Probe
from actfirst.train.state import load_training_checkpoint, save_training_checkpoint
from actfirst.train.student import StudentUpdater
from actfirst.train.teacher import TeacherScorer
from actfirst.train.trackers import TrackedRun, open_trackers
from actfirst.train.update_record import UpdateRecords
from actfirst.train.update_thread import CpuSplit, UpdateThread, cpu_split, pin_this_thread, set_torch_threads

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SHUTDOWN_WAIT_S = 30.0
"""How long a shutdown waits for the collection ahead to end once cancelled, and then for the update in progress."""


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


@dataclasses.dataclass(frozen=True, slots=True)
class Due:
    """What an update's step does after its weight sync, decided once."""

    probe: bool
    engine_check: bool
    """The engines' agreement check (every update with several ranks)."""
    checkpoint: bool
    evaluation: bool

    @property
    def quiet(self) -> bool:
        """Whether anything due needs an engine with nothing else in flight: the probe, the engines' check and the
        evaluations are timed apart from training and their requests kept out of the update's counters, and a
        checkpoint saves the buffer, the task stream and the open update's record."""
        return self.probe or self.engine_check or self.checkpoint or self.evaluation


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
        self.records = UpdateRecords(clock=self.clock, ctx=ctx, b_max=cfg.scheduler.b_max, pipeline=cfg.pipeline,
                                     uopd=self.strategy.intervenes)
        """The open update's record, the alignment window, the metrics line."""
        self.probe = Probe(cfg, ctx)
        self.evaluations = TrainingEvaluations(cfg, ctx, benchmark=self.benchmark, clock=self.clock)
        self.pipeline = create_pipeline(cfg.pipeline, cfg, rank=ctx.rank, world_size=ctx.world_size, tasks=self.tasks,
                                        task_key=self.benchmark.task_key, clock=self.clock, records=self.records,
                                        on_batch=self.probe.offer)
        """The collection of every update's samples: task stream, buffer, the collection ahead."""
        self.first_update = 1
        self.engine: ActFirstEngine | None = None
        self.teacher: TeacherScorer | None = None
        self.policy: LMHeadModel | None = None
        self.updater: StudentUpdater | None = None
        self.intervention: Intervention | None = None
        """UOPD's rule, with the teacher's own engine (``_build_intervention``)."""
        self.pool: EnvPool | None = None
        self.runner: RolloutRunner | None = None
        self.sink: MetricsSink | None = None
        self.cpu: CpuSplit | None = None
        """On the CPU: the threads and cores of the engine, the update and the workers (:meth:`_split_cpu`)."""
        self.cores_before = os.sched_getaffinity(0)
        """This thread's cores before :meth:`_split_cpu` pinned it (given back at :meth:`shut_down`)."""
        self.update_thread = UpdateThread()
        """Where scoring and the update run (``actfirst.train.update_thread``; its cores: :meth:`_split_cpu`)."""
        self.terminated = False
        """Whether SIGTERM stopped the run (the main thread's handler: :meth:`_train`)."""

    # -- setup ----------------------------------------------------------------------------------------------------

    def _resume_point(self) -> Path | None:
        """The checkpoint to continue from (``--resume``), after checking that the run may start here."""
        checkpoint = latest_checkpoint(self.out_dir) if self.resume else None
        if self.resume and checkpoint is None and self.ctx.lead:
            logger.info("resume: no checkpoint in %s; starting from update 1", self.out_dir)
        if checkpoint is None and not self.resume and (self.out_dir / "metrics.jsonl").exists():
            raise ConfigError(f"out_dir={str(self.out_dir)!r} holds a run's metrics.jsonl: pass --resume to "
                                  f"continue it, or choose another out_dir")
        return checkpoint

    def _references(self) -> dict | None:
        if not self.strategy.uses_references:
            return None
        return load_references(self.cfg.references, benchmark=self.benchmark,
                               tasks=[self.benchmark.task_key(t) for t in self.tasks])

    def _split_cpu(self) -> None:
        """On the CPU: the update's threads, and with ``parallel.cpu_pin_cores`` the cores of each side
        (``actfirst.train.update_thread.cpu_split``), this thread pinned to the engine's before the engine starts."""
        if self.ctx.device.type == "cpu":
            env = os.environ
            self.cpu = cpu_split(self.cfg.parallel.cpu_update_threads, pin=self.cfg.parallel.cpu_pin_cores,
                                 engine_threads=torch.get_num_threads(), local_rank=int(env.get("LOCAL_RANK", "0")),
                                 ranks_here=int(env.get("LOCAL_WORLD_SIZE", "1")))
            logger.info("[rank %d] CPU: %s", self.ctx.rank, self.cpu.describe())
            if self.cpu.engine_cores is not None and self.cpu.engine_threads > len(self.cpu.engine_cores):
                logger.warning("[rank %d] the engine's %d OpenMP threads (OMP_NUM_THREADS) share %d pinned core(s)",
                               self.ctx.rank, self.cpu.engine_threads, len(self.cpu.engine_cores))
            pin_this_thread(self.cpu.engine_cores)
            self.update_thread.cores = self.cpu.trainer_cores

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
        self.policy = load_policy(self.model_dir, mesh=ctx.mesh, device=ctx.device,
                                  compute_dtype=_DTYPES[cfg.parallel.compute_dtype], attention=attention,
                                  activation_checkpointing=cfg.parallel.activation_checkpointing)
        self.updater = StudentUpdater(self.policy, optim=cfg.optim, loss=cfg.loss, temperature=cfg.rollout.temperature,
                                      num_updates=cfg.num_updates, num_minibatches=cfg.num_minibatches,
                                      micro_batch_tokens=cfg.micro_batch_tokens)
        logger.info("[rank %d] models built: host memory peak %.3f GiB (VmHWM; %.3f before them)", ctx.rank,
                    host_peak_gib(), host_before)

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
                                         seed=cfg.seed * 7919 + 13 * self.ctx.rank + 1,
                                         scoring_cores=None if self.cpu is None else self.cpu.trainer_cores)

    def _restore(self) -> None:
        """Continue from ``self.checkpoint``: optimizer (resharded), schedule, counters, and this rank's state (on
        another number of ranks, every saved rank's pooled and dealt: ``actfirst.train.state``)."""
        trainer_state, rank_states = load_training_checkpoint(self.checkpoint, ctx=self.ctx, policy=self.policy,
                                                              optimizer=self.updater.optimizer)
        check_resumable(trainer_state["config"], to_dict(self.cfg), "resume")
        self.updater.load_state_dict(trainer_state["updater"])
        self.probe.gaps = list(trainer_state["probe_gaps"])
        # A checkpoint written before the clock had its own state holds its figures at the top level.
        self.clock.load_state_dict(trainer_state.get("clock", trainer_state))
        self.first_update = trainer_state["update"] + 1
        self.engine.weight_version = trainer_state["weight_version"]  # the engine loaded the checkpoint's weights
        rank, world = self.ctx.rank, self.ctx.world_size
        if trainer_state["world_size"] == world:  # the same ranks: this rank's state exactly
            state = rank_states[0]
            self.pipeline.load_state_dict(state)
            self.probe.contexts = state["probe_contexts"]
            if self.intervention is not None:
                self.intervention.load_state_dict(state["intervention"])
            restore_rng(state)
        else:
            seed = (self.cfg.seed * 1_000_003 + rank * 7_919 + trainer_state["update"]) % (1 << 31)
            self.pipeline.redeal(rank_states, rank=rank, world_size=world, seed=seed)
            self.probe.contexts = [c for state in rank_states for c in state["probe_contexts"]][rank::world]
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)
            if self.intervention is not None:  # the score buffers pooled, dealt like the samples; a fresh stream
                scores = [x for state in rank_states for x in state["intervention"]["scores"]]
                self.intervention.scores.extend(scores[rank::world])
                self.intervention.rng.seed(seed)
        self.records.restore(rank_states, same_ranks=trainer_state["world_size"] == world, rank=rank,
                             world_size=world)
        if self.ctx.lead:
            ranks = trainer_state["world_size"]
            moved = f"; {ranks} -> {world} ranks" if ranks != world else ""
            logger.info("resume: %s (update %d, weight version %d)%s", self.checkpoint, trainer_state["update"],
                        self.engine.weight_version, moved)

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

    def _start(self) -> None:
        """Engines, models, the checkpoint's state, the outputs, the environment workers and the rollout runner."""
        torch.manual_seed(self.cfg.seed + self.ctx.rank)
        hf_logging.disable_progress_bar()  # the console is the updates' progress bar and lines
        self._split_cpu()
        self.engine = self._build_engine()
        self._build_models()
        self._build_intervention()
        if self.checkpoint is not None:
            self._restore()
        self._open_outputs()
        self.records.begin(self.first_update, self.engine, self.pipeline.buffer)
        self.pool = EnvPool(self.benchmark.env_spec(), size=self.pipeline.batch_tasks,
                            call_timeout_s=self.cfg.rollout.env_timeout_s,
                            cores=None if self.cpu is None else self.cpu.worker_cores)
        self.pool.start()
        self.runner = RolloutRunner(engine=self.engine, tokenizer=self.tokenizer, benchmark=self.benchmark,
                                    pool=self.pool, strategy=self.strategy, cfg=self.cfg.rollout,
                                    references=self.references, seed=self.cfg.seed * 7919 + self.ctx.rank,
                                    intervention=self.intervention)
        self.pipeline.start(self.runner)

    # -- the run ----------------------------------------------------------------------------------------------------

    def train(self) -> TrainResult:
        """Run the updates this run has not done yet; every rank returns the same result. Ctrl-C and SIGTERM end
        it as an error does (:meth:`shut_down`), then raise ``KeyboardInterrupt`` or ``SystemExit``."""
        try:
            return asyncio.run(self._train())
        except asyncio.CancelledError:
            if self.terminated:
                raise SystemExit(128 + signal.SIGTERM) from None
            raise

    async def _train(self) -> TrainResult:
        bar = None
        if threading.current_thread() is threading.main_thread():  # SIGTERM: the shutdown of Ctrl-C
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self._terminate, asyncio.current_task())
        try:
            self._start()
            bar = tqdm(total=self.cfg.num_updates, initial=self.first_update - 1, desc="updates", unit="update",
                       disable=not self.ctx.lead, dynamic_ncols=True)
            start = self.first_update - 1  # the starting weights, or the evaluation a kill interrupted
            if self.evaluations.due(start) and not self.evaluations.done_before(start):
                await self.evaluate(start)
            for update in range(self.first_update, self.cfg.num_updates + 1):
                await self.step(update)
                bar.update(1)
            if self.ctx.lead:
                self.evaluations.draw_curve(self.cfg.num_updates, self.sink)
        finally:
            if bar is not None:
                bar.close()
            await self.shut_down()
        return self._result()

    def _terminate(self, task: asyncio.Task) -> None:
        self.terminated = True
        task.cancel()

    async def shut_down(self) -> None:
        """The one shutdown of a finished, failed or interrupted run, each wait bounded: cancel the collection ahead
        and wait for it, let the update in progress finish (its collectives before the engines' shutdown), then
        close the environment workers, the metrics sink and the engines."""
        await self.pipeline.stop(SHUTDOWN_WAIT_S)
        if not self.update_thread.close(SHUTDOWN_WAIT_S):
            logger.warning("[rank %d] the update did not finish within %.0f s of the shutdown; closing without it",
                           self.ctx.rank, SHUTDOWN_WAIT_S)
        if self.pool is not None:
            self.pool.close()
        if self.sink is not None:
            self.sink.close()
        engines = [] if self.intervention is None else [self.intervention.teacher_engine]
        for engine in [*engines, *([] if self.engine is None else [self.engine])]:
            await engine.shutdown()
        pin_this_thread(tuple(self.cores_before))  # what the process does after the run is not the engine's

    def _result(self) -> TrainResult:
        """The run's result; rank 0 writes its wall-clock figures (``wall_clock.json``)."""
        wall, probe = self.clock.elapsed(), self.clock.kept_probe_s
        evals = read_records(self.out_dir / "evals.jsonl") if self.ctx.lead else []
        if self.ctx.lead:
            write_wall_clock(self.out_dir, self.clock, updates=self.cfg.num_updates)
        return TrainResult(self.out_dir, self.cfg.num_updates, wall, probe, self.clock.total_transitions,
                           self.engine.weight_version, self.probe.gaps, evals)

    async def step(self, update: int) -> None:
        """One update, phase by phase (see the module docstring)."""
        start = time.perf_counter()
        samples = await self.pipeline.collect(update)
        metrics = await self.score_and_update(samples)
        version = await self.sync_weights(metrics)
        record = self.pipeline.close(update, time.perf_counter() - start)  # what follows is not the update's
        due = self.due(update)
        if due.quiet:  # inflight: the collection ahead may still run
            await self.pipeline.quiesce()
        with self.records.left_out(self.engine):
            metrics.update(await self.diagnose(due))
        self.records.log(record, metrics, version=version, buffered=len(self.pipeline.buffer),
                         batch_n=self.pipeline.batch_index - 1, sink=self.sink,
                         horizon=self.strategy.horizon(self.pipeline.batch_index - 1, self.benchmark.max_turns))
        if due.checkpoint:
            self.save_checkpoint(update)
        if due.evaluation:
            await self.evaluate(update)

    async def evaluate(self, update: int) -> None:
        """The evaluation of ``update`` (``actfirst.train.evaluations``)."""
        with self.records.left_out(self.engine):  # its requests are not the next update's
            await self.evaluations.run(update, engine=self.engine, tokenizer=self.tokenizer, pool=self.pool,
                                       sink=self.sink)

    def due(self, update: int) -> Due:
        """What ``update``'s step does after its weight sync: the probe every ``probe_every`` updates and the last;
        the engines' check with several ranks; a checkpoint every ``checkpoint_every`` updates, the last, and with
        ``keep_best`` every evaluation; an evaluation when ``evaluation:`` says so."""
        cfg = self.cfg
        evaluation = self.evaluations.due(update)
        checkpoint = (update % cfg.checkpoint_every == 0 or update == cfg.num_updates
                      or (cfg.keep_best and evaluation))
        return Due(probe=self.probe.due(update), engine_check=self.ctx.world_size > 1, checkpoint=checkpoint,
                   evaluation=evaluation)

    # -- 2-3. teacher scoring and the update ------------------------------------------------------------------------

    async def score_and_update(self, samples: list[Sample]) -> dict[str, float]:
        """The teacher scores the batch, the student takes its steps (every rank together), in a thread of their own
        while the event loop keeps serving the rollouts in flight; on the CPU with their own torch threads
        (``parallel.cpu_update_threads``; ``actfirst.train.update_thread``)."""
        if self.cfg.student.sleep_level:
            self.engine.sleep()
        cpu = self.cpu
        engine_threads = torch.get_num_threads() if cpu is None else cpu.engine_threads  # the event loop's thread's

        def work() -> dict[str, Any]:
            if self.ctx.device.type == "cuda":  # the current CUDA device is per thread
                torch.cuda.set_device(self.ctx.device)
            used = set_torch_threads(cpu.update_threads) if cpu is not None else torch.get_num_threads()
            with self.engine.update_phase():  # CUDA: the update's own stream, finished on the GPU when it ends
                t0 = time.perf_counter()
                self.teacher.score(samples)
                t1 = time.perf_counter()
                metrics = self.updater.update(samples, self.engine.weight_version)
            return {**metrics, "score_s": t1 - t0, "update_s": time.perf_counter() - t1, **kernel_paths(),
                    "cpu/engine_threads": engine_threads, "cpu/update_threads": used}

        return await self.update_thread.run(work)

    # -- 4. weight sync ---------------------------------------------------------------------------------------------

    async def sync_weights(self, metrics: dict[str, float]) -> int:
        """The new weights into this rank's engine, once the pipeline allows (``async``: after the collection ahead
        has ended; ``inflight``: at once, between two engine steps, the requests in flight continuing under them and
        keeping their tokens). When every step was skipped (a non-finite loss or gradient) the weights did not change
        and stay, unless the engine slept (then they are reloaded: its memory held none)."""
        await self.pipeline.before_weights()
        t0 = time.perf_counter()
        if metrics["skipped"] >= self.cfg.num_minibatches and not self.engine.asleep:
            if self.ctx.lead:
                logger.info("every step was skipped (non-finite loss or gradient); the weights stay")
            return self.engine.weight_version
        version = self.engine.update_weights(gathered_parameters(
            self.policy.model, dtype=_DTYPES[self.cfg.student.dtype],
            bucket_bytes=self.cfg.parallel.sync_bucket_mb << 20), keep_in_flight=self.pipeline.keeps_in_flight)
        metrics["sync_s"] = time.perf_counter() - t0
        return version

    # -- 5. what is due ---------------------------------------------------------------------------------------------

    async def diagnose(self, due: Due) -> dict[str, float]:
        """The probe and the engines' check when due, left out of the training time (``probe_s``: their time), on a
        quiet engine: ``probe/beside_collection`` is 1 when the collection ahead still ran as they began, which
        would put rollout work in the time left out and queue their requests behind b_max rollout requests (the
        step awaits it first: always 0)."""
        t0 = time.perf_counter()
        diagnosing = due.probe or due.engine_check
        metrics = {"probe/beside_collection": float(self.pipeline.running_ahead)} if diagnosing else {}
        if due.engine_check:
            metrics.update(await self.probe.check_engines(self.engine, self.tokenizer))
        if due.probe:
            metrics.update(await self.probe.gap(self.runner, self.teacher))
        metrics["probe_s"] = time.perf_counter() - t0
        self.clock.exclude_probe(metrics["probe_s"])
        return metrics

    def save_checkpoint(self, update: int) -> None:
        """A checkpoint of ``update`` (after its metrics line: a kill between the two loses the update, never a line
        of the series)."""
        cfg = self.cfg
        trainer_state = {
            "update": update, "config": to_dict(cfg), "updater": self.updater.state_dict(),
            "weight_version": self.engine.weight_version, "probe_gaps": self.probe.gaps,
            "clock": self.clock.state_dict()}
        rank_state = {**self.pipeline.state_dict(), "probe_contexts": self.probe.contexts,
                      **self.records.state_dict(self.engine, self.pipeline.buffer), "rng": rng_state()}
        if self.intervention is not None:
            rank_state["intervention"] = self.intervention.state_dict()
        save_training_checkpoint(self.out_dir, update=update, keep=cfg.keep_checkpoints, ctx=self.ctx,
                                 policy=self.policy, optimizer=self.updater.optimizer, tokenizer=self.tokenizer,
                                 trainer_state=trainer_state, rank_state=rank_state, keep_best=cfg.keep_best)


def kernel_paths() -> dict[str, str]:
    """Which path the fused ops' dispatcher took last for scoring and for the update (``actfirst.kernels``)."""
    plans = {"kernel/score_path": last_path("logprob_gather"), "kernel/update_path": last_path("ppo_loss_from_hidden")}
    return {key: plan.path for key, plan in plans.items() if plan is not None}

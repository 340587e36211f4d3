"""The OPD training loop: environment -> rollout -> buffer -> teacher scoring -> update -> engine.

    python -m actfirst.train --config configs/train/<setting>.yaml [key=value ...] [--resume]

Each update (Appendix B.4, C.3):

1. rollout batches of ``rollout.batch_tasks`` tasks are collected until the FIFO buffer holds a batch of
   ``batch_samples`` full responses of the current or the immediately preceding weight version;
2. the frozen teacher scores every response token under the same context (fused log-prob gather);
3. the student takes its dual-clipped PPO steps on that batch;
4. the new weights go into the engine in this process; the version it returns is what the staleness rule reads.

With ``overlap``, the next rollout batch is collected while steps 2-3 run (in a thread; the engine keeps serving
on the event loop), and the new weights enter the engine when that rollout batch ends, so nothing in flight is
thrown away and the staleness rule bounds the lag to one version.

Every ``checkpoint_every`` updates (and after the last) the student, optimizer, schedule, buffer, task order, RNG
states and counters are checkpointed atomically (``actfirst.train.checkpoint``); ``resume`` continues from the
latest checkpoint, losing at most the update in flight, and the metrics continue the same series.

``rank`` and ``world_size`` are parameters from the start: each rank plays its own shard of the tasks (world size 1
here; the multi-GPU launcher adds ranks and the gradient all-reduce without changing this loop).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from actfirst.config import TrainConfig, to_dict
from actfirst.engine.core import ActFirstEngine, summarize_records
from actfirst.envs.benchmarks import get_benchmark
from actfirst.envs.workers import EnvPool
from actfirst.references import load_references
from actfirst.rollout.budget import generate_full_response
from actfirst.rollout.runner import RolloutBatch, RolloutRunner
from actfirst.rollout.strategies import make_strategy
from actfirst.train.buffer import SampleBuffer
from actfirst.train.checkpoint import latest_checkpoint, load_checkpoint, restore_rng, save_checkpoint, truncate_metrics
from actfirst.train.metrics import ALIGNMENT_WINDOW, MetricsSink, rollout_metrics, summary_line
from actfirst.train.sample import Sample
from actfirst.train.student import StudentUpdater
from actfirst.train.teacher import TeacherScorer

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclasses.dataclass(slots=True)
class TrainResult:
    """What a finished run reports."""

    out_dir: Path
    num_updates: int
    wall_s: float
    """Process-level training time: initialization to shutdown (Appendix C.3), evaluation excluded."""
    num_transitions: int
    weight_version: int
    probe_gaps: list[float]


def train(cfg: TrainConfig, *, resume: bool = False, rank: int = 0, world_size: int = 1) -> TrainResult:
    """Run ``cfg.num_updates`` updates (with ``resume``: those the latest checkpoint in ``cfg.out_dir`` has not done);
    metrics, checkpoints and the config go to ``cfg.out_dir``."""
    return asyncio.run(_train(cfg, resume=resume, rank=rank, world_size=world_size))


class TaskStream:
    """This rank's training tasks, reshuffled every pass, handed out one rollout batch at a time."""

    def __init__(self, tasks: list[Any], seed: int) -> None:
        if not tasks:
            raise ValueError("no training tasks for this rank")
        self.tasks, self.rng, self.queue = tasks, random.Random(seed), deque()

    def next(self, n: int) -> list[Any]:
        while len(self.queue) < n:
            order = list(self.tasks)
            self.rng.shuffle(order)
            self.queue.extend(order)
        return [self.queue.popleft() for _ in range(n)]

    def state_dict(self, key) -> dict[str, Any]:
        """The shuffle's RNG state and the tasks still queued (by ``key(task)``)."""
        return {"rng": self.rng.getstate(), "queue": [key(t) for t in self.queue]}

    def load_state_dict(self, state: dict[str, Any], key) -> None:
        by_key = {key(t): t for t in self.tasks}
        self.rng.setstate(state["rng"])
        self.queue = deque(by_key[k] for k in state["queue"])


async def _train(cfg: TrainConfig, *, resume: bool, rank: int, world_size: int) -> TrainResult:
    started = time.perf_counter()
    torch.manual_seed(cfg.seed + rank)
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = latest_checkpoint(out_dir) if resume else None
    if resume and checkpoint is None:
        print(f"resume: no checkpoint in {out_dir}; starting from update 1", flush=True)
    if checkpoint is None and (out_dir / "metrics.jsonl").exists():
        raise FileExistsError(f"out_dir={str(out_dir)!r} holds a run's metrics.jsonl: pass --resume to continue it, "
                              f"or choose another out_dir")
    (out_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=1, default=str))

    # The benchmark, this rank's tasks and their references.
    benchmark = get_benchmark(cfg.benchmark, cfg.env_config)
    tasks = benchmark.tasks("train")[: cfg.train_tasks or None][rank::world_size]
    strategy = make_strategy(cfg.rollout.strategy)
    references = load_references(cfg.references) if strategy.uses_references else None
    if references is not None:
        missing = [benchmark.task_key(t) for t in tasks if benchmark.task_key(t) not in references]
        if missing:
            raise ValueError(f"references={cfg.references!r}: no reference for {len(missing)} of {len(tasks)} training "
                             f"tasks, e.g. {missing[:5]}")

    # The student (engine + trainer copy), the frozen teacher, the buffer.
    # A checkpoint is a Hugging Face directory: the engine and the trainer both start from it on resume.
    student_dir = str(checkpoint) if checkpoint is not None else cfg.student.model
    engine = ActFirstEngine.from_config(dataclasses.replace(cfg.student, model=student_dir), cfg.scheduler)
    tokenizer = AutoTokenizer.from_pretrained(student_dir)
    student = AutoModelForCausalLM.from_pretrained(student_dir, dtype=_DTYPES[cfg.train_dtype])
    student.train()
    teacher = TeacherScorer(cfg.teacher, student_tokenizer=tokenizer, dtype=cfg.teacher_dtype,
                            micro_batch_tokens=cfg.micro_batch_tokens)
    updater = StudentUpdater(student, optim=cfg.optim, loss=cfg.loss, temperature=cfg.rollout.temperature,
                             num_updates=cfg.num_updates, num_minibatches=cfg.num_minibatches,
                             micro_batch_tokens=cfg.micro_batch_tokens)
    buffer = SampleBuffer()
    stream = TaskStream(tasks, cfg.seed + rank)
    recent: deque[RolloutBatch] = deque(maxlen=ALIGNMENT_WINDOW)
    probe_contexts: list[list[int]] = []
    probe_gaps: list[float] = []
    total_transitions, batch_index, first_update, elapsed_before = 0, 0, 1, 0.0
    if checkpoint is not None:
        state = load_checkpoint(checkpoint)
        updater.load_state_dict(state["updater"])
        buffer.load_state_dict(state["buffer"])
        stream.load_state_dict(state["tasks"], benchmark.task_key)
        restore_rng(state)
        engine.weight_version = state["weight_version"]  # the checkpoint's weights are what the engine loaded
        probe_contexts, probe_gaps = state["probe_contexts"], state["probe_gaps"]
        total_transitions, batch_index, first_update = state["total_transitions"], state["batch_index"], \
            state["update"] + 1
        elapsed_before = state["elapsed_s"]
        truncate_metrics(out_dir / "metrics.jsonl", state["update"])  # drop what the lost update logged
        print(f"resume: {checkpoint} (update {state['update']}, weight version {engine.weight_version})", flush=True)
    sink = MetricsSink(out_dir)

    def elapsed() -> float:
        """Training wall-clock so far, the runs before a resume included."""
        return elapsed_before + time.perf_counter() - started

    def save(update: int) -> None:
        state = {"update": update, "updater": updater.state_dict(), "buffer": buffer.state_dict(),
                 "tasks": stream.state_dict(benchmark.task_key), "weight_version": engine.weight_version,
                 "probe_contexts": probe_contexts, "probe_gaps": probe_gaps,
                 "total_transitions": total_transitions, "batch_index": batch_index, "elapsed_s": elapsed()}
        save_checkpoint(out_dir, update=update, model=student, tokenizer=tokenizer, trainer_state=state,
                        keep=cfg.keep_checkpoints)

    try:
        with EnvPool(benchmark.env_spec(), size=cfg.rollout.batch_tasks) as pool:
            runner = RolloutRunner(engine=engine, tokenizer=tokenizer, benchmark=benchmark, pool=pool,
                                   strategy=strategy, cfg=cfg.rollout, references=references,
                                   seed=cfg.seed * 7919 + rank)

            def start_batch() -> asyncio.Task:
                nonlocal batch_index
                batch_index += 1
                return asyncio.ensure_future(runner.run_batch(stream.next(cfg.rollout.batch_tasks), batch_index))

            def finish_batch(batch: RolloutBatch) -> dict[str, float]:
                nonlocal total_transitions
                buffer.add(batch.samples)
                recent.append(batch)
                total_transitions += batch.num_transitions
                if not probe_contexts and cfg.probe_contexts:
                    probe_contexts.extend(s.context_ids for s in batch.samples[: cfg.probe_contexts])
                return {"rollout_s": batch.wall_s, "transitions": batch.num_transitions}

            pending: asyncio.Task | None = None
            for update in range(first_update, cfg.num_updates + 1):
                update_started = time.perf_counter()
                records_start = len(engine.records)
                generated_start, discarded_start = engine.num_generated_tokens, engine.num_discarded_tokens
                rollout_s, transitions = 0.0, 0
                # 1. Rollouts until the buffer holds a batch of the current or preceding version.
                while buffer.num_eligible(engine.weight_version) < cfg.batch_samples:
                    batch_started = time.perf_counter()
                    info = finish_batch(await (pending or start_batch()))
                    pending = None
                    rollout_s += time.perf_counter() - batch_started
                    transitions += info["transitions"]
                samples = buffer.take(cfg.batch_samples, engine.weight_version)
                if cfg.overlap and buffer.num_eligible(engine.weight_version + 1) < cfg.batch_samples:
                    # The next update needs a new rollout batch: collect it on the event loop while the thread
                    # below scores and updates.
                    pending = start_batch()

                # 2-3. Teacher scoring and the update.
                def score_and_update() -> dict[str, float]:
                    t0 = time.perf_counter()
                    teacher.score(samples)
                    t1 = time.perf_counter()
                    metrics = updater.update(samples, engine.weight_version)
                    return {**metrics, "score_s": t1 - t0, "update_s": time.perf_counter() - t1}

                metrics = (await asyncio.to_thread(score_and_update)) if cfg.overlap else score_and_update()

                # 4. Weights into the engine (with overlap: once the rollout batch in flight has ended).
                if pending is not None:
                    batch_started = time.perf_counter()
                    info = finish_batch(await pending)
                    pending = None
                    rollout_s += time.perf_counter() - batch_started
                    transitions += info["transitions"]
                version = engine.update_weights(student.named_parameters())
                wall = time.perf_counter() - update_started
                generated = engine.num_generated_tokens - generated_start
                discarded = engine.num_discarded_tokens - discarded_start

                # 5. Probe (outside the update's time and token counts) and log.
                if probe_contexts and (update % cfg.probe_every == 0 or update == cfg.num_updates):
                    metrics["probe/gap"] = await _probe_gap(engine, tokenizer, teacher, probe_contexts, cfg)
                    probe_gaps.append(metrics["probe/gap"])
                record = {
                    **metrics, **rollout_metrics(recent), "weight_version": version, "rollout_s": rollout_s,
                    "update_wall_s": wall, "elapsed_s": elapsed(),
                    "env_steps_per_s": transitions / wall if wall > 0 else math.nan,
                    "transitions": transitions, "total_transitions": total_transitions,
                    "generated_tokens": generated, "discarded_tokens": discarded,
                    "discarded_frac": discarded / generated if generated else 0.0,
                    "buffer/size": len(buffer), "buffer/dropped": buffer.num_dropped,
                    "queue": summarize_records(engine.records[records_start:]),
                }
                sink.log(update, record)
                if rank == 0:
                    print(summary_line(update, record), flush=True)
                    # After the metrics: a kill between the two loses the update, never a line of the series.
                    if update % cfg.checkpoint_every == 0 or update == cfg.num_updates:
                        save(update)
    finally:
        sink.close()
        await engine.close()
    return TrainResult(out_dir, cfg.num_updates, elapsed(), total_transitions,
                       engine.weight_version, probe_gaps)


async def _probe_gap(engine: ActFirstEngine, tokenizer, teacher: TeacherScorer, contexts: list[list[int]],
                     cfg: TrainConfig) -> float:
    """Teacher-minus-student log-prob gap (mean over sampled tokens) of fresh full responses at fixed contexts,
    with fixed seeds: an estimate of -KL(student || teacher) on those contexts (Eq. 4-5)."""
    budget = cfg.rollout.budget
    responses = await asyncio.gather(*(generate_full_response(
        engine, tokenizer, ctx, first_stage=budget.first_stage, total=budget.total, second_stage=budget.second_stage,
        temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, seed=10_007 + i)
        for i, ctx in enumerate(contexts)))
    samples: list[Sample] = [r.to_sample(c, task="probe", turn=0, strategy="probe")
                             for c, r in zip(contexts, responses)]
    teacher.score(samples)
    diffs = [t - s for x in samples for t, s, m in zip(x.teacher_logprobs, x.logprobs, x.loss_mask) if m]
    return sum(diffs) / len(diffs) if diffs else math.nan

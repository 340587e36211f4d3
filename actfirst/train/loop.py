"""The OPD training loop: environment -> rollout -> buffer -> teacher scoring -> update -> engine.

    python -m actfirst.run --config configs/train/<setting>.yaml [key=value ...] [--resume]   (prepares, then this)

Each update (Appendix B.4, C.3):

1. rollout batches of ``rollout.batch_tasks`` tasks are collected until the FIFO buffer holds a batch of
   ``batch_samples`` full responses of the current or the immediately preceding weight version;
2. the frozen teacher scores every response token under the same context (fused log-prob gather);
3. the student takes its dual-clipped PPO steps on that batch;
4. the new weights go into the engine in this process; the version it returns is what the staleness rule reads.

With ``overlap``, the next rollout batch is collected while steps 2-3 run (in a thread; the engine keeps serving
on the event loop), and the new weights enter the engine when that rollout batch ends, so nothing in flight is
thrown away and the staleness rule bounds the lag to one version.

With an ``evaluation`` section the student is evaluated on the same engine (C.1, C.4: think-then-act, the evaluation
budget, seeds 42/43/44) before the first update, every ``evaluation.every`` updates and after the last; each
evaluation appends a line to ``evals.jsonl``, stores its report under ``evals/`` and redraws
``training_curve.png``. Evaluation time is not training time: ``elapsed_s`` excludes it.

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
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from actfirst.config import TrainConfig, to_dict
from actfirst.engine.core import ActFirstEngine, summarize_records
from actfirst.envs.benchmarks import get_benchmark
from actfirst.envs.workers import EnvPool
from actfirst.eval import evaluate, pick_tasks
from actfirst.references import load_references
from actfirst.rollout.runner import EpisodeResult, RolloutBatch, RolloutRunner
from actfirst.rollout.strategies import make_strategy
from actfirst.train.buffer import SampleBuffer
from actfirst.train.checkpoint import latest_checkpoint, load_checkpoint, restore_rng, save_checkpoint, truncate_metrics
from actfirst.train.metrics import ALIGNMENT_WINDOW, MetricsSink, rollout_metrics, summary_line
from actfirst.train.plots import plot_training_curve, read_records
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
    evals: list[dict[str, Any]]
    """The run's evaluations (``evals.jsonl``), the runs before a resume included."""


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


RESUMABLE_CHANGES = ("num_updates", "checkpoint_every", "keep_checkpoints", "probe_every", "evaluation", "prepare")
"""Config keys a resumed run may change; any other difference from the checkpointed run is refused."""


async def _train(cfg: TrainConfig, *, resume: bool, rank: int, world_size: int) -> TrainResult:
    started = time.perf_counter()
    torch.manual_seed(cfg.seed + rank)
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = latest_checkpoint(out_dir) if resume else None
    if resume and checkpoint is None:
        print(f"resume: no checkpoint in {out_dir}; starting from update 1", flush=True)
    if checkpoint is None and not resume and (out_dir / "metrics.jsonl").exists():
        raise FileExistsError(f"out_dir={str(out_dir)!r} holds a run's metrics.jsonl: pass --resume to continue it, "
                              f"or choose another out_dir")
    state = load_checkpoint(checkpoint) if checkpoint is not None else None
    if state is not None:
        _check_resumable(state["config"], to_dict(cfg))

    # The benchmark, this rank's tasks and their references.
    benchmark = get_benchmark(cfg.benchmark, cfg.env_config)
    tasks = cfg.training_tasks(benchmark)[rank::world_size]
    strategy = make_strategy(cfg.rollout.strategy)
    references = load_references(cfg.references) if strategy.uses_references else None
    if references is not None:
        missing = [benchmark.task_key(t) for t in tasks if benchmark.task_key(t) not in references]
        if missing:
            raise ValueError(f"references={cfg.references!r}: no reference for {len(missing)} of {len(tasks)} training "
                             f"tasks, e.g. {missing[:5]}")

    # The frozen teacher (its tokenizer is checked first), the student's trainer copy, the buffer. A checkpoint is a
    # Hugging Face directory: on resume the trainer and the engine both start from it.
    student_dir = str(checkpoint) if checkpoint is not None else cfg.student.model
    tokenizer = AutoTokenizer.from_pretrained(student_dir)
    teacher = TeacherScorer(cfg.teacher, student_tokenizer=tokenizer, dtype=cfg.teacher_dtype,
                            micro_batch_tokens=cfg.micro_batch_tokens)
    student = AutoModelForCausalLM.from_pretrained(student_dir, dtype=_DTYPES[cfg.train_dtype])
    student.train()
    updater = StudentUpdater(student, optim=cfg.optim, loss=cfg.loss, temperature=cfg.rollout.temperature,
                             num_updates=cfg.num_updates, num_minibatches=cfg.num_minibatches,
                             micro_batch_tokens=cfg.micro_batch_tokens)
    buffer = SampleBuffer()
    stream = TaskStream(tasks, cfg.seed + rank)
    probe_contexts: list[list[int]] = []
    probe_gaps: list[float] = []
    total_transitions, batch_index, first_update, elapsed_before = 0, 0, 1, 0.0
    recent: deque[list[EpisodeResult]] = deque(maxlen=ALIGNMENT_WINDOW)  # Appendix F's window, episodes only
    if state is not None:
        updater.load_state_dict(state["updater"])
        buffer.load_state_dict(state["buffer"])
        stream.load_state_dict(state["tasks"], benchmark.task_key)
        restore_rng(state)
        probe_contexts, probe_gaps = state["probe_contexts"], state["probe_gaps"]
        total_transitions, batch_index = state["total_transitions"], state["batch_index"]
        first_update, elapsed_before = state["update"] + 1, state["elapsed_s"]
    lead = rank == 0  # only rank 0 writes the config, the metrics and the checkpoints
    if lead:
        (out_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=1, default=str))
        if resume:  # drop what the updates after the checkpoint (or before any checkpoint) logged
            truncate_metrics(out_dir / "metrics.jsonl", state["update"] if state is not None else 0)
            truncate_metrics(out_dir / "evals.jsonl", state["update"] if state is not None else 0)
    sink = MetricsSink(out_dir) if lead else None
    eval_s = 0.0  # this process's evaluation time (not training time)
    eval_tasks = pick_tasks(benchmark, benchmark.tasks(cfg.evaluation.split), cfg.evaluation.tasks) \
        if cfg.evaluation is not None and lead else []

    def elapsed() -> float:
        """Training wall-clock so far, the runs before a resume included, evaluation excluded."""
        return elapsed_before + time.perf_counter() - started - eval_s

    def eval_due(update: int) -> bool:
        spec = cfg.evaluation
        return lead and spec is not None and (
            (update == 0 and spec.before) or update == cfg.num_updates or (spec.every > 0 and update > 0
                                                                           and update % spec.every == 0))

    async def run_evaluation(update: int) -> None:
        """Evaluate the engine's current weights; log, store the report and redraw the training curve."""
        nonlocal eval_s
        t0 = time.perf_counter()
        spec = cfg.evaluation
        tqdm.write(f"evaluation at update {update}: {len(eval_tasks)} tasks x seeds {spec.seeds}")
        report = await evaluate(engine, tokenizer, benchmark, eval_tasks, seeds=spec.seeds, rollout=cfg.rollout,
                                max_in_flight=spec.max_in_flight, progress=False, pool=pool)
        wall = time.perf_counter() - t0
        report.meta.update({"update": update, "weight_version": engine.weight_version, "split": spec.split})
        name = f"evals/update_{update:06d}.json"
        (out_dir / "evals").mkdir(exist_ok=True)
        (out_dir / name).write_text(report.to_json())
        summary = report.summary()
        eval_s += time.perf_counter() - t0
        row = {"update": update, "elapsed_s": elapsed(), "eval_wall_s": wall, "report": name, "summary": summary}
        with (out_dir / "evals.jsonl").open("a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        lo, hi = summary["SR_ci95_pooled"]
        tqdm.write(f"evaluation at update {update}: SR {summary['SR']['mean']:.1f} ± {summary['SR']['sd']:.1f} "
                   f"(95% CI [{lo:.1f}, {hi:.1f}], {summary['episodes']} episodes) in {wall:.0f} s")
        plot_training_curve(out_dir, teacher_sr=teacher_sr)
        engine.records.clear()  # the evaluation's requests are not the next update's queue statistics

    engine = ActFirstEngine.from_config(dataclasses.replace(cfg.student, model=student_dir), cfg.scheduler)
    if state is not None:
        engine.weight_version = state["weight_version"]  # the engine loaded the checkpoint's weights
        print(f"resume: {checkpoint} (update {state['update']}, weight version {engine.weight_version})", flush=True)
    teacher_sr = _teacher_sr(cfg.teacher)
    pending: asyncio.Future | None = None
    bar = tqdm(total=cfg.num_updates, initial=first_update - 1, desc="updates", unit="update", disable=not lead,
               dynamic_ncols=True)
    try:
        with EnvPool(benchmark.env_spec(), size=cfg.rollout.batch_tasks,
                     call_timeout_s=cfg.rollout.env_timeout_s) as pool:
            runner = RolloutRunner(engine=engine, tokenizer=tokenizer, benchmark=benchmark, pool=pool,
                                   strategy=strategy, cfg=cfg.rollout, references=references,
                                   seed=cfg.seed * 7919 + rank)
            done_evals = {r["update"] for r in read_records(out_dir / "evals.jsonl")}
            last_done = state["update"] if state is not None else 0
            if eval_due(last_done) and last_done not in done_evals:  # update 0, or one a kill interrupted
                await run_evaluation(last_done)

            def start_batch() -> asyncio.Future:
                nonlocal batch_index
                batch_index += 1
                return asyncio.ensure_future(runner.run_batch(stream.next(cfg.rollout.batch_tasks), batch_index))

            def finish_batch(batch: RolloutBatch, stats: dict[str, Any]) -> None:
                nonlocal total_transitions
                buffer.add(batch.samples)
                recent.append([_slim(e) for e in batch.episodes])
                total_transitions += batch.num_transitions
                stats["rollout_s"] += batch.wall_s
                stats["transitions"] += batch.num_transitions
                stats["batches"] += 1
                stats["failures"] += [f"{e.task}: {e.failure}" for e in batch.episodes if e.failure]
                if not probe_contexts and cfg.probe_contexts:  # spread over the batch's episodes and turns
                    step = max(1, len(batch.samples) // cfg.probe_contexts)
                    probe_contexts.extend(s.context_ids for s in batch.samples[::step][: cfg.probe_contexts])

            for update in range(first_update, cfg.num_updates + 1):
                update_started = time.perf_counter()
                generated_start, discarded_start = engine.num_generated_tokens, engine.num_discarded_tokens
                dropped_start = buffer.num_dropped
                stats: dict[str, Any] = {"rollout_s": 0.0, "transitions": 0, "batches": 0, "failures": []}
                # 1. Rollouts until the buffer holds a batch of the current or preceding version.
                while buffer.num_eligible(engine.weight_version) < cfg.batch_samples:
                    batch, pending = await (pending or start_batch()), None
                    finish_batch(batch, stats)
                samples = buffer.take(cfg.batch_samples, engine.weight_version)
                overlapped = False
                if cfg.overlap and buffer.num_eligible(engine.weight_version + 1) < cfg.batch_samples:
                    # The next update needs a new rollout batch: collect it on the event loop while the thread
                    # below scores and updates.
                    pending, overlapped = start_batch(), True

                # 2-3. Teacher scoring and the update.
                def score_and_update() -> dict[str, float]:
                    t0 = time.perf_counter()
                    teacher.score(samples)
                    t1 = time.perf_counter()
                    metrics = updater.update(samples, engine.weight_version)
                    return {**metrics, "score_s": t1 - t0, "update_s": time.perf_counter() - t1}

                metrics = (await asyncio.to_thread(score_and_update)) if cfg.overlap else score_and_update()

                # 4. Weights into the engine (with overlap: once the rollout batch in flight has ended), unless every
                # step was skipped (a non-finite loss or gradient): then the weights did not change.
                if pending is not None:
                    batch, pending = await pending, None
                    finish_batch(batch, stats)
                if metrics["skipped"] < cfg.num_minibatches:
                    version = engine.update_weights(student.named_parameters())
                else:
                    version = engine.weight_version
                    tqdm.write(f"update {update}: every step skipped (non-finite loss or gradient); weights kept")
                wall = time.perf_counter() - update_started
                generated = engine.num_generated_tokens - generated_start
                discarded = engine.num_discarded_tokens - discarded_start
                queue = summarize_records(engine.records)

                # 5. Probe (outside the update's time and token counts), log, checkpoint.
                if probe_contexts and (update % cfg.probe_every == 0 or update == cfg.num_updates):
                    metrics["probe/gap"] = await _probe_gap(runner, teacher, probe_contexts)
                    probe_gaps.append(metrics["probe/gap"])
                record = {
                    **metrics, **rollout_metrics([e for episodes in recent for e in episodes]),
                    "weight_version": version, "rollout_s": stats["rollout_s"], "rollout_batches": stats["batches"],
                    "overlapped": overlapped, "update_wall_s": wall, "elapsed_s": elapsed(),
                    "env_steps_per_s": stats["transitions"] / wall if wall > 0 else math.nan,
                    "transitions": stats["transitions"], "total_transitions": total_transitions,
                    "failed_episodes": len(stats["failures"]), "failures": stats["failures"],
                    "generated_tokens": generated, "discarded_tokens": discarded,
                    "discarded_frac": discarded / generated if generated else 0.0,
                    "buffer/size": len(buffer), "buffer/dropped": buffer.num_dropped - dropped_start,
                    "queue": queue,
                }
                engine.records.clear()  # per-update queue statistics (the probe's requests not included)
                if lead:
                    sink.log(update, record)
                    tqdm.write(summary_line(update, record))
                    for failure in stats["failures"]:
                        tqdm.write(f"  episode failed: {failure}")
                    # After the metrics: a kill between the two loses the update, never a line of the series.
                    if update % cfg.checkpoint_every == 0 or update == cfg.num_updates:
                        trainer_state = {
                            "update": update, "config": to_dict(cfg), "updater": updater.state_dict(),
                            "buffer": buffer.state_dict(), "tasks": stream.state_dict(benchmark.task_key),
                            "weight_version": engine.weight_version, "probe_contexts": probe_contexts,
                            "probe_gaps": probe_gaps, "total_transitions": total_transitions,
                            "batch_index": batch_index, "elapsed_s": elapsed()}
                        save_checkpoint(out_dir, update=update, model=student, tokenizer=tokenizer,
                                        trainer_state=trainer_state, keep=cfg.keep_checkpoints)
                bar.update(1)
                if eval_due(update):
                    await run_evaluation(update)
            if lead:
                plot_training_curve(out_dir, teacher_sr=teacher_sr)  # the gap curve, with or without evaluations
    finally:
        if pending is not None:
            pending.cancel()
        bar.close()
        if sink is not None:
            sink.close()
        await engine.close()
    return TrainResult(out_dir, cfg.num_updates, elapsed(), total_transitions, engine.weight_version, probe_gaps,
                       read_records(out_dir / "evals.jsonl"))


def _teacher_sr(teacher: str) -> float | None:
    """The teacher's SR (percent) when ``actfirst.prepare`` evaluated it (a line on the training curve)."""
    from actfirst.prepare import teacher_summary

    summary = teacher_summary(teacher)
    return summary["SR"]["mean"] if summary is not None else None


def _check_resumable(saved: dict[str, Any], current: dict[str, Any]) -> None:
    """Refuse to resume a run under a different config (a different strategy, benchmark, model...)."""
    differ = [k for k in sorted(set(saved) | set(current))
              if k not in RESUMABLE_CHANGES and saved.get(k) != current.get(k)]
    if differ:
        raise ValueError(f"resume: the config differs from the checkpointed run's in {differ} (only "
                         f"{list(RESUMABLE_CHANGES)} may change); use another out_dir for a new run")


def _slim(episode: EpisodeResult) -> EpisodeResult:
    """An episode without its contexts and responses: what the windowed rollout metrics need."""
    return dataclasses.replace(episode, contexts=[], full_responses=[], full_response_done=[])


async def _probe_gap(runner: RolloutRunner, teacher: TeacherScorer, contexts: list[list[int]]) -> float:
    """Teacher-minus-student log-prob gap (mean over sampled tokens) of fresh full responses at fixed contexts,
    with fixed seeds: an estimate of -KL(student || teacher) on those contexts (Eq. 4-5)."""
    responses = await asyncio.gather(*(runner.full_response(ctx, seed=10_007 + i) for i, ctx in enumerate(contexts)))
    samples: list[Sample] = [r.to_sample(c, task="probe", turn=0, strategy="probe")
                             for c, (r, _) in zip(contexts, responses)]
    teacher.score(samples)
    diffs = [t - s for x in samples for t, s, m in zip(x.teacher_logprobs, x.logprobs, x.loss_mask) if m]
    return sum(diffs) / len(diffs) if diffs else math.nan

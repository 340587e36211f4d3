"""A training run's evaluations (C.1, C.4: think-then-act, the evaluation budget, seeds 42/43/44): when they are due
(before the first update, every ``evaluation.every`` updates, after the last), played on the training engines and
environment workers (every rank its share of the episodes), and what rank 0 keeps of them: ``evals/``,
``evals.jsonl``, the trackers' record and ``training_curve.png``. Their time is not training time (the run's clock
leaves it out)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from actfirst.core.config import TrainConfig
from actfirst.engine.core import ActFirstEngine
from actfirst.envs.benchmarks import Benchmark
from actfirst.envs.workers import EnvPool
from actfirst.evaluation.evaluate import merge_reports, run_evaluation
from actfirst.evaluation.report import teacher_summary
from actfirst.parallel.context import (
    ParallelContext,
    all_gather_objects,
    broadcast_object,
    reduce_max,
    wait_for_ranks,
)
from actfirst.train.checkpoint import record_best
from actfirst.train.clock import RunClock
from actfirst.train.metrics import MetricsSink
from actfirst.train.plots import plot_training_curve, read_records

logger = logging.getLogger(__name__)


class TrainingEvaluations:
    """The evaluations of the run of ``cfg`` on this rank (see the module docstring)."""

    def __init__(self, cfg: TrainConfig, ctx: ParallelContext, *, benchmark: Benchmark, clock: RunClock) -> None:
        self.cfg, self.ctx, self.clock = cfg, ctx, clock
        self.out_dir = Path(cfg.out_dir)
        self.plan = run_evaluation(cfg, benchmark) if cfg.evaluation is not None else None
        self.teacher_sr = (teacher_summary(cfg.teacher) or {}).get("SR", {}).get("mean")
        """The teacher's SR, drawn in the training curve (None: it has no stored evaluation)."""

    def due(self, update: int) -> bool:
        spec = self.cfg.evaluation
        return spec is not None and ((update == 0 and spec.before) or update == self.cfg.num_updates
                                     or (spec.every > 0 and update > 0 and update % spec.every == 0))

    def done_before(self, update: int) -> bool:
        """Whether ``evals.jsonl`` holds ``update``'s evaluation (a resume after it), on every rank."""
        return broadcast_object(self.ctx.lead and update in {
            r["update"] for r in read_records(self.out_dir / "evals.jsonl")})

    async def run(self, update: int, *, engine: ActFirstEngine, tokenizer: Any, pool: EnvPool,
                  sink: MetricsSink | None) -> None:
        """Evaluate the engines' current weights (every rank its share of the episodes); rank 0 stores the report,
        appends to ``evals.jsonl`` and redraws the training curve (``sink``: rank 0's)."""
        t0, elapsed = time.perf_counter(), self.clock.elapsed()  # the training time it evaluates (its own excluded)
        if self.ctx.lead:
            logger.info("evaluation at update %d: %d tasks x seeds %s", update, len(self.plan.tasks),
                        self.plan.spec.seeds)
        report = await self.plan.play(engine, tokenizer, progress=False, pool=pool,
                                       shard=(self.ctx.rank, self.ctx.world_size))
        wait_for_ranks()  # shares may end hours apart: past the process group's timeout
        parts = all_gather_objects(report)
        wall = reduce_max([time.perf_counter() - t0])[0]
        if self.ctx.lead:
            report = merge_reports(parts, self.plan.benchmark)
            report.meta.update({"update": update, "weight_version": engine.weight_version,
                                "split": self.plan.spec.split, "world_size": self.ctx.world_size})
            self._record(update, report, wall, elapsed, sink)
        self.clock.exclude_evaluation(time.perf_counter() - t0, kept=wall)  # its report and plot included
        self.clock.beat()

    def _record(self, update: int, report: Any, wall: float, elapsed: float, sink: MetricsSink) -> None:
        name = f"evals/update_{update:06d}.json"
        (self.out_dir / "evals").mkdir(exist_ok=True)
        (self.out_dir / name).write_text(report.to_json())
        summary = report.summary()
        row = {"update": update, "elapsed_s": elapsed, "eval_wall_s": wall, "report": name, "summary": summary,
               "splits": {split: report.summary(split=split) for split in report.splits}}
        with (self.out_dir / "evals.jsonl").open("a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        sink.log_evaluation(update, row)
        lo, hi = summary["SR_ci95_pooled"]
        best = self.cfg.keep_best and record_best(self.out_dir, update=update, sr=summary["SR"]["mean"],
                                                  keep=self.cfg.keep_checkpoints)
        logger.info("evaluation at update %d: SR %.1f ± %.1f (95%% CI [%.1f, %.1f], %d episodes) in %.0f s%s", update,
                    summary["SR"]["mean"], summary["SR"]["sd"], lo, hi, summary["episodes"], wall,
                    " (the best so far: kept)" if best else "")
        self.draw_curve(update, sink)

    def draw_curve(self, update: int, sink: MetricsSink) -> None:
        """Rank 0: redraw ``training_curve.png`` and give it to the trackers."""
        sink.log_image(update, "training_curve", plot_training_curve(self.out_dir, teacher_sr=self.teacher_sr))

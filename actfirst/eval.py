"""Evaluation of a student checkpoint (Appendix C.1, C.4): think-then-act without references, the evaluation
thinking budget, seeds 42, 43, 44; SR, Score (ScienceWorld, WebShop), Round, mean and sample SD over the seeds,
overall, per task type (ALFWorld: seen and unseen pooled) and per evaluation split (``Benchmark.task_split``:
ALFWorld's valid_seen and valid_unseen apart, as Table 1 reports them).

    python -m actfirst.eval --checkpoint DIR --benchmark alfworld [--split eval] [--tasks N] [--seeds 42 43 44] \\
        [--out report.json] [key=value ...]        # env config; rollout.*, engine.*, scheduler.* go to those configs

The command line over ``actfirst.evaluation`` (what is played and how: its docstring).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from actfirst.config import EngineConfig, RolloutConfig, SchedulerConfig
from actfirst.envs.benchmarks import BENCHMARKS, Benchmark
from actfirst.eval_report import EvalReport
from actfirst.evaluation import EVAL_SEEDS, emit_report, evaluate, pick_tasks, served, serving_configs
from actfirst.user_input import check_model_dir, check_writable_file, command, positive_int


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m actfirst.eval``."""
    parser = argparse.ArgumentParser(prog="python -m actfirst.eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="the student's Hugging Face directory")
    parser.add_argument("--benchmark", required=True, choices=sorted(BENCHMARKS))
    parser.add_argument("--split", default="eval", choices=["train", "eval"])
    parser.add_argument("--tasks", type=int, default=0, help="evaluate N tasks, round-robin over task types (0: all)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(EVAL_SEEDS))
    parser.add_argument("--out", help="write the JSON report here")
    parser.add_argument("--config", help="env config file (default configs/envs/<benchmark>.yaml)")
    parser.add_argument("--max-in-flight", type=positive_int, default=16, help="episodes (and env workers) at once")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="env config overrides (games=generated, max_turns=...); rollout.*, engine.*, "
                             "scheduler.* override those configs (rollout.budget.eval_total=..., engine.dtype=...)")
    return parser


async def _main(args: argparse.Namespace, benchmark: Benchmark, rollout: RolloutConfig, engine_cfg: EngineConfig,
                scheduler_cfg: SchedulerConfig) -> EvalReport:
    tasks = pick_tasks(benchmark, benchmark.tasks(args.split), args.tasks)
    print(f"[eval {benchmark.name}] {len(tasks)} {args.split} tasks x seeds {args.seeds}, checkpoint "
          f"{args.checkpoint}", flush=True)
    async with served(engine_cfg, scheduler_cfg) as (engine, tokenizer):
        return await evaluate(engine, tokenizer, benchmark, tasks, seeds=args.seeds, rollout=rollout,
                              max_in_flight=args.max_in_flight)


@command
def main(argv: list[str] | None = None) -> int:
    """Evaluate a checkpoint (every input checked before the engine starts); returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if len(set(args.seeds)) != len(args.seeds) or min(args.seeds) < 0:
        parser.error(f"--seeds={args.seeds}: need distinct seeds >= 0")
    check_model_dir(args.checkpoint, "--checkpoint")
    if args.out:
        check_writable_file(args.out, "--out")
    benchmark, rollout, engine_cfg, scheduler_cfg = serving_configs(
        args.checkpoint, args.benchmark, args.config, args.overrides, max_in_flight=args.max_in_flight,
        budget="eval_total")
    report = asyncio.run(_main(args, benchmark, rollout, engine_cfg, scheduler_cfg))
    report.meta.update({"checkpoint": str(args.checkpoint), "split": args.split})
    emit_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

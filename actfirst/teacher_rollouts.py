"""Teacher rollouts as reference candidates (Appendix C.2: "ten rollouts per training task" of the teacher).

    python -m actfirst.teacher_rollouts --teacher DIR --benchmark scienceworld --out refs/teacher.jsonl \\
        [--per-task 10] [--tasks N] [--config ENVYAML] [key=value ...]   # rollout.*, engine.*, scheduler.* as eval

The command line over ``actfirst.preparation.teacher_candidates`` (how the teacher plays and what is kept: its
docstring). The JSONL it writes is what ``python -m actfirst.references build --candidates`` reads. Each task's
candidates go to the journal ``<out>.partial`` as soon as its rollouts finish (``actfirst.core.journal``): a killed run,
started again with the same arguments, plays only the tasks the journal lacks (delete the journal to start over);
``<out>`` is written atomically once every task is done.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from actfirst.core.config import EngineConfig, RolloutConfig, SchedulerConfig
from actfirst.core.user_input import check_writable_file, command, positive_int
from actfirst.envs.benchmarks import BENCHMARKS, Benchmark
from actfirst.evaluation.evaluate import pick_tasks, served, serving_configs
from actfirst.models.hub import resolve_model
from actfirst.preparation.teacher_candidates import MAX_REPEATS, merge_candidates, play_share


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m actfirst.teacher_rollouts``."""
    parser = argparse.ArgumentParser(prog="python -m actfirst.teacher_rollouts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", required=True, help="the teacher's Hugging Face directory or Hub id")
    parser.add_argument("--revision", default=None, help="with a Hub id: its branch, tag or commit (default: main)")
    parser.add_argument("--benchmark", required=True,
                        choices=sorted(n for n, b in BENCHMARKS.items() if b.fast_actions))
    parser.add_argument("--out", required=True, help="candidate JSONL to write")
    parser.add_argument("--split", default="train", choices=["train", "eval"])
    parser.add_argument("--per-task", type=int, default=10, help="rollouts per task (C.2: ten)")
    parser.add_argument("--tasks", type=int, default=0, help="N tasks, round-robin over task types (0: all)")
    parser.add_argument("--seed", type=int, default=0, help="base of the sampling seeds")
    parser.add_argument("--config", help="env config file (default actfirst/envs/<benchmark>/<benchmark>.yaml)")
    parser.add_argument("--max-in-flight", type=positive_int, default=16, help="episodes (and env workers) at once")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="env config overrides (max_turns=...); rollout.*, engine.*, scheduler.* override those "
                             "configs (rollout.budget.total=..., rollout.temperature=..., engine.dtype=...)")
    return parser


async def _main(args: argparse.Namespace, benchmark: Benchmark, rollout: RolloutConfig, engine_cfg: EngineConfig,
                scheduler_cfg: SchedulerConfig) -> Path:
    """Play the tasks the journal of ``--out`` lacks, then write ``--out`` from it; returns its path."""
    tasks = pick_tasks(benchmark, benchmark.tasks(args.split), args.tasks)
    print(f"[teacher {benchmark.name}] {len(tasks)} {args.split} tasks x {args.per_task} rollouts, teacher "
          f"{args.teacher}", flush=True)
    async with served(engine_cfg, scheduler_cfg) as (engine, tokenizer):
        await play_share(engine, tokenizer, benchmark, tasks, out=args.out, per_task=args.per_task, rollout=rollout,
                         max_in_flight=args.max_in_flight, seed=args.seed)
    path = merge_candidates(args.out, [benchmark.task_key(t) for t in tasks])
    kept = [json.loads(line)["task"] for line in path.read_text().splitlines()]
    print(f"[teacher {benchmark.name}] {len(set(kept))}/{len(tasks)} tasks with a kept rollout, {len(kept)} distinct "
          f"sequences", flush=True)
    return path


@command
def main(argv: list[str] | None = None) -> int:
    """Play the teacher's rollouts and write the kept ones (every input checked first); the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 1 <= args.per_task <= MAX_REPEATS:
        parser.error(f"--per-task={args.per_task}: must be in [1, {MAX_REPEATS}]")
    if args.max_in_flight < 1:
        parser.error(f"--max-in-flight={args.max_in_flight}: must be >= 1")
    if args.seed < 0:
        parser.error(f"--seed={args.seed}: must be >= 0")
    teacher = resolve_model(args.teacher, "--teacher", args.revision, revision_key="--revision")
    check_writable_file(args.out, "--out")
    benchmark, rollout, engine_cfg, scheduler_cfg = serving_configs(
        str(teacher), args.benchmark, args.config, args.overrides, max_in_flight=args.max_in_flight,
        budget="total")
    print(f"wrote {asyncio.run(_main(args, benchmark, rollout, engine_cfg, scheduler_cfg))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

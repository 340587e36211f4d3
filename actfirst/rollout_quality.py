"""Rollout quality of a frozen checkpoint (Sec. 5.4, Appendix C.5, Figure 4): think-then-act, direct action without
reference next observations, and ActFirst-OPD's reference-conditioned interaction, played on the same tasks.

    python -m actfirst.rollout_quality --checkpoint DIR --config CFG [--tasks N] [--seed S] [--out report.json] \\
        [--max-in-flight K] [key=value ...]       # overrides of the training config CFG

The command line over ``actfirst.evaluation.quality`` (the strategies, their settings and seeds: its docstring). The
tasks are the config's training tasks, or ``--tasks N`` of them spread over the task types as
``actfirst.evaluation.evaluate.pick_tasks`` spreads them; task i's turn t samples with a seed that is a function of
(``--seed``, i, t) alone.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys

from actfirst.core.config import ConfigError, TrainConfig
from actfirst.core.user_input import check_exists, check_writable_file, command, positive_int
from actfirst.envs.base import Reference
from actfirst.envs.benchmarks import BENCHMARKS, Benchmark, get_benchmark
from actfirst.evaluation.evaluate import pick_tasks, save_report, served
from actfirst.evaluation.quality import STRATEGIES, measure_quality, model_len_needed, quality_rollout_config
from actfirst.evaluation.quality_metrics import QualityReport
from actfirst.models.hub import resolve_model
from actfirst.preparation.build import load_run_config
from actfirst.preparation.reference_cache import load_references


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m actfirst.rollout_quality``."""
    parser = argparse.ArgumentParser(prog="python -m actfirst.rollout_quality", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="the frozen student's Hugging Face directory or Hub id")
    parser.add_argument("--revision", default=None, help="with a Hub id: its branch, tag or commit (default: main)")
    parser.add_argument("--config", required=True, help="the training config (benchmark, tasks, references, budget)")
    parser.add_argument("--tasks", type=int, default=0, help="N training tasks, round-robin over task types (0: all)")
    parser.add_argument("--seed", type=int, default=42, help="base of the sampling seeds")
    parser.add_argument("--out", help="write the JSON report here")
    parser.add_argument("--max-in-flight", type=positive_int, default=16, help="episodes (and env workers) at once")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides of the training config")
    return parser


def load_inputs(args: argparse.Namespace) -> tuple[TrainConfig, Benchmark, list, dict[str, Reference]]:
    """The config, benchmark, tasks and references of ``args``, every input checked before any engine starts
    (``ConfigError`` naming the first that cannot be used). The teacher is not read, so its path is not checked."""
    args.checkpoint = str(resolve_model(args.checkpoint, "--checkpoint", args.revision,  # a Hub id: its snapshot
                                        revision_key="--revision"))
    if args.out:
        check_writable_file(args.out, "--out")
    cfg = load_run_config(args.config, args.overrides)
    benchmark = get_benchmark(cfg.benchmark, cfg.env)
    if benchmark.state_source is None:
        raise ConfigError(f"benchmark={cfg.benchmark!r}: its environment exposes no state to compare (C.5); "
                          f"rollout quality runs on {[n for n, b in BENCHMARKS.items() if b.state_source]}")
    if cfg.references is None:
        raise ConfigError("references=None: the actfirst strategy needs the reference cache")
    check_exists(cfg.references, "references", "file")
    tasks = pick_tasks(benchmark, cfg.training_tasks(benchmark), args.tasks)
    references = load_references(cfg.references, benchmark=benchmark, tasks=[benchmark.task_key(t) for t in tasks])
    return cfg, benchmark, tasks, references


async def _main(args: argparse.Namespace, cfg: TrainConfig, benchmark: Benchmark, tasks: list,
                references: dict[str, Reference]) -> QualityReport:
    need = model_len_needed(quality_rollout_config(cfg.rollout, args.max_in_flight))
    engine_cfg = dataclasses.replace(cfg.student, model=args.checkpoint,
                                     max_model_len=max(cfg.student.max_model_len, need))
    print(f"[quality {benchmark.name}] {len(tasks)} training tasks x {list(STRATEGIES)}, checkpoint "
          f"{args.checkpoint}", flush=True)
    async with served(engine_cfg, cfg.scheduler) as (engine, tokenizer):
        return await measure_quality(engine, tokenizer, benchmark, tasks, references=references, rollout=cfg.rollout,
                                     seed=args.seed, max_in_flight=args.max_in_flight)


@command
def main(argv: list[str] | None = None) -> int:
    """Measure a checkpoint's rollout quality (every input checked before the engine starts); the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error(f"--seed={args.seed}: must be >= 0")
    cfg, benchmark, tasks, references = load_inputs(args)
    report = asyncio.run(_main(args, cfg, benchmark, tasks, references))
    report.meta.update({"checkpoint": str(args.checkpoint), "config": str(args.config)})
    print(save_report(report, args.out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Evaluation of a student checkpoint (Appendix C.1, C.4): think-then-act without references, the evaluation
thinking budget, seeds 42, 43, 44; SR, Score (ScienceWorld, WebShop), Round, mean and sample SD over the seeds,
overall, per task type (ALFWorld: seen and unseen pooled) and per evaluation split (``Benchmark.task_split``:
ALFWorld's valid_seen and valid_unseen apart, as Table 1 reports them).

    python -m actfirst.eval --checkpoint DIR --config TRAIN.yaml [key=value ...]       # as the run evaluates
    python -m actfirst.eval --checkpoint best --config runs/x/config.json     # that run's best (or latest) one
    python -m actfirst.eval --checkpoint DIR --benchmark alfworld [--env-config ENV.yaml] [key=value ...]
    python -m actfirst.eval --checkpoint Qwen/Qwen3-1.7B [--revision REV] --benchmark alfworld   # a Hub model
        [--split eval] [--tasks N] [--seeds 42 43 44] [--max-in-flight 16] [--out report.json] [--nproc-per-node N]

``--config``: the training run's config (``python -m actfirst.run``'s): its ``evaluation:`` section (split, tasks,
seeds, max_in_flight, temperature, top_p), its rollout section (prompt limit, evaluation budgets), its ``env:``, its
``student:`` engine (checkpoint as the model) and scheduler, so the command plays the episodes the run's own
evaluation played; overrides are that config's keys (``evaluation.tasks=8``, ``student.dtype=bfloat16``).
``--benchmark``: an environment config (its default file, or ``--env-config``) with overrides of its keys, and
``evaluation.*``, ``rollout.*``, ``engine.*``, ``scheduler.*`` for those sections; evaluation's defaults are a
training run's (``EvaluationConfig``: temperature 0.6, top-p 1). ``--split``, ``--tasks``, ``--seeds`` and
``--max-in-flight`` set ``evaluation.<key>`` in either form. ``--nproc-per-node N``: N ranks on this machine (default:
one per GPU, one on a CPU), each with its own engine on its share of the (seed, task) episodes; rank 0 merges the
report (under torchrun every process is a rank).

The command line over ``actfirst.evaluation.evaluate`` (what is played and how: its docstring).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from actfirst.core.config import EngineConfig, SchedulerConfig, TrainConfig
from actfirst.core.schema import load_config, paths_unchecked
from actfirst.core.user_input import (
    ConfigError,
    add_nproc_argument,
    check_writable_file,
    command,
    positive_int,
    ranks_per_node,
)
from actfirst.envs.benchmarks import BENCHMARKS
from actfirst.models.hub import model_commit, resolve_model
from actfirst.parallel.host_memory import check_host_memory, eval_worker_stage

if TYPE_CHECKING:
    from actfirst.evaluation.evaluate import RunEvaluation
    from actfirst.evaluation.report import EvalReport

# torch and scipy are imported where they are used, not here: every environment worker (a spawned process) runs this
# module again as its ``__mp_main__``, and they cost it about 1.5 s of CPU each (tests/test_command_imports.py)


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m actfirst.eval``."""
    parser = argparse.ArgumentParser(prog="python -m actfirst.eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True,
                        help="the student's Hugging Face directory, a Hub id (owner/name), a run's checkpoint "
                             "(<out_dir>/checkpoints/update_NNNNNN, .../latest, .../best), or with --config: latest "
                             "or best of that run")
    parser.add_argument("--revision", default=None, help="with a Hub id: its branch, tag or commit (default: main)")
    parser.add_argument("--config", help="the training run's config: evaluate as the run does")
    parser.add_argument("--benchmark", choices=sorted(BENCHMARKS),
                        help="evaluate on a benchmark without a run config")
    parser.add_argument("--env-config",
                        help="with --benchmark: env config file (default actfirst/envs/<benchmark>/<benchmark>.yaml)")
    parser.add_argument("--split", choices=["train", "eval"], help="evaluation.split")
    parser.add_argument("--tasks", type=int, help="evaluation.tasks: N tasks, round-robin over task types (0: all)")
    parser.add_argument("--seeds", type=int, nargs="+", help="evaluation.seeds")
    parser.add_argument("--max-in-flight", type=positive_int, help="evaluation.max_in_flight: episodes at once")
    parser.add_argument("--out", help="write the JSON report here")
    add_nproc_argument(parser, "ranks on this machine, each with its own engine; ignored under torchrun")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="with --config: the run config's keys (evaluation.temperature=0.4, student.dtype=...); "
                             "with --benchmark: env keys (games=generated, max_turns=...), evaluation.*, rollout.*, "
                             "engine.*, scheduler.*")
    return parser


def flag_overrides(args: argparse.Namespace) -> list[str]:
    """``evaluation.<key>=value`` for each of ``--split``, ``--tasks``, ``--seeds``, ``--max-in-flight`` given."""
    given = {"split": args.split, "tasks": args.tasks, "seeds": args.seeds, "max_in_flight": args.max_in_flight}
    return [f"evaluation.{key}={json.dumps(value)}" for key, value in given.items() if value is not None]


def serving(args: argparse.Namespace) -> tuple[RunEvaluation, EngineConfig, SchedulerConfig]:
    """The evaluation and its engine from the command line (every input checked; ``ConfigError`` otherwise)."""
    if (args.config is None) == (args.benchmark is None):
        raise ConfigError("give --config (a training run's config) or --benchmark (with --env-config for an "
                          "environment file), not both and not neither")
    if args.env_config is not None and args.benchmark is None:
        raise ConfigError(f"--env-config={args.env_config!r}: goes with --benchmark (--config holds its env: section)")
    from actfirst.evaluation.evaluate import benchmark_serving, run_serving
    from actfirst.parallel.context import launched_as_rank

    overrides = list(args.overrides) + flag_overrides(args)
    # a Hub id is downloaded by the launching process only; the ranks read the cache
    model = str(resolve_model(checkpoint_name(args, overrides), "--checkpoint", args.revision,
                              revision_key="--revision", download=not launched_as_rank()))
    if args.out:
        check_writable_file(args.out, "--out")
    if args.config is not None:
        return run_serving(args.config, model, overrides)
    return benchmark_serving(model, args.benchmark, args.env_config, overrides)


def checkpoint_name(args: argparse.Namespace, overrides: list[str]) -> str:
    """``--checkpoint`` as a directory or Hub id: ``latest`` or ``best`` (with ``--config``) as that run's
    ``<out_dir>/checkpoints/latest`` or ``.../best``, and those as the checkpoint they name."""
    from actfirst.train.checkpoint import NAMED, named_checkpoint

    name = args.checkpoint
    if name in NAMED and not Path(name).exists():
        if args.config is None:
            raise ConfigError(f"--checkpoint={name!r}: names a checkpoint of a run; give the run's --config (or "
                              f"the path <out_dir>/checkpoints/{name})")
        with paths_unchecked():
            out_dir = load_config(TrainConfig, args.config, overrides).out_dir
        name = str(Path(out_dir) / "checkpoints" / name)
    return str(named_checkpoint(name, "--checkpoint"))


async def _play(plan: RunEvaluation, engine_cfg: EngineConfig, scheduler_cfg: SchedulerConfig,
                shard: tuple[int, int]) -> list[EvalReport]:
    """This rank's part, and every rank's parts gathered while the engines run (vLLM's shutdown may take the
    process group down with it)."""
    from actfirst.evaluation.evaluate import served
    from actfirst.parallel.context import all_gather_objects, wait_for_ranks

    async with served(engine_cfg, scheduler_cfg, world_size=shard[1]) as (engine, tokenizer):
        report = await plan.play(engine, tokenizer, progress=shard[0] == 0, shard=shard)
        wait_for_ranks()  # shares may end far apart: past the process group's timeout
        return all_gather_objects(report)


def evaluate_as_rank(args: argparse.Namespace, plan: RunEvaluation, engine_cfg: EngineConfig,
                     scheduler_cfg: SchedulerConfig) -> None:
    """Play this process's share (all of it in a world of one); rank 0 merges the parts and writes the report."""
    from actfirst.evaluation.evaluate import merge_reports, save_report
    from actfirst.parallel.context import init_parallel, launched_as_rank, shutdown_parallel

    ctx = init_parallel() if launched_as_rank() else None
    rank, ranks = (ctx.rank, ctx.world_size) if ctx is not None else (0, 1)
    if rank == 0:
        print(f"[eval {plan.benchmark.name}] {len(plan.tasks)} {plan.spec.split} tasks x seeds {plan.spec.seeds} "
              f"at temperature {plan.rollout.temperature}, checkpoint {args.checkpoint}"
              f"{f' on {ranks} ranks' if ranks > 1 else ''}", flush=True)
    parts = asyncio.run(_play(plan, engine_cfg, scheduler_cfg, (rank, ranks)))
    if rank == 0:
        merged = merge_reports(parts, plan.benchmark) if ranks > 1 else parts[0]
        merged.meta.update({"checkpoint": str(args.checkpoint), "commit": model_commit(engine_cfg.model),
                            "split": plan.spec.split, "config": args.config, "world_size": ranks})
        print(save_report(merged, args.out), flush=True)
    if ctx is not None:
        shutdown_parallel()


@command
def main(argv: list[str] | None = None) -> int:
    """Evaluate a checkpoint (every input checked before any engine or rank starts); returns the exit status."""
    from actfirst.parallel.context import launched_as_rank
    from actfirst.parallel.launch import launch_ranks

    args = build_parser().parse_intermixed_args(argv)  # KEY=VALUE overrides before and after options
    plan, engine_cfg, scheduler_cfg = serving(args)
    if not launched_as_rank():
        nproc = ranks_per_node(args.nproc_per_node)
        for line in check_host_memory([eval_worker_stage(plan.benchmark.name, plan.spec.max_in_flight, nproc)]):
            print(f"[eval] {line}", flush=True)
        if nproc > 1:
            return launch_ranks(nproc, ["-m", "actfirst.eval", *(sys.argv[1:] if argv is None else argv)])
    evaluate_as_rank(args, plan, engine_cfg, scheduler_cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The product run: prepare what is missing, start the ranks, train, evaluate, and say where everything is.

    python -m actfirst.run                                      # the CPU demo (configs/demo/scienceworld_lifespan.yaml)
    python -m actfirst.run --config configs/train/<benchmark>/<setting>.yaml [key=value ...] [--resume]
    python -m actfirst.run --config ... --nproc-per-node 2      # ranks on this machine (default: one per GPU)
    python -m actfirst.run --config ... --dry-run [--gpu 80GB]  # what it would use and need; starts nothing
    torchrun --nnodes N --nproc-per-node 8 ... -m actfirst.run --config ...   # several nodes

Stages: ``actfirst.prepare`` (reference cache; for the demo also the teacher and the student's warm start) from the
launching process, the teacher's rollouts and the reference replay shared by as many ranks as the training, then the
training (``actfirst.train.trainer``) on every rank with its evaluations (update 0, every ``evaluation.every``
updates, the last), each of which rewrites ``<out_dir>/training_curve.png``.

Without torchrun's environment this command starts the ranks itself: one in this process, or several through
PyTorch's elastic launcher (``actfirst.parallel.launch``), each of which runs this same command as a rank. Under
torchrun every process is a rank and preparation must have been done (``python -m actfirst.prepare``). A rank
that fails stops the others; ``--resume`` continues from the latest checkpoint (kill -9 included), on any number
of ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from actfirst.core.config import DEMO_CONFIG, ConfigError, TrainConfig
from actfirst.core.logs import run_log_dir, setup_logging
from actfirst.core.user_input import add_nproc_argument, command, ranks_per_node
from actfirst.train.clock import LAUNCH_ENV


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m actfirst.run``."""
    parser = argparse.ArgumentParser(prog="python -m actfirst.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=None, help="a training config (default: the CPU demo)")
    parser.add_argument("--resume", action="store_true", help="continue the run in out_dir from its latest checkpoint")
    add_nproc_argument(parser, "ranks to start on this machine; ignored under torchrun, which sets its own")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the resolved config, where each model and data set resolves, the GPU memory plan "
                             "and the host memory, and exit (0: the run could start) without starting anything")
    parser.add_argument("--gpu", default=None, metavar="GPU",
                        help="with --dry-run: plan for this GPU (80GB, 141GB or a size in GiB; default: the GPU here)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides (rollout.strategy=vanilla)")
    return parser


@command
def main(argv: list[str] | None = None) -> int:
    """Launch the run (no torchrun environment) or run this process's rank; returns the exit status."""
    from actfirst.parallel.context import launched_as_rank
    from actfirst.preparation.build import check_inputs, load_run_config, resolve_models

    args = build_parser().parse_intermixed_args(argv)  # KEY=VALUE overrides before and after options
    if args.gpu is not None and not args.dry_run:
        raise ConfigError(f"--gpu={args.gpu!r}: goes with --dry-run (a run plans for the GPUs it has)")
    if args.dry_run:
        from actfirst.preparation.dry_run import dry_run

        report = dry_run(args.config, args.overrides, nproc=args.nproc_per_node, gpu=args.gpu, resume=args.resume)
        print("\n".join(report.lines()), flush=True)
        return 0 if report.could_start else 1
    if not launched_as_rank():
        return launch(args)
    from torch.distributed.elastic.multiprocessing.errors import record

    # a rank started by the launcher (its models resolved there) or by torchrun: it never downloads a model
    cfg = resolve_models(load_run_config(args.config, args.overrides), download=False)
    setup_logging(run_log_dir(cfg.out_dir))
    check_inputs(cfg)
    # an error is written where the launcher reads it
    status = record(train)(cfg, args)
    # Every output is written and closed. Leave without the interpreter's teardown: a native thread that a library
    # never joined can abort it ("terminate called without an active exception", SIGABRT after a finished run,
    # seen once on a 2-rank resume), and the launcher would then report a finished run as failed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def launch(args: argparse.Namespace) -> int:
    """The launching process: check the config, resolve its models (downloading Hub ids), prepare what is missing,
    start the ranks (with the models' local paths)."""
    from actfirst.parallel.host_memory import check_host_memory, run_worker_stages
    from actfirst.parallel.launch import launch_ranks
    from actfirst.preparation.build import (
        RankFailed,
        load_run_config,
        model_overrides,
        plays_teacher_rollouts,
        resolve_models,
    )
    from actfirst.train.pipeline import check_layout
    from actfirst.train.stages import prepare

    started = time.time()
    nproc = ranks_per_node(args.nproc_per_node)
    cfg = load_run_config(args.config, args.overrides)
    check_layout(cfg, nproc)
    if not args.resume and (Path(cfg.out_dir) / "metrics.jsonl").exists():
        raise ConfigError(f"out_dir={cfg.out_dir!r} holds a run: add --resume to continue it, or give another "
                          f"out_dir=... to start a new one")
    setup_logging(run_log_dir(cfg.out_dir))
    print(f"[run] config {args.config or DEMO_CONFIG}; out_dir {cfg.out_dir}; {nproc} rank(s)", flush=True)
    cfg = resolve_models(cfg)  # a model that is missing is named first
    for line in check_host_memory(run_worker_stages(cfg, nproc, preparing=plays_teacher_rollouts(cfg))):
        print(f"[run] {line}", flush=True)
    resolved = model_overrides(cfg)
    try:  # every input is checked first; the teacher's rollouts and the replay run on the ranks too
        timings = prepare(cfg, args.config, [*args.overrides, *resolved], nproc=nproc, in_child=nproc > 1)
    except RankFailed as e:
        print(f"[run] {e}", file=sys.stderr, flush=True)
        return 1
    os.environ[LAUNCH_ENV] = json.dumps({"started": started, "prepare_s": time.time() - started,
                                         "prepare_stages_s": timings})
    if nproc == 1:
        return train(cfg, args)
    return launch_ranks(nproc, ["-m", "actfirst.run", *rank_argv(args), *resolved])


def train(cfg: TrainConfig, args: argparse.Namespace) -> int:
    """This process's rank of the run (``actfirst.train.stages.run_rank``); rank 0 prints where everything is."""
    from actfirst.train.stages import run_rank

    message = run_rank(cfg, resume=args.resume, config=args.config)
    if message is not None:
        print(message, flush=True)
    return 0


def rank_argv(args: argparse.Namespace) -> list[str]:
    """The command line every rank runs (the same run, without the launcher's own option)."""
    return ([] if args.config is None else ["--config", args.config]) + (["--resume"] if args.resume else []) + \
        list(args.overrides)


if __name__ == "__main__":
    sys.exit(main())

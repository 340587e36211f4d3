"""Build what a training run needs before it starts.

    python -m actfirst.prepare --config configs/<benchmark>/<setting>.yaml [key=value ...]
    python -m actfirst.prepare --config ... --nproc-per-node 8     # teacher rollouts and replay on 8 ranks

The command line over ``actfirst.preparation.build`` (what is built, and from what: its docstring). Whatever exists is
kept: a second call does nothing, and a killed one resumes without redoing a finished task. The teacher's rollouts
and the reference replay are shared by ``--nproc-per-node`` ranks (default: one per GPU; one on a CPU), each
started as this command with ``--stage`` under PyTorch's elastic launcher.
"""

from __future__ import annotations

import argparse
import os
import sys

from actfirst.core.logs import run_log_dir, setup_logging
from actfirst.core.user_input import ConfigError, add_nproc_argument, command, ranks_per_node
from actfirst.parallel.host_memory import check_host_memory, preparation_stage
from actfirst.preparation.build import (
    STAGES,
    RankFailed,
    ensure_prepared,
    load_run_config,
    plays_teacher_rollouts,
    resolve_models,
    run_stage,
)


@command
def main(argv: list[str] | None = None) -> int:
    """Prepare what the config needs; returns the exit status."""
    from actfirst.parallel.context import launched_as_rank

    parser = argparse.ArgumentParser(prog="python -m actfirst.prepare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=None, help="a training config (default: the CPU demo's)")
    add_nproc_argument(parser, "ranks that share the teacher's rollouts and the replay")
    parser.add_argument("--stage", choices=STAGES, default=None,
                        help="run one rank's share of this stage only (how preparation starts its ranks)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = parser.parse_intermixed_args(argv)  # KEY=VALUE overrides before and after options
    cfg = load_run_config(args.config, args.overrides)
    setup_logging(run_log_dir(cfg.out_dir))
    if args.stage is not None:
        from torch.distributed.elastic.multiprocessing.errors import record

        record(run_stage)(cfg, args.stage)  # an error is written where the launcher reads it
        # Leave without the interpreter's teardown, as a training rank does (actfirst.run): a native thread that a
        # library never joined can abort it, and the launcher would report a finished share as failed.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    if launched_as_rank():
        raise ConfigError("python -m actfirst.prepare starts its own ranks (--nproc-per-node); run it without "
                          "torchrun")
    nproc = ranks_per_node(args.nproc_per_node)
    cfg = resolve_models(cfg)  # Hub ids downloaded here, once; the stage ranks get the resolved paths
    stage = preparation_stage(cfg, nproc) if plays_teacher_rollouts(cfg) else None
    for line in check_host_memory([stage] if stage is not None else []):
        print(f"[prepare] {line}", flush=True)
    try:
        timings = ensure_prepared(cfg, nproc)
    except RankFailed as e:
        print(f"[prepare] {e}", file=sys.stderr, flush=True)
        return 1
    done = ", ".join(f"{k[:-2]} {v:.0f} s" for k, v in timings.items()) or "nothing to do: everything exists"
    print(f"[prepare] {done}; references {cfg.references}, teacher {cfg.teacher}, student {cfg.student.model}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

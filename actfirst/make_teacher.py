"""Make a task-specialized teacher by SFT on successful trajectories (Appendix C.2's first stage).

    python -m actfirst.make_teacher --config configs/teacher/alfworld-qwen3-8b-sft.yaml \\
        base_model=/models/Qwen3-8B references=runs/refs/alfworld.jsonl out=runs/teachers/alfworld-qwen3-8b-sft
    python -m actfirst.make_teacher --config ... --train-config configs/train/alfworld/qwen3-1.7b.yaml   # its env
    python -m actfirst.make_teacher --config ... --nproc-per-node 8        # ranks on this machine
    torchrun --nnodes N --nproc-per-node 8 ... -m actfirst.make_teacher --config ...   # several nodes

The command line over ``actfirst.teacher.sft`` (the config, the data, the layout) and
``actfirst.teacher.training`` (each rank's loop). Rerun the same command after an interruption: it continues from
the last checkpoint; once ``out`` holds the teacher it does nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from actfirst.core.user_input import add_nproc_argument, check_writable_dir, command, ranks_per_node
from actfirst.models.hub import resolve_model


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m actfirst.make_teacher``."""
    parser = argparse.ArgumentParser(prog="python -m actfirst.make_teacher", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=None, help="a teacher SFT config (configs/teacher/*.yaml)")
    parser.add_argument("--train-config", default=None, metavar="YAML",
                        help="a training config whose benchmark, env (and references) the teacher takes")
    add_nproc_argument(parser, "ranks to start on this machine; ignored under torchrun")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides (epochs=3)")
    return parser


@command
def main(argv: list[str] | None = None) -> int:
    """Start the ranks (no torchrun environment) or run this process's rank; returns the exit status."""
    from actfirst.parallel.context import launched_as_rank
    from actfirst.teacher.sft import check_resumable, finished, load_teacher_config

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_intermixed_args(argv)  # KEY=VALUE overrides before and after options
    cfg = load_teacher_config(args.config, args.overrides, train_config=args.train_config)
    # a Hub id is downloaded by the launching process only; the ranks read the cache
    base = resolve_model(cfg.base_model, "base_model", download=not launched_as_rank())
    cfg = dataclasses.replace(cfg, base_model=str(base))
    if finished(cfg):
        print(f"[make_teacher] {cfg.out} holds the teacher already: nothing to do", flush=True)
        return 0
    check_writable_dir(Path(cfg.out).parent, "out")
    check_resumable(cfg)
    from actfirst.teacher.training import train_rank

    if launched_as_rank():
        from torch.distributed.elastic.multiprocessing.errors import record

        status = record(train_rank)(cfg)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)  # as actfirst.run's ranks: no interpreter teardown of threads a library never joined
    from actfirst.parallel.launch import launch_ranks

    nproc = ranks_per_node(args.nproc_per_node)
    print(f"[make_teacher] base model {cfg.base_model} -> {cfg.out}; {nproc} rank(s)", flush=True)
    if nproc == 1:
        return train_rank(cfg)
    return launch_ranks(nproc, ["-m", "actfirst.make_teacher", *_without_nproc(argv)])


def _without_nproc(argv: list[str]) -> list[str]:
    """``argv`` without ``--nproc-per-node N`` (each rank runs the same command as a rank)."""
    out, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item == "--nproc-per-node":
            skip = True
        elif not item.startswith("--nproc-per-node="):
            out.append(item)
    return out


if __name__ == "__main__":
    sys.exit(main())

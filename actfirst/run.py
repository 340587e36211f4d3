"""The product run: prepare what is missing, start the ranks, train, evaluate, and say where everything is.

    python -m actfirst.run                                        # the CPU demo (configs/demo/scienceworld_lifespan.yaml)
    python -m actfirst.run --config configs/train/<benchmark>/<setting>.yaml [key=value ...] [--resume]
    python -m actfirst.run --config ... --nproc-per-node 2        # ranks on this machine (default: one per GPU)
    torchrun --nnodes N --nproc-per-node 8 ... -m actfirst.run --config ...   # several nodes

Stages: ``actfirst.prepare`` (reference cache; for the demo also the teacher and the student's warm start) in the
launching process, then the training (``actfirst.train.trainer``) on every rank with its evaluations (update 0,
every ``evaluation.every`` updates, the last), each of which rewrites ``<out_dir>/training_curve.png``.

Without torchrun's environment this command starts the ranks itself: one in this process, or several through
PyTorch's elastic launcher (``actfirst.parallel.launch``), each of which runs this same command as a rank. Under
torchrun every process is a rank and preparation must have been done (``python -m actfirst.prepare``). A rank
that fails stops the others; ``--resume`` continues from the latest checkpoint (kill -9 included), on any number
of ranks.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from actfirst.config import DEMO_CONFIG, ConfigError, TrainConfig
from actfirst.eval_report import load_episodes, sr_change, teacher_summary
from actfirst.train.clock import LAUNCH_ENV, PARTS, launch_info
from actfirst.user_input import command

if TYPE_CHECKING:
    from actfirst.train.trainer import TrainResult

def load_run_config(config: str | None, overrides: list[str]) -> TrainConfig:
    """The run's config (``None``: the CPU demo's). Paths that ``actfirst.prepare`` builds may not exist yet;
    :func:`actfirst.prepare.ensure_prepared` builds them and then checks every path."""
    from actfirst.prepare import load_prepare_config

    return load_prepare_config(config or str(DEMO_CONFIG), overrides)


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m actfirst.run``."""
    parser = argparse.ArgumentParser(prog="python -m actfirst.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=None, help="a training config (default: the CPU demo)")
    parser.add_argument("--resume", action="store_true", help="continue the run in out_dir from its latest checkpoint")
    parser.add_argument("--nproc-per-node", type=int, default=None, metavar="N",
                        help="ranks to start on this machine (default: one per GPU; one on a CPU); ignored under "
                             "torchrun, which sets its own")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides (rollout.strategy=vanilla)")
    return parser


@command
def main(argv: list[str] | None = None) -> int:
    """Launch the run (no torchrun environment) or run this process's rank; returns the exit status."""
    from actfirst.parallel.context import launched_as_rank
    from actfirst.prepare import check_inputs

    args = build_parser().parse_args(argv)
    if not launched_as_rank():
        return launch(args)
    from torch.distributed.elastic.multiprocessing.errors import record

    cfg = load_run_config(args.config, args.overrides)  # a rank started by the launcher or by torchrun
    check_inputs(cfg)
    status = record(run_rank)(args, cfg)  # an error is written where the launcher reads it
    # Every output is written and closed. Leave without the interpreter's teardown: a native thread that a library
    # never joined can abort it ("terminate called without an active exception", SIGABRT after a finished run,
    # seen once on a 2-rank resume), and the launcher would then report a finished run as failed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def launch(args: argparse.Namespace) -> int:
    """The launching process: check the config, prepare what is missing, start the ranks."""
    from actfirst.parallel.launch import default_nproc, launch_ranks
    from actfirst.train.trainer import check_layout

    started = time.time()
    nproc = default_nproc() if args.nproc_per_node is None else args.nproc_per_node
    if nproc < 1:
        raise ConfigError(f"--nproc-per-node={nproc}: must be >= 1")
    cfg = load_run_config(args.config, args.overrides)
    check_layout(cfg, nproc)
    if not args.resume and (Path(cfg.out_dir) / "metrics.jsonl").exists():
        raise ConfigError(f"out_dir={cfg.out_dir!r} holds a run: add --resume to continue it, or give another "
                          f"out_dir=... to start a new one")
    print(f"[run] config {args.config or DEMO_CONFIG}; out_dir {cfg.out_dir}; {nproc} rank(s)", flush=True)
    timings = prepare(cfg, args, in_child=nproc > 1)  # every input is checked first
    os.environ[LAUNCH_ENV] = json.dumps({"started": started, "prepare_s": time.time() - started,
                                         "prepare_stages_s": timings})
    if nproc == 1:
        return run_rank(args, cfg)
    return launch_ranks(nproc, ["-m", "actfirst.run", *rank_argv(args)])


def rank_argv(args: argparse.Namespace) -> list[str]:
    """The command line every rank runs (the same run, without the launcher's own option)."""
    return ([] if args.config is None else ["--config", args.config]) + (["--resume"] if args.resume else []) + \
        list(args.overrides)


def prepare(cfg: TrainConfig, args: argparse.Namespace, *, in_child: bool) -> dict[str, float]:
    """Build what the run needs that is missing (``actfirst.prepare``). ``in_child``: in a child process, so that
    no engine or GPU memory of the preparation outlives it into the ranks."""
    from actfirst.prepare import ensure_prepared

    if not in_child:
        return ensure_prepared(cfg)
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(_prepare_child, (args.config, list(args.overrides)))


def _prepare_child(config: str | None, overrides: list[str]) -> dict[str, float]:
    from actfirst.prepare import ensure_prepared

    return ensure_prepared(load_run_config(config, overrides))


def run_rank(args: argparse.Namespace, cfg: TrainConfig) -> int:
    """One rank: train, then (rank 0) write the summary and print where everything is. A failure is reported to the
    other ranks (they stop) and raised, so that the launcher names this rank and its error; one caused by a lost
    peer stops this rank naming that peer (``PeerWatch.fail``)."""
    from actfirst.parallel.context import init_parallel, shutdown_parallel
    from actfirst.parallel.watchdog import PeerWatch
    from actfirst.train.trainer import Trainer

    ctx = init_parallel()
    watch = PeerWatch(ctx.rank, ctx.world_size, timeout_s=cfg.parallel.peer_timeout_s).start() \
        if ctx.world_size > 1 else None
    try:
        result = Trainer(cfg, ctx, resume=args.resume).train()
    except BaseException as e:
        if watch is not None:
            watch.fail(e)  # stops here when a lost peer is the cause, naming it
        raise
    if watch is not None:
        watch.stop()
    if ctx.lead:
        summary = write_summary(cfg, args, result)
        print(final_message(cfg, summary), flush=True)
    shutdown_parallel()
    return 0


def write_summary(cfg: TrainConfig, args: argparse.Namespace, result: TrainResult) -> dict:
    """``<out_dir>/run_summary.json``: teacher and student SRs, the SR change, the wall-clock of every session of
    the run (``wall_clock.json``: its parts sum to ``total_s``; speedups use ``train_s``)."""
    from actfirst.train.plots import read_records, read_wall_clock

    evals = result.evals
    clock = read_wall_clock(cfg.out_dir) or {}
    last = (read_records(Path(cfg.out_dir) / "metrics.jsonl") or [{}])[-1]
    summary = {"config": str(args.config or DEMO_CONFIG), "wall_clock": {k: clock.get(k) for k in (
                   "total_s", *PARTS, "sessions", "speedup_uses")},
               "prepare_stages_s": launch_info().get("prepare_stages_s", {}),
               "teacher": teacher_summary(cfg.teacher),
               "evals": [{"update": e["update"], "elapsed_s": e["elapsed_s"], **e["summary"]} for e in evals],
               "sr_change": run_sr_change(Path(cfg.out_dir), evals), "probe_gaps": result.probe_gaps,
               "throughput": {k.removeprefix("throughput/"): last.get(k) for k in (
                   "throughput/full_window", "throughput/first_600s", "throughput/window_s")},
               "rollout_speedup_model": {k: last.get(f"speedup/run_{k}") for k in ("measured", "eq36", "eq26")},
               "transitions": result.num_transitions, "weight_version": result.weight_version,
               "world_size": int(os.environ.get("WORLD_SIZE", "1"))}
    (Path(cfg.out_dir) / "run_summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def run_sr_change(out_dir: Path, evals: list[dict]) -> dict | None:
    """The student's SR change from the run's first evaluation to its last (:func:`sr_change`: the paired interval
    over the same (seed, task) episodes, the unpaired one beside it)."""
    if len(evals) < 2:
        return None
    change = sr_change(load_episodes(out_dir / evals[0]["report"]), load_episodes(out_dir / evals[-1]["report"]))
    return None if change is None else {"from_update": evals[0]["update"], "to_update": evals[-1]["update"],
                                        **change}


def final_message(cfg: TrainConfig, summary: dict) -> str:
    """What the run prints at its end: the stages' wall-clock, the SRs, where every output is."""
    out = Path(cfg.out_dir)
    clock = summary["wall_clock"]
    sessions = f" over {clock['sessions']} sessions" if (clock["sessions"] or 0) > 1 else ""
    lines = ["", (f"[run] done: {cfg.num_updates} updates on {summary['world_size']} rank(s), "
                  f"{summary['transitions']} transitions, weight version {summary['weight_version']}"),
             (f"  wall-clock: {clock['total_s'] or 0:.0f} s in all{sessions}: prepare {clock['prepare_s'] or 0:.0f} "
              f"s, training {clock['train_s'] or 0:.0f} s (C.3; the speedups' figure), evaluation "
              f"{clock['eval_s'] or 0:.0f} s, probe {clock['probe_s'] or 0:.0f} s, redone after a kill "
              f"{clock['lost_s'] or 0:.0f} s, other {clock['other_s'] or 0:.0f} s")]
    rate = summary["throughput"]
    if rate["full_window"] is not None:
        lines.append(f"  environment transitions per second (C.5, Eq. 37): {rate['full_window']:.2f} over the training "
                     f"window ({rate['window_s']:.0f} s), {rate['first_600s']:.2f} over its first "
                     f"{min(600, rate['window_s']):.0f} s")
    model = summary["rollout_speedup_model"]
    if model["eq36"] is not None:
        lines.append(f"  rollout speedup over Vanilla OPD's Eq. 36 time from this run's requests: measured "
                     f"{model['measured']:.2f}x, Eq. 36 {model['eq36']:.2f}x, Eq. 26's bound {model['eq26']:.2f}x "
                     f"(actfirst.train.speedup)")
    teacher = summary["teacher"]
    if teacher is not None:
        lo, hi = teacher["SR_ci95_pooled"]
        lines.append(f"  teacher SR {teacher['SR']['mean']:.1f}% (95% CI [{lo:.1f}, {hi:.1f}], "
                     f"{teacher['episodes']} episodes)")
    for e in summary["evals"]:
        lo, hi = e["SR_ci95_pooled"]
        lines.append(f"  student SR at update {e['update']:>3}: {e['SR']['mean']:.1f}% ± {e['SR']['sd']:.1f} "
                     f"(95% CI [{lo:.1f}, {hi:.1f}], {e['episodes']} episodes)")
    change = summary["sr_change"]
    if change is not None:
        (lo, hi), (ulo, uhi) = change["ci95"], change["ci95_unpaired"]
        verdict = "beyond the evaluation noise" if change["beyond_noise"] else "within the evaluation noise"
        lines.append(f"  SR change, update {change['from_update']} -> {change['to_update']}: {change['points']:+.1f} "
                     f"points (paired 95% CI [{lo:+.1f}, {hi:+.1f}]; unpaired [{ulo:+.1f}, {uhi:+.1f}]): {verdict}")
    gaps = [g for g in summary["probe_gaps"] if g is not None]
    if gaps:
        lines.append(f"  teacher-minus-student gap (probe): {gaps[0]:+.3f} -> {gaps[-1]:+.3f} nat/token")
    lines += [f"  metrics:    {out / 'metrics.jsonl'} (TensorBoard: {out / 'tensorboard'}), evaluations "
              f"{out / 'evals.jsonl'}; vLLM's log: {out / 'logs'}",
              f"  plot:       {out / 'training_curve.png'}",
              f"  checkpoint: {out / 'checkpoints'} (a Hugging Face directory; python -m actfirst.eval --checkpoint "
              f"...)",
              f"  summary:    {out / 'run_summary.json'}"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

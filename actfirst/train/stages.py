"""A training run's stages below its command (``python -m actfirst.run``): preparation, in a child process when ranks
follow; one rank's training; and, on the lead rank, the run's summary (``run_summary.json``) and the message that says
where everything is.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from actfirst.core.config import DEMO_CONFIG, TrainConfig
from actfirst.core.logs import current_log_dir, setup_logging
from actfirst.core.threads import thread_counts
from actfirst.evaluation.report import load_episodes, sr_change, teacher_summary
from actfirst.preparation.build import ensure_prepared, load_run_config, resolve_models
from actfirst.train.clock import PARTS, launch_info
from actfirst.train.trackers import tracker_locations

if TYPE_CHECKING:
    from actfirst.train.trainer import TrainResult


def prepare(cfg: TrainConfig, config: str | None, overrides: list[str], *, nproc: int = 1,
            in_child: bool) -> dict[str, float]:
    """Build what the run of ``cfg`` (loaded from ``config`` and ``overrides``, which hand on its resolved models:
    ``actfirst.preparation.build.model_overrides``) needs that is missing (:func:`ensure_prepared`, its rollouts and
    replay on ``nproc`` ranks). ``in_child``: in a child process (logging as this one), so that no engine or GPU
    memory of the preparation outlives it into the ranks."""
    if not in_child:
        return ensure_prepared(cfg, nproc)
    with mp.get_context("spawn").Pool(1, initializer=setup_logging, initargs=(current_log_dir(),)) as pool:
        return pool.apply(_prepare_child, (config, list(overrides), nproc))


def _prepare_child(config: str | None, overrides: list[str], nproc: int) -> dict[str, float]:
    return ensure_prepared(resolve_models(load_run_config(config, overrides), download=False), nproc)


def run_rank(cfg: TrainConfig, *, resume: bool, config: str | None) -> str | None:
    """One rank: train, then (rank 0) write the summary; returns, on rank 0, the message that says where everything
    is (:func:`final_message`; None on the others). A failure is reported to the other ranks (they stop) and raised,
    so that the launcher names this rank and its error; one caused by a lost peer stops this rank naming that peer
    (``PeerWatch.fail``)."""
    from actfirst.parallel.context import init_parallel, shutdown_parallel
    from actfirst.parallel.watchdog import PeerWatch
    from actfirst.train.trainer import Trainer

    ctx = init_parallel(mesh=cfg.parallel.mesh)
    watch = PeerWatch(ctx.rank, ctx.world_size, timeout_s=cfg.parallel.peer_timeout_s).start() \
        if ctx.world_size > 1 else None
    threads = {"training": thread_counts()}  # what this rank computes with, as it starts training
    try:
        result = Trainer(cfg, ctx, resume=resume).train()
    except BaseException as e:
        if watch is not None:
            watch.fail(e)  # stops here when a lost peer is the cause, naming it
        raise
    if watch is not None:
        watch.stop()
    message = None
    if ctx.lead:
        summary = write_summary(cfg, config, result, threads={**threads, "end": thread_counts()})
        message = final_message(cfg, summary)
    shutdown_parallel()
    return message


def write_summary(cfg: TrainConfig, config: str | None, result: TrainResult, *,
                  threads: dict[str, Any] | None = None) -> dict:
    """``<out_dir>/run_summary.json`` of the run of ``config`` (None: the CPU demo's): teacher and student SRs, the SR
    change, the wall-clock of every session of the run (``wall_clock.json``: its parts sum to ``total_s``; speedups
    use ``train_s``), the threads the lead rank computed with (``threads``: ``actfirst.core.threads.thread_counts`` as
    training started and at its end)."""
    from actfirst.train.plots import read_records, read_wall_clock

    evals = result.evals
    clock = read_wall_clock(cfg.out_dir) or {}
    last = (read_records(Path(cfg.out_dir) / "metrics.jsonl") or [{}])[-1]
    summary = {"config": str(config or DEMO_CONFIG), "wall_clock": {k: clock.get(k) for k in (
                   "total_s", *PARTS, "sessions", "speedup_uses")},
               "prepare_stages_s": launch_info().get("prepare_stages_s", {}),
               "teacher": teacher_summary(cfg.teacher),
               "evals": [{"update": e["update"], "elapsed_s": e["elapsed_s"], **e["summary"]} for e in evals],
               "sr_change": run_sr_change(Path(cfg.out_dir), evals), "probe_gaps": result.probe_gaps,
               "throughput": {k.removeprefix("throughput/"): last.get(k) for k in (
                   "throughput/full_window", "throughput/first_600s", "throughput/window_s")},
               "rollout_model": clock.get("rollout_model"),
               "transitions": result.num_transitions, "weight_version": result.weight_version,
               "world_size": int(os.environ.get("WORLD_SIZE", "1")), "threads": threads}
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
    counts = (summary.get("threads") or {}).get("training")
    if counts:
        lines.append(f"  threads: torch {counts['torch_threads']} (OMP_NUM_THREADS={counts['OMP_NUM_THREADS']}), "
                     f"{counts['usable_cores']} of {counts['cores']} cores usable")
    rate = summary["throughput"]
    if rate["full_window"] is not None:
        lines.append(f"  environment transitions per second (C.5, Eq. 37): {rate['full_window']:.2f} over the training "
                     f"window ({rate['window_s']:.0f} s), {rate['first_600s']:.2f} over its first "
                     f"{min(600, rate['window_s']):.0f} s")
    model = summary["rollout_model"]
    if model is not None and model["eq36_s_per_batch"] is not None:
        fast = "-" if model["l_fast_s"] is None else f"{model['l_fast_s'] * 1e3:.0f} ms"
        lines.append(f"  rollout batches ({model['batches']}, this run's own requests; actfirst.train.speedup): "
                     f"Eq. 36 {model['eq36_s_per_batch']:.1f} s per batch, measured {model['measured_s_per_batch']:.1f}"
                     f" s; in-slot l_fast {fast}, l_full {model['l_full_s'] * 1e3:.0f} ms; "
                     f"{model['turns_per_episode']:.1f} turns per episode")
        stand_in = model["stand_in"]
        if model["l_fast_s"] is not None and stand_in["eq36"] is not None:
            lines.append(f"  in-run stand-in (this run's full responses as Vanilla's, not a comparison): Eq. 36 "
                         f"{stand_in['eq36']:.2f}x, measured {stand_in['measured']:.2f}x")
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
    trackers = tracker_locations(cfg.report_to, out, cfg.tracker_project)
    lines += [f"  metrics:    {out / 'metrics.jsonl'}, evaluations {out / 'evals.jsonl'}; vLLM's log: {out / 'logs'}",
              *(f"  {name + ':':<11} {where}" for name, where in trackers.items()),
              f"  plot:       {out / 'training_curve.png'}",
              (f"  checkpoint: {out / 'checkpoints'} (re-evaluate: python -m actfirst.eval --config "
               f"{out / 'config.json'} --checkpoint latest; a model to hand on: python -m actfirst.export "
               f"{out / 'checkpoints' / 'latest'} --out ...; best instead of latest with keep_best)"),
              f"  summary:    {out / 'run_summary.json'}"]
    return "\n".join(lines)

"""The product run: prepare what is missing, train, evaluate, and say where everything is.

    python -m actfirst.run                                        # the CPU demo (configs/demo/scienceworld_lifespan.yaml)
    python -m actfirst.run --config configs/train/<benchmark>/<setting>.yaml [key=value ...] [--resume]

Stages: ``actfirst.prepare`` (reference cache; for the demo also the teacher and the student's warm start), then
the training loop (``actfirst.train.loop``) with its evaluations (update 0, every ``evaluation.every`` updates,
the last), each of which rewrites ``<out_dir>/training_curve.png``. ``--resume`` continues an interrupted run
(kill -9 included) from its latest checkpoint.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from actfirst.config import ConfigError, TrainConfig
from actfirst.eval_report import difference_interval

DEMO_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "demo" / "scienceworld_lifespan.yaml"
"""The CPU demo's config (used when ``--config`` is not given)."""


def load_run_config(config: str | None, overrides: list[str]) -> TrainConfig:
    """The run's config (``None``: the CPU demo's). Paths that ``actfirst.prepare`` builds may not exist yet;
    :func:`actfirst.prepare.ensure_prepared` builds them and then checks every path."""
    from actfirst.prepare import load_prepare_config

    return load_prepare_config(config or str(DEMO_CONFIG), overrides)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m actfirst.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=None, help="a training config (default: the CPU demo)")
    parser.add_argument("--resume", action="store_true", help="continue the run in out_dir from its latest checkpoint")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides (rollout.strategy=vanilla)")
    args = parser.parse_args(argv)

    from actfirst.prepare import ensure_prepared, teacher_summary
    from actfirst.train.loop import train

    started = time.perf_counter()
    try:
        cfg = load_run_config(args.config, args.overrides)
        if not args.resume and (Path(cfg.out_dir) / "metrics.jsonl").exists():
            raise ConfigError(f"out_dir={cfg.out_dir!r} holds a run: add --resume to continue it, or give another "
                              f"out_dir=... to start a new one")
        print(f"[run] config {args.config or DEMO_CONFIG}; out_dir {cfg.out_dir}", flush=True)
        timings = ensure_prepared(cfg)
    except (ConfigError, FileExistsError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    prepare_s = time.perf_counter() - started
    result = train(cfg, resume=args.resume)
    out = Path(cfg.out_dir)
    evals = result.evals
    summary = {"config": str(args.config or DEMO_CONFIG), "prepare_s": prepare_s, "prepare_stages_s": timings,
               "train_wall_s": result.wall_s, "eval_wall_s": sum(e["eval_wall_s"] for e in evals),
               "total_s": time.perf_counter() - started, "teacher": teacher_summary(cfg.teacher),
               "evals": [{"update": e["update"], "elapsed_s": e["elapsed_s"], **e["summary"]} for e in evals],
               "sr_change": sr_change(evals), "probe_gaps": result.probe_gaps,
               "transitions": result.num_transitions, "weight_version": result.weight_version}
    (out / "run_summary.json").write_text(json.dumps(summary, indent=1))
    print(_final_message(cfg, summary), flush=True)
    return 0


def sr_change(evals: list[dict]) -> dict | None:
    """The student's SR change from the first evaluation to the last, in points, with its 95% CI (Newcombe's, for
    independent samples: conservative for these paired ones); ``beyond_noise`` when the interval excludes zero."""
    if len(evals) < 2:
        return None
    first, last = evals[0]["summary"], evals[-1]["summary"]
    if first["episodes"] == 0 or last["episodes"] == 0:
        return None
    d, lo, hi = difference_interval(first["successes"], first["episodes"], last["successes"], last["episodes"])
    return {"from_update": evals[0]["update"], "to_update": evals[-1]["update"], "points": 100 * d,
            "ci95": [100 * lo, 100 * hi], "beyond_noise": lo > 0 or hi < 0}


def _final_message(cfg: TrainConfig, summary: dict) -> str:
    out = Path(cfg.out_dir)
    lines = ["", f"[run] done: {cfg.num_updates} updates, {summary['transitions']} transitions, weight version "
                 f"{summary['weight_version']}; {summary['total_s']:.0f} s in all: prepare {summary['prepare_s']:.0f} s, "
                 f"training {summary['train_wall_s']:.0f} s, evaluation {summary['eval_wall_s']:.0f} s"]
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
        lo, hi = change["ci95"]
        verdict = "beyond the evaluation noise" if change["beyond_noise"] else "within the evaluation noise"
        lines.append(f"  SR change, update {change['from_update']} -> {change['to_update']}: {change['points']:+.1f} "
                     f"points (95% CI [{lo:+.1f}, {hi:+.1f}]): {verdict}")
    gaps = [g for g in summary["probe_gaps"] if g is not None]
    if gaps:
        lines.append(f"  teacher-minus-student gap (probe): {gaps[0]:+.3f} -> {gaps[-1]:+.3f} nat/token")
    lines += [f"  metrics:    {out / 'metrics.jsonl'} (TensorBoard: {out / 'tensorboard'}), evaluations "
              f"{out / 'evals.jsonl'}",
              f"  plot:       {out / 'training_curve.png'}",
              f"  checkpoint: {out / 'checkpoints'} (a Hugging Face directory; python -m actfirst.eval --checkpoint "
              f"...)",
              f"  summary:    {out / 'run_summary.json'}"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

"""Vanilla OPD against ActFirst-OPD (or any rollout strategies) under one training config.

    python -m actfirst.compare [--config CFG] [--strategies vanilla actfirst] [--out DIR] [--resume] [key=value ...]

Runs the same training config once per strategy, only ``rollout.strategy`` and ``out_dir=<out>/<strategy>`` changed
(same seeds), then writes ``<out>/comparison.json``, ``<out>/comparison.md`` and ``<out>/comparison.png`` and prints
the table. Each row comes from the run's last evaluation (``evals.jsonl``), its ``metrics.jsonl`` and its
``wall_clock.json``: SR (mean ± SD over the evaluation seeds, and the pooled 95% interval), Score where the benchmark
has one, Round, the training wall-clock (Appendix C.3: the trainer's initialization to its shutdown, evaluation and
our probe excluded; the final figure, which the last metrics line does not yet hold), executed transitions and
transitions per second, and the wall-clock speedup over Vanilla OPD (vanilla / strategy) when ``vanilla`` is among
the strategies. A run that has not finished shows its latest wall-clock and no speedup.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from actfirst.config import STRATEGIES, ConfigError
from actfirst.eval_report import _finite
from actfirst.train.plots import new_figure, read_records, read_wall_clock, save_figure, sr_points
from actfirst.user_input import check_writable_dir, command

METHODS = {"vanilla": "Vanilla OPD", "actfirst": "ActFirst-OPD", "no_id": "w/o ID", "no_nap": "w/o NAP fallback",
           "ref_prefix_50": "Reference-Prefix Replay (50%)", "ref_prefix_100": "Reference-Prefix Replay (100%)",
           "f2b": "TCOD-F2B", "b2f": "TCOD-B2F", "uopd": "UOPD"}
"""The paper's name of each strategy."""
BASELINE = "vanilla"
COMPARISON_SIZE = (7.0, 4.5)
"""Inches of ``comparison.png``."""


def comparison_rows(run_dirs: dict[str, Path]) -> list[dict[str, Any]]:
    """One row per strategy (in ``run_dirs`` order) from its run's last evaluation, last metrics record and final
    wall-clock; values a run does not have yet are None. ``speedup`` is the baseline's training wall-clock over this
    one's, both finished (None without a finished ``vanilla`` run)."""
    rows = []
    for strategy, run_dir in run_dirs.items():
        evals = read_records(Path(run_dir) / "evals.jsonl")
        metrics = read_records(Path(run_dir) / "metrics.jsonl")
        summary = evals[-1]["summary"] if evals else {}
        last = metrics[-1] if metrics else {}
        final = read_wall_clock(run_dir)
        wall = final["train_s"] if final else last.get("elapsed_s")
        transitions = last.get("total_transitions")
        rows.append({
            "strategy": strategy, "method": METHODS.get(strategy, strategy), "run_dir": str(run_dir),
            "eval_update": evals[-1]["update"] if evals else None, "episodes": summary.get("episodes"),
            "SR": summary.get("SR"), "SR_ci95_pooled": summary.get("SR_ci95_pooled"), "Score": summary.get("Score"),
            "Round": summary.get("Round"), "updates": last.get("update"), "wall_s": wall, "transitions": transitions,
            "transitions_per_s": transitions / wall if wall and transitions is not None else None,
            "finished": final is not None,
        })
    base = next((r["wall_s"] for r in rows if r["strategy"] == BASELINE and r["finished"]), None)
    for row in rows:
        row["speedup"] = base / row["wall_s"] if base and row["finished"] else None
    return rows


def comparison_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table (a Score column only where some run has a Score, a speedup column only with a
    ``vanilla`` row)."""
    with_score = any(r["Score"] for r in rows)
    with_speedup = any(r["strategy"] == BASELINE for r in rows)
    head = (["Method", "Eval at update", "SR (%)", "SR 95% CI (pooled)"] + (["Score"] if with_score else [])
            + ["Round", "Wall-clock (s)", "Transitions/s", "Transitions"]
            + ([f"Speedup vs {METHODS[BASELINE]}"] if with_speedup else []))
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in rows:
        cells = [r["method"], _fmt(r["eval_update"], "d"), _pm(r["SR"]), _ci(r["SR_ci95_pooled"])]
        cells += [_pm(r["Score"])] if with_score else []
        cells += [_pm(r["Round"]), _fmt(r["wall_s"], ".0f"), _fmt(r["transitions_per_s"], ".2f"),
                  _fmt(r["transitions"], "d")]
        cells += [_fmt(r["speedup"], ".2f", "x")] if with_speedup else []
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_comparison(run_dirs: dict[str, Path], path: str | Path, *, teacher_sr: float | None = None) -> Path | None:
    """Each run's SR (with its pooled 95% interval) at every evaluation against training wall-clock, one line per
    strategy, and ``teacher_sr`` (percent) as a dashed line, written to ``path``; None without matplotlib."""
    fig = new_figure(COMPARISON_SIZE)
    if fig is None:
        return None
    ax = fig.subplots()
    for strategy, run_dir in run_dirs.items():
        xs, ys, err = sr_points(read_records(Path(run_dir) / "evals.jsonl"))
        if xs:
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=METHODS.get(strategy, strategy))
    if not ax.get_legend_handles_labels()[0]:
        ax.text(0.5, 0.5, "no evaluation yet", transform=ax.transAxes, ha="center", va="center", color="gray")
    if teacher_sr is not None:
        ax.axhline(teacher_sr, linestyle="--", color="gray", label=f"teacher ({teacher_sr:.1f}%)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    ax.set_ylim(0, 100)
    ax.set_xlabel("training wall-clock (s, evaluation excluded)")
    ax.set_ylabel("success rate (%)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def write_comparison(run_dirs: dict[str, Path], out: str | Path, *, teacher: dict[str, Any] | None = None) -> str:
    """``comparison.json``, ``comparison.md`` and ``comparison.png`` under ``out``, with the teacher's evaluation
    summary (``EvalReport.summary()``) as the reference where given; returns the markdown."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = comparison_rows(run_dirs)
    table = comparison_table(rows)
    teacher_sr = ((teacher or {}).get("SR") or {}).get("mean")
    if teacher_sr is not None:
        table += f"\n\nTeacher: SR {_pm(teacher['SR'])} %, pooled 95% CI {_ci(teacher.get('SR_ci95_pooled'))}"
    (out / "comparison.json").write_text(
        json.dumps(_finite({"rows": rows, "teacher": teacher}), indent=1, allow_nan=False) + "\n")
    (out / "comparison.md").write_text(table + "\n")
    plot_comparison(run_dirs, out / "comparison.png", teacher_sr=teacher_sr)
    return table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; refuses an unknown or repeated strategy and overrides of what the comparison sets."""
    parser = argparse.ArgumentParser(prog="python -m actfirst.compare", description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="YAML TrainConfig (default: the CPU demo config)")
    parser.add_argument("--strategies", nargs="+", default=["vanilla", "actfirst"], metavar="STRATEGY",
                        help=f"rollout strategies to compare, of {', '.join(STRATEGIES)}")
    parser.add_argument("--out", default="runs/compare", help="one run per strategy in <out>/<strategy>")
    parser.add_argument("--resume", action="store_true", help="continue each run from its latest checkpoint")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides applied to every run")
    args = parser.parse_args(argv)
    # ``--strategies a b key=value`` hands the overrides to --strategies (nargs="+" is greedy): take them back.
    args.overrides += [s for s in args.strategies if "=" in s]
    args.strategies = [s for s in args.strategies if "=" not in s]
    unknown = [s for s in args.strategies if s not in STRATEGIES]
    if unknown:
        parser.error(f"unknown strategy {', '.join(map(repr, unknown))} (known: {', '.join(STRATEGIES)})")
    if not args.strategies or len(set(args.strategies)) != len(args.strategies):
        parser.error(f"--strategies {' '.join(args.strategies)}: give each strategy once")
    for item in args.overrides:
        if item.split("=", 1)[0].strip() in ("rollout.strategy", "out_dir"):
            parser.error(f"override {item!r}: set by the comparison (use --strategies and --out)")
    return args


@command
def main(argv: list[str] | None = None) -> int:
    """Load and prepare every strategy's config, train each run, write and print the comparison."""
    args = parse_args(argv)
    from actfirst.eval_report import teacher_summary
    from actfirst.prepare import check_inputs, ensure_prepared
    from actfirst.run import load_run_config
    from actfirst.train.trainer import train

    out = Path(args.out)
    check_writable_dir(out, "--out")
    # every config first: a bad one is refused before hours of training
    configs = {s: load_run_config(args.config, [*args.overrides, f"rollout.strategy={s}", f"out_dir={out / s}"])
               for s in args.strategies}
    existing = [cfg.out_dir for cfg in configs.values() if (Path(cfg.out_dir) / "metrics.jsonl").exists()]
    if existing and not args.resume:
        raise ConfigError(f"--out={args.out!r}: {', '.join(existing)} already hold a run; pass --resume to "
                          f"continue, or choose another --out")
    for cfg in configs.values():
        check_inputs(cfg, buildable=True)
    for cfg in configs.values():
        ensure_prepared(cfg)
    for strategy, cfg in configs.items():
        print(f"== {METHODS[strategy]} ({strategy}) -> {cfg.out_dir}", flush=True)
        train(cfg, resume=args.resume)
    teacher = teacher_summary(next(iter(configs.values())).teacher)  # one teacher: only the strategy differs
    print(write_comparison({s: Path(cfg.out_dir) for s, cfg in configs.items()}, out, teacher=teacher))
    print(f"comparison: {out / 'comparison.md'}, {out / 'comparison.json'}, {out / 'comparison.png'}")
    return 0


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def _ci(interval: list[float | None] | None) -> str:
    return f"[{interval[0]:.1f}, {interval[1]:.1f}]" if interval and None not in interval else "n/a"


def _pm(stat: dict[str, Any] | None) -> str:
    """``mean ± sd`` of a summary metric (the SD of a single seed is n/a)."""
    if not stat or stat.get("mean") is None:
        return "n/a"
    return f"{stat['mean']:.1f} ± {_fmt(stat.get('sd'), '.1f')}"


if __name__ == "__main__":
    sys.exit(main())

"""The shipped CPU demo under several training seeds: does it learn in every run?

    python bench/demo_seeds.py [--seeds 0 1 2 3 4] [--out runs/demo_seeds] [key=value ...]

Runs ``python -m actfirst.run seed=<K> out_dir=<out>/seed<K>`` once per seed, one after the other (a run that has
finished is kept; one that was interrupted continues with ``--resume``), each its own process from the same warm
start and teacher, then reads every run's ``run_summary.json`` and writes ``<out>/seeds.md``, ``<out>/seeds.json``
and ``<out>/seeds.png``: per seed the first and last evaluation's SR, the paired SR change with its 95% interval
(Newcombe's method 10, the same (seed, task) episodes before and after), whether it is beyond the evaluation noise,
the run's wall-clock in all and its parts. The issue's bar: at least 4 of 5 seeds beyond the noise upwards, none
ending below where it started, each run within 10 minutes after setup.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from actfirst.train.plots import new_figure, save_figure


def run_seed(seed: int, out_dir: Path, overrides: list[str]) -> float | None:
    """Train the demo with ``seed`` into ``out_dir`` unless it has finished; returns the command's wall-clock (None:
    kept from before)."""
    if (out_dir / "run_summary.json").is_file():
        return None
    resume = ["--resume"] if (out_dir / "metrics.jsonl").is_file() else []
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "actfirst.run", f"seed={seed}", f"out_dir={out_dir}", *overrides, *resume],
                   check=True)
    return time.perf_counter() - started


def seed_row(seed: int, out_dir: Path, command_s: float | None) -> dict[str, Any]:
    """One seed's figures from its ``run_summary.json``."""
    summary = json.loads((out_dir / "run_summary.json").read_text())
    first, last, change = summary["evals"][0], summary["evals"][-1], summary["sr_change"]
    return {"seed": seed, "run_dir": str(out_dir), "first_update": first["update"], "first_sr": first["SR"]["mean"],
            "last_update": last["update"], "last_sr": last["SR"]["mean"], "episodes": last["episodes"],
            "change": change, "up": change["ci95"][0] > 0, "below_start": change["points"] < 0,
            "wall_clock": summary["wall_clock"], "command_s": command_s,
            "probe_gaps": [summary["probe_gaps"][0], summary["probe_gaps"][-1]] if summary["probe_gaps"] else None}


def spread(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """How much of the seeds' spread in the last SR is evaluation noise and how much training: the variance over
    seeds, the mean binomial sampling variance of one evaluation (p (1 - p) / n over its episodes, an upper bound:
    the tasks are fixed) and the difference (training's share, clipped at 0); and the correlation over seeds of the
    last probe gap with the last SR (does the gap tell which runs learned?). Points squared, None with < 3 seeds."""
    if len(rows) < 3:
        return {"sr_var": None, "eval_var": None, "train_var": None, "gap_sr_corr": None}
    srs = [r["last_sr"] for r in rows]
    sr_var = statistics.variance(srs)
    eval_var = statistics.fmean(sr * (100 - sr) / r["episodes"] for sr, r in zip(srs, rows, strict=True))
    gaps = [r["probe_gaps"][1] for r in rows if r["probe_gaps"]]
    corr = statistics.correlation(gaps, srs) if len(gaps) == len(rows) and len(set(gaps)) > 1 else None
    return {"sr_var": sr_var, "eval_var": eval_var, "train_var": max(0.0, sr_var - eval_var), "gap_sr_corr": corr}


def table(rows: list[dict[str, Any]]) -> str:
    """The seeds as a markdown table, with the verdict line."""
    head = ("| seed | SR first -> last (%) | change (points) | paired 95% CI | unpaired 95% CI | beyond noise | "
            "in all (s) | prepare / train / eval / probe (s) |")
    lines = [head, "|---:|---|---:|---|---|---|---:|---|"]
    for r in rows:
        c, w = r["change"], r["wall_clock"]
        lines.append(f"| {r['seed']} | {r['first_sr']:.1f} -> {r['last_sr']:.1f} | {c['points']:+.1f} | "
                     f"[{c['ci95'][0]:+.1f}, {c['ci95'][1]:+.1f}] | [{c['ci95_unpaired'][0]:+.1f}, "
                     f"{c['ci95_unpaired'][1]:+.1f}] | {'up' if r['up'] else 'no'} | {w['total_s']:.0f} | "
                     f"{w['prepare_s']:.0f} / {w['train_s']:.0f} / {w['eval_s']:.0f} / {w['probe_s']:.0f} |")
    up = sum(r["up"] for r in rows)
    below = sum(r["below_start"] for r in rows)
    longest = max(r["wall_clock"]["total_s"] for r in rows)
    lines += ["", (f"{up} of {len(rows)} seeds end beyond the first evaluation by the paired interval; {below} end "
                   f"below where they started; the longest run took {longest:.0f} s in all.")]
    var = spread(rows)
    if var["sr_var"] is not None:
        corr = "n/a" if var["gap_sr_corr"] is None else f"{var['gap_sr_corr']:+.2f}"
        lines.append(f"Last SR over seeds: SD {var['sr_var'] ** 0.5:.1f} points; one evaluation's sampling SD "
                     f"{var['eval_var'] ** 0.5:.1f}, so training accounts for an SD of about "
                     f"{var['train_var'] ** 0.5:.1f}; correlation of the last probe gap with the last SR: {corr}.")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Each seed's SR at every evaluation against training wall-clock."""
    fig = new_figure((7.0, 4.5))
    if fig is None:
        return
    ax = fig.subplots()
    for r in rows:
        evals = json.loads((Path(r["run_dir"]) / "run_summary.json").read_text())["evals"]
        ax.plot([e["elapsed_s"] for e in evals], [e["SR"]["mean"] for e in evals], marker="o",
                label=f"seed {r['seed']}: {r['change']['points']:+.1f} [{r['change']['ci95'][0]:+.1f}, "
                      f"{r['change']['ci95'][1]:+.1f}]")
    ax.set_xlabel("training wall-clock (s, evaluation excluded)")
    ax.set_ylabel("student SR (%), 3 evaluation seeds")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", title="SR change, paired 95% CI")
    fig.tight_layout()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", default="runs/demo_seeds")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides for every run")
    args = parser.parse_args(argv)
    out = Path(args.out)
    rows = []
    for seed in args.seeds:
        command_s = run_seed(seed, out / f"seed{seed}", args.overrides)
        rows.append(seed_row(seed, out / f"seed{seed}", command_s))
    text = table(rows)
    (out / "seeds.md").write_text(text + "\n")
    (out / "seeds.json").write_text(json.dumps({"seeds": rows, "spread": spread(rows)}, indent=1) + "\n")
    plot(rows, out / "seeds.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

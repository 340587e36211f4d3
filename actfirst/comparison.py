"""Method tables in the layout of the paper's Tables 1-3: any rollout strategies under one training config, each
trained under one or more training seeds (``python -m actfirst.compare`` trains the runs, then writes the tables).

One row per method, from its finished runs (a run's SR, Score and Round are its last evaluation's means over the
evaluation seeds, ``evals.jsonl``; its training wall-clock is Appendix C.3's final ``train_s``, ``wall_clock.json``):

- SR, Score (where the evaluations report one: ScienceWorld, WebShop), Round: mean ± SD over training seeds; ALFWorld's
  valid_seen and valid_unseen also apart (the evaluation's per-split summaries).
- Training wall-clock (s), executed transitions and transitions per second: mean ± SD over training seeds.
- Speedup over Vanilla OPD (Sec. 5.1): mean Vanilla ``train_s`` / mean method ``train_s``, with a 95% percentile
  bootstrap interval (each method's seeds resampled independently, :data:`BOOTSTRAP_RESAMPLES` resamples, a fixed RNG
  seed; none with one seed).
- Time to the common SR: the lower of the method's and Vanilla OPD's best mean-over-seeds evaluation SR, the mean
  training wall-clock of the first evaluation whose mean SR reaches it (for both), and their ratio Vanilla / method:
  a speedup that cannot come from learning less (none where either reaches it at update 0, before training). Its 95%
  interval is a bootstrap over seeds too: each side's runs resampled, their mean curves, the common SR and both times
  recomputed (``common_sr_interval``).
- Sec. 5.4's split: the method's transitions per second and executed transitions over Vanilla OPD's (elapsed time
  is transitions over throughput, so the speedup is close to the first ratio over the second).
- The rollout speedup model from each run's own request records (``actfirst.train.speedup``): measured and Eq. 36's
  prediction against Eq. 36's Vanilla time, mean ± SD over seeds.

``comparison.md`` also lists every run; ``comparison.json`` holds each method's aggregates, its mean curve and every
run's own row (run_dir, seed); ``comparison.png`` is Figure 5: per method the mean SR over seeds at each evaluated
update against the mean training wall-clock there, with the SD over seeds (the pooled 95% interval with one seed), and
the teacher's SR as a dashed line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from actfirst.config import RESUMABLE_CHANGES, ConfigError, TrainConfig, check_resumable
from actfirst.eval_report import _finite, mean_sd
from actfirst.rollout.strategies import StrategyLabels
from actfirst.schema import to_dict
from actfirst.train.plots import new_figure, read_records, read_wall_clock, save_figure

METHODS = StrategyLabels()
"""The paper's name of each strategy (its class's ``label``)."""
BASELINE = "vanilla"
EVAL_METRICS = ("SR", "Score", "Round")
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
"""The bootstrap's RNG seed: the same runs give the same table."""
COMPARISON_SIZE = (7.0, 4.5)
"""Inches of ``comparison.png``."""
ROLLOUT_MODEL = ("measured", "eq36", "eq26")
"""The run's rollout speedup figures (``actfirst.train.speedup``): measured and Eq. 36 against Eq. 36's Vanilla time
from the run's own requests, and Eq. 26's bound."""
FINISHED, STARTED, NEW = "finished", "started", "new"
"""A run's state for ``--resume``: skipped, resumed, started."""


def run_dir(out: str | Path, strategy: str, seed: int) -> Path:
    """Where the comparison trains ``strategy`` under training seed ``seed``."""
    return Path(out) / strategy / f"seed{seed}"


def run_state(cfg: TrainConfig) -> str:
    """FINISHED when the run's ``wall_clock.json`` records ``cfg.num_updates`` updates, STARTED when its out_dir
    exists otherwise, else NEW. A run's ``config.json`` must be ``cfg`` up to what a resume may change (a finished
    run's evaluation too: it is not evaluated again), or the comparison is refused before anything trains."""
    final = read_wall_clock(cfg.out_dir)
    finished = final is not None and final.get("updates") == cfg.num_updates
    path = Path(cfg.out_dir) / "config.json"
    if finished or path.exists():
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"--resume: {path}: the run's config cannot be read ({e})") from None
        if not isinstance(saved, dict):
            raise ConfigError(f"--resume: {path}: not a config (a {type(saved).__name__})")
        may_change = tuple(k for k in RESUMABLE_CHANGES if not (finished and k == "evaluation"))
        check_resumable(saved, to_dict(cfg), f"--resume: {cfg.out_dir}", may_change=may_change,
                        remedy="pass another --out, or delete the run to train it again")
    if finished:
        return FINISHED
    return STARTED if Path(cfg.out_dir).exists() else NEW


def run_row(strategy: str, seed: int, path: str | Path) -> dict[str, Any]:
    """One run's row: its last evaluation (overall and per split; each metric's summary over the evaluation seeds),
    its last metrics record and its final wall-clock, and its SR curve; what it does not have yet is None.
    ``train_s`` is the final C.3 figure of a finished run, the latest one of a run still going."""
    path = Path(path)
    evals = read_records(path / "evals.jsonl")
    metrics = read_records(path / "metrics.jsonl")
    last_eval = evals[-1] if evals else {}
    summary = last_eval.get("summary") or {}
    last = metrics[-1] if metrics else {}
    final = read_wall_clock(path)
    train_s = final["train_s"] if final else last.get("elapsed_s")
    transitions = last.get("total_transitions")
    splits = last_eval.get("splits") or {}
    return {"strategy": strategy, "method": METHODS.get(strategy, strategy), "seed": seed, "run_dir": str(path),
            "finished": final is not None, "updates": last.get("update"), "eval_update": last_eval.get("update"),
            "episodes": summary.get("episodes"), **{m: summary.get(m) for m in EVAL_METRICS},
            "SR_ci95_pooled": summary.get("SR_ci95_pooled"),
            "splits": {split: {m: stats.get(m) for m in EVAL_METRICS} for split, stats in splits.items()},
            "train_s": train_s, "transitions": transitions,
            "transitions_per_s": transitions / train_s if train_s and transitions is not None else None,
            **{f"rollout_{k}": last.get(f"speedup/run_{k}") for k in ROLLOUT_MODEL},
            "curve": _sr_curve(evals)}


def method_row(strategy: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One method's aggregates over its finished runs (mean ± SD over training seeds) and its mean curve; every run's
    row under "runs"."""
    done = _finished(runs)
    splits = sorted({split for r in done for split in r["splits"]})
    return {"strategy": strategy, "method": METHODS.get(strategy, strategy), "seeds": [r["seed"] for r in done],
            "unfinished": [r["seed"] for r in runs if not r["finished"]],
            **{m: _over_seeds([(r[m] or {}).get("mean") for r in done]) for m in EVAL_METRICS},
            "splits": {split: {m: _over_seeds([((r["splits"].get(split) or {}).get(m) or {}).get("mean") for r in done])
                               for m in EVAL_METRICS} for split in splits},
            **{key: _over_seeds([r[key] for r in done]) for key in ("train_s", "transitions", "transitions_per_s",
                                                                  *(f"rollout_{k}" for k in ROLLOUT_MODEL))},
            "curve": mean_curve(done), "runs": runs}


def mean_curve(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """At every update that all ``runs`` evaluated: the mean training wall-clock and the mean and SD of SR over the
    runs, and with one run its pooled 95% interval."""
    by_update = [{p["update"]: p for p in r["curve"]} for r in runs]
    common = sorted(set.intersection(*(set(points) for points in by_update))) if by_update else []
    curve = []
    for update in common:
        at = [points[update] for points in by_update]
        mean, sd = mean_sd([p["SR"] for p in at])
        curve.append({"update": update, "elapsed_s": sum(p["elapsed_s"] for p in at) / len(at), "SR": mean,
                      "SR_sd": sd, "SR_ci95_pooled": at[0]["SR_ci95_pooled"] if len(at) == 1 else None})
    return curve


def sr_error_bars(curve: list[dict[str, Any]]) -> list[list[float]]:
    """A mean curve's error bars as [below, above] lengths: the SD over seeds, else (one seed) the pooled 95%
    interval, else none."""
    below, above = [], []
    for p in curve:
        lo, hi = p["SR_ci95_pooled"] or (None, None)
        if not _missing(p["SR_sd"]):
            below.append(p["SR_sd"])
            above.append(p["SR_sd"])
        else:  # the seeds' mean may sit just outside the pooled interval when seeds hold different episode counts
            below.append(max(0.0, p["SR"] - lo) if lo is not None else 0.0)
            above.append(max(0.0, hi - p["SR"]) if hi is not None else 0.0)
    return [below, above]


def speedup_interval(baseline: Sequence[float], method: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES,
                     seed: int = BOOTSTRAP_SEED) -> list[float] | None:
    """The 95% percentile-bootstrap interval of mean(baseline) / mean(method), each sample resampled with replacement
    on its own; None when either has fewer than two values."""
    if min(len(baseline), len(method)) < 2:
        return None
    rng = np.random.default_rng(seed)
    means = [np.asarray(x, dtype=float)[rng.integers(0, len(x), (resamples, len(x)))].mean(axis=1)
             for x in (baseline, method)]
    return [float(v) for v in np.percentile(means[0] / means[1], [2.5, 97.5])]


def time_to_common_sr(baseline: list[dict[str, Any]], curve: list[dict[str, Any]]) -> dict[str, float | None]:
    """The SR level both mean curves reach (the lower of their best SRs), the training wall-clock of the first
    evaluation where each reaches it, and the ratio baseline / method. No ratio (None) when either reaches it at
    update 0, before any training (its time is the initialization's: training made no progress to compare), or
    when the method's time is 0."""
    if not baseline or not curve:
        return {"common_SR": None, "time_to_common_s": None, "baseline_time_to_common_s": None,
                "speedup_at_common_SR": None}
    level = min(max(p["SR"] for p in baseline), max(p["SR"] for p in curve))
    base, method = (next(p for p in c if p["SR"] >= level) for c in (baseline, curve))
    trained = base["update"] > 0 and method["update"] > 0 and method["elapsed_s"] > 0
    return {"common_SR": level, "time_to_common_s": method["elapsed_s"],
            "baseline_time_to_common_s": base["elapsed_s"],
            "speedup_at_common_SR": base["elapsed_s"] / method["elapsed_s"] if trained else None}


def common_sr_interval(baseline: list[dict[str, Any]], method: list[dict[str, Any]], *,
                       resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> list[float] | None:
    """The 95% percentile-bootstrap interval of the speedup at the common SR: each side's runs resampled with
    replacement on their own, the mean curves, the common SR and the times to it recomputed per resample. A resample
    without a ratio (:func:`time_to_common_sr`: the common SR held before training) is left out; None when either
    side has fewer than two runs or no resample has a ratio."""
    if min(len(baseline), len(method)) < 2:
        return None
    rng = np.random.default_rng(seed)
    ratios = []
    for _ in range(resamples):
        base, ours = ([runs[i] for i in rng.integers(0, len(runs), len(runs))] for runs in (baseline, method))
        ratio = time_to_common_sr(mean_curve(base), mean_curve(ours))["speedup_at_common_SR"]
        if ratio is not None:
            ratios.append(ratio)
    return [float(v) for v in np.percentile(ratios, [2.5, 97.5])] if ratios else None


def comparison_rows(runs: dict[str, dict[int, Path]]) -> list[dict[str, Any]]:
    """One row per strategy of ``runs`` (strategy -> training seed -> run directory, in that order) with its
    aggregates and, against a ``vanilla`` row with finished runs, its speedups (else None)."""
    methods = [method_row(s, [run_row(s, seed, path) for seed, path in by_seed.items()]) for s, by_seed in runs.items()]
    base = next((m for m in methods if m["strategy"] == BASELINE and m["train_s"]), None)
    base_runs = _finished(base["runs"]) if base else []
    base_times = [r["train_s"] for r in base_runs]
    for m in methods:
        times = [r["train_s"] for r in _finished(m["runs"])]
        m["speedup"] = base["train_s"]["mean"] / m["train_s"]["mean"] if base and m["train_s"] else None
        m["speedup_ci95"] = speedup_interval(base_times, times) if m["speedup"] and m is not base else None
        m.update(time_to_common_sr(base["curve"] if base else [], m["curve"]))
        m["speedup_at_common_SR_ci95"] = (common_sr_interval(base_runs, _finished(m["runs"]))
                                          if m["speedup_at_common_SR"] and m is not base else None)
        m.update(speedup_split(base, m))
    return methods


def speedup_split(base: dict[str, Any] | None, method: dict[str, Any]) -> dict[str, float | None]:
    """Sec. 5.4's split of the speedup over Vanilla OPD: the ratio of transitions per second and the ratio of
    executed transitions (method / Vanilla, means over seeds); the speedup is close to the first over the second
    (elapsed time = transitions / throughput; close, not equal: a run's time is not all rollout)."""
    def mean(row: dict[str, Any] | None, key: str) -> float | None:
        return (row.get(key) or {}).get("mean") if row else None

    rate, count = (mean(method, k) / mean(base, k) if mean(method, k) and mean(base, k) else None
                   for k in ("transitions_per_s", "transitions"))
    return {"throughput_ratio": rate, "transitions_ratio": count,
            "split_speedup": rate / count if rate and count else None}


def comparison_table(methods: list[dict[str, Any]]) -> str:
    """The methods as a markdown table in the paper's layout: a column per split where the evaluations report splits
    apart, Score only where some method has one, the speedups only with a ``vanilla`` row."""
    splits = sorted({split for m in methods for split in m["splits"]})

    def split_cell(split: str, metric: str) -> Callable[[dict[str, Any]], str]:
        return lambda m: _pm((m["splits"].get(split) or {}).get(metric))

    columns: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("Method", lambda m: m["method"]),
        ("Seeds", _seeds),
        ("SR (%)", lambda m: _pm(m["SR"])), *((f"SR {s}", split_cell(s, "SR")) for s in splits)]
    columns += [("Score", lambda m: _pm(m["Score"]))] if any(m["Score"] for m in methods) else []
    columns += [("Round", lambda m: _pm(m["Round"])), *((f"Round {s}", split_cell(s, "Round")) for s in splits),
                ("Train (s)", lambda m: _pm(m["train_s"], ".0f")),
                ("Transitions", lambda m: _pm(m["transitions"], ".0f")),
                ("Transitions/s", lambda m: _pm(m["transitions_per_s"], ".2f"))]
    if any(m["strategy"] == BASELINE for m in methods):
        columns += [
            (f"Speedup vs {METHODS[BASELINE]} (95% CI)",
             lambda m: _fmt(m["speedup"], ".2f", "x") + _ci(m["speedup_ci95"], ".2f", lead=" ", absent="")),
            ("Common SR (%)", lambda m: _fmt(m["common_SR"], ".1f")),
            (f"Time to it (s): method / {METHODS[BASELINE]}",
             lambda m: f"{_fmt(m['time_to_common_s'], '.0f')} / {_fmt(m['baseline_time_to_common_s'], '.0f')}"),
            ("Speedup at common SR (95% CI)", lambda m: _fmt(m["speedup_at_common_SR"], ".2f", "x")
             + _ci(m["speedup_at_common_SR_ci95"], ".2f", lead=" ", absent="")),
            ("Transitions/s ratio / transitions ratio (Sec. 5.4)",
             lambda m: f"{_fmt(m['throughput_ratio'], '.2f')} / {_fmt(m['transitions_ratio'], '.2f')}")]
    if any(m["rollout_eq36"] for m in methods):
        columns += [("Rollout speedup measured / Eq. 36 (run's requests)",
                     lambda m: f"{_pm(m['rollout_measured'], '.2f')} / {_pm(m['rollout_eq36'], '.2f')}")]
    return _markdown(columns, methods)


def runs_table(methods: list[dict[str, Any]]) -> str:
    """Every run of every method as a markdown table: its last evaluation (mean ± SD over the evaluation seeds,
    pooled 95% interval), wall-clock and transitions; a run still going shows its latest figures."""
    runs = [r for m in methods for r in m["runs"]]
    splits = sorted({split for r in runs for split in r["splits"]})
    columns: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("Method", lambda r: r["method"]), ("Seed", lambda r: str(r["seed"])),
        ("Finished", lambda r: "yes" if r["finished"] else "no"),
        ("Eval at update", lambda r: _fmt(r["eval_update"], "d")),
        ("SR (%)", lambda r: _pm(r["SR"])), ("SR 95% CI (pooled)", lambda r: _ci(r["SR_ci95_pooled"])),
        *((f"SR {s}", lambda r, s=s: _pm((r["splits"].get(s) or {}).get("SR"))) for s in splits)]
    columns += [("Score", lambda r: _pm(r["Score"]))] if any(r["Score"] for r in runs) else []
    columns += [("Round", lambda r: _pm(r["Round"])), ("Train (s)", lambda r: _fmt(r["train_s"], ".0f")),
                ("Transitions", lambda r: _fmt(r["transitions"], "d")),
                ("Transitions/s", lambda r: _fmt(r["transitions_per_s"], ".2f"))]
    return _markdown(columns, runs)


def plot_comparison(methods: list[dict[str, Any]], path: str | Path, *, teacher_sr: float | None = None) -> Path | None:
    """Figure 5: each method's mean SR over seeds at every evaluated update against the mean training wall-clock
    there, with the SD over seeds as error bars (the pooled 95% interval with one seed), and ``teacher_sr``
    (percent) as a dashed line, written to ``path``; None without matplotlib."""
    fig = new_figure(COMPARISON_SIZE)
    if fig is None:
        return None
    ax = fig.subplots()
    for m in methods:
        if m["curve"]:
            ax.errorbar([p["elapsed_s"] for p in m["curve"]], [p["SR"] for p in m["curve"]],
                        yerr=sr_error_bars(m["curve"]), marker="o", capsize=3,
                        label=f"{m['method']} ({len(m['seeds'])} seed{'s' if len(m['seeds']) > 1 else ''})")
    if not ax.get_legend_handles_labels()[0]:
        ax.text(0.5, 0.5, "no evaluation yet", transform=ax.transAxes, ha="center", va="center", color="gray")
    if teacher_sr is not None:
        ax.axhline(teacher_sr, linestyle="--", color="gray", label=f"teacher ({teacher_sr:.1f}%)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    ax.set_ylim(0, 100)
    ax.set_xlabel("training wall-clock (s, evaluation excluded; mean over seeds)")
    ax.set_ylabel("success rate (%, mean over seeds)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def write_comparison(runs: dict[str, dict[int, Path]], out: str | Path, *,
                     teacher: dict[str, Any] | None = None) -> str:
    """``comparison.json``, ``comparison.md`` and ``comparison.png`` under ``out`` for ``runs`` (strategy ->
    training seed -> run directory), with the teacher's evaluation summary (``EvalReport.summary()``) as the
    reference where given; returns the markdown."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    methods = comparison_rows(runs)
    teacher_sr = ((teacher or {}).get("SR") or {}).get("mean")
    text = comparison_table(methods) + (
        "\n\nMean ± SD over training seeds (finished runs); a run's SR, Score and Round are its last evaluation's "
        "means over the evaluation seeds. Train: training wall-clock (C.3). Speedup: mean Vanilla OPD train / mean "
        f"method train, 95% percentile bootstrap over training seeds ({BOOTSTRAP_RESAMPLES:,} resamples). Common SR: "
        "the lower of the method's and Vanilla OPD's best mean SR; time to it: the first evaluation reaching it.")
    if teacher_sr is not None:
        text += f"\n\nTeacher: SR {_pm(teacher['SR'])} %, pooled 95% CI {_ci(teacher.get('SR_ci95_pooled'))}"
    text += "\n\nRuns (SR: mean ± SD over the evaluation seeds):\n\n" + runs_table(methods)
    (out / "comparison.json").write_text(json.dumps(_finite({
        "methods": methods, "teacher": teacher,
        "bootstrap": {"resamples": BOOTSTRAP_RESAMPLES, "seed": BOOTSTRAP_SEED}}), indent=1, allow_nan=False) + "\n")
    (out / "comparison.md").write_text(text + "\n")
    plot_comparison(methods, out / "comparison.png", teacher_sr=teacher_sr)
    return text


def _finished(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in runs if r["finished"]]


def _missing(value: float | None) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _over_seeds(values: Sequence[float | None]) -> dict[str, float] | None:
    """Mean and sample SD of the values present (None when there are none; the SD of one value is NaN)."""
    present = [v for v in values if not _missing(v)]
    if not present:
        return None
    mean, sd = mean_sd(present)
    return {"mean": mean, "sd": sd}


def _sr_curve(evals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Update, training wall-clock, SR (mean over the evaluation seeds) and pooled interval of each evaluation that
    has them."""
    curve = []
    for record in evals:
        summary = record.get("summary") or {}
        sr = (summary.get("SR") or {}).get("mean")
        if record.get("elapsed_s") is not None and not _missing(sr):
            curve.append({"update": record["update"], "elapsed_s": record["elapsed_s"], "SR": sr,
                          "SR_ci95_pooled": summary.get("SR_ci95_pooled")})
    return curve


def _seeds(method: dict[str, Any]) -> str:
    """The method's finished runs, and how many are not."""
    unfinished = f" (+{len(method['unfinished'])} unfinished)" if method["unfinished"] else ""
    return f"{len(method['seeds'])}{unfinished}"


def _markdown(columns: list[tuple[str, Callable[[dict[str, Any]], str]]], rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(head for head, _ in columns) + " |", "|---|" + "---:|" * (len(columns) - 1)]
    lines += ["| " + " | ".join(cell(row) for _, cell in columns) + " |" for row in rows]
    return "\n".join(lines)


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "n/a" if _missing(value) else f"{value:{spec}}{suffix}"


def _ci(interval: list[float | None] | None, spec: str = ".1f", *, lead: str = "", absent: str = "n/a") -> str:
    """``[low, high]`` after ``lead``, or ``absent`` without an interval or with an end missing."""
    if not interval or any(map(_missing, interval)):
        return absent
    return f"{lead}[{interval[0]:{spec}}, {interval[1]:{spec}}]"


def _pm(stat: dict[str, Any] | None, spec: str = ".1f") -> str:
    """``mean ± sd`` of a statistic (the SD of a single value is n/a)."""
    if not stat or _missing(stat.get("mean")):
        return "n/a"
    return f"{stat['mean']:{spec}} ± {_fmt(stat.get('sd'), spec)}"

"""The comparison's tables, read from the runs that ``python -m actfirst.compare`` trains and evaluates
(``actfirst.comparison.runs``): any rollout strategies under one training config, each trained under several
training seeds, in the layout of the paper's Tables 1-3.

A run's SR curve comes from its checkpoints, evaluated after training on the same episodes for every checkpoint of
every run (``checkpoint_evals.jsonl``), its first point the warm start's evaluation (update 0, 0 s of training); a
point's time is the training wall-clock (C.3, evaluation outside it) at that update's metrics record. Its training
wall-clock is C.3's final ``train_s`` (``wall_clock.json``). One row per method, from its finished runs:

- SR, Score (where the evaluations report one: ScienceWorld, WebShop), Round at the last checkpoint: mean ± SD over
  training seeds; ALFWorld's valid_seen and valid_unseen also apart.
- Training wall-clock (s), executed transitions and transitions per second: mean ± SD over training seeds; the
  seconds of each phase (rollout, score, update, sync, probe, evaluation during and after training) summed over a
  run, mean over seeds (with the asynchronous pipeline the phases overlap: they need not add up to the wall-clock).
- Speedup over Vanilla OPD at the same updates: the paired per-seed log ratio log(T_vanilla,s / T_method,s) over
  the seeds both finished, its mean m and SD s over n seeds; reported as exp(m) with the Student t interval
  exp(m -+ t_{0.975, n-1} s / sqrt(n)) (``actfirst.evaluation.stats.paired_ratio``). A percentile bootstrap of the
  ratio of mean times (each method's seeds resampled on their own, ``stats.speedup_interval``) stands beside it as a
  cross-check only.
- Same SR: the threshold fixed before any run trained (``compare.threshold``, :func:`fixed_threshold`), each run's
  time to it (its first checkpoint at or above it, no interpolation: :func:`time_to_threshold`), and the paired
  interval of the speedup there over the seeds where both methods reach it; a seed where either never reaches it
  is left out of the interval and listed ("not reached"). Beside it, over every seed (leaving seeds out biases the
  figure towards the method that reaches the threshold less often): each run's time to the threshold restricted to
  a horizon tau, min(T, tau), where tau is the shortest last-checkpoint time of any finished run of the
  comparison, so that every run was observed up to tau and a run that does not reach the threshold by then counts
  as tau (:func:`restricted_horizon`, :func:`restricted_time`); per method the restricted mean time to the
  threshold (RMST) over its seeds, and the paired speedup of those restricted times over the seeds both finished.
  A seed where neither method reaches the threshold by tau adds a ratio of 1: the figure is conservative.
- Sec. 5.4's split: the method's transitions per second and executed transitions over Vanilla OPD's (elapsed time
  is transitions over throughput, so the speedup is close to the first ratio over the second).
- The rollout speedup from each run's own request records (``actfirst.train.speedup.run_figures``, the run's
  ``wall_clock.json``): Vanilla OPD's measured rollout-batch time over the method's, and the same of Eq. 36's times
  (Vanilla's from its own full responses, the method's from its own fast actions and full responses), each the paired
  per-seed log ratio as above.

``comparison.md`` also lists every run (its threads: ``run_summary.json``); ``comparison.json`` holds each method's
aggregates, its mean curve, every run's own row and the threshold; ``comparison.png`` is Figure 5 (per method the
mean SR over seeds at each checkpoint against the mean training wall-clock there, the SD over seeds, the teacher's
SR and the threshold as dashed lines); ``curves.png`` one panel per seed with every method's SR against training
time and the threshold.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from actfirst.core.config import RESUMABLE_CHANGES, ConfigError, TrainConfig, check_resumable
from actfirst.core.files import json_safe, write_atomically
from actfirst.core.schema import to_dict
from actfirst.evaluation.stats import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    CONFIDENCE,
    mean_sd,
    paired_ratio,
    speedup_interval,
)
from actfirst.rollout.strategies import StrategyLabels
from actfirst.train.plots import new_figure, read_records, read_wall_clock, save_figure

METHODS = StrategyLabels()
"""The paper's name of each strategy (its class's ``label``)."""
BASELINE = "vanilla"
EVAL_METRICS = ("SR", "Score", "Round")
COMPARISON_SIZE = (7.0, 4.5)
"""Inches of ``comparison.png``."""
PANEL_SIZE = (4.0, 3.2)
"""Inches of one seed's panel in ``curves.png``."""
ROLLOUT_MODEL = {"measured": "measured_s_per_batch", "eq36": "eq36_s_per_batch"}
"""The rollout speedups over Vanilla OPD, each from a figure of both runs' own records (``run_figures``)."""
PHASES = ("rollout_s", "score_s", "update_s", "sync_s", "probe_s")
"""The per-update phase seconds of ``metrics.jsonl`` that a run's row sums."""
CHECKPOINT_EVALS = "checkpoint_evals.jsonl"
"""A run's checkpoints evaluated after training: one row per update (as ``evals.jsonl``'s rows)."""
OUTPUTS = ("comparison.md", "comparison.json", "comparison.png", "curves.png")
"""What :func:`write_comparison` writes under the comparison's directory."""
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


def run_row(strategy: str, seed: int, path: str | Path, *, warm_start: dict[str, Any] | None = None,
            threshold: float | None = None) -> dict[str, Any]:
    """One run's row: its last checkpoint's evaluation (overall and per split; each metric's summary over the
    evaluation seeds), its final wall-clock, its phases and threads, its SR curve (``warm_start``: the warm start's
    evaluation row, the curve's update 0) and its time to ``threshold``; what it does not have yet is None.
    ``train_s`` is the final C.3 figure of a finished run, the latest one of a run still going."""
    path = Path(path)
    evals = read_records(path / CHECKPOINT_EVALS)
    metrics = read_records(path / "metrics.jsonl")
    last_eval = evals[-1] if evals else {}
    summary = last_eval.get("summary") or {}
    last = metrics[-1] if metrics else {}
    final = read_wall_clock(path)
    train_s = final["train_s"] if final else last.get("elapsed_s")
    transitions = last.get("total_transitions")
    splits = last_eval.get("splits") or {}
    curve = _sr_curve(([warm_start] if warm_start and all(r["update"] for r in evals) else []) + evals)
    phases = {k: math.fsum(r[k] for r in metrics if r.get(k) is not None) if any(k in r for r in metrics) else None
              for k in PHASES}
    phases["eval_s"] = final.get("eval_s") if final else None
    phases["checkpoint_eval_s"] = math.fsum(r.get("eval_wall_s") or 0.0 for r in evals) if evals else None
    return {"strategy": strategy, "method": METHODS.get(strategy, strategy), "seed": seed, "run_dir": str(path),
            "finished": final is not None, "updates": last.get("update"), "eval_update": last_eval.get("update"),
            "episodes": summary.get("episodes"), **{m: summary.get(m) for m in EVAL_METRICS},
            "SR_ci95_pooled": summary.get("SR_ci95_pooled"),
            "splits": {split: {m: stats.get(m) for m in EVAL_METRICS} for split, stats in splits.items()},
            "train_s": train_s, "transitions": transitions,
            "transitions_per_s": transitions / train_s if train_s and transitions is not None else None,
            "rollout": final.get("rollout_model") if final else None,
            "phases_s": phases, "threads": _threads(path), "curve": curve,
            "to_threshold": time_to_threshold(curve, threshold) if threshold is not None else None}


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
            **{key: _over_seeds([r[key] for r in done]) for key in ("train_s", "transitions", "transitions_per_s")},
            "phases_s": {k: _over_seeds([r["phases_s"][k] for r in done]) for k in (*PHASES, "eval_s",
                                                                                   "checkpoint_eval_s")},
            "time_to_threshold_s": _over_seeds([(r["to_threshold"] or {}).get("elapsed_s") for r in done]),
            "reached": [r["seed"] for r in done if r["to_threshold"]],
            "not_reached": [r["seed"] for r in done if not r["to_threshold"]],
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


def fixed_threshold(setting: str | float, warm_start_sr: float | None, teacher_sr: float | None) -> float:
    """The same-SR threshold (percent) of ``compare.threshold``: a number as given; ``auto`` the warm start's SR plus
    half the gap to the teacher's. Raises ``ConfigError`` when ``auto`` lacks an SR or the threshold is not above the
    warm start's SR (every run would reach it before training)."""
    if setting == "auto":
        if warm_start_sr is None or teacher_sr is None:
            raise ConfigError("compare.threshold=auto: needs the warm start's and the teacher's SR (the comparison's "
                              "preparation evaluates both); give a number instead")
        threshold = warm_start_sr + (teacher_sr - warm_start_sr) / 2
    else:
        threshold = float(setting)
    if warm_start_sr is not None and threshold <= warm_start_sr:
        raise ConfigError(f"compare.threshold={setting!r}: gives {threshold:.1f}%, not above the warm start's SR "
                          f"{warm_start_sr:.1f}% (teacher: {_fmt(teacher_sr, '.1f')}%); give a higher number")
    return threshold


def time_to_threshold(curve: list[dict[str, Any]], threshold: float) -> dict[str, float] | None:
    """The first point of a run's curve (in update order) whose SR is at or above ``threshold``: its update and
    training wall-clock (no interpolation between checkpoints); None when the run never reaches it."""
    point = next((p for p in curve if p["SR"] >= threshold), None)
    return None if point is None else {"update": point["update"], "elapsed_s": point["elapsed_s"]}


def restricted_horizon(runs: list[dict[str, Any]]) -> float | None:
    """The horizon tau of the restricted times: the shortest time of a last evaluated checkpoint among ``runs`` (run
    rows of finished runs), so that every one of them was observed up to tau; None when a run has no checkpoint
    past update 0."""
    ends = [r["curve"][-1]["elapsed_s"] if r["curve"] else 0.0 for r in runs]
    return min(ends) if ends and min(ends) > 0 else None


def restricted_time(run: dict[str, Any], horizon: float) -> float:
    """A run's time to the threshold restricted to ``horizon``: min(T, tau), the horizon itself where the run does
    not reach the threshold by then (or at all)."""
    reached = run["to_threshold"]
    return horizon if reached is None else min(reached["elapsed_s"], horizon)


def comparison_rows(runs: dict[str, dict[int, Path]], *, warm_start: dict[str, Any] | None = None,
                    threshold: float | None = None) -> list[dict[str, Any]]:
    """One row per strategy of ``runs`` (strategy -> training seed -> run directory, in that order) with its
    aggregates (``warm_start``: the warm start's evaluation row, every curve's update 0; ``threshold``: the
    same-SR threshold) and, against a ``vanilla`` row with finished runs, its speedups (else None)."""
    methods = [method_row(s, [run_row(s, seed, path, warm_start=warm_start, threshold=threshold)
                              for seed, path in by_seed.items()]) for s, by_seed in runs.items()]
    base = next((m for m in methods if m["strategy"] == BASELINE and m["train_s"]), None)
    base_runs = _finished(base["runs"]) if base else []
    horizon = restricted_horizon([r for m in methods for r in _finished(m["runs"])]) if threshold is not None else None
    for m in methods:
        done = _finished(m["runs"])
        m["restricted_horizon_s"] = horizon
        m["restricted_time_s"] = _over_seeds([restricted_time(r, horizon) for r in done]) if horizon else None
        if m is base:  # against itself: 1 by definition, no interval
            m.update(speedup=1.0, speedup_ci95=None, speedup_seeds=m["seeds"], speedup_log_sd=None,
                     speedup_bootstrap_ci95=None, speedup_at_threshold=1.0 if m["reached"] else None,
                     speedup_at_threshold_ci95=None, speedup_at_threshold_seeds=m["reached"],
                     speedup_restricted=1.0 if horizon else None, speedup_restricted_ci95=None,
                     speedup_restricted_seeds=m["seeds"] if horizon else [])
            m.update(speedup_split(base, m), **{f"rollout_{k}": None for k in ROLLOUT_MODEL})
            continue
        same = paired_ratio({r["seed"]: r["train_s"] for r in base_runs}, {r["seed"]: r["train_s"] for r in done})
        m["speedup"], m["speedup_ci95"], m["speedup_seeds"] = same["ratio"], same["ci95"], same["seeds"]
        m["speedup_log_sd"] = same["log_sd"]
        m["speedup_bootstrap_ci95"] = speedup_interval([r["train_s"] for r in base_runs],
                                                       [r["train_s"] for r in done]) if base else None
        at_sr = paired_ratio(*({r["seed"]: r["to_threshold"]["elapsed_s"] for r in side if r["to_threshold"]}
                               for side in (base_runs, done)))
        m["speedup_at_threshold"], m["speedup_at_threshold_ci95"] = at_sr["ratio"], at_sr["ci95"]
        m["speedup_at_threshold_seeds"] = at_sr["seeds"]
        restricted = paired_ratio(*({r["seed"]: restricted_time(r, horizon) for r in side} if horizon else {}
                                    for side in (base_runs, done)))
        m["speedup_restricted"], m["speedup_restricted_ci95"] = restricted["ratio"], restricted["ci95"]
        m["speedup_restricted_seeds"] = restricted["seeds"]
        m.update(speedup_split(base, m), **rollout_speedups(base_runs, done))
    return methods


def rollout_speedups(base_runs: list[dict[str, Any]], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The rollout speedups over Vanilla OPD from each run's own records (:data:`ROLLOUT_MODEL`): per figure the
    paired per-seed ratio (:func:`paired_ratio`) of Vanilla's per-batch seconds over the method's."""

    def figure(side: list[dict[str, Any]], key: str) -> dict[int, float]:
        return {r["seed"]: r["rollout"][key] for r in side if r["rollout"] and r["rollout"].get(key)}

    return {f"rollout_{name}": paired_ratio(figure(base_runs, key), figure(runs, key))
            for name, key in ROLLOUT_MODEL.items()}


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


def comparison_table(methods: list[dict[str, Any]], threshold: float | None = None) -> str:
    """The methods as a markdown table in the paper's layout: a column per split where the evaluations report splits
    apart, Score only where some method has one, the speedups only with a ``vanilla`` row, the same-SR columns only
    with a ``threshold``."""
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
            (f"Speedup vs {METHODS[BASELINE]}, same updates (paired t 95% CI)",
             lambda m: _fmt(m["speedup"], ".2f", "x") + _ci(m["speedup_ci95"], ".2f", lead=" ", absent="")),
            ("Bootstrap 95% CI (cross-check)", lambda m: _ci(m["speedup_bootstrap_ci95"], ".2f", absent="")),
            ("Transitions/s ratio / transitions ratio (Sec. 5.4)",
             lambda m: f"{_fmt(m['throughput_ratio'], '.2f')} / {_fmt(m['transitions_ratio'], '.2f')}")]
    if threshold is not None:
        columns += [(f"Seeds reaching {threshold:.1f}%", _reached),
                    ("Time to it (s)", lambda m: _pm(m["time_to_threshold_s"], ".0f"))]
        if any(m["strategy"] == BASELINE for m in methods):
            columns += [("Speedup at it (paired t 95% CI, seeds)", lambda m: _fmt(m["speedup_at_threshold"], ".2f", "x")
                         + _ci(m["speedup_at_threshold_ci95"], ".2f", lead=" ", absent="")
                         + (f", {len(m['speedup_at_threshold_seeds'])}" if m["speedup_at_threshold"] else ""))]
        horizon = next((m["restricted_horizon_s"] for m in methods if m["restricted_horizon_s"]), None)
        if horizon is not None:
            columns += [(f"Restricted mean time to it, tau {horizon:.0f} s (every seed)",
                         lambda m: _pm(m["restricted_time_s"], ".0f"))]
        if horizon is not None and any(m["strategy"] == BASELINE for m in methods):
            columns += [("Speedup at it, restricted (paired t 95% CI, every seed)",
                         lambda m: _fmt(m["speedup_restricted"], ".2f", "x")
                         + _ci(m["speedup_restricted_ci95"], ".2f", lead=" ", absent="")
                         + (f", {len(m['speedup_restricted_seeds'])}" if m["speedup_restricted"] else ""))]
    if any((m.get("rollout_eq36") or {}).get("ratio") for m in methods):
        columns += [("Rollout speedup measured / Eq. 36 (each run's own records, paired t 95% CI)",
                     lambda m: f"{_paired(m['rollout_measured'])} / {_paired(m['rollout_eq36'])}")]
    return _markdown(columns, methods)


def runs_table(methods: list[dict[str, Any]]) -> str:
    """Every run of every method as a markdown table: its last checkpoint's evaluation (mean ± SD over the
    evaluation seeds, pooled 95% interval), wall-clock, phases, threads, transitions and time to the threshold; a run
    still going shows its latest figures."""
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
                ("Rollout / score / update / sync (s)",
                 lambda r: " / ".join(_fmt(r["phases_s"][k], ".0f") for k in ("rollout_s", "score_s", "update_s",
                                                                             "sync_s"))),
                ("Eval after (s)", lambda r: _fmt(r["phases_s"]["checkpoint_eval_s"], ".0f")),
                ("Threads (torch / OMP / cores)", _thread_cell),
                ("Transitions", lambda r: _fmt(r["transitions"], "d")),
                ("Transitions/s", lambda r: _fmt(r["transitions_per_s"], ".2f")),
                ("To threshold: update, s", lambda r: "not reached" if not r["to_threshold"] else
                 f"{r['to_threshold']['update']}, {r['to_threshold']['elapsed_s']:.0f}")]
    return _markdown(columns, runs)


def plot_comparison(methods: list[dict[str, Any]], path: str | Path, *, teacher_sr: float | None = None,
                    threshold: float | None = None) -> Path | None:
    """Figure 5: each method's mean SR over seeds at every checkpoint against the mean training wall-clock there,
    with the SD over seeds as error bars (the pooled 95% interval with one seed), ``teacher_sr`` and ``threshold``
    (percent) as dashed lines, written to ``path``; None without matplotlib."""
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
    _reference_lines(ax, teacher_sr, threshold)
    ax.set_xlabel("training wall-clock (s, evaluation excluded; mean over seeds)")
    ax.set_ylabel("success rate (%, mean over seeds)")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_seed_curves(methods: list[dict[str, Any]], path: str | Path, *, teacher_sr: float | None = None,
                     threshold: float | None = None) -> Path | None:
    """One panel per training seed: every method's SR at each checkpoint of that seed's run against its training
    wall-clock, with ``teacher_sr`` and ``threshold`` as dashed lines, written to ``path``; None without
    matplotlib."""
    seeds = sorted({r["seed"] for m in methods for r in m["runs"]})
    columns = min(3, max(1, len(seeds)))
    rows = max(1, math.ceil(len(seeds) / columns))
    fig = new_figure((PANEL_SIZE[0] * columns, PANEL_SIZE[1] * rows))
    if fig is None:
        return None
    axes = np.atleast_1d(fig.subplots(rows, columns, squeeze=False)).ravel()
    for ax, seed in zip(axes, seeds, strict=False):
        for m in methods:
            for r in m["runs"]:
                if r["seed"] == seed and r["curve"]:
                    ax.plot([p["elapsed_s"] for p in r["curve"]], [p["SR"] for p in r["curve"]], marker="o",
                            label=m["method"])
        ax.set_title(f"seed {seed}", fontsize="medium")
        _reference_lines(ax, teacher_sr, threshold)
        ax.set_xlabel("training wall-clock (s)")
        ax.set_ylabel("SR (%)")
    for ax in axes[len(seeds):]:
        ax.set_visible(False)
    fig.tight_layout()
    return save_figure(fig, path)


def _reference_lines(ax: Any, teacher_sr: float | None, threshold: float | None) -> None:
    """The teacher's SR and the threshold as dashed lines, the legend, the axes' range and grid."""
    if teacher_sr is not None:
        ax.axhline(teacher_sr, linestyle="--", color="gray", label=f"teacher ({teacher_sr:.1f}%)")
    if threshold is not None:
        ax.axhline(threshold, linestyle=":", color="black", label=f"threshold ({threshold:.1f}%)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)


def write_comparison(runs: dict[str, dict[int, Path]], out: str | Path, *,
                     teacher: dict[str, Any] | None = None, fixed: dict[str, Any] | None = None) -> str:
    """``comparison.json``, ``comparison.md``, ``comparison.png`` and ``curves.png`` under ``out`` for ``runs``
    (strategy -> training seed -> run directory), with the teacher's evaluation summary (``EvalReport.summary()``)
    as the reference where given and ``fixed``, the comparison's record made before training (``threshold.json``:
    the threshold, the warm start's and the teacher's evaluation rows); returns the markdown."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fixed = fixed or {}
    threshold = fixed.get("threshold")
    methods = comparison_rows(runs, warm_start=fixed.get("warm_start"), threshold=threshold)
    teacher_sr = ((teacher or {}).get("SR") or {}).get("mean")
    text = comparison_table(methods, threshold) + (
        "\n\nMean ± SD over training seeds (finished runs); a run's SR, Score and Round are its last checkpoint's "
        "evaluation (after training), means over the evaluation seeds. Train: training wall-clock (C.3). Speedup: "
        "exp of the mean over seeds of log(Vanilla OPD train / method train), paired by seed, with its Student t "
        f"interval; the bootstrap of the ratio of mean times ({BOOTSTRAP_RESAMPLES:,} resamples, unpaired) only as a "
        "cross-check.")
    if threshold is not None:
        text += (f"\n\nSame SR: threshold {threshold:.1f}% ({fixed.get('setting')!r}, fixed before training: "
                 f"{fixed.get('how', '')}). Time to it: a run's first checkpoint at or above it (no interpolation); "
                 "the speedup there is paired over the seeds where both methods reach it, a seed that never does "
                 "is left out (listed under Seeds reaching). Restricted: every seed, each run's time to the threshold "
                 "as min(T, tau), tau the shortest last-checkpoint time of any finished run (every run observed up "
                 "to it; one that has not reached the threshold by then counts as tau); its mean over seeds (RMST) "
                 "and the paired speedup of those times.")
    if teacher_sr is not None:
        text += f"\n\nTeacher: SR {_pm(teacher['SR'])} %, pooled 95% CI {_ci(teacher.get('SR_ci95_pooled'))}"
    text += "\n\nRuns (SR: mean ± SD over the evaluation seeds):\n\n" + runs_table(methods)
    write_atomically(out / "comparison.json", json.dumps(json_safe({
        "methods": methods, "teacher": teacher, "fixed_before_training": fixed, "confidence": CONFIDENCE,
        "bootstrap": {"resamples": BOOTSTRAP_RESAMPLES, "seed": BOOTSTRAP_SEED}}), indent=1, allow_nan=False) + "\n")
    write_atomically(out / "comparison.md", text + "\n")
    plot_comparison(methods, out / "comparison.png", teacher_sr=teacher_sr, threshold=threshold)
    plot_seed_curves(methods, out / "curves.png", teacher_sr=teacher_sr, threshold=threshold)
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


def _paired(stat: dict[str, Any] | None) -> str:
    """A :func:`paired_ratio` as ``2.10x [1.50, 2.94]`` (``-`` where there is none)."""
    if not stat or stat["ratio"] is None:
        return "-"
    return _fmt(stat["ratio"], ".2f", "x") + _ci(stat["ci95"], ".2f", lead=" ", absent="")


def _pm(stat: dict[str, Any] | None, spec: str = ".1f") -> str:
    """``mean ± sd`` of a statistic (the SD of a single value is n/a)."""
    if not stat or _missing(stat.get("mean")):
        return "n/a"
    return f"{stat['mean']:{spec}} ± {_fmt(stat.get('sd'), spec)}"


def _threads(path: Path) -> dict[str, Any] | None:
    """The threads the run's training process computed with (``run_summary.json``), None before it is written."""
    try:
        return json.loads((path / "run_summary.json").read_text()).get("threads")
    except (OSError, ValueError):
        return None


def _thread_cell(run: dict[str, Any]) -> str:
    counts = (run["threads"] or {}).get("training") or {}
    return " / ".join(str(counts.get(k, "n/a")) for k in ("torch_threads", "OMP_NUM_THREADS", "usable_cores"))


def _reached(method: dict[str, Any]) -> str:
    """How many finished seeds reach the threshold, and which do not."""
    missing = f" (not: {', '.join(map(str, method['not_reached']))})" if method["not_reached"] else ""
    return f"{len(method['reached'])} of {len(method['seeds'])}{missing}"

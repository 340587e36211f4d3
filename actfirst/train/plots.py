"""Training curves of one run, drawn from its ``metrics.jsonl`` and ``evals.jsonl``.

``plot_training_curve`` writes ``<out_dir>/training_curve.png`` with two panels against training wall-clock
(evaluation excluded): the success rate of each evaluation with its pooled 95% Wilson interval (and the teacher's
SR as a dashed reference line), and the teacher-minus-student gap (on the fixed probe contexts, and on each update's
training batch). The file is replaced atomically, so it can be redrawn at every evaluation while a run goes on and
read at any time.

Figures are built on matplotlib's Agg canvas directly (no pyplot, no global backend switch, nothing kept alive
between calls). Without an importable matplotlib nothing is drawn: the functions warn and return None.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

DPI = 100
TRAINING_CURVE_SIZE = (7.0, 6.0)
"""Inches; at ``DPI`` the PNG is 700 x 600 pixels."""


WALL_CLOCK = "wall_clock.json"
"""A finished run's wall-clock (``train_s``, ``eval_s``, ``probe_s``; Appendix C.3), in its out_dir."""


def read_wall_clock(run_dir: str | Path) -> dict[str, Any] | None:
    """The finished run's :data:`WALL_CLOCK` record (None while the run has not finished)."""
    path = Path(run_dir) / WALL_CLOCK
    return json.loads(path.read_text()) if path.is_file() else None


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The JSON records of a JSONL file, one per ``update`` (a later line replaces an earlier one of the same update,
    as after a resume), in update order. A missing file gives none; a last line without its newline (being written
    right now) is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    *lines, _cut = path.read_text().split("\n")
    by_update: dict[Any, dict[str, Any]] = {}
    for line in lines:
        if line.strip():
            record = json.loads(line)
            by_update[record.get("update")] = record
    return sorted(by_update.values(), key=lambda r: r.get("update") or 0)


def sr_points(evals: list[dict[str, Any]]) -> tuple[list[float], list[float], list[list[float]]]:
    """From ``evals.jsonl`` records: training wall-clock (s), SR mean (%) and the pooled 95% interval as
    ``[below, above]`` error-bar lengths; evaluations without an SR are left out."""
    xs: list[float] = []
    ys: list[float] = []
    err: list[list[float]] = [[], []]
    for record in evals:
        summary = record.get("summary") or {}
        mean = (summary.get("SR") or {}).get("mean")
        if mean is None or record.get("elapsed_s") is None:
            continue
        lo, hi = summary.get("SR_ci95_pooled") or (None, None)
        xs.append(record["elapsed_s"])
        ys.append(mean)
        # The seeds' mean may sit just outside the pooled interval when seeds hold different episode counts.
        err[0].append(max(0.0, mean - lo) if lo is not None else 0.0)
        err[1].append(max(0.0, hi - mean) if hi is not None else 0.0)
    return xs, ys, err


def new_figure(figsize: tuple[float, float]) -> Any | None:
    """A matplotlib Figure on an Agg canvas, or None (with a warning) when matplotlib cannot be imported."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        warnings.warn(f"matplotlib is not importable ({e}): no plot written", stacklevel=3)
        return None
    fig = Figure(figsize=figsize, dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Any, path: str | Path) -> Path:
    """Write ``fig`` as a PNG to ``path`` atomically (a temporary file in the same directory, then ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fig.savefig(tmp, format="png", dpi=DPI)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def plot_training_curve(out_dir: str | Path, *, teacher_sr: float | None = None,
                        title: str | None = None) -> Path | None:
    """Draw ``<out_dir>/training_curve.png`` from the run's metrics and evaluations (any of them may be missing);
    ``teacher_sr`` (percent) is drawn as a dashed line. Returns the PNG's path, or None without matplotlib."""
    out_dir = Path(out_dir)
    fig = new_figure(TRAINING_CURVE_SIZE)
    if fig is None:
        return None
    metrics = read_records(out_dir / "metrics.jsonl")
    evals = read_records(out_dir / "evals.jsonl")
    ax_sr, ax_gap = fig.subplots(2, 1, sharex=True)

    xs, ys, err = sr_points(evals)
    if xs:
        ax_sr.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label="student SR (pooled 95% CI)")
    if teacher_sr is not None:
        ax_sr.axhline(teacher_sr, linestyle="--", color="gray", label=f"teacher SR ({teacher_sr:.1f}%)")
    if not xs:
        ax_sr.text(0.5, 0.5, "no evaluation yet", transform=ax_sr.transAxes, ha="center", va="center", color="gray")
    ax_sr.set_ylim(0, 100)
    ax_sr.set_ylabel("success rate (%)")

    drawn = False
    for key, label, style in (("probe/gap", "probe contexts", {"marker": ".", "color": "C0"}),
                              ("teacher_minus_old", "training batch", {"color": "C0", "alpha": 0.35})):
        points = [(r["elapsed_s"], r[key]) for r in metrics
                  if r.get(key) is not None and r.get("elapsed_s") is not None]
        if points:
            ax_gap.plot(*zip(*points, strict=True), label=label, **style)
            drawn = True
    if drawn:
        ax_gap.axhline(0.0, color="black", linewidth=0.5)
    else:
        ax_gap.text(0.5, 0.5, "no gap measured yet", transform=ax_gap.transAxes, ha="center", va="center",
                    color="gray")
    ax_gap.set_ylabel("teacher - student log-prob")
    ax_gap.set_xlabel("training wall-clock (s, evaluation excluded)")

    for ax in (ax_sr, ax_gap):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.suptitle(title if title is not None else out_dir.name)
    fig.tight_layout()
    return save_figure(fig, out_dir / "training_curve.png")

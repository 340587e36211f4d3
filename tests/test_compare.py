"""The method comparison from hand-written run directories (aggregates over training seeds, the paired t interval of
the speedups and its bootstrap cross-check, the fixed same-SR threshold and the times to it, ALFWorld's splits, Score,
table, JSON, PNGs) against hand computations, the ABBA order, the command line and ``--resume``'s check of a run's
saved config. The comparison end to end (real runs): tests/train/test_compare_run.py."""

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from actfirst.compare import main, parse_args
from actfirst.comparison.runs import run_order
from actfirst.comparison.tables import (
    CHECKPOINT_EVALS,
    COMPARISON_SIZE,
    FINISHED,
    METHODS,
    NEW,
    PANEL_SIZE,
    STARTED,
    comparison_rows,
    comparison_table,
    fixed_threshold,
    mean_curve,
    plot_comparison,
    run_row,
    run_state,
    sr_error_bars,
    time_to_threshold,
    write_comparison,
)
from actfirst.core.config import ConfigError
from actfirst.core.schema import config_json
from actfirst.evaluation.report import EpisodeRecord, EvalReport
from actfirst.evaluation.stats import BOOTSTRAP_RESAMPLES, paired_ratio, speedup_interval, t_quantile, wilson_interval
from actfirst.rollout.strategies import STRATEGIES
from actfirst.train.plots import DPI, WALL_CLOCK

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TASKS = 10
"""Tasks per evaluation seed (and per split)."""


def eval_report(successes: list[int] | dict[str, list[int]], benchmark: str = "alfworld") -> EvalReport:
    """An evaluation under seeds 42, 43, ...: ``successes[i]`` of :data:`TASKS` tasks won under seed 42 + i, or per
    split (each split its own tasks). A won episode scores 100, a lost one 20; every episode of seed 42 + i takes
    4 + i turns, 2 more in the second split."""
    by_split = successes if isinstance(successes, dict) else {None: successes}
    episodes = [EpisodeRecord(seed=42 + s, index=k * TASKS + i, task=f"t{i}", task_type="Pick", success=i < won,
                              score=100.0 if i < won else 20.0, turns=4 + s + 2 * k, invalid_turns=0, actions=[],
                              response_tokens=[], response_hashes=[], truncated_responses=0, split=split)
                for k, (split, per_seed) in enumerate(by_split.items()) for s, won in enumerate(per_seed)
                for i in range(TASKS)]
    seeds = len(next(iter(by_split.values())))
    return EvalReport(benchmark, [42 + s for s in range(seeds)], ["Pick"], episodes)


def eval_record(update: int, elapsed_s: float, successes, benchmark: str = "alfworld") -> dict:
    """An ``evals.jsonl`` row as ``actfirst.train.evaluations`` writes it (``test_the_trainer_records_splits``)."""
    report = eval_report(successes, benchmark)
    return {"update": update, "elapsed_s": elapsed_s, "eval_wall_s": 3.0, "report": f"evals/update_{update:06d}.json",
            "summary": report.summary(), "splits": {s: report.summary(split=s) for s in report.splits}}


def write_run(run_dir: Path, *, wall: float, transitions: int, evals: list[tuple], benchmark: str = "alfworld",
              updates: int = 4, final_s: float | None = None, finished: bool = True,
              rollout: tuple[float, float] | None = None) -> None:
    """A run directory: ``updates`` metrics records ending at ``wall`` s and ``transitions`` transitions (each update
    1 s of rollout, 2 of scoring, 3 of update, 0.5 of sync), the checkpoints' evaluations ``(update, elapsed_s,
    successes)`` (see :func:`eval_report`), and (``finished``) ``wall_clock.json``
    with ``updates`` updates and the final wall-clock ``final_s`` (default ``wall``); ``rollout``: the run's own
    rollout figures there (measured and Eq. 36 seconds per rollout batch, ``actfirst.train.speedup.run_figures``)."""
    run_dir.mkdir(parents=True, exist_ok=True)  # the stand-in trainer rewrites a resumed run
    if finished:
        (run_dir / WALL_CLOCK).write_text(json.dumps({"train_s": wall if final_s is None else final_s,
                                                      "eval_s": 6.0, "probe_s": 1.0, "updates": updates,
                                                      "rollout_model": None if rollout is None else dict(zip(
                                                          ("measured_s_per_batch", "eq36_s_per_batch"), rollout,
                                                          strict=True))}))
    metrics = [{"update": u, "elapsed_s": wall * u / updates, "total_transitions": transitions * u // updates,
                "transitions": transitions // updates, "rollout_s": 1.0, "score_s": 2.0, "update_s": 3.0,
                "sync_s": 0.5}
               for u in range(1, updates + 1)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    rows = [eval_record(u, t, s, benchmark) for u, t, s in evals]
    # NaN as the evaluation writes it
    (run_dir / CHECKPOINT_EVALS).write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))


@pytest.fixture
def runs(tmp_path) -> dict[str, dict[int, Path]]:
    """Vanilla OPD and ActFirst-OPD under training seeds 1 and 2; w/o ID with seed 1 finished and seed 2 still going.
    SR at updates 0 / 2 / 4: vanilla 10 / 30 / 40 (seed 1) and 10 / 50 / 50 (seed 2); actfirst 10 / 50 / 60 and
    10 / 40 / 70; no_id 10 / - / 40."""
    spec = {("vanilla", 1): (300.0, 600, [(0, 0.0, [1, 1, 1]), (2, 150.0, [2, 3, 4]), (4, 300.0, [3, 4, 5])]),
            ("vanilla", 2): (340.0, 800, [(0, 0.0, [1, 1, 1]), (2, 170.0, [5, 5, 5]), (4, 340.0, [5, 5, 5])]),
            ("actfirst", 1): (120.0, 600, [(0, 0.0, [1, 1, 1]), (2, 60.0, [5, 5, 5]), (4, 120.0, [5, 6, 7])]),
            ("actfirst", 2): (140.0, 700, [(0, 0.0, [1, 1, 1]), (2, 70.0, [4, 4, 4]), (4, 140.0, [7, 7, 7])]),
            ("no_id", 1): (200.0, 500, [(0, 0.0, [1, 1, 1]), (4, 200.0, [4, 4, 4])])}
    rollout = {("vanilla", 1): (30.0, 40.0), ("vanilla", 2): (34.0, 44.0), ("actfirst", 1): (15.0, 10.0),
               ("actfirst", 2): (16.0, 11.0)}
    for (strategy, seed), (wall, transitions, evals) in spec.items():
        write_run(tmp_path / strategy / f"seed{seed}", wall=wall, transitions=transitions, evals=evals,
                  rollout=rollout.get((strategy, seed)))
    write_run(tmp_path / "no_id" / "seed2", wall=90.0, transitions=250, evals=[(0, 0.0, [1, 1, 1])], updates=2,
              finished=False)
    return {s: {k: tmp_path / s / f"seed{k}" for k in (1, 2)} for s in ("vanilla", "actfirst", "no_id")}


def test_a_run_from_its_last_evaluation_metrics_and_wall_clock(runs):
    row = run_row("actfirst", 1, runs["actfirst"][1])
    assert (row["method"], row["seed"], row["run_dir"]) == ("ActFirst-OPD", 1, str(runs["actfirst"][1]))
    assert row["finished"] and row["eval_update"] == 4 and row["episodes"] == 30 and row["updates"] == 4
    assert row["SR"]["mean"] == pytest.approx(60.0) and row["SR"]["sd"] == pytest.approx(10.0)  # over eval seeds
    assert row["SR_ci95_pooled"] == pytest.approx([100 * x for x in wilson_interval(18, 30)])
    assert row["Round"]["mean"] == pytest.approx(5.0) and row["Score"] is None and row["splits"] == {}  # ALFWorld
    assert (row["train_s"], row["transitions"], row["transitions_per_s"]) == (120.0, 600, 5.0)
    assert [(p["update"], p["elapsed_s"], p["SR"]) for p in row["curve"]] == [(0, 0.0, 10.0), (2, 60.0, 50.0),
                                                                              (4, 120.0, pytest.approx(60.0))]
    going = run_row("no_id", 2, runs["no_id"][2])
    assert not going["finished"] and going["train_s"] == 90.0 and going["updates"] == 2  # the latest figures


def test_methods_over_training_seeds_by_hand(runs):
    vanilla, actfirst, no_id = comparison_rows(runs)
    assert [m["method"] for m in (vanilla, actfirst, no_id)] == ["Vanilla OPD", "ActFirst-OPD", "w/o ID"]
    # SR: each run's final evaluation (the mean over evaluation seeds), then mean ± SD over the training seeds.
    assert (vanilla["SR"]["mean"], vanilla["SR"]["sd"]) == pytest.approx((45.0, math.sqrt(50)))
    assert (actfirst["SR"]["mean"], actfirst["SR"]["sd"]) == pytest.approx((65.0, math.sqrt(50)))
    assert (actfirst["Round"]["mean"], actfirst["Round"]["sd"]) == pytest.approx((5.0, 0.0))
    assert (vanilla["train_s"]["mean"], vanilla["train_s"]["sd"]) == pytest.approx((320.0, math.sqrt(800)))
    assert (vanilla["transitions"]["mean"], vanilla["transitions"]["sd"]) == pytest.approx((700.0, math.sqrt(20000)))
    assert vanilla["transitions_per_s"]["mean"] == pytest.approx((600 / 300 + 800 / 340) / 2)
    assert actfirst["transitions_per_s"]["mean"] == pytest.approx(5.0) and actfirst["seeds"] == [1, 2]
    assert actfirst["phases_s"]["update_s"]["mean"] == 12.0 and actfirst["phases_s"]["sync_s"]["mean"] == 2.0
    # Same updates: the paired log ratios log(300 / 120), log(340 / 140); with n = 2, t_{0.975, 1} = tan(0.475 pi).
    logs = np.log([300 / 120, 340 / 140])
    half = math.tan(0.475 * math.pi) * logs.std(ddof=1) / math.sqrt(2)
    assert actfirst["speedup"] == pytest.approx(math.exp(logs.mean()), rel=1e-12)
    assert actfirst["speedup_ci95"] == pytest.approx(np.exp([logs.mean() - half, logs.mean() + half]), rel=1e-9)
    # The bootstrap cross-check (ratio of mean times): each extreme ratio has probability 1/16 > 2.5%.
    assert actfirst["speedup_bootstrap_ci95"] == pytest.approx([300 / 140, 340 / 120])
    assert vanilla["speedup"] == 1.0 and vanilla["speedup_ci95"] is None
    # w/o ID: its finished seed alone pairs with vanilla's seed 1; one pair has a ratio and no interval.
    assert (no_id["seeds"], no_id["unfinished"]) == ([1], [2])
    assert no_id["SR"]["mean"] == pytest.approx(40.0) and math.isnan(no_id["SR"]["sd"])
    assert no_id["speedup"] == pytest.approx(300 / 200) and no_id["speedup_ci95"] is None
    assert no_id["speedup_seeds"] == [1]


def test_same_sr_from_the_fixed_threshold(runs):
    """Threshold 40%: vanilla reaches it at update 4 (300 s, seed 1) and 2 (170 s, seed 2), actfirst at update 2 in
    both (60 s, 70 s), w/o ID at update 4 (200 s). Threshold 55%: vanilla never does (its best is 50%)."""
    vanilla, actfirst, no_id = comparison_rows(runs, threshold=40.0)
    assert [r["to_threshold"] for r in vanilla["runs"]] == [{"update": 4, "elapsed_s": 300.0},
                                                           {"update": 2, "elapsed_s": 170.0}]
    assert actfirst["time_to_threshold_s"]["mean"] == pytest.approx(65.0) and actfirst["reached"] == [1, 2]
    logs = np.log([300 / 60, 170 / 70])
    half = math.tan(0.475 * math.pi) * logs.std(ddof=1) / math.sqrt(2)
    assert actfirst["speedup_at_threshold"] == pytest.approx(math.exp(logs.mean()), rel=1e-12)
    assert actfirst["speedup_at_threshold_ci95"] == pytest.approx(np.exp([logs.mean() - half, logs.mean() + half]))
    assert no_id["speedup_at_threshold"] == pytest.approx(1.5) and no_id["speedup_at_threshold_ci95"] is None
    vanilla, actfirst, _ = comparison_rows(runs, threshold=55.0)
    assert (vanilla["reached"], vanilla["not_reached"]) == ([], [1, 2])
    assert actfirst["reached"] == [1, 2] and actfirst["speedup_at_threshold"] is None  # no seed where both reach
    table = comparison_table(comparison_rows(runs, threshold=55.0), 55.0)
    assert "| 0 of 2 (not: 1, 2) |" in table and "| 2 of 2 |" in table


def test_same_sr_restricted_over_every_seed(runs):
    """The restricted times keep every seed: the horizon is the shortest last checkpoint of a finished run (actfirst
    seed 1's 120 s; w/o ID's unfinished seed 2, evaluated only at 0 s, is not counted), and each run's time to the
    threshold is min(T, 120 s). Threshold 40%: vanilla 300 -> 120 and 170 -> 120, actfirst 60 and 70, w/o ID 200 ->
    120. Threshold 55%, which vanilla never reaches, still gives a figure over both seeds: actfirst reaches it at
    120 s and 140 s, both 120 after the restriction, a ratio of 1 where the seeds-reached figure has none."""
    vanilla, actfirst, no_id = comparison_rows(runs, threshold=40.0)
    assert vanilla["restricted_horizon_s"] == actfirst["restricted_horizon_s"] == 120.0
    assert (vanilla["restricted_time_s"]["mean"], vanilla["restricted_time_s"]["sd"]) == (120.0, 0.0)
    assert actfirst["restricted_time_s"]["mean"] == pytest.approx(65.0)
    logs = np.log([120 / 60, 120 / 70])
    half = math.tan(0.475 * math.pi) * logs.std(ddof=1) / math.sqrt(2)
    assert actfirst["speedup_restricted"] == pytest.approx(math.exp(logs.mean()), rel=1e-12)
    assert actfirst["speedup_restricted_ci95"] == pytest.approx(np.exp([logs.mean() - half, logs.mean() + half]))
    assert actfirst["speedup_restricted_seeds"] == [1, 2] and vanilla["speedup_restricted"] == 1.0
    assert no_id["speedup_restricted"] == pytest.approx(1.0) and no_id["speedup_restricted_seeds"] == [1]
    vanilla, actfirst, _ = comparison_rows(runs, threshold=55.0)
    assert actfirst["speedup_at_threshold"] is None and actfirst["speedup_restricted"] == pytest.approx(1.0)
    assert actfirst["speedup_restricted_seeds"] == [1, 2]
    table = comparison_table(comparison_rows(runs, threshold=40.0), 40.0)
    assert "Restricted mean time to it, tau 120 s (every seed)" in table
    assert f"| {math.exp(logs.mean()):.2f}x [" in table
    assert all(m["restricted_horizon_s"] is None and m["speedup_restricted"] is None
               for m in comparison_rows(runs))  # no threshold, no restricted figure
    assert comparison_table(comparison_rows(runs)).count("Restricted") == 0


def test_the_warm_start_opens_every_curve(tmp_path):
    """Checkpoints are evaluated from the first one on; update 0 is the warm start's evaluation, at 0 s."""
    write_run(tmp_path, wall=100.0, transitions=40, evals=[(2, 50.0, [3, 3]), (4, 100.0, [5, 5])])
    row = run_row("actfirst", 1, tmp_path, warm_start=eval_record(0, 0.0, [2, 2]), threshold=25.0)
    assert [(p["update"], p["elapsed_s"], p["SR"]) for p in row["curve"]] == [
        (0, 0.0, pytest.approx(20.0)), (2, 50.0, pytest.approx(30.0)), (4, 100.0, pytest.approx(50.0))]
    assert row["to_threshold"] == {"update": 2, "elapsed_s": 50.0}
    assert row["phases_s"]["checkpoint_eval_s"] == 6.0  # two evaluations of 3 s each, after training


def test_time_to_threshold_from_curves():
    curve = [{"update": 0, "elapsed_s": 0.0, "SR": 40.0}, {"update": 2, "elapsed_s": 50.0, "SR": 55.0},
             {"update": 4, "elapsed_s": 90.0, "SR": 48.0}, {"update": 6, "elapsed_s": 130.0, "SR": 61.0}]
    assert time_to_threshold(curve, 50.0) == {"update": 2, "elapsed_s": 50.0}  # the first, not the best
    assert time_to_threshold(curve, 55.0) == {"update": 2, "elapsed_s": 50.0}  # at or above
    assert time_to_threshold(curve, 60.0) == {"update": 6, "elapsed_s": 130.0}  # no interpolation
    assert time_to_threshold(curve, 62.0) is None


def test_threshold_fixed_from_warm_start_and_teacher():
    assert fixed_threshold("auto", 46.875, 75.0) == pytest.approx(46.875 + (75.0 - 46.875) / 2)
    assert fixed_threshold(55.0, 46.875, 75.0) == 55.0
    with pytest.raises(ConfigError, match="not above the warm start's SR 46.9%"):
        fixed_threshold(40.0, 46.875, 75.0)
    with pytest.raises(ConfigError, match="compare.threshold='auto'"):
        fixed_threshold("auto", 30.0, 20.0)  # a teacher below the warm start
    with pytest.raises(ConfigError, match="give a number instead"):
        fixed_threshold("auto", None, 75.0)


def test_paired_t_interval_by_hand():
    # The three seeds (Vanilla OPD 534 / 393 / 573 s, ActFirst-OPD 274 / 399 / 329 s): t_{0.975, 2} is
    # (2p - 1) / sqrt(2p(1 - p)) at p = 0.975; the interval includes 1.
    base, method = {0: 534.0, 1: 393.0, 2: 573.0}, {0: 274.0, 1: 399.0, 2: 329.0}
    logs = np.log(np.array([534.0, 393.0, 573.0], dtype=np.float64) / np.array([274.0, 399.0, 329.0]))
    half = 0.95 / math.sqrt(2 * 0.975 * 0.025) * logs.std(ddof=1) / math.sqrt(3)
    result = paired_ratio(base, method)
    assert result["ratio"] == pytest.approx(math.exp(logs.mean()), rel=1e-12)
    assert result["ci95"] == pytest.approx(np.exp([logs.mean() - half, logs.mean() + half]), rel=1e-9)
    assert result["ci95"][0] < 1 < result["ci95"][1] and result["ci95"] == pytest.approx([0.60, 3.71], abs=0.005)
    steady = paired_ratio({0: 200.0, 1: 210.0, 2: 190.0}, {0: 100.0, 1: 100.0, 2: 100.0})
    assert 1 < steady["ci95"][0] < 2 < steady["ci95"][1]  # excludes 1
    assert paired_ratio({0: 200.0, 1: 210.0}, {1: 100.0, 2: 100.0})["seeds"] == [1]  # only the seeds both have
    assert paired_ratio({0: 200.0}, {1: 100.0})["ratio"] is None


def test_t_quantile():
    assert t_quantile(0.975, 1) == pytest.approx(math.tan(0.475 * math.pi), rel=1e-10)
    assert t_quantile(0.975, 2) == pytest.approx(0.95 / math.sqrt(2 * 0.975 * 0.025), rel=1e-10)
    # Tables (Fisher and Yates): 2.571 (5), 2.228 (10), 2.042 (30)
    assert [round(t_quantile(0.975, df), 3) for df in (5, 10, 30)] == [2.571, 2.228, 2.042]
    with pytest.raises(ValueError):
        t_quantile(0.4, 3)


def test_abba_order():
    assert run_order(["vanilla", "actfirst"], [0, 1, 2, 3]) == [
        ("vanilla", 0), ("actfirst", 0), ("actfirst", 1), ("vanilla", 1),
        ("vanilla", 2), ("actfirst", 2), ("actfirst", 3), ("vanilla", 3)]
    assert run_order(["a", "b", "c"], [5, 7]) == [("a", 5), ("b", 5), ("c", 5), ("c", 7), ("b", 7), ("a", 7)]


def test_without_a_finished_baseline_there_is_no_speedup(runs):
    methods = comparison_rows({"vanilla": {2: runs["no_id"][2]}, "actfirst": runs["actfirst"]})
    assert methods[0]["train_s"] is None and methods[0]["SR"] is None and methods[0]["unfinished"] == [2]
    assert all(m["speedup"] is None and m["speedup_at_threshold"] is None for m in methods)
    assert comparison_rows({"actfirst": runs["actfirst"]})[0]["speedup"] is None


def test_table(runs):
    lines = comparison_table(comparison_rows(runs, threshold=40.0), 40.0).splitlines()
    assert lines[0] == ("| Method | Seeds | SR (%) | Round | Train (s) | Transitions | Transitions/s | Speedup vs "
                        "Vanilla OPD, same updates (paired t 95% CI) | Bootstrap 95% CI (cross-check) | "
                        "Transitions/s ratio / transitions ratio (Sec. 5.4) | Seeds reaching 40.0% | Time to it (s) | "
                        "Speedup at it (paired t 95% CI, seeds) | Restricted mean time to it, tau 120 s (every seed) | "
                        "Speedup at it, restricted (paired t 95% CI, every seed) | Rollout speedup measured / Eq. 36 "
                        "(each run's own records, paired t 95% CI) |")
    assert len(lines) == 5
    # Sec. 5.4: transitions/s 5.00 / 2.18 (vanilla: 2.0 and 2.35) and transitions 650 / 700
    assert lines[2] == ("| Vanilla OPD | 2 | 45.0 ± 7.1 | 5.0 ± 0.0 | 320 ± 28 | 700 ± 141 | 2.18 ± 0.25 | 1.00x |  | "
                        "1.00 / 1.00 | 2 of 2 | 235 ± 92 | 1.00x, 2 | 120 ± 0 | 1.00x, 2 | - / - |")
    assert lines[3].startswith("| ActFirst-OPD | 2 | 65.0 ± 7.1 | 5.0 ± 0.0 | 130 ± 14 | 650 ± 71 | 5.00 ± 0.00 | "
                               "2.46x [2.05, 2.96] | [2.14, 2.83] | 2.30 / 0.93 | 2 of 2 | 65 ± 7 | 3.48x [")
    assert lines[4] == ("| w/o ID | 1 (+1 unfinished) | 40.0 ± n/a | 5.0 ± n/a | 200 ± n/a | 500 ± n/a | "
                        "2.50 ± n/a | 1.50x |  | 1.15 / 0.71 | 1 of 1 | 200 ± n/a | 1.50x, 1 | 120 ± n/a | 1.00x, 1 | "
                        "- / - |")
    # the rollout speedups, paired over seeds 1 and 2 from each run's own records: measured 30/15 and 34/16 (the
    # geometric mean 2.06, t_1 = 12.706), Eq. 36 40/10 and 44/11 (4 both times: no spread)
    assert lines[3].endswith("| 2.06x [1.40, 3.03] / 4.00x [4.00, 4.00] |"), lines[3]
    actfirst = comparison_rows(runs)[1]
    assert actfirst["split_speedup"] == pytest.approx((5.0 / ((2.0 + 800 / 340) / 2)) / (650 / 700))


def test_alfworld_seen_and_unseen_apart(tmp_path):
    """Table 1 reports valid_seen and valid_unseen apart; the overall SR and Round pool them."""
    finals = {1: {"valid_seen": [6, 7, 8], "valid_unseen": [2, 3, 4]},
              2: {"valid_seen": [8, 8, 8], "valid_unseen": [4, 4, 4]}}
    for seed, successes in finals.items():
        write_run(tmp_path / f"seed{seed}", wall=100.0, transitions=400, evals=[(4, 100.0, successes)])
    run = run_row("actfirst", 1, tmp_path / "seed1")
    assert run["splits"]["valid_seen"]["SR"]["mean"] == pytest.approx(70.0)
    assert run["splits"]["valid_unseen"]["Round"]["mean"] == pytest.approx(7.0)  # 2 more turns in the second split
    (method,) = comparison_rows({"actfirst": {k: tmp_path / f"seed{k}" for k in finals}})
    assert (method["SR"]["mean"], method["Round"]["mean"]) == pytest.approx((55.0, 6.0))  # pooled: 50 and 60
    seen, unseen = method["splits"]["valid_seen"], method["splits"]["valid_unseen"]
    assert (seen["SR"]["mean"], seen["SR"]["sd"], seen["Round"]["mean"]) == pytest.approx((75.0, math.sqrt(50), 5.0))
    assert (unseen["SR"]["mean"], unseen["Round"]["mean"]) == pytest.approx((35.0, 7.0))
    lines = comparison_table([method]).splitlines()
    assert lines[0] == ("| Method | Seeds | SR (%) | SR valid_seen | SR valid_unseen | Round | Round valid_seen | "
                        "Round valid_unseen | Train (s) | Transitions | Transitions/s |")
    assert lines[2].startswith("| ActFirst-OPD | 2 | 55.0 ± 7.1 | 75.0 ± 7.1 | 35.0 ± 7.1 | 6.0 ± 0.0 | 5.0 ± 0.0 | "
                               "7.0 ± 0.0 | 100 ± 0 |")


def test_scienceworld_has_a_score(tmp_path):
    write_run(tmp_path / "seed1", wall=100.0, transitions=250, evals=[(2, 50.0, [5])], benchmark="scienceworld")
    write_run(tmp_path / "seed2", wall=80.0, transitions=200, evals=[(2, 40.0, [7])], benchmark="scienceworld")
    (method,) = comparison_rows({"actfirst": {1: tmp_path / "seed1", 2: tmp_path / "seed2"}})
    # Score: 5 x 100 + 5 x 20 over 10 = 60, and 7 x 100 + 3 x 20 = 76.
    assert (method["Score"]["mean"], method["Score"]["sd"]) == pytest.approx((68.0, math.sqrt(128)))
    table = comparison_table([method])
    assert "| SR (%) | Score | Round |" in table and "Speedup" not in table
    assert "| ActFirst-OPD | 2 | 60.0 ± 14.1 | 68.0 ± 11.3 | 4.0 ± 0.0 | 90 ± 14 |" in table
    assert math.isnan(run_row("actfirst", 1, tmp_path / "seed1")["SR"]["sd"])  # one evaluation seed: the trainer's NaN


def test_speedup_interval():
    assert speedup_interval([300.0], [100.0, 120.0]) is None and speedup_interval([300.0, 310.0], [100.0]) is None
    times = ([300.0, 320.0, 350.0], [100.0, 140.0, 120.0])
    interval = speedup_interval(*times)
    assert interval == speedup_interval(*times)  # a fixed RNG seed: the same table every time
    assert 300 / 140 <= interval[0] < 970 / 360 < interval[1] <= 350 / 100
    assert speedup_interval(*times, seed=1) != interval and BOOTSTRAP_RESAMPLES == 10_000
    assert speedup_interval([5.0, 5.0], [2.0, 2.0]) == pytest.approx([2.5, 2.5])


def test_curves_and_error_bars(runs):
    one = run_row("actfirst", 1, runs["actfirst"][1])
    two = run_row("actfirst", 2, runs["actfirst"][2])
    curve = mean_curve([one, two])
    assert [p["update"] for p in curve] == [0, 2, 4]
    assert [p["elapsed_s"] for p in curve] == pytest.approx([0, 65, 130])
    assert [p["SR"] for p in curve] == pytest.approx([10, 45, 65])
    assert [p["SR_sd"] for p in curve] == pytest.approx([0.0, math.sqrt(50), math.sqrt(50)])
    below, above = sr_error_bars(curve)
    assert below == above == pytest.approx([0.0, math.sqrt(50), math.sqrt(50)])  # the SD over seeds
    single = mean_curve([one])
    assert math.isnan(single[2]["SR_sd"]) and single[2]["SR_ci95_pooled"] == one["SR_ci95_pooled"]
    lo, hi = one["SR_ci95_pooled"]
    below, above = sr_error_bars(single)
    assert (below[2], above[2]) == pytest.approx((60.0 - lo, hi - 60.0))  # one seed: the pooled 95% interval
    assert [p["update"] for p in mean_curve([one, run_row("no_id", 1, runs["no_id"][1])])] == [0, 4]  # both have


def test_files(runs, tmp_path):
    out = tmp_path / "cmp"
    fixed = {"setting": "auto", "threshold": 40.0, "how": "by hand", "warm_start": eval_record(0, 0.0, [1, 1, 1])}
    text = write_comparison(runs, out, teacher=eval_report([7, 8]).summary(), fixed=fixed)
    assert (out / "comparison.md").read_text() == text + "\n"
    assert "Teacher: SR 75.0 ± 7.1 %" in text and "10,000 resamples" in text
    assert "threshold 40.0% ('auto', fixed before training: by hand)" in text
    runs_lines = text.split("Runs (SR: mean ± SD over the evaluation seeds):\n\n")[1].splitlines()
    assert len(runs_lines) == 2 + 6
    assert runs_lines[-1].startswith("| w/o ID | 2 | no | 0 | 10.0 ± 0.0 |") and \
        "| 90 | 2 / 4 / 6 / 1 | 3 | n/a / n/a / n/a | 250 | 2.78 | not reached |" in runs_lines[-1]  # 2 updates
    assert "| 4 / 8 / 12 / 2 |" in runs_lines[2]  # rollout / score / update / sync seconds over the run's 4 updates
    saved = json.loads((out / "comparison.json").read_text())
    assert [m["strategy"] for m in saved["methods"]] == ["vanilla", "actfirst", "no_id"]
    actfirst = saved["methods"][1]
    assert actfirst["speedup"] == pytest.approx(math.sqrt(300 / 120 * 340 / 140))
    assert actfirst["speedup_bootstrap_ci95"] == pytest.approx([300 / 140, 340 / 120])
    assert [(r["seed"], r["run_dir"]) for r in actfirst["runs"]] == [(k, str(runs["actfirst"][k])) for k in (1, 2)]
    assert actfirst["runs"][0]["curve"][0]["SR"] == pytest.approx(10.0)  # the warm start's row opens each curve
    assert saved["methods"][2]["SR"]["sd"] is None and saved["teacher"]["successes"] == 15  # JSON has no NaN
    assert saved["bootstrap"] == {"resamples": BOOTSTRAP_RESAMPLES, "seed": 0}
    assert saved["fixed_before_training"]["threshold"] == 40.0
    png = out / "comparison.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    with Image.open(png) as image:
        assert image.size == (round(COMPARISON_SIZE[0] * DPI), round(COMPARISON_SIZE[1] * DPI))
    with Image.open(out / "curves.png") as image:  # one panel per seed (1 and 2), side by side
        assert image.size == (round(2 * PANEL_SIZE[0] * DPI), round(PANEL_SIZE[1] * DPI))


def test_plot_without_evaluations(tmp_path):
    write_run(tmp_path / "vanilla", wall=10.0, transitions=40, evals=[])
    methods = comparison_rows({"vanilla": {0: tmp_path / "vanilla"}, "actfirst": {0: tmp_path / "missing"}})
    assert plot_comparison(methods, tmp_path / "c.png").read_bytes()[:8] == PNG_MAGIC


def test_every_strategy_has_its_paper_name():
    assert set(METHODS) == set(STRATEGIES)


def test_unknown_strategy_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--strategies", "vanilla", "nope"])
    assert exc.value.code != 0
    assert "nope" in capsys.readouterr().err


@pytest.mark.parametrize("argv, why", [(["--strategies", "vanilla", "vanilla"], "once"),
                                       (["--seeds", "1", "1"], "each training seed once"),
                                       (["--seeds", "one"], "as an integer"),
                                       (["out_dir=x"], "set by the comparison"),
                                       (["seed=3"], "use --strategies, --seeds and --out"),
                                       (["rollout.strategy=vanilla"], "set by the comparison"),
                                       (["checkpoint_every=5"], "use compare.checkpoint_every")])
def test_other_refusals(capsys, argv, why):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert why in capsys.readouterr().err


def test_overrides_after_the_strategies_and_seeds():
    args = parse_args(["--config", "c.yaml", "lr=1", "--strategies", "actfirst", "vanilla", "num_updates=3",
                       "--seeds", "2", "0", "teacher=t"])
    assert args.strategies == ["actfirst", "vanilla"] and args.seeds == [2, 0]
    assert args.overrides == ["lr=1", "num_updates=3", "teacher=t"]
    assert parse_args([]).strategies == ["vanilla", "actfirst"] and parse_args([]).seeds is None


@dataclasses.dataclass
class SavedConfig:
    """What ``run_state`` compares: a config whose ``config.json`` :func:`save_config` writes as the trainer does."""

    out_dir: str
    teacher: str = "T"
    num_updates: int = 4
    evaluation: dict | None = None
    compare: dict | None = None


def save_config(cfg: SavedConfig) -> None:
    (Path(cfg.out_dir) / "config.json").write_text(config_json(cfg))


def test_resume_states(tmp_path):
    """A run with all its updates is finished, one with fewer (or no wall-clock yet) started, a missing one new."""
    finished, short, missing = (SavedConfig(str(tmp_path / name)) for name in ("finished", "short", "missing"))
    write_run(Path(finished.out_dir), wall=100.0, transitions=40, evals=[])
    write_run(Path(short.out_dir), wall=40.0, transitions=20, evals=[], updates=2)
    for cfg in (finished, short):
        save_config(cfg)
    assert [run_state(c) for c in (finished, short, missing)] == [FINISHED, STARTED, NEW]


def test_a_finished_comparison_is_extended_by_more_updates_and_checkpoints(tmp_path):
    """``--resume num_updates=20 compare.checkpoint_every=5`` on a comparison trained for 10 updates, checkpointed
    every 10: each finished run is started again from its last checkpoint (a run ignores the compare section)."""
    run = SavedConfig(str(tmp_path / "run"), num_updates=10, compare={"threshold": "auto", "checkpoint_every": 10})
    write_run(Path(run.out_dir), wall=100.0, transitions=40, evals=[], updates=10)
    save_config(run)
    more = SavedConfig(run.out_dir, num_updates=20, compare={"threshold": "auto", "checkpoint_every": 5})
    assert (run_state(run), run_state(more)) == (FINISHED, STARTED)


def test_resume_refuses_a_run_of_another_config(tmp_path):
    """A finished run saved under another teacher or evaluation, or a started one under another teacher, is refused
    by field and values; a started run may change its evaluation, as a resume may."""
    finished, started = SavedConfig(str(tmp_path / "finished")), SavedConfig(str(tmp_path / "started"))
    write_run(Path(finished.out_dir), wall=100.0, transitions=40, evals=[])
    write_run(Path(started.out_dir), wall=40.0, transitions=20, evals=[], finished=False)
    save_config(SavedConfig(finished.out_dir, teacher="another teacher"))
    with pytest.raises(ConfigError, match="teacher: 'another teacher' -> 'T'"):
        run_state(finished)
    save_config(SavedConfig(started.out_dir, evaluation={"seeds": [7]}))
    assert run_state(started) == STARTED
    save_config(SavedConfig(finished.out_dir, evaluation={"seeds": [7]}))
    with pytest.raises(ConfigError, match="evaluation: "):
        run_state(finished)  # its table row would hold another evaluation's SR
    (Path(finished.out_dir) / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not a config"):
        run_state(finished)


def test_the_compare_section_is_checked():
    from actfirst.preparation.build import load_run_config

    assert load_run_config(None, ["compare.threshold=55", "compare.checkpoint_every=3"]).compare.threshold == 55.0
    for item, why in (("compare.threshold=150", "compare.threshold=150"), ("compare.threshold=aut", "auto"),
                      ("compare.checkpoint_every=0", "compare.checkpoint_every=0")):
        with pytest.raises(ConfigError, match=why):
            load_run_config(None, [item])

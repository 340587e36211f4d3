"""The method comparison from hand-written run directories (aggregates over training seeds, speedups and their
bootstrap interval, time to the common SR, ALFWorld's splits, Score, table, JSON, PNG) against hand computations,
its command line, and ``main`` (which runs it trains, skips or resumes) with config loading, preparation and training
replaced by stand-ins (no real training)."""

import dataclasses
import json
import math
import sys
import types
from pathlib import Path

import pytest
from PIL import Image

from actfirst.compare import main, parse_args
from actfirst.comparison import (
    BOOTSTRAP_RESAMPLES,
    COMPARISON_SIZE,
    METHODS,
    comparison_rows,
    comparison_table,
    mean_curve,
    plot_comparison,
    run_row,
    speedup_interval,
    sr_error_bars,
    time_to_common_sr,
    write_comparison,
)
from actfirst.eval_report import EpisodeRecord, EvalReport, wilson_interval
from actfirst.rollout.strategies import STRATEGIES
from actfirst.schema import config_json
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
    """An ``evals.jsonl`` row as ``Trainer._record_evaluation`` writes it (``test_the_trainer_records_splits``)."""
    report = eval_report(successes, benchmark)
    return {"update": update, "elapsed_s": elapsed_s, "eval_wall_s": 3.0, "report": f"evals/update_{update:06d}.json",
            "summary": report.summary(), "splits": {s: report.summary(split=s) for s in report.splits}}


def write_run(run_dir: Path, *, wall: float, transitions: int, evals: list[tuple], benchmark: str = "alfworld",
              updates: int = 4, final_s: float | None = None, finished: bool = True,
              rollout: tuple[float, float, float] | None = None) -> None:
    """A run directory: ``updates`` metrics records ending at ``wall`` s and ``transitions`` transitions, the
    evaluations ``(update, elapsed_s, successes)`` (see :func:`eval_report`), and (``finished``) ``wall_clock.json``
    with ``updates`` updates and the final wall-clock ``final_s`` (default ``wall``); ``rollout``: the run's rollout
    speedup model figures (measured, Eq. 36, Eq. 26) in its metrics."""
    run_dir.mkdir(parents=True, exist_ok=True)  # the stand-in trainer rewrites a resumed run
    if finished:
        (run_dir / WALL_CLOCK).write_text(json.dumps({"train_s": wall if final_s is None else final_s,
                                                      "eval_s": 6.0, "probe_s": 1.0, "updates": updates}))
    metrics = [{"update": u, "elapsed_s": wall * u / updates, "total_transitions": transitions * u // updates,
                "transitions": transitions // updates,
                **({} if rollout is None else dict(zip(("speedup/run_measured", "speedup/run_eq36",
                                                        "speedup/run_eq26"), rollout)))}
               for u in range(1, updates + 1)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    rows = [eval_record(u, t, s, benchmark) for u, t, s in evals]
    (run_dir / "evals.jsonl").write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))  # NaN as the trainer


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
    rollout = {("actfirst", 1): (1.5, 2.0, 3.0), ("actfirst", 2): (1.7, 2.2, 3.2)}
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
    # Speedup: mean vanilla train_s / mean method train_s. With two seeds a side, a resample's mean is a seed's value
    # with probability 1/2, so each extreme ratio has probability 1/16 > 2.5%: the interval is the extreme ratios.
    assert actfirst["speedup"] == pytest.approx(320 / 130)
    assert actfirst["speedup_ci95"] == pytest.approx([300 / 140, 340 / 120])
    assert vanilla["speedup"] == 1.0 and vanilla["speedup_ci95"] is None
    # w/o ID: its finished seed alone; one seed has no SD and no interval.
    assert (no_id["seeds"], no_id["unfinished"]) == ([1], [2])
    assert no_id["SR"]["mean"] == pytest.approx(40.0) and math.isnan(no_id["SR"]["sd"])
    assert no_id["speedup"] == pytest.approx(320 / 200) and no_id["speedup_ci95"] is None
    # Time to the common SR. Mean curves: vanilla 10 / 40 / 45 at 0 / 160 / 320 s, actfirst 10 / 45 / 65 at
    # 0 / 65 / 130 s, no_id 10 / 40 at 0 / 200 s.
    assert (actfirst["common_SR"], actfirst["time_to_common_s"], actfirst["baseline_time_to_common_s"]) == \
        pytest.approx((45.0, 65.0, 320.0))
    assert actfirst["speedup_at_common_SR"] == pytest.approx(320 / 65)
    assert (no_id["common_SR"], no_id["time_to_common_s"], no_id["baseline_time_to_common_s"]) == \
        pytest.approx((40.0, 200.0, 160.0))
    assert no_id["speedup_at_common_SR"] == pytest.approx(0.8)  # faster per update, slower to the same SR
    assert vanilla["common_SR"] == pytest.approx(45.0) and vanilla["speedup_at_common_SR"] == 1.0
    # Its interval: a side's resampled mean curve is seed 1's (p 1/4), seed 2's (1/4) or the mean (1/2). The nine
    # pairs' ratios run from 170 / 140 (vanilla seed 2: common SR 50 at 170 s; actfirst seed 2 reaches 50 at 140 s;
    # p 1/16) to 320 / 60 (vanilla's mean: 45 at 320 s; actfirst seed 1: 50 at 60 s; p 1/8), both > 2.5%.
    assert actfirst["speedup_at_common_SR_ci95"] == pytest.approx([170 / 140, 320 / 60])
    assert vanilla["speedup_at_common_SR_ci95"] is None and no_id["speedup_at_common_SR_ci95"] is None  # one seed


def test_no_speedup_at_the_common_sr_when_it_held_before_training(tmp_path):
    """Both methods lose SR in training (the generation-bound demo's runs): the SR both reach is the warm start's, at
    update 0, where the times are the initialization's. No ratio, and no interval."""
    runs: dict[str, dict[int, Path]] = {}
    for strategy, first, later in (("vanilla", 24.0, [3, 3]), ("actfirst", 21.0, [4, 3])):
        for seed in (0, 1):
            path = tmp_path / strategy / f"seed{seed}"
            write_run(path, wall=200.0, transitions=500, evals=[(0, first, [5, 5, 5]), (4, 100.0, [later[seed]] * 3)])
            runs.setdefault(strategy, {})[seed] = path
    vanilla, actfirst = comparison_rows(runs)
    assert (actfirst["common_SR"], actfirst["time_to_common_s"], actfirst["baseline_time_to_common_s"]) == \
        pytest.approx((50.0, 21.0, 24.0))
    assert actfirst["speedup_at_common_SR"] is None and actfirst["speedup_at_common_SR_ci95"] is None
    assert actfirst["speedup"] == pytest.approx(1.0)  # the same updates: still measured
    assert "| 50.0 | 21 / 24 | n/a |" in comparison_table([vanilla, actfirst])


def test_without_a_finished_baseline_there_is_no_speedup(runs):
    methods = comparison_rows({"vanilla": {2: runs["no_id"][2]}, "actfirst": runs["actfirst"]})
    assert methods[0]["train_s"] is None and methods[0]["SR"] is None and methods[0]["unfinished"] == [2]
    assert all(m["speedup"] is None and m["speedup_at_common_SR"] is None for m in methods)
    assert comparison_rows({"actfirst": runs["actfirst"]})[0]["speedup"] is None


def test_table(runs):
    lines = comparison_table(comparison_rows(runs)).splitlines()
    assert lines[0] == ("| Method | Seeds | SR (%) | Round | Train (s) | Transitions | Transitions/s | Speedup vs "
                        "Vanilla OPD (95% CI) | Common SR (%) | Time to it (s): method / Vanilla OPD | Speedup at "
                        "common SR (95% CI) | Transitions/s ratio / transitions ratio (Sec. 5.4) | Rollout speedup "
                        "measured / Eq. 36 (run's requests) |")
    assert len(lines) == 5
    # Sec. 5.4: transitions/s 5.00 / 2.18 (vanilla: 2.0 and 2.35) and transitions 650 / 700
    assert lines[2] == ("| Vanilla OPD | 2 | 45.0 ± 7.1 | 5.0 ± 0.0 | 320 ± 28 | 700 ± 141 | 2.18 ± 0.25 | 1.00x | "
                        "45.0 | 320 / 320 | 1.00x | 1.00 / 1.00 | n/a / n/a |")
    assert lines[3] == ("| ActFirst-OPD | 2 | 65.0 ± 7.1 | 5.0 ± 0.0 | 130 ± 14 | 650 ± 71 | 5.00 ± 0.00 | "
                        "2.46x [2.14, 2.83] | 45.0 | 65 / 320 | 4.92x [1.21, 5.33] | 2.30 / 0.93 | 1.60 ± 0.14 / 2.10 ± 0.14 |")
    assert lines[4] == ("| w/o ID | 1 (+1 unfinished) | 40.0 ± n/a | 5.0 ± n/a | 200 ± n/a | 500 ± n/a | "
                        "2.50 ± n/a | 1.60x | 40.0 | 200 / 160 | 0.80x | 1.15 / 0.71 | n/a / n/a |")
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
    assert time_to_common_sr([], curve)["common_SR"] is None


def test_files(runs, tmp_path):
    out = tmp_path / "cmp"
    text = write_comparison(runs, out, teacher=eval_report([7, 8]).summary())
    assert (out / "comparison.md").read_text() == text + "\n"
    assert "Teacher: SR 75.0 ± 7.1 %" in text and "10,000 resamples" in text
    runs_lines = text.split("Runs (SR: mean ± SD over the evaluation seeds):\n\n")[1].splitlines()
    assert len(runs_lines) == 2 + 6
    assert runs_lines[-1].startswith("| w/o ID | 2 | no | 0 | 10.0 ± 0.0 |") and "| 90 | 250 | 2.78 |" in runs_lines[-1]
    saved = json.loads((out / "comparison.json").read_text())
    assert [m["strategy"] for m in saved["methods"]] == ["vanilla", "actfirst", "no_id"]
    actfirst = saved["methods"][1]
    assert actfirst["speedup"] == pytest.approx(320 / 130) and actfirst["speedup_ci95"] == pytest.approx(
        [300 / 140, 340 / 120])
    assert [(r["seed"], r["run_dir"]) for r in actfirst["runs"]] == [(k, str(runs["actfirst"][k])) for k in (1, 2)]
    assert saved["methods"][2]["SR"]["sd"] is None and saved["teacher"]["successes"] == 15  # JSON has no NaN
    assert saved["bootstrap"] == {"resamples": BOOTSTRAP_RESAMPLES, "seed": 0}
    png = out / "comparison.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    with Image.open(png) as image:
        assert image.size == (round(COMPARISON_SIZE[0] * DPI), round(COMPARISON_SIZE[1] * DPI))


def test_plot_without_evaluations(tmp_path):
    write_run(tmp_path / "vanilla", wall=10.0, transitions=40, evals=[])
    methods = comparison_rows({"vanilla": {0: tmp_path / "vanilla"}, "actfirst": {0: tmp_path / "missing"}})
    assert plot_comparison(methods, tmp_path / "c.png").read_bytes()[:8] == PNG_MAGIC


def test_the_trainer_records_splits(tmp_path):
    """``Trainer._record_evaluation`` (run on a stand-in for the trainer) stores the per-split summaries that the
    comparison reads."""
    from actfirst.train.trainer import Trainer

    from actfirst.train.metrics import MetricsSink

    stand_in_trainer = types.SimpleNamespace(
        engine=types.SimpleNamespace(weight_version=3), ctx=types.SimpleNamespace(world_size=1), out_dir=tmp_path,
        cfg=types.SimpleNamespace(evaluation=types.SimpleNamespace(split="eval"), keep_best=False,
                                  keep_checkpoints=1),
        eval_kept=0.0, teacher_sr=None, sink=MetricsSink(tmp_path))
    stand_in_trainer._draw_curve = lambda update: Trainer._draw_curve(stand_in_trainer, update)
    report = eval_report({"valid_seen": [6, 7], "valid_unseen": [2, 3]})
    Trainer._record_evaluation(stand_in_trainer, 5, report, 9.0, 42.0)
    (record,) = [json.loads(line) for line in (tmp_path / "evals.jsonl").read_text().splitlines()]
    assert record == {**eval_record(5, 42.0, {"valid_seen": [6, 7], "valid_unseen": [2, 3]}), "eval_wall_s": 9.0}
    row = run_row("actfirst", 0, tmp_path)
    assert row["splits"]["valid_seen"]["SR"]["mean"] == pytest.approx(65.0) and row["SR"]["mean"] == 45.0


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
                                       (["rollout.strategy=vanilla"], "set by the comparison")])
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
class StandInConfig:
    """What ``main`` reads of a run's config; :func:`save_config` writes its ``config.json`` as the trainer does."""

    out_dir: str | None
    strategy: str | None
    seed: int
    teacher: str = "T"
    num_updates: int = 4


def save_config(cfg: StandInConfig) -> None:
    (Path(cfg.out_dir) / "config.json").write_text(config_json(cfg))


@pytest.fixture
def stand_ins(monkeypatch):
    """Stand-ins for the config loader (and the models' resolution: it names none), the preparation, the teacher's
    summary and the trainer (which writes a finished run of 4 updates and its config); the calls they got, in
    order."""
    calls = []

    def stand_in_load_run_config(config, overrides):
        calls.append(("load", config, overrides))
        values = dict(o.split("=", 1) for o in overrides)
        return StandInConfig(values.get("out_dir"), values.get("rollout.strategy"), int(values.get("seed", 7)))

    def stand_in_train(cfg, resume=False):
        calls.append(("train", cfg.strategy, cfg.seed, resume))
        wall = {"vanilla": 200.0, "actfirst": 80.0}[cfg.strategy] + 2 * cfg.seed
        write_run(Path(cfg.out_dir), wall=wall, transitions=400, evals=[(4, wall, [2, 3])], updates=cfg.num_updates)
        save_config(cfg)

    monkeypatch.setitem(sys.modules, "actfirst.preparation", types.SimpleNamespace(
        load_run_config=stand_in_load_run_config, resolve_models=lambda cfg: cfg,
        check_inputs=lambda cfg, buildable: calls.append(("check", cfg.strategy, cfg.seed)),
        ensure_prepared=lambda cfg: calls.append(("prepare", cfg.strategy, cfg.seed))))
    import actfirst.eval_report

    monkeypatch.setattr(actfirst.eval_report, "teacher_summary",
                        lambda teacher: eval_report([7, 7]).summary() if teacher == "T" else None)
    monkeypatch.setitem(sys.modules, "actfirst.train.trainer", types.SimpleNamespace(train=stand_in_train))
    return calls


def test_main_trains_every_strategy_and_seed_then_compares(tmp_path, capsys, stand_ins):
    out = tmp_path / "cmp"
    assert main(["--out", str(out), "--seeds", "1", "2", "num_updates=4"]) == 0
    loads = [c for c in stand_ins if c[0] == "load"]
    assert loads[0] == ("load", None, ["num_updates=4", "rollout.strategy=vanilla", "seed=1",
                                       f"out_dir={out / 'vanilla' / 'seed1'}"])
    assert [c[1:] for c in stand_ins if c[0] != "load"] == [
        ("vanilla", 1), ("actfirst", 1), ("vanilla", 2), ("actfirst", 2),  # every input checked before any work
        ("vanilla", 1), ("actfirst", 1), ("vanilla", 2), ("actfirst", 2),  # prepared (the first builds)
        ("vanilla", 1, False), ("actfirst", 1, False), ("vanilla", 2, False), ("actfirst", 2, False)]  # seed by seed
    printed = capsys.readouterr().out
    # train_s: vanilla 202, 204 s; actfirst 82, 84 s: 203 / 83 = 2.45, in [202 / 84, 204 / 82] = [2.40, 2.49]
    assert "| ActFirst-OPD | 2 | 25.0 ± 0.0 |" in printed and "| 2.45x [2.40, 2.49] | 25.0 | 83 / 203 |" in printed
    assert "Teacher: SR 70.0 ± 0.0 %" in printed and "Teacher: SR 70.0" in (out / "comparison.md").read_text()
    saved = json.loads((out / "comparison.json").read_text())
    assert saved["teacher"]["successes"] == 14 and saved["methods"][1]["speedup"] == pytest.approx(203 / 83)
    assert {p.name for p in out.iterdir()} == {"vanilla", "actfirst", "comparison.json", "comparison.md",
                                               "comparison.png"}
    # A second comparison into the same --out is refused before anything trains, unless it resumes.
    stand_ins.clear()
    assert main(["--out", str(out), "--seeds", "1"]) == 2
    assert [c[0] for c in stand_ins] == ["load", "load"]
    assert f"--out='{out}'" in capsys.readouterr().err


def test_resume_skips_finished_runs_and_continues_the_others(tmp_path, capsys, stand_ins):
    """vanilla seed 1 finished; vanilla seed 2 killed; actfirst seed 1 finished an earlier, shorter schedule (2 of
    the 4 updates: not finished); actfirst seed 2 never started."""
    out = tmp_path / "cmp"
    write_run(out / "vanilla" / "seed1", wall=202.0, transitions=400, evals=[(4, 202.0, [2, 3])])
    save_config(StandInConfig(str(out / "vanilla" / "seed1"), "vanilla", 1))
    write_run(out / "vanilla" / "seed2", wall=90.0, transitions=200, evals=[], updates=2, finished=False)
    write_run(out / "actfirst" / "seed1", wall=40.0, transitions=200, evals=[], updates=2)
    assert main(["--out", str(out), "--seeds", "1", "2"]) == 2  # refused without --resume
    assert "pass --resume" in capsys.readouterr().err
    stand_ins.clear()
    assert main(["--out", str(out), "--seeds", "1", "2", "--resume"]) == 0
    assert [c[1:] for c in stand_ins if c[0] == "train"] == [("actfirst", 1, True), ("vanilla", 2, True),
                                                             ("actfirst", 2, False)]
    assert ("check", "vanilla", 1) not in stand_ins and ("prepare", "vanilla", 1) not in stand_ins
    assert "seed 1: finished in" in capsys.readouterr().out
    saved = json.loads((out / "comparison.json").read_text())
    assert [m["seeds"] for m in saved["methods"]] == [[1, 2], [1, 2]]
    stand_ins.clear()  # everything finished: a resumed comparison only writes the table
    assert main(["--out", str(out), "--seeds", "1", "2", "--resume"]) == 0
    assert not [c for c in stand_ins if c[0] != "load"]


def test_resume_refuses_a_run_of_another_config(tmp_path, capsys, stand_ins):
    """Before anything trains: a finished run saved under another teacher or evaluation, or a started one under
    another teacher, is refused by field and values; a started run may change its evaluation, as a resume may."""
    out = tmp_path / "cmp"
    assert main(["--out", str(out), "--seeds", "1", "2", "--strategies", "vanilla"]) == 0
    finished, started = out / "vanilla" / "seed1", out / "vanilla" / "seed2"
    (started / WALL_CLOCK).unlink()
    save_config(StandInConfig(str(finished), "vanilla", 1, teacher="another teacher"))
    stand_ins.clear()
    resume = ["--out", str(out), "--seeds", "1", "2", "--strategies", "vanilla", "--resume"]
    assert main(resume) == 2
    err = capsys.readouterr().err
    assert f"--resume: {finished}: the config differs from the run's saved config: teacher: 'another teacher' -> 'T'" \
        in err and "pass another --out, or delete the run to train it again" in err
    assert not [c for c in stand_ins if c[0] in ("train", "prepare")]
    save_config(StandInConfig(str(finished), "vanilla", 1))
    config = json.loads((started / "config.json").read_text())
    (started / "config.json").write_text(json.dumps({**config, "evaluation": {"seeds": [7]}, "out_dir": "moved"}))
    assert main(resume) == 0  # the started run resumes under its new evaluation (and is where it is)
    assert [c[1:] for c in stand_ins if c[0] == "train"] == [("vanilla", 2, True)]
    own = json.loads((finished / "config.json").read_text())
    (finished / "config.json").write_text(json.dumps({**own, "evaluation": {"seeds": [7]}}))
    assert main(resume) == 2  # its table row would hold another evaluation's SR
    assert "differs from the run's saved config: evaluation: " in capsys.readouterr().err
    (finished / "config.json").write_text("[1, 2]")
    assert main(resume) == 2
    assert f"{finished / 'config.json'}: not a config (a list)" in capsys.readouterr().err
    (finished / "config.json").write_text("{not json")
    assert main(resume) == 2
    assert f"{finished / 'config.json'}: the run's config cannot be read" in capsys.readouterr().err


def test_the_default_seed_is_the_configs(tmp_path, stand_ins):
    out = tmp_path / "cmp"
    assert main(["--out", str(out), "--strategies", "actfirst"]) == 0
    assert stand_ins[0] == ("load", None, [])  # read for its seed (the stand-in config's is 7)
    assert [c for c in stand_ins if c[0] == "train"] == [("train", "actfirst", 7, False)]
    assert (out / "actfirst" / "seed7" / WALL_CLOCK).is_file()

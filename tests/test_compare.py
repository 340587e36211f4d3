"""The strategy comparison from hand-written run directories (rows, table, JSON, PNG), its command line, and the
orchestration of ``main`` with config loading, preparation and training replaced by stand-ins (no real training)."""

import json
import sys
import types
from pathlib import Path

import pytest
from PIL import Image

from actfirst.compare import (
    COMPARISON_SIZE,
    METHODS,
    comparison_rows,
    comparison_table,
    main,
    parse_args,
    plot_comparison,
    write_comparison,
)
from actfirst.config import STRATEGIES
from actfirst.eval_report import EpisodeRecord, EvalReport
from actfirst.train.plots import DPI, WALL_CLOCK

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def eval_summary(successes: list[int], tasks: int, benchmark: str) -> dict:
    """The overall summary of an EvalReport with ``successes[i]`` of ``tasks`` won under seed 42 + i."""
    episodes = [EpisodeRecord(seed=42 + s, index=i, task=f"t{i}", task_type="Pick", success=i < won,
                              score=100.0 if i < won else 20.0, turns=4 + s, invalid_turns=0, actions=[],
                              response_tokens=[], response_hashes=[], truncated_responses=0)
                for s, won in enumerate(successes) for i in range(tasks)]
    report = EvalReport(benchmark, [42 + s for s in range(len(successes))], ["Pick"], episodes)
    return report.to_dict()["summary"]["overall"]


def write_run(run_dir: Path, *, wall: float, transitions: int, evals: list[tuple[int, float, list[int]]],
              benchmark: str = "alfworld", updates: int = 4, final_s: float | None = None,
              finished: bool = True) -> None:
    """A run directory: ``updates`` metrics records ending at ``wall`` s and ``transitions`` transitions, the
    evaluations ``(update, elapsed_s, successes per seed)`` of 10 tasks each, and (``finished``) the final
    wall-clock ``final_s`` (default ``wall``)."""
    run_dir.mkdir(parents=True)
    if finished:
        (run_dir / WALL_CLOCK).write_text(json.dumps({"train_s": wall if final_s is None else final_s,
                                                      "eval_s": 6.0, "probe_s": 1.0}))
    metrics = [{"update": u, "elapsed_s": wall * u / updates, "total_transitions": transitions * u // updates,
                "transitions": transitions // updates, "probe/gap": -0.5, "teacher_minus_old": -0.6}
               for u in range(1, updates + 1)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    rows = [{"update": u, "elapsed_s": t, "eval_wall_s": 3.0, "report": f"evals/update_{u:06d}.json",
             "summary": eval_summary(s, 10, benchmark)} for u, t, s in evals]
    (run_dir / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def runs(tmp_path) -> dict[str, Path]:
    write_run(tmp_path / "vanilla", wall=300.0, transitions=600, evals=[(0, 0.0, [1, 1, 1]), (4, 300.0, [3, 4, 5])])
    write_run(tmp_path / "actfirst", wall=120.0, transitions=600, evals=[(0, 0.0, [1, 1, 1]), (4, 120.0, [5, 6, 7])])
    return {"vanilla": tmp_path / "vanilla", "actfirst": tmp_path / "actfirst"}


def test_rows_from_the_last_evaluation_and_metrics(runs):
    vanilla, actfirst = comparison_rows(runs)
    assert [vanilla["method"], actfirst["method"]] == ["Vanilla OPD", "ActFirst-OPD"]
    assert actfirst["eval_update"] == 4 and actfirst["episodes"] == 30 and actfirst["updates"] == 4
    assert actfirst["SR"]["mean"] == pytest.approx(60.0) and actfirst["SR"]["sd"] == pytest.approx(10.0)
    lo, hi = actfirst["SR_ci95_pooled"]
    assert lo < 60.0 < hi
    assert actfirst["Round"]["mean"] == pytest.approx(5.0) and actfirst["Score"] is None  # ALFWorld: no Score
    assert vanilla["wall_s"] == 300.0 and actfirst["wall_s"] == 120.0
    assert vanilla["transitions"] == actfirst["transitions"] == 600
    assert vanilla["transitions_per_s"] == pytest.approx(2.0) and actfirst["transitions_per_s"] == pytest.approx(5.0)
    assert vanilla["speedup"] == pytest.approx(1.0) and actfirst["speedup"] == pytest.approx(2.5)


def test_table(runs):
    table = comparison_table(comparison_rows(runs))
    lines = table.splitlines()
    assert lines[0] == ("| Method | Eval at update | SR (%) | SR 95% CI (pooled) | Round | Wall-clock (s) | "
                        "Transitions/s | Transitions | Speedup vs Vanilla OPD |")
    assert len(lines) == 4
    cells = [c.strip() for c in lines[3].strip("|").split("|")]
    assert cells[:3] == ["ActFirst-OPD", "4", "60.0 ± 10.0"]
    assert cells[4:] == ["5.0 ± 1.0", "120", "5.00", "600", "2.50x"]


def test_score_and_no_baseline(tmp_path):
    """ScienceWorld has a Score column; without a vanilla run there is no speedup."""
    write_run(tmp_path / "actfirst", wall=100.0, transitions=250, evals=[(2, 50.0, [5])], benchmark="scienceworld")
    write_run(tmp_path / "no_id", wall=80.0, transitions=200, evals=[], benchmark="scienceworld")
    rows = comparison_rows({"actfirst": tmp_path / "actfirst", "no_id": tmp_path / "no_id"})
    assert rows[0]["Score"]["mean"] == pytest.approx(60.0)  # 5 x 100 + 5 x 20 over 10
    assert rows[0]["speedup"] is None and rows[1]["SR"] is None and rows[1]["transitions_per_s"] == 2.5
    table = comparison_table(rows)
    assert "| Score |" in table and "Speedup" not in table
    assert table.splitlines()[2].startswith("| ActFirst-OPD | 2 | 50.0 ± n/a |")  # one seed: no SD
    assert table.splitlines()[3] == "| w/o ID | n/a | n/a | n/a | n/a | n/a | 80 | 2.50 | 200 |"


def test_files(runs, tmp_path):
    out = tmp_path / "cmp"
    table = write_comparison(runs, out)
    assert (out / "comparison.md").read_text() == table + "\n"
    saved = json.loads((out / "comparison.json").read_text())
    assert [r["strategy"] for r in saved["rows"]] == ["vanilla", "actfirst"]
    assert saved["rows"][1]["speedup"] == pytest.approx(2.5)
    assert saved["teacher"] is None and "Teacher" not in table
    png = out / "comparison.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    with Image.open(png) as image:
        assert image.size == (round(COMPARISON_SIZE[0] * DPI), round(COMPARISON_SIZE[1] * DPI))


def test_the_speedup_uses_the_final_wall_clock_of_finished_runs(tmp_path):
    """C.3 ends at the shutdown, after the last metrics line: the final figure is the one compared; a run still
    going shows its latest figure and no speedup."""
    write_run(tmp_path / "vanilla", wall=300.0, transitions=600, evals=[], final_s=330.0)
    write_run(tmp_path / "actfirst", wall=100.0, transitions=600, evals=[], final_s=110.0)
    write_run(tmp_path / "no_id", wall=90.0, transitions=600, evals=[], finished=False)
    vanilla, actfirst, no_id = comparison_rows({s: tmp_path / s for s in ("vanilla", "actfirst", "no_id")})
    assert (vanilla["wall_s"], actfirst["wall_s"], no_id["wall_s"]) == (330.0, 110.0, 90.0)
    assert actfirst["speedup"] == pytest.approx(3.0) and no_id["speedup"] is None and not no_id["finished"]
    write_run(tmp_path / "unfinished" / "vanilla", wall=300.0, transitions=600, evals=[], finished=False)
    rows = comparison_rows({"vanilla": tmp_path / "unfinished" / "vanilla", "actfirst": tmp_path / "actfirst"})
    assert [r["speedup"] for r in rows] == [None, None]  # no finished baseline


def test_plot_without_evaluations(tmp_path):
    write_run(tmp_path / "vanilla", wall=10.0, transitions=40, evals=[])
    path = plot_comparison({"vanilla": tmp_path / "vanilla", "actfirst": tmp_path / "missing"}, tmp_path / "c.png")
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_every_strategy_has_its_paper_name():
    assert set(METHODS) == set(STRATEGIES)


def test_unknown_strategy_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--strategies", "vanilla", "nope"])
    assert exc.value.code != 0
    assert "nope" in capsys.readouterr().err


@pytest.mark.parametrize("argv, why", [(["--strategies", "vanilla", "vanilla"], "once"),
                                       (["out_dir=x"], "set by the comparison"),
                                       (["rollout.strategy=vanilla"], "set by the comparison")])
def test_other_refusals(capsys, argv, why):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert why in capsys.readouterr().err


def test_overrides_after_the_strategies():
    args = parse_args(["--config", "c.yaml", "seed=1", "--strategies", "actfirst", "vanilla", "num_updates=3"])
    assert args.strategies == ["actfirst", "vanilla"] and args.overrides == ["seed=1", "num_updates=3"]
    assert parse_args([]).strategies == ["vanilla", "actfirst"]


def test_main_trains_each_strategy_then_compares(tmp_path, monkeypatch, capsys):
    """``main`` with stand-ins for the config loader, the preparation and the training loop."""
    calls = []

    def load_run_config(config, overrides):
        calls.append(("load", config, overrides))
        values = dict(o.split("=", 1) for o in overrides)
        return types.SimpleNamespace(out_dir=values["out_dir"], strategy=values["rollout.strategy"], teacher="T")

    def train(cfg, resume=False):
        calls.append(("train", cfg.strategy, resume))
        wall = {"vanilla": 200.0, "actfirst": 80.0}[cfg.strategy]
        write_run(Path(cfg.out_dir), wall=wall, transitions=400, evals=[(4, wall, [2, 3])])

    monkeypatch.setitem(sys.modules, "actfirst.run", types.SimpleNamespace(load_run_config=load_run_config))
    monkeypatch.setitem(sys.modules, "actfirst.prepare", types.SimpleNamespace(
        check_inputs=lambda cfg, buildable: calls.append(("check", cfg.strategy, buildable)),
        ensure_prepared=lambda cfg: calls.append(("prepare", cfg.strategy))))
    import actfirst.eval_report

    monkeypatch.setattr(actfirst.eval_report, "teacher_summary",
                        lambda teacher: eval_summary([7, 7], 10, "alfworld") if teacher == "T" else None)
    monkeypatch.setitem(sys.modules, "actfirst.train.trainer", types.SimpleNamespace(train=train))
    out = tmp_path / "cmp"
    assert main(["--out", str(out), "seed=3"]) == 0
    assert calls == [("load", None, ["seed=3", "rollout.strategy=vanilla", f"out_dir={out / 'vanilla'}"]),
                     ("load", None, ["seed=3", "rollout.strategy=actfirst", f"out_dir={out / 'actfirst'}"]),
                     ("check", "vanilla", True), ("check", "actfirst", True),  # every input before any work
                     ("prepare", "vanilla"), ("prepare", "actfirst"),
                     ("train", "vanilla", False), ("train", "actfirst", False)]
    printed = capsys.readouterr().out
    assert "| ActFirst-OPD | 4 | 25.0 ± 7.1 |" in printed
    assert "Teacher: SR 70.0 ± 0.0 %" in printed and "Teacher: SR 70.0" in (out / "comparison.md").read_text()
    assert json.loads((out / "comparison.json").read_text())["teacher"]["successes"] == 14
    assert {p.name for p in out.iterdir()} >= {"comparison.json", "comparison.md", "comparison.png"}
    # A second run into the same --out is refused before anything trains, unless it resumes.
    calls.clear()
    assert main(["--out", str(out)]) == 2
    assert [c[0] for c in calls] == ["load", "load"]
    assert "already hold a run" in capsys.readouterr().err

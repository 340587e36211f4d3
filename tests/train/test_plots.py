"""The training curve from hand-written ``metrics.jsonl`` / ``evals.jsonl`` rows: a valid PNG of the expected size,
redrawn (atomically) when an evaluation is added, and any subset of the inputs (none at all included)."""

import json
import sys
from pathlib import Path

import pytest
from PIL import Image

from actfirst.evaluation.report import EpisodeRecord, EvalReport
from actfirst.train.plots import DPI, TRAINING_CURVE_SIZE, plot_training_curve, read_records, sr_points

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SIZE = (round(TRAINING_CURVE_SIZE[0] * DPI), round(TRAINING_CURVE_SIZE[1] * DPI))


def eval_summary(successes: list[int], tasks: int, benchmark: str = "alfworld") -> dict:
    """The overall summary of an EvalReport with ``successes[i]`` of ``tasks`` won under seed 42 + i."""
    episodes = [EpisodeRecord(seed=42 + s, index=i, task=f"t{i}", task_type="Pick", success=i < won, score=0.0,
                              turns=3, invalid_turns=0, actions=[], response_tokens=[], response_hashes=[],
                              truncated_responses=0)
                for s, won in enumerate(successes) for i in range(tasks)]
    return EvalReport(benchmark, [42 + s for s in range(len(successes))], ["Pick"], episodes).to_dict()["summary"][
        "overall"]


def eval_row(update: int, elapsed: float, successes: list[int], tasks: int = 10) -> dict:
    return {"update": update, "elapsed_s": elapsed, "eval_wall_s": 5.0, "report": f"evals/update_{update:06d}.json",
            "summary": eval_summary(successes, tasks)}


def metrics_row(update: int, elapsed: float, probe: float | None) -> dict:
    return {"update": update, "elapsed_s": elapsed, "probe/gap": probe, "teacher_minus_old": -1.0 + 0.05 * update,
            "transitions": 10, "total_transitions": 10 * update, "rollout_s": 1.0, "update_wall_s": 2.0,
            "weight_version": update}


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def check_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.size == SIZE


def test_full_run_then_redrawn_on_a_new_evaluation(tmp_path):
    # probe/gap missing (None) on every other update, as with probe_every=2
    write_jsonl(tmp_path / "metrics.jsonl", [metrics_row(u, 3.0 * u, -0.8 + 0.02 * u if u % 2 == 0 else None)
                                             for u in range(1, 11)])
    evals = [eval_row(0, 0.0, [1, 2, 1]), eval_row(5, 15.0, [4, 5, 3])]
    write_jsonl(tmp_path / "evals.jsonl", evals)
    path = plot_training_curve(tmp_path, teacher_sr=70.0, title="alfworld: ActFirst-OPD")
    assert path == tmp_path / "training_curve.png"
    check_png(path)
    first, inode = path.read_bytes(), path.stat().st_ino

    write_jsonl(tmp_path / "evals.jsonl", evals + [eval_row(10, 30.0, [7, 6, 8])])
    assert plot_training_curve(tmp_path, teacher_sr=70.0, title="alfworld: ActFirst-OPD") == path
    check_png(path)
    assert path.read_bytes() != first
    assert path.stat().st_ino != inode  # replaced by a new file, never rewritten in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evals.jsonl", "metrics.jsonl", "training_curve.png"]


@pytest.mark.parametrize("files", [{}, {"metrics": 3}, {"evals": 1}, {"metrics": 3, "evals": 1, "no_probe": True}])
def test_any_subset_of_the_inputs(tmp_path, files):
    out = tmp_path / "run"  # not created yet in the empty case
    if files:
        out.mkdir()
    if "metrics" in files:
        write_jsonl(out / "metrics.jsonl", [metrics_row(u, 2.0 * u, None if files.get("no_probe") else -0.5)
                                            for u in range(1, files["metrics"] + 1)])
    if "evals" in files:
        write_jsonl(out / "evals.jsonl", [eval_row(0, 0.0, [3])])  # one seed: SD is null
    check_png(plot_training_curve(out))


def test_records_skip_a_cut_last_line_and_keep_the_last_of_an_update(tmp_path):
    path = tmp_path / "evals.jsonl"
    rows = [eval_row(0, 0.0, [1]), eval_row(5, 10.0, [2]), eval_row(5, 10.5, [3])]  # update 5 again after a resume
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"update": 10, "elaps')
    records = read_records(path)
    assert [r["update"] for r in records] == [0, 5]
    assert records[1]["elapsed_s"] == 10.5
    check_png(plot_training_curve(tmp_path))


def test_sr_points_are_the_mean_with_the_pooled_interval():
    row = eval_row(5, 12.5, [4, 6])  # 10 of 20 pooled, seeds at 40% and 60%
    xs, ys, err = sr_points([row, {"update": 6, "elapsed_s": 13.0, "summary": {"SR": {"mean": None}}}])
    lo, hi = row["summary"]["SR_ci95_pooled"]
    assert xs == [12.5] and ys == [pytest.approx(50.0)]
    assert err == [[pytest.approx(50.0 - lo)], [pytest.approx(hi - 50.0)]]
    assert 0 < lo < 50 < hi < 100


def test_without_matplotlib_returns_none(tmp_path, monkeypatch):
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.warns(UserWarning, match="matplotlib is not importable"):
        assert plot_training_curve(tmp_path) is None
    assert not (tmp_path / "training_curve.png").exists()

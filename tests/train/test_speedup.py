"""The rollout-speedup model (``actfirst.train.speedup``): Eq. 36 and Eq. 25 by hand on small batches, the ratios of
sums, the cases without fast actions or full responses, each run's own figures and Eq. 36 between two runs from
each method's own records. (The loop tests check that every metrics line and wall_clock.json carry the figures.)"""

import json
import sys
from pathlib import Path

import pytest

from actfirst.train.speedup import (
    FIELDS,
    EpisodeLatencies,
    batch_times,
    between,
    eq36_speedup,
    read_run_figures,
    run_figures,
    speedup_line,
    speedups,
)


def test_eq36_and_eq25_by_hand():
    """Two episodes: 3 turns with full responses of 1.0, 2.0, 3.0 s (median 2) and fast actions of 0.1 s; 2 turns
    with full responses of 4 s and fast actions of 0.2 and 0.4 s (median 0.3); b_max 2."""
    episodes = [EpisodeLatencies(3, [1.0, 2.0, 3.0], [0.1, 0.1, 0.1]), EpisodeLatencies(2, [4.0, 4.0], [0.2, 0.4])]
    times = batch_times(episodes, wall_s=5.0, b_max=2)
    assert times["vanilla_eq36_s"] == pytest.approx(max(3 * 2.0, 2 * 4.0))
    assert times["actfirst_eq36_s"] == pytest.approx(max(2 * 0.1 + 2.0, 1 * 0.3 + 4.0))
    slot = (6.0 + 0.3 + 8.0 + 0.6) / 2  # Eq. 23: every request's in-slot time over b_max
    assert times["actfirst_eq25_s"] == pytest.approx(max(2 * 0.1 + 2.0, 0.3 + 4.0, slot))
    assert times["measured_s"] == 5.0
    s = speedups(times)
    assert s["eq36"] == pytest.approx(8.0 / 4.3) and s["measured"] == pytest.approx(8.0 / 5.0)
    assert s["eq26"] == pytest.approx(8.0 / slot)


def test_sums_over_batches_and_degenerate_episodes():
    """Speedups over several batches are ratios of sums (Eq. 35); an episode without fast actions (Vanilla OPD)
    waits for a full response every turn; one without full responses or turns adds only its slot time."""
    vanilla = batch_times([EpisodeLatencies(4, [1.0] * 4, [])], wall_s=4.5, b_max=8)
    assert vanilla["vanilla_eq36_s"] == vanilla["actfirst_eq36_s"] == 4.0 and speedups(vanilla)["eq36"] == 1.0
    empty = batch_times([EpisodeLatencies(0, [], [0.5])], wall_s=1.0, b_max=1)
    assert empty["vanilla_eq36_s"] == 0.0 and empty["actfirst_eq25_s"] == 0.5
    total = {k: vanilla[k] + empty[k] for k in vanilla}
    assert speedups(total)["measured"] == pytest.approx(4.0 / 5.5)
    assert speedups(dict.fromkeys(total, 0.0)) == {"eq36": None, "measured": None, "eq26": None}


def summed(batches: list[tuple[list[EpisodeLatencies], float]], b_max: int = 8) -> dict[str, float]:
    """A run's ``rollout_times``: :func:`batch_times` of every (episodes, wall_s) batch, summed as the trainer does."""
    total = dict.fromkeys(FIELDS, 0.0)
    for episodes, wall in batches:
        times = batch_times(episodes, wall_s=wall, b_max=b_max)
        total = {k: total[k] + times[k] for k in FIELDS}
    return total


def test_eq36_from_each_methods_own_records():
    """A Vanilla OPD run (full responses only) and an ActFirst-OPD run (fast actions too), two batches each, on
    latencies that are exact in float64: each run's Eq. 36 time per batch is its own method's, and the comparison
    divides Vanilla's by ActFirst's; the in-run stand-in uses the ActFirst run's full responses instead."""
    vanilla = summed([([EpisodeLatencies(4, [1.0, 1.5, 2.0, 1.0], []), EpisodeLatencies(2, [2.0, 2.0], [])], 6.0),
                      ([EpisodeLatencies(3, [0.5, 0.5, 0.5], [])], 2.0)])
    actfirst = summed([([EpisodeLatencies(4, [1.0] * 4, [0.25] * 4), EpisodeLatencies(2, [3.0, 3.0], [0.5, 0.5])],
                        4.0),
                       ([EpisodeLatencies(3, [0.5] * 3, [0.75] * 3)], 1.0)])
    v, a = run_figures(vanilla), run_figures(actfirst)
    # Vanilla: max(4 x 1.25, 2 x 2) = 5 and 3 x 0.5 = 1.5, over 2 batches; no fast action.
    assert v["eq36_s_per_batch"] == (5.0 + 1.5) / 2 and v["measured_s_per_batch"] == 4.0 and v["batches"] == 2
    assert v["l_fast_s"] is None and v["l_full_s"] == 11.0 / 9 and v["turns_per_episode"] == 3.0
    assert vanilla["actfirst_eq36_s"] == vanilla["vanilla_eq36_s"] and v["stand_in"]["eq36"] == 1.0
    # ActFirst: max(3 x 0.25 + 1, 0.5 + 3) = 3.5 and 2 x 0.75 + max(0.75, 0.5) = 2.25, over 2 batches.
    assert a["eq36_s_per_batch"] == (3.5 + 2.25) / 2 and a["measured_s_per_batch"] == 2.5
    assert a["l_fast_s"] == (1.0 + 1.0 + 2.25) / 9 and a["l_full_s"] == (4.0 + 6.0 + 1.5) / 9
    assert between(v, a) == {"eq36": 3.25 / 2.875, "measured": 4.0 / 2.5}
    # The stand-in: the ActFirst run's own full responses as Vanilla's, max(4 x 1, 2 x 3) + 3 x 0.5 = 7.5.
    assert a["stand_in"]["eq36"] == 7.5 / 5.75 and a["stand_in"]["measured"] == 7.5 / 5.0
    assert between(v, run_figures(dict.fromkeys(FIELDS, 0.0))) == {"eq36": None, "measured": None}


def test_eq36_speedup_for_t_turns():
    assert eq36_speedup(l_fast=0.25, l_full=2.0, turns=12) == 24.0 / 4.75
    assert eq36_speedup(l_fast=1.0, l_full=0.5, turns=3) == 1.5 / 3.0  # a fast action slower than a full response
    assert eq36_speedup(l_fast=0.5, l_full=2.0, turns=1) == 1.0
    with pytest.raises(ValueError, match="turns=0"):
        eq36_speedup(l_fast=0.5, l_full=2.0, turns=0)


def test_run_figures_read_back_and_the_line(tmp_path):
    """What the trainer writes into wall_clock.json reads back; the console line holds each figure."""
    figures = run_figures(summed([([EpisodeLatencies(2, [1.0, 1.0], [0.25, 0.25])], 1.5)]))
    assert read_run_figures(tmp_path) is None  # not finished
    (tmp_path / "wall_clock.json").write_text(json.dumps({"train_s": 1.0, "rollout_model": figures}))
    assert read_run_figures(tmp_path) == figures
    line = speedup_line(own={"eq36": 2.5, "measured": 1.25}, turns=12,
                        calibration={"l_fast_s": 0.25, "l_full_s": 2.0})
    assert "measured 1.25x" in line and "own records 2.50x" in line and f"T=12 {24 / 4.75:.2f}x" in line
    assert "l_fast 250 ms, l_full 2000 ms" in line
    assert speedup_line(own=None, calibration=None, turns=4).endswith("no figures")


def test_calibration_command_names_bad_input(tmp_path, capsys, paths):
    """``bench/speedup_calibration.py``: a bad argument or a run that has not finished is named, exit 2 (nothing
    starts)."""
    sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
    from speedup_calibration import main

    config = str(Path(__file__).parents[2] / "configs" / "demo" / "scienceworld_lifespan.yaml")
    assert main(["--config", config, "--episodes", "0", *paths]) == 2
    assert "--episodes=0: must be >= 1" in capsys.readouterr().err
    assert main(["--config", config, *paths, "--turns", "12", "0"]) == 2
    assert "--turns=[12, 0]" in capsys.readouterr().err
    assert main(["--config", config, "--runs", str(tmp_path), str(tmp_path), *paths]) == 2
    assert f"--runs: {str(tmp_path)!r} has no finished run's rollout_model" in capsys.readouterr().err

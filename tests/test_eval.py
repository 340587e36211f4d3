"""Evaluation (Appendix C.1, C.4) on the real engine, real generated ALFWorld games and a tiny random student (SR is
0 there): the report's structure and per-type rows, Round at the turn limit for failed ALFWorld episodes, the
evaluation budget, seed reproducibility, the statistics against hand computations, and the CLI."""

import asyncio
import dataclasses
import itertools
import json
import math
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from actfirst.core.config import EvaluationConfig, RolloutConfig, SchedulerConfig, ThinkingBudgetConfig
from actfirst.envs.alfworld.config import ALFWorldConfig
from actfirst.envs.alfworld.env import ALFWorldTask
from actfirst.envs.benchmarks import get_benchmark
from actfirst.evaluation.evaluate import EVAL_SEEDS, episode_seed, eval_rollout_config, evaluate, pick_tasks
from actfirst.evaluation.report import EpisodeRecord, EvalReport, paired_table, sr_change
from actfirst.evaluation.stats import difference_interval, mean_sd, paired_difference_interval, wilson_interval

MAX_TURNS = 2
# Training budget 8/12 tokens, evaluation budget 24/32: an evaluation response can exceed the training total.
BUDGET = ThinkingBudgetConfig(first_stage=8, total=12, second_stage=4, fast_action_tokens=6, eval_first_stage=24,
                              eval_total=32)
ROLLOUT = RolloutConfig(strategy="actfirst", batch_tasks=16, max_prompt_tokens=900, budget=BUDGET)
ALFWORLD_ROWS = ["overall", "Pick", "Look", "Clean", "Heat", "Cool", "Pick2"]


def run_eval(engine, tiny_model_dir, tasks, seeds, max_in_flight, rollout=ROLLOUT):
    engine.reconfigure(SchedulerConfig(b_max=8))
    benchmark = get_benchmark("alfworld", ALFWorldConfig(games="generated", max_turns=MAX_TURNS))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    return asyncio.run(evaluate(engine, tokenizer, benchmark, tasks, seeds=seeds, rollout=rollout,
                                max_in_flight=max_in_flight, progress=False))


SEEDS = (42, 43)
"""Two seeds keep the test short (an ALFWorld reset takes 2-3 s); Eq. 34 over three is checked by hand below."""


@pytest.fixture(scope="module")
def report(engine, tiny_model_dir, alfworld_games):
    """The six task types x two seeds; 4 episodes in flight, so finished slots take the next episode."""
    return run_eval(engine, tiny_model_dir, alfworld_games, SEEDS, max_in_flight=4)


def test_report_structure_and_alfworld_rows(report, alfworld_games):
    assert report.benchmark == "alfworld" and report.seeds == [42, 43] and EVAL_SEEDS == (42, 43, 44)
    assert report.rows == ALFWORLD_ROWS
    assert report.metrics == ("SR", "Round")  # C.1: no Score on ALFWorld
    assert [(r.seed, r.index) for r in report.episodes] == [(s, i) for s in SEEDS for i in range(6)]
    assert sorted(r.task_type for r in report.records(seed=42)) == sorted(ALFWORLD_ROWS[1:])
    assert report.failures == []
    for r in report.episodes:
        assert r.failure is None and len(r.actions) == r.turns == len(r.response_tokens) == len(r.response_hashes)

    data = json.loads(report.to_json())
    assert data["rows"] == ALFWORLD_ROWS and data["metrics"] == ["SR", "Round"]
    assert data["meta"]["strategy"] == "vanilla" and data["meta"]["references"] is None
    assert len(data["episodes"]) == 12 and data["failures"] == []
    for row in ALFWORLD_ROWS:
        s = data["summary"][row]
        assert "Score" not in s
        assert s["episodes"] == (12 if row == "overall" else 2) and s["tasks"] == (6 if row == "overall" else 1)
        assert len(s["SR"]["per_seed"]) == len(s["Round"]["per_seed"]) == 2
        assert len(s["SR_ci95_pooled"]) == 2

    table = report.table()
    print(table)
    lines = [line for line in table.splitlines() if line.startswith("|")]
    assert lines[0] == "| Task type | Tasks | SR | Round | SR 95% CI (pooled) |"
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["Overall", *ALFWORLD_ROWS[1:]]
    assert "Score" not in table


def test_failed_alfworld_episodes_use_the_turn_limit(report):
    # C.1: ALFWorld episodes end on success or at the turn limit, so a failed episode contributes the limit.
    failed = [r for r in report.episodes if not r.success]
    assert failed  # a tiny random student solves nothing
    assert all(r.turns == MAX_TURNS for r in failed)
    if len(failed) == len(report.episodes):
        for row in report.rows:
            s = report.summary(row)
            assert s["Round"]["mean"] == MAX_TURNS and s["Round"]["sd"] == 0.0
            assert s["SR"]["mean"] == 0.0 and s["SR"]["sd"] == 0.0
            assert s["SR_ci95_pooled"][0] == 0.0 and s["SR_ci95_pooled"][1] > 0.0


def test_the_evaluation_budget_is_used(report, engine, tiny_model_dir, alfworld_games):
    cfg = eval_rollout_config(ROLLOUT, max_in_flight=4)
    assert cfg.strategy == "vanilla" and cfg.batch_tasks == 4
    assert (cfg.budget.first_stage, cfg.budget.total, cfg.budget.second_stage) == (24, 32, BUDGET.second_stage)
    assert report.meta["rollout"]["budget"]["total"] == 32
    lengths = [n for r in report.episodes for n in r.response_tokens]
    assert all(1 <= n <= BUDGET.eval_total for n in lengths)
    assert max(lengths) > BUDGET.total  # longer than training would ever allow
    assert report.responses()["max_tokens"] == max(lengths)
    # The evaluation budget must fit the engine's max_model_len next to the prompt budget.
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    limit = engine.max_model_len
    assert limit >= ROLLOUT.max_prompt_tokens + BUDGET.eval_total
    too_long = dataclasses.replace(ROLLOUT, max_prompt_tokens=limit - BUDGET.eval_total + 1)
    with pytest.raises(ValueError, match=f"eval_total=32 = {limit + 1} exceeds the engine's max_model_len={limit}"):
        asyncio.run(evaluate(engine, tokenizer, get_benchmark("alfworld", ALFWorldConfig(games="generated")),
                             alfworld_games, rollout=too_long, progress=False))


def test_a_seed_reproduces_its_run_and_seeds_differ(report, engine, tiny_model_dir, alfworld_games):
    # Seed 42 again on the first three tasks, all in flight at once: the sampling seeds depend on (seed, task index)
    # only, not on scheduling or on how many tasks follow.
    # A fourth task whose game file is missing: its environment raises, and the episode is a reported failure.
    missing = ALFWorldTask(game_file="/nonexistent/missing-game/game.tw-pddl", task_type="pick_and_place_simple")
    again = run_eval(engine, tiny_model_dir, [*alfworld_games[:3], missing], (42,), max_in_flight=4)
    first = report.records(seed=42)[:3]
    assert [r.response_hashes for r in again.episodes[:3]] == [r.response_hashes for r in first]
    assert [r.actions for r in again.episodes[:3]] == [r.actions for r in first]
    lost = again.episodes[3]
    assert lost.failure.startswith("EnvError") and not lost.success and lost.turns == 0
    assert again.failures == [lost] and again.summary()["episodes"] == 4
    assert json.loads(again.to_json())["failures"][0]["task"] == "missing-game"
    assert "failed (worker died or environment error): 1" in again.table()
    assert math.isnan(again.summary()["SR"]["sd"])  # the SD of one seed
    assert json.loads(again.to_json())["summary"]["overall"]["SR"]["sd"] is None
    hashes = {s: [h for r in report.records(seed=s) for h in r.response_hashes] for s in SEEDS}
    assert not set(hashes[42]) & set(hashes[43])  # different seeds sample different responses
    assert len(set(hashes[42])) == len(hashes[42])  # and so do different turns and tasks
    # No two episodes of any seeds share a sampling seed.
    stride = 2 * MAX_TURNS + BUDGET.eval_total + 2
    bases = sorted(episode_seed(s, i, stride) for s in EVAL_SEEDS for i in range(300))
    assert all(b - a >= stride for a, b in itertools.pairwise(bases))


# -- statistics against hand computations ------------------------------------------------------------------------


def record(seed, index, task_type, success, score, turns, failure=None):
    return EpisodeRecord(seed=seed, index=index, task=f"t{index}", task_type=task_type, success=success, score=score,
                         turns=turns, invalid_turns=0, actions=["a"] * turns, response_tokens=[10] * turns,
                         response_hashes=["0"] * turns,
                         truncated_responses=0, failure=failure)


def test_mean_sd_and_wilson_by_hand():
    assert mean_sd([2.0, 4.0, 9.0]) == pytest.approx((5.0, math.sqrt(((-3) ** 2 + 1 + 16) / 2)))
    mean, sd = mean_sd([7.0])
    assert mean == 7.0 and math.isnan(sd)
    z2 = 1.959963984540054 ** 2
    # 0 of 10: [0, z^2 / (n + z^2)]; n of n: [n / (n + z^2), 1].
    assert wilson_interval(0, 10) == pytest.approx((0.0, z2 / (10 + z2)))
    assert wilson_interval(10, 10) == pytest.approx((10 / (10 + z2), 1.0))
    # 7 of 20 (the textbook example): [0.1812, 0.5671]; and the (2np + z^2 -+ z sqrt(z^2 + 4np(1-p))) / 2(n + z^2) form.
    lo, hi = wilson_interval(7, 20)
    assert (round(lo, 4), round(hi, 4)) == (0.1812, 0.5671)
    n, p, z = 9, 5 / 9, 1.959963984540054
    root = z * math.sqrt(z2 + 4 * n * p * (1 - p))
    assert wilson_interval(5, 9) == pytest.approx(((2 * n * p + z2 - root) / (2 * (n + z2)),
                                                   (2 * n * p + z2 + root) / (2 * (n + z2))))
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_report_statistics_by_hand():
    # Tasks 0 and 1 of type A, task 2 of type B; seed 44's task 2 lost its worker (a failure, still counted).
    rows = [(42, [(1, 100, 5), (0, 50, 30), (1, 100, 7)]),
            (43, [(0, 20, 30), (0, 0, 30), (1, 100, 9)]),
            (44, [(1, 100, 4), (1, 100, 6), (0, 10, 2)])]
    episodes = [record(seed, i, "A" if i < 2 else "B", bool(u), float(sc), t,
                       failure="WorkerDied: gone" if (seed, i) == (44, 2) else None)
                for seed, eps in rows for i, (u, sc, t) in enumerate(eps)]
    report = EvalReport(benchmark="scienceworld", seeds=[42, 43, 44], task_types=["A", "B"], episodes=episodes)
    assert report.metrics == ("SR", "Score", "Round")
    s = report.summary()
    # SR per seed 200/3, 100/3, 200/3; Score 250/3, 40, 70; Round 14, 23, 4.
    assert s["SR"]["per_seed"] == pytest.approx([200 / 3, 100 / 3, 200 / 3])
    assert (s["SR"]["mean"], s["SR"]["sd"]) == pytest.approx((500 / 9, math.sqrt(30000) / 9))
    assert (s["Score"]["mean"], s["Score"]["sd"]) == pytest.approx((580 / 9, math.sqrt(39900) / 9))
    assert (s["Round"]["mean"], s["Round"]["sd"]) == pytest.approx((41 / 3, math.sqrt(813) / 3))
    assert s["successes"] == 5 and s["episodes"] == 9
    assert s["SR_ci95_pooled"] == pytest.approx([100 * x for x in wilson_interval(5, 9)])
    b = report.summary("B")
    assert b["SR"]["per_seed"] == [100.0, 100.0, 0.0]
    assert (b["SR"]["mean"], b["SR"]["sd"]) == pytest.approx((200 / 3, 100 / math.sqrt(3)))
    assert (b["Round"]["mean"], b["Round"]["sd"]) == pytest.approx((6.0, math.sqrt(((7 - 6) ** 2 + 9 + 16) / 2)))
    a = report.summary("A")
    assert a["SR"]["per_seed"] == [50.0, 0.0, 100.0] and a["tasks"] == 2 and a["episodes"] == 6
    data = json.loads(report.to_json())
    assert data["failures"] == [{"seed": 44, "index": 2, "task": "t2", "reason": "WorkerDied: gone"}]
    table = report.table()
    assert "| Task type | Tasks | SR | Score | Round | SR 95% CI (pooled) |" in table
    score_sd, round_sd = math.sqrt(39900) / 9, math.sqrt(813) / 3  # 22.2, 9.5
    assert f"| Overall | 3 | 55.6 ± 19.2 | 64.4 ± {score_sd:.1f} | 13.7 ± {round_sd:.1f} |" in table
    assert "failed (worker died or environment error): 1" in table


def test_split_summaries_by_hand():
    """ALFWorld's valid_seen and valid_unseen apart: each summary restricted to its episodes, the overall and per-type
    rows pooling both; a stored report without splits still loads."""
    # seed 42: seen tasks 0, 1 won (3 and 5 turns), unseen task 2 lost (30); seed 43: seen 0 won, 1 lost, unseen won.
    outcomes = {42: [(1, 3), (1, 5), (0, 30)], 43: [(1, 4), (0, 30), (1, 10)]}
    episodes = [dataclasses.replace(record(seed, i, "Pick", bool(won), 100.0 * won, turns),
                                    split="valid_seen" if i < 2 else "valid_unseen")
                for seed, eps in outcomes.items() for i, (won, turns) in enumerate(eps)]
    report = EvalReport(benchmark="alfworld", seeds=[42, 43], task_types=["Pick"], episodes=episodes)
    assert report.splits == ["valid_seen", "valid_unseen"]
    seen, unseen = report.summary(split="valid_seen"), report.summary(split="valid_unseen")
    assert seen["SR"]["per_seed"] == [100.0, 50.0] and seen["Round"]["per_seed"] == [4.0, 17.0]
    assert (seen["tasks"], seen["episodes"], seen["successes"]) == (2, 4, 3)
    assert seen["SR_ci95_pooled"] == pytest.approx([100 * x for x in wilson_interval(3, 4)])
    assert unseen["SR"]["per_seed"] == [0.0, 100.0] and unseen["Round"]["per_seed"] == [30.0, 10.0]
    assert report.summary()["SR"]["per_seed"] == pytest.approx([200 / 3, 200 / 3])  # pooled
    assert report.summary("Pick", split="valid_unseen")["episodes"] == 2
    data = json.loads(report.to_json())
    assert data["splits"]["valid_unseen"]["SR"]["mean"] == 50.0 and data["episodes"][2]["split"] == "valid_unseen"
    assert [line.split("|")[1].strip() for line in report.table().splitlines() if line.startswith("| ")][1:] == [
        "Overall", "valid_seen", "valid_unseen", "Pick"]
    stored = {k: v for k, v in data["episodes"][0].items() if k != "split"}  # a report written before splits
    old = EpisodeRecord(**stored)
    assert old.split is None
    assert EvalReport("alfworld", [42], ["Pick"], [old]).splits == []


def test_pick_tasks_spreads_over_types_and_splits(alfworld_games):
    benchmark = get_benchmark("alfworld", ALFWorldConfig(games="generated"))
    # Each type twice as "seen" then twice as "unseen", seen games listed first (as ALFWorld's eval split does).
    tasks = [dataclasses.replace(g, game_file=f"{split}{k}/{g.game_file}") for split in ("seen", "unseen")
             for k in (0, 1) for g in alfworld_games]
    picked = pick_tasks(benchmark, tasks, 12)
    assert len(picked) == 12 and len(set(map(id, picked))) == 12
    assert Counter(benchmark.task_type(t) for t in picked) == Counter({t: 2 for t in ALFWORLD_ROWS[1:]})
    assert sum(t.game_file.startswith("seen") for t in picked) == 6  # one seen and one unseen game of each type
    assert [benchmark.task_type(t) for t in picked[:6]] == [benchmark.task_type(g) for g in alfworld_games]
    assert Counter(benchmark.task_type(t) for t in pick_tasks(benchmark, tasks, 8)).most_common(1)[0][1] == 2
    assert pick_tasks(benchmark, tasks, 0) == tasks and pick_tasks(benchmark, tasks, 99) == tasks


# -- the CLI -------------------------------------------------------------------------------------------------------


def test_cli_on_the_tiny_model(tmp_path, tiny_model_dir, alfworld_games):
    # The fixture's games serve as both evaluation splits (existing games are kept, nothing is generated).
    games = Path(alfworld_games[0].game_file).parents[1]
    generated = tmp_path / "games"
    generated.mkdir()
    for split in ("valid_seen", "valid_unseen"):
        (generated / split).symlink_to(games, target_is_directory=True)
    out = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "actfirst.eval", "--checkpoint", str(tiny_model_dir), "--benchmark", "alfworld",
           "--tasks", "2", "--seeds", "42", "--out", str(out), "--max-in-flight", "2",
           "games=generated", f"generated_dir={generated}", "games_per_type=1", "max_turns=2",
           "rollout.max_prompt_tokens=900",
           "rollout.budget.eval_first_stage=16", "rollout.budget.eval_total=24", "engine.max_model_len=1024",
           "engine.kv_cache_gib=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=Path(__file__).parents[1])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["seeds"] == [42] and data["meta"]["num_tasks"] == 2 and data["meta"]["split"] == "eval"
    types = data["rows"][1:]
    assert data["rows"][0] == "overall" and len(types) == 2  # round-robin over types: two different ones
    assert sorted(e["task_type"] for e in data["episodes"]) == sorted(types)
    assert all(e["turns"] == 2 for e in data["episodes"] if not e["success"])
    assert data["meta"]["rollout"]["budget"]["total"] == 24
    # without a run's config, evaluation's defaults are a training run's (EvaluationConfig's)
    assert data["meta"]["rollout"]["temperature"] == EvaluationConfig().temperature
    assert data["meta"]["rollout"]["top_p"] == EvaluationConfig().top_p
    assert data["summary"]["overall"]["SR"]["sd"] is None  # one seed
    assert "| Overall | 2 |" in proc.stdout and f"| {types[0]} | 1 |" in proc.stdout

    bad = subprocess.run(cmd[:-2] + ["engine.max_model_len=512"], capture_output=True, text=True, timeout=120,
                         env=env, cwd=Path(__file__).parents[1])
    assert bad.returncode == 2 and "exceeds engine.max_model_len=512" in bad.stderr


def test_cli_takes_sampling_from_evaluation_keys(capsys, tiny_model_dir):
    from actfirst.eval import main

    assert main(["--checkpoint", str(tiny_model_dir), "--benchmark", "alfworld", "rollout.temperature=0.4"]) == 2
    assert "rollout.temperature=0.4: evaluation samples with evaluation.temperature=..." in capsys.readouterr().err


def test_difference_interval_matches_newcombe():
    """Newcombe (1998), method 10, examples (a)-(c): 56/70 - 48/80, 9/10 - 3/10, 5/56 - 0/29."""
    d, lo, hi = difference_interval(48, 80, 56, 70)
    assert (round(d, 4), round(lo, 4), round(hi, 4)) == (0.2, 0.0524, 0.3339)
    d, lo, hi = difference_interval(3, 10, 9, 10)
    assert (round(lo, 4), round(hi, 4)) == (0.1705, 0.8090)
    d, lo, hi = difference_interval(0, 29, 5, 56)
    assert (round(lo, 4), round(hi, 4)) == (-0.0381, 0.1926)
    assert all(math.isnan(x) for x in difference_interval(0, 0, 3, 10))
    # Swapping the two proportions mirrors the interval.
    assert difference_interval(56, 70, 48, 80) == pytest.approx((-0.2, -0.3339, -0.0524), abs=1e-4)


def test_paired_interval_matches_the_published_example():
    """Newcombe's method 10 on Fagerland, Lydersen and Laake's Ch. 8 example (Cavo et al. 2012: complete response
    before and after consolidation therapy, 59/6/16/80 of 161 patients): -0.0621, 95% CI -0.1186 to -0.0046 for
    before minus after; ours is after minus before, the same interval mirrored."""
    d, lo, hi = paired_difference_interval(59, 6, 16, 80)
    assert (round(d, 4), round(lo, 4), round(hi, 4)) == (0.0621, 0.0046, 0.1186)
    assert paired_difference_interval(59, 16, 6, 80) == pytest.approx((-d, -hi, -lo), abs=1e-12)
    assert all(math.isnan(x) for x in paired_difference_interval(0, 0, 0, 0))
    with pytest.raises(ValueError, match="counts must be >= 0"):
        paired_difference_interval(1, -1, 0, 0)


def test_paired_interval_is_narrower_and_covers():
    """On fresh random paired tables: the interval holds the estimate and stays in [-1, 1]; with positively
    correlated pairs it is narrower than the unpaired one; over tables drawn from a known joint distribution (n=72,
    the demo's size) it covers the true difference close to 95% of the time."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")
    rng = random.Random(seed)
    for _ in range(500):
        cells = [rng.randrange(0, 30) for _ in range(4)]
        d, lo, hi = paired_difference_interval(*cells)
        assert -1 <= lo <= d <= hi <= 1, (cells, lo, d, hi)
    # joint: P(both)=0.3, P(first only)=0.05, P(second only)=0.25, P(neither)=0.4 -> true difference +0.20
    probs, truth, n, covered, narrower = (0.3, 0.05, 0.25, 0.4), 0.20, 72, 0, 0
    trials = 2000
    for _ in range(trials):
        cells = [0, 0, 0, 0]
        for _ in range(n):
            cells[rng.choices(range(4), probs)[0]] += 1
        d, lo, hi = paired_difference_interval(*cells)
        covered += lo <= truth <= hi
        _, ulo, uhi = difference_interval(cells[0] + cells[1], n, cells[0] + cells[2], n)
        narrower += hi - lo < uhi - ulo
    assert 0.92 <= covered / trials <= 0.99, covered / trials
    assert narrower / trials > 0.95


def _records(successes: dict[tuple[int, int], bool]) -> list[EpisodeRecord]:
    return [EpisodeRecord(seed=s, index=i, task=f"t{i}", task_type="x", success=ok, score=0.0, turns=1,
                          invalid_turns=0, actions=[], response_tokens=[], response_hashes=[], truncated_responses=0)
            for (s, i), ok in successes.items()]


def test_sr_change_pairs_episodes_by_seed_and_task():
    before = _records({(42, 0): True, (42, 1): False, (43, 0): False, (43, 1): False})
    after = _records({(43, 1): True, (43, 0): True, (42, 1): True, (42, 0): True})  # another order
    assert paired_table(before, after) == (1, 0, 3, 0)
    change = sr_change(before, after)
    assert change["points"] == pytest.approx(75.0) and change["table"] == {"both": 1, "first_only": 0,
                                                                         "last_only": 3, "neither": 0}
    lo, hi = change["ci95"]
    assert lo <= 75.0 <= hi and change["beyond_noise"] == (lo > 0)
    with pytest.raises(ValueError, match="not paired"):
        paired_table(before, after[:3])


def test_greedy_evaluation_ignores_the_sampling_seed(engine, tiny_model_dir, alfworld_games):
    """``evaluation.temperature: 0`` decodes greedily: two seeds play every task alike; the report records the
    sampling it used."""
    greedy = EvaluationConfig(temperature=0.0, top_p=1.0).sampling(ROLLOUT)
    report = run_eval(engine, tiny_model_dir, alfworld_games[:2], (42, 43), max_in_flight=1, rollout=greedy)
    by_seed = {seed: [(r.index, r.actions, r.response_hashes) for r in report.episodes if r.seed == seed]
               for seed in (42, 43)}
    assert by_seed[42] == by_seed[43] and len(by_seed[42]) == 2
    assert report.meta["rollout"]["temperature"] == 0.0 and report.meta["rollout"]["top_p"] == 1.0

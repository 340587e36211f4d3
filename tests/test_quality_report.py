"""C.5's unproductive action repetition on hand-made episode records (each clause of the definition), C.5's action
validity, and Eq. 38-40 against hand computations."""

import json

import pytest

from actfirst.envs.alfworld.config import ALFWorldConfig
from actfirst.envs.base import EnvState, Transition
from actfirst.envs.benchmarks import get_benchmark
from actfirst.evaluation.quality_metrics import (
    EpisodeTrace,
    QualityEpisode,
    QualityReport,
    TraceTurn,
    strategy_summary,
    unproductive_repetitions,
)

S0, S1 = EnvState(("at(agent, room)",), False), EnvState(("at(agent, cabinet 1)",), False)
O1 = "You are in the middle of a room."


def trace(*turns, first=O1):
    """``turns``: (state, action, valid, observation) tuples."""
    return EpisodeTrace(first, tuple(TraceTurn(*t) for t in turns))


def test_a_repeated_pair_with_no_new_observation_is_unproductive():
    t = trace((S0, "look", True, "You see a cabinet 1."), (S0, "look", True, "You see a cabinet 1."))
    assert unproductive_repetitions(t) == [1]


def test_the_first_execution_of_a_pair_never_counts_even_without_a_new_observation():
    # Its feedback repeats o_1 (not new), but the pair was never executed before.
    assert unproductive_repetitions(trace((S0, "look", True, O1))) == []


def test_a_new_observation_since_the_pairs_last_execution_makes_it_productive():
    t = trace((S0, "look", True, "You see a cabinet 1."),
              (S0, "inventory", True, "You are carrying nothing."),  # new: a new observation in between
              (S0, "look", True, "You see a cabinet 1."))
    assert unproductive_repetitions(t) == []


def test_a_repeated_pair_whose_action_produces_a_new_observation_is_productive():
    t = trace((S0, "open drawer 1", True, "Nothing happens."),
              (S0, "open drawer 1", True, "You open the drawer 1. It is empty."))
    assert unproductive_repetitions(t) == []


def test_invalid_actions_never_count_but_their_feedback_joins_the_record():
    nothing = "Nothing happens."
    t = trace((S0, "fly", False, nothing), (S0, "fly", False, nothing), (S0, "fly", False, nothing))
    assert unproductive_repetitions(t) == []
    # An invalid attempt's first feedback is new: it breaks the run between two executions of a valid pair...
    t = trace((S0, "look", True, "You see a cabinet 1."), (S0, "fly", False, nothing),
              (S0, "look", True, "You see a cabinet 1."))
    assert unproductive_repetitions(t) == []
    # ...and once it has been seen, repeating it does not.
    t = trace((S0, "fly", False, nothing), (S0, "look", True, "You see a cabinet 1."), (S0, "fly", False, nothing),
              (S0, "look", True, "You see a cabinet 1."))
    assert unproductive_repetitions(t) == [3]


def test_the_same_action_in_another_state_is_another_pair():
    t = trace((S0, "examine cabinet 1", True, "The cabinet 1 is closed."),
              (S1, "examine cabinet 1", True, "The cabinet 1 is closed."))
    assert unproductive_repetitions(t) == []
    # The success flag is part of the state.
    won = EnvState(S0.content, True)
    t = trace((S0, "look", True, "You see a cabinet 1."), (won, "look", True, "You see a cabinet 1."))
    assert unproductive_repetitions(t) == []


def test_actions_and_observations_are_normalized():
    # Pairs compare normalized actions; novelty compares NFKC + case-folded + whitespace-normalized text.
    t = trace((S0, "go to cabinet 1", True, "You arrive at cabinet 1."),
              (S0, "Go  to Cabinet 1", True, "you  arrive at CABINET 1.\n"),
              (S0, "go to ｃａｂｉｎｅｔ 1", True, "You arrive at ｃａｂｉｎｅｔ 1."))
    assert unproductive_repetitions(t) == [1, 2]


def test_the_window_starts_at_the_end_of_the_pairs_most_recent_valid_execution():
    # The pair's first execution produced a new observation: that is its own feedback, not one "since" its end.
    t = trace((S0, "look", True, "You see a cabinet 1."), (S0, "look", True, "You see a cabinet 1."))
    assert unproductive_repetitions(t) == [1]
    # A new observation between executions 1 and 2, none between 2 and 3: only the third counts.
    t = trace((S0, "look", True, "You see a cabinet 1."), (S0, "inventory", True, "You carry nothing."),
              (S0, "look", True, "You see a cabinet 1."), (S0, "look", True, "You see a cabinet 1."))
    assert unproductive_repetitions(t) == [3]
    # Other pairs in between that produce nothing new do not break the run.
    t = trace((S0, "look", True, "You see a cabinet 1."), (S0, "inventory", True, "You see a cabinet 1."),
              (S0, "look", True, "You see a cabinet 1."), (S0, "inventory", True, "You see a cabinet 1."))
    assert unproductive_repetitions(t) == [2, 3]


def test_c5_validity_is_an_exact_match_after_stripping():
    benchmark = get_benchmark("alfworld", ALFWorldConfig(games="generated"))
    current = Transition(observation=O1, admissible=("go to cabinet 1", "look"), score=0.0, done=False, won=False)
    assert benchmark.executed_valid("look", current)
    assert benchmark.executed_valid("  go to cabinet 1\n", current)
    assert not benchmark.executed_valid("Look", current)  # exact: no case folding
    assert not benchmark.executed_valid("go to  cabinet 1", current)
    assert not benchmark.executed_valid("", current)  # parsing failed (B.3's empty action)
    assert not benchmark.executed_valid("help", current)  # not in ALFWorld's admissible list


def episode(strategy, index, success, turns, repetitions=(), failure=None):
    return QualityEpisode(strategy=strategy, index=index, task=f"t{index}", task_type="Pick", success=success,
                          turns=turns, invalid_turns=1, repetitions=list(repetitions), seeds=[7] * turns,
                          full_responses=0, fallback_turn=None, failure=failure)


def test_eq_38_to_40_by_hand():
    rows = [episode("no_id", 0, True, 4), episode("no_id", 1, False, 30, [5, 9]),
            episode("no_id", 2, True, 6, [2]), episode("no_id", 3, False, 30, failure="WorkerDied: x")]
    s = strategy_summary(rows)
    assert s["repeat_pct"] == pytest.approx(100 * 2 / 4)  # Eq. 38
    assert s["yield_per_100"] == pytest.approx(100 * 2 / 70)  # Eq. 39: successes per 100 transitions
    assert s["mean_turns"] == pytest.approx(70 / 4)  # Eq. 40
    assert s["SR"] == 50.0
    assert (s["tasks"], s["tasks_with_repetition"], s["repetitions"], s["successes"], s["transitions"],
            s["invalid_turns"], s["failures"]) == (4, 2, 3, 2, 70, 4, 1)
    assert strategy_summary([episode("x", 0, False, 0)])["yield_per_100"] is None  # no transitions at all
    with pytest.raises(ValueError):
        strategy_summary([])


def test_report_json_and_table():
    rows = [episode(name, i, i == 0, 3 + i, [1] if name == "no_id" else []) for name in ("vanilla", "no_id",
                                                                                           "actfirst") for i in (1, 0)]
    report = QualityReport(benchmark="alfworld", strategies=["vanilla", "no_id", "actfirst"], episodes=rows,
                           meta={"seed": 42})
    assert [e.index for e in report.records("no_id")] == [0, 1]
    data = json.loads(report.to_json())
    assert list(data["summary"]) == ["vanilla", "no_id", "actfirst"] and len(data["episodes"]) == 6
    assert data["summary"]["no_id"]["repeat_pct"] == 100.0 and data["summary"]["vanilla"]["repeat_pct"] == 0.0
    assert data["summary"]["actfirst"]["yield_per_100"] == pytest.approx(100 / 7)
    lines = report.table().splitlines()
    assert len(lines) == 5 and lines[0].startswith("| Strategy | Tasks | Repeat (%) | Yield")
    assert lines[2].startswith("| Think-then-act | 2 | 0.0 | 14.29 | 3.50 | 50.0 |")
    assert lines[3].startswith("| Direct action (no reference) | 2 | 100.0 |")
    assert lines[4].startswith("| ActFirst-OPD | 2 |")


def test_cli_refuses_a_benchmark_without_state_and_a_config_without_references(tiny_model_dir, capsys, alfworld_data):
    from actfirst.rollout_quality import main

    webshop = ["--checkpoint", str(tiny_model_dir), "--config", "configs/train/webshop/qwen3-1.7b.yaml"]
    assert main(webshop) == 2
    assert "benchmark='webshop': its environment exposes no state" in capsys.readouterr().err
    alfworld = ["--checkpoint", str(tiny_model_dir), "--config", "configs/train/alfworld/qwen3-1.7b.yaml"]
    assert main([*alfworld, "references=null", "rollout.strategy=vanilla"]) == 2
    assert "references=None: the actfirst strategy needs the reference cache" in capsys.readouterr().err
    assert main([*alfworld, "--tasks", "2", "references=/nonexistent/refs.jsonl"]) == 2
    assert "references='/nonexistent/refs.jsonl'" in capsys.readouterr().err

"""The run's wall-clock across sessions (``actfirst.train.clock``) from hand-written ``clock.jsonl`` lines: the parts
sum to the whole, what a killed session did past its checkpoint is lost time, a line cut short by a kill is skipped.
A :class:`RunClock` leaves out what it is told, and its state continues in a new session, from its own
``state_dict`` or from a trainer state of the earlier format. (``tests/train/test_kill_resume.py`` checks the same on a
real run killed with SIGKILL and resumed.)"""

import json

import pytest

from actfirst.train.clock import PARTS, RunClock, SessionClock, account
from actfirst.train.speedup import FIELDS


def line(started, now, *, prepare=0.0, base=0.0, train=0.0, eval_s=0.0, probe=0.0):
    return json.dumps({"started": started, "now": now, "prepare_s": prepare, "base_s": base,
                       "train_s": train, "eval_s": eval_s, "probe_s": probe})


def test_a_killed_and_resumed_run_adds_up(tmp_path):
    """Session 1 (launched at t=1000, 30 s of preparation) measured 100 s of training, 20 s of evaluation and 5 s
    of probe before it was killed; its checkpoint held 70 s of training and 4 s of probe, and one 20 s evaluation
    was recorded: session 2 resumes from 94 s, so 31 s were lost. Session 2 ends at 90 s of its own."""
    path = tmp_path / "clock.jsonl"
    path.write_text("\n".join([
        line(1000.0, 1040.0, prepare=30.0, train=5.0),
        line(1000.0, 1170.0, prepare=30.0, train=100.0, eval_s=20.0, probe=5.0),
        line(2000.0, 2010.0, base=94.0, train=72.0, eval_s=20.0, probe=4.0),
        line(2000.0, 2090.0, base=94.0, train=140.0, eval_s=40.0, probe=6.0),
        '{"started": 2000.0, "now": 20',  # a line cut short by a kill
    ]) + "\n")
    wall = account(path)
    assert wall["sessions"] == 2 and wall["speedup_uses"] == "train_s"
    assert wall["total_s"] == pytest.approx(170.0 + 90.0)
    assert (wall["prepare_s"], wall["train_s"], wall["eval_s"], wall["probe_s"]) == (30.0, 140.0, 40.0, 6.0)
    assert wall["lost_s"] == pytest.approx(125.0 - 94.0)
    assert wall["other_s"] == pytest.approx(260.0 - 30.0 - 140.0 - 40.0 - 6.0 - 31.0)
    assert sum(wall[k] for k in PARTS) == pytest.approx(wall["total_s"])


def test_one_session_and_no_session(tmp_path):
    path = tmp_path / "clock.jsonl"
    assert account(path)["total_s"] == 0.0 and account(path)["sessions"] == 0
    clock = SessionClock(path, started=0.0, prepare_s=2.0, base_s=0.0)  # started at the epoch: now - 0 is large
    clock.beat(train_s=3.0, eval_s=1.0, probe_s=0.5)
    wall = account(path)
    assert wall["sessions"] == 1 and wall["lost_s"] == 0.0 and wall["train_s"] == 3.0
    assert sum(wall[k] for k in PARTS) == pytest.approx(wall["total_s"])
    SessionClock(None, started=0.0, prepare_s=0.0, base_s=0.0).beat(train_s=1.0, eval_s=0.0, probe_s=0.0)  # rank > 0


def test_run_clock_excludes_evaluation_and_probe_and_resumes_from_its_state(tmp_path):
    clock = RunClock()
    clock.open_window()
    origin = clock.window_origin
    clock.open_window()  # the first rollout batch's start stays the origin
    assert clock.window_origin == origin >= 0.0
    before = clock.elapsed()
    clock.exclude_evaluation(5.0, kept=6.0)
    clock.exclude_probe(0.25)
    assert clock.elapsed() < before - 5.0 + 0.1 and clock.kept_probe_s == 0.25 and clock.eval_kept == 6.0
    clock.count(transitions=10, early=4, rollout_times=dict.fromkeys(FIELDS, 1.5))
    clock.count(transitions=2, early=0, rollout_times=dict.fromkeys(FIELDS, 0.5))
    state = clock.state_dict()
    assert (state["total_transitions"], state["early_transitions"], state["probe_s"]) == (12, 4, 0.25)
    assert state["rollout_times"] == dict.fromkeys(FIELDS, 2.0)

    resumed = RunClock()  # a new session continues the training time and the window
    resumed.load_state_dict(state)
    assert resumed.elapsed() >= state["elapsed_s"] and resumed.kept_probe_s == 0.25
    assert (resumed.total_transitions, resumed.early_transitions, resumed.window_origin) == (12, 4, origin)
    resumed.open_session(tmp_path / "clock.jsonl", kept_evaluations=6.0)
    (line,) = [json.loads(x) for x in (tmp_path / "clock.jsonl").read_text().splitlines()]
    assert line["base_s"] == pytest.approx(state["elapsed_s"] + 0.25 + 6.0) and line["probe_s"] == 0.25


def test_run_clock_resumes_from_an_earlier_trainer_state():
    """A checkpoint written before the clock had its own state: its figures are keys of the trainer state, and the
    oldest lack the probe time, the window and the rollout times."""
    trainer_state = {"update": 4, "weight_version": 4, "probe_gaps": [], "total_transitions": 37, "elapsed_s": 81.5}
    clock = RunClock()
    clock.load_state_dict(trainer_state)
    assert (clock.train_before, clock.probe_before, clock.total_transitions, clock.early_transitions) == (81.5, 0.0,
                                                                                                         37, 0)
    assert clock.window_origin is None and clock.rollout_times == dict.fromkeys(FIELDS, 0.0)
    assert clock.elapsed() >= 81.5

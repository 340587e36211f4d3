"""Reference steps after invalid turns (``actfirst.train.invalid_turns``), replayed in the real ScienceWorld simulator
from the demo's shipped references: every inserted turn is refused by B.5's validity where it is played, the steps
are the reference's own, their histories hold the invalid turns, and replaying a step's history with its action still
reaches the reference's success."""

import asyncio
import random

import pytest
from train_helpers import demo_references

from actfirst.preparation.reference_cache import replay
from actfirst.train.invalid_turns import invalid_action, invalid_turn_steps


@pytest.fixture(scope="module")
def demo():
    with demo_references(3) as found:
        yield found


def steps_of(demo, seed, variants=2, max_turns=5):
    benchmark, references, tasks, pool = demo
    return asyncio.run(invalid_turn_steps(benchmark, pool, tasks, references, variants=variants,
                                          max_turns=max_turns, seed=seed))


def test_the_invalid_turns_are_refused_where_played_and_the_reference_still_succeeds(demo):
    benchmark, references, tasks, pool = demo
    steps = steps_of(demo, seed=0)
    assert steps
    by_key = {benchmark.task_key(t): t for t in tasks}
    for step in steps:
        reference = list(references[step.task].actions)
        history = [s.action for s in step.history]
        executed, transitions = asyncio.run(replay(pool.workers[0], by_key[step.task], history + [step.action]))
        assert executed == history + [step.action]
        valid = [a for t, a in enumerate(history) if benchmark.valid_action(a, transitions[t])]
        assert valid == reference[:len(valid)]  # the reference's own earlier steps, in order
        assert step.action == reference[len(valid)]
        assert 1 <= len(history) - len(valid) <= 5  # the inserted turns, each refused where it was played
        assert transitions[-2].observation == step.current.observation
        _, after = asyncio.run(replay(pool.workers[0], by_key[step.task], history + reference[len(valid):]))
        assert benchmark.accepts_reference(after[-1])  # they left the state as it was: the reference still succeeds


def test_the_draws_follow_the_seed_alone(demo):
    first, again, other = steps_of(demo, seed=3), steps_of(demo, seed=3), steps_of(demo, seed=4)
    key = [(s.task, tuple(h.action for h in s.history), s.action) for s in first]
    assert key == [(s.task, tuple(h.action for h in s.history), s.action) for s in again]
    assert key != [(s.task, tuple(h.action for h in s.history), s.action) for s in other]


def test_an_invalid_action_is_one_the_benchmark_refuses(demo):
    benchmark, references, tasks, pool = demo
    current = asyncio.run(pool.workers[0].areset(tasks[0]))
    actions = list(references[benchmark.task_key(tasks[0])].actions)
    rng = random.Random(0)
    for _ in range(50):
        action = invalid_action(benchmark, rng, actions, current)
        assert action is not None and not benchmark.valid_action(action, current)


def test_bad_counts_are_refused(demo):
    with pytest.raises(ValueError, match="variants=0"):
        steps_of(demo, seed=0, variants=0)

"""Inverse-dynamics examples of other actions (``actfirst.train.inverse_dynamics``), played in the real ScienceWorld
from the demo's shipped references: each alternative is an admissible action of the reference action's command that
B.5 accepts, its context is the reference step's, its next observation is what the simulator answers to it after the
reference's earlier steps and differs from the reference next observation and the step's other alternatives."""

import asyncio
import random

import pytest
from train_helpers import demo_references

from actfirst.core.config import ConfigError, SFTConfig
from actfirst.preparation.reference_cache import replay
from actfirst.train.inverse_dynamics import alternative_steps, candidates, nearest_first
from actfirst.train.sft import expert_steps


@pytest.fixture(scope="module")
def demo():
    with demo_references(3) as (benchmark, references, tasks, pool):
        steps = asyncio.run(expert_steps(benchmark, pool, tasks, references))
        yield benchmark, references, tasks, pool, steps


def alternatives_of(demo, seed, alternatives=2):
    benchmark, references, tasks, pool, steps = demo
    return asyncio.run(alternative_steps(benchmark, pool, tasks, references, steps, alternatives=alternatives,
                                         seed=seed))


def test_each_alternative_is_another_valid_action_whose_observation_only_it_gives(demo):
    benchmark, references, tasks, pool, steps = demo
    found = alternatives_of(demo, seed=0)
    assert len(found) > len(steps)  # most steps have two (a focus among a room's animals, a move among its doors)
    by_context = {(s.task, len(s.history)): s for s in steps}
    by_key = {benchmark.task_key(t): t for t in tasks}
    observations: dict[tuple[str, int], list[str]] = {}
    for alt in found:
        step = by_context[(alt.task, len(alt.history))]
        assert (alt.history, alt.current) == (step.history, step.current)
        assert alt.action != step.action and alt.action.split()[0] == step.action.split()[0]
        assert alt.action in step.current.admissible and benchmark.valid_action(alt.action, step.current)
        executed, transitions = asyncio.run(replay(pool.workers[0], by_key[alt.task],
                                                   [h.action for h in alt.history] + [alt.action]))
        assert executed[-1] == alt.action and transitions[-1].observation == alt.next_observation
        observations.setdefault((alt.task, len(alt.history)), [step.next_observation]).append(alt.next_observation)
    for seen in observations.values():
        normalized = [benchmark.normalize_observation(o) for o in seen]
        assert len(set(normalized)) == len(normalized)


def test_the_candidates_share_the_command_and_the_draw_follows_the_seed_alone(demo):
    benchmark, _, _, _, steps = demo
    focus = next(s for s in steps if s.action.startswith("focus on"))
    assert candidates(benchmark, focus) and all(a.startswith("focus ") for a in candidates(benchmark, focus))
    first, again, other = alternatives_of(demo, seed=3), alternatives_of(demo, seed=3), alternatives_of(demo, seed=4)
    assert [(s.task, s.action) for s in first] == [(s.task, s.action) for s in again]
    assert [(s.task, s.action) for s in first] != [(s.task, s.action) for s in other]


def test_bad_counts_are_refused(demo):
    with pytest.raises(ValueError, match="alternatives=0"):
        alternatives_of(demo, seed=0, alternatives=0)
    with pytest.raises(ConfigError, match="inverse_dynamics_alternatives"):
        SFTConfig(epochs=1, lr=1e-3, modes=["full_response"], inverse_dynamics_alternatives=2)
    with pytest.raises(ConfigError, match="inverse_dynamics_alternatives"):
        SFTConfig(epochs=1, lr=1e-3, inverse_dynamics_alternatives=-1)


def test_the_nearest_alternatives_come_first_in_the_seeds_order():
    actions = ["focus on fountain", "focus on baby baby wolf", "focus on egg crocodile", "focus on egg turtle",
               "focus on baby baby mouse", "focus on agent"]
    orders = {tuple(nearest_first("focus on egg parrot", actions, random.Random(seed))) for seed in range(20)}
    for order in orders:
        assert sorted(order) == sorted(actions)
        assert set(order[:2]) == {"focus on egg crocodile", "focus on egg turtle"}  # three shared words, then two
    assert len(orders) > 1  # within a count, the order is the seed's

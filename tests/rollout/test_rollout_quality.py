"""The rollout-quality measurement (C.5, Figure 4) end to end on the real engine and generated ALFWorld games.

The student's hand-set weights (this folder's bigram machine, ``load_chain``) answer every prompt, full-response,
next-action and inverse-dynamics alike, with ``<action>look</action>``: every strategy looks three times. The first
look's feedback is new and it adds a fact (the place is ``checked``), so the second look is a first execution in a
new state; the third repeats the second's (state, action) pair with nothing new since and produces nothing new: an
unproductive repetition, at turn 2 only. ActFirst-OPD's first transition check fails against the reference (it
looks, the reference moves), and it falls back to NAP for good.
"""

import asyncio

import pytest

from actfirst.core.config import RolloutConfig, SchedulerConfig, ThinkingBudgetConfig
from actfirst.envs.alfworld.config import ALFWorldConfig
from actfirst.envs.base import Reference, Transition
from actfirst.envs.benchmarks import get_benchmark
from actfirst.evaluation.evaluate import episode_seed, seed_stride
from actfirst.evaluation.quality import STRATEGIES, measure_quality, quality_rollout_config
from actfirst.rollout.runner import RolloutRunner
from actfirst.rollout.strategies import make_strategy

pytestmark = pytest.mark.engine

MAX_TURNS = 3
BUDGET = ThinkingBudgetConfig(first_stage=8, total=12, second_stage=4, fast_action_tokens=6)
ROLLOUT = RolloutConfig(strategy="vanilla", temperature=0.6, top_p=0.9, max_prompt_tokens=900, budget=BUDGET)
"""What the training config says; the measurement replaces the sampling and the action-only limit by C.5's."""


def reference(benchmark, task, first: Transition) -> Reference:
    """A reference whose first step the student's ``look`` cannot match (a move to somewhere it never goes)."""
    moved = Transition(observation="You arrive at nowhere 1.", admissible=first.admissible, score=0.0, done=False,
                       won=False)
    return Reference(benchmark.task_key(task), ["go to nowhere 1"], [first, moved], "test")


@pytest.fixture(scope="module")
def setup(alfworld_games):
    from actfirst.envs.alfworld.env import ALFWorldTextEnv

    benchmark = get_benchmark("alfworld", ALFWorldConfig(games="generated", max_turns=MAX_TURNS))
    tasks = alfworld_games[:3]
    env = ALFWorldTextEnv(max_turns=MAX_TURNS)
    try:
        firsts = [env.reset(task) for task in tasks]
        first_state = env.state()  # the last task's, from an environment in this process
    finally:
        env.close()
    references = {benchmark.task_key(t): reference(benchmark, t, f) for t, f in zip(tasks, firsts, strict=True)}
    return benchmark, tasks, references, first_state


@pytest.fixture
def look(load_chain, tokenizer):
    prompt_end = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True,
                                               tokenize=True, return_dict=False)[-1]
    load_chain([prompt_end, *tokenizer.encode("<action>look</action>", add_special_tokens=False),
                tokenizer.convert_tokens_to_ids("<|im_end|>")])


def test_three_strategies_on_the_same_tasks_with_matched_seeds(engine, tokenizer, setup, look):
    benchmark, tasks, references, first_state = setup
    engine.reconfigure(SchedulerConfig(b_max=8))
    report = asyncio.run(measure_quality(engine, tokenizer, benchmark, tasks, references=references, rollout=ROLLOUT,
                                         seed=42, max_in_flight=3, progress=False))
    keys = [benchmark.task_key(t) for t in tasks]
    assert report.strategies == list(STRATEGIES) == ["vanilla", "no_id", "actfirst"]
    assert [(e.strategy, e.index) for e in report.episodes] == [(s, i) for s in STRATEGIES for i in range(3)]
    stride = seed_stride(benchmark, quality_rollout_config(ROLLOUT, 3))
    for index, key in enumerate(keys):
        rows = [report.records(name)[index] for name in STRATEGIES]
        assert {r.task for r in rows} == {key}
        # Turn t of task i samples the executed action with one seed under every strategy: (seed, i, t) alone.
        expected = [episode_seed(42, index, stride) + 2 * t + 1 for t in range(MAX_TURNS)]
        assert all(r.seeds == expected for r in rows)
        vanilla, no_id, actfirst = rows
        assert (vanilla.full_responses, no_id.full_responses, actfirst.full_responses) == (MAX_TURNS, 0, 0)
        assert (vanilla.fallback_turn, no_id.fallback_turn, actfirst.fallback_turn) == (None, None, 0)
        for r in rows:
            assert r.failure is None and not r.success and r.turns == MAX_TURNS and r.invalid_turns == 0
            assert r.repetitions == [2]

    summary = report.summary()
    for name in STRATEGIES:
        assert summary[name] == {"tasks": 3, "repeat_pct": 100.0, "yield_per_100": 0.0, "mean_turns": MAX_TURNS,
                                 "SR": 0.0, "tasks_with_repetition": 3, "repetitions": 3, "successes": 0,
                                 "transitions": 9, "invalid_turns": 0, "failures": 0}
    meta = report.meta
    assert meta["state"] == benchmark.state_source == "positive facts and the task-success flag"
    assert (meta["rollout"]["temperature"], meta["rollout"]["top_p"]) == (1.0, 1.0)  # C.5, whatever the config says
    assert meta["rollout"]["budget"]["fast_action_tokens"] == 512
    assert (meta["rollout"]["budget"]["first_stage"], meta["rollout"]["budget"]["total"]) == (8, 12)  # training B.3
    assert "| ActFirst-OPD | 3 | 100.0 | 0.00 | 3.00 | 0.0 |" in report.table()

    # The states the rule compared are the facts: a traced episode's, against an environment's own state() in this
    # process; the first look adds a fact, the others none.
    async def traced():
        from actfirst.envs.workers import EnvPool

        with EnvPool(benchmark.env_spec(), size=1) as pool:
            runner = RolloutRunner(engine=engine, tokenizer=tokenizer, benchmark=benchmark, pool=pool,
                                   strategy=make_strategy("no_id"), cfg=quality_rollout_config(ROLLOUT, 1),
                                   references=None, full_responses=False, trace=True)
            return await runner.run_episode(tasks[-1], pool.workers[0], seed=5)

    episode = asyncio.run(traced())
    assert [t.action for t in episode.turns] == ["look"] * MAX_TURNS
    assert episode.full_responses == [] and episode.contexts == []
    assert len(episode.transitions) == len(episode.states) == MAX_TURNS + 1 and episode.states[0] == first_state
    assert episode.states[1] == episode.states[2] == episode.states[3] != first_state
    assert any(fact.lower().startswith("atlocation(") for fact in first_state.content), first_state.content[:5]

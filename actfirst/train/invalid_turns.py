"""Reference steps after invalid turns: examples for the histories that a failing rollout builds.

The built models learn from the references' own steps (``actfirst.train.sft``), whose histories hold a few valid
turns. A small student's failing rollouts run to the turn limit with most of their turns invalid actions (the
rollout-bound demo's 96-epoch warm start at 30 turns: 18 to 26 of the 30 in each failed evaluation episode), and the
contexts they visit are the ones OPD's teacher scores most often. :func:`invalid_turn_steps` makes such contexts from
the references: each is replayed with invalid actions inserted before one of its steps (their number uniform in 1 to
``max_turns``), each drawn from what a small model writes when it errs (:func:`invalid_action`) and kept only where
``Benchmark.valid_action`` (B.5) refuses it, so that the simulator answers it and its state stays as it was; a replay
that then fails to reach the reference's success gives nothing. The reference's steps after the insertion are
returned: their histories hold the invalid turns, their actions are the reference's own; the invalid turns are never
targets. ``bench/invalid_turn_histories.py`` measures how the built models read such contexts.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from actfirst.envs.base import Reference, Transition
from actfirst.envs.benchmarks import Benchmark
from actfirst.train.sft import ExpertStep, goal, replayed_steps

DRAWS = 16
"""How many candidates :func:`invalid_action` draws before it gives up on a context."""


def invalid_action(benchmark: Benchmark, rng: random.Random, actions: Sequence[str], current: Transition) -> str | None:
    """An action that ``benchmark`` refuses in ``current``, of one of the kinds a small model writes when it errs:
    an empty action, one of the reference's ``actions`` with a word doubled or played where it does not apply, an
    action command with its placeholder unfilled, or a thought run into an action ("go to find the animal ... The
    next step is: go to outside"). None when ``DRAWS`` candidates were all valid."""
    commands = benchmark.action_commands(current)
    for _ in range(DRAWS):
        action = rng.choice(actions)
        words = action.split()
        verb, other = words[0] if words else "go", rng.choice(actions)
        run_on = f"{verb} {goal(current.task_description)}. The next step is: {other}"
        kinds = ["", action, _doubled(words, rng), run_on]
        if commands:
            kinds.append(rng.choice(commands))
        candidate = rng.choice(kinds)
        if not benchmark.valid_action(candidate, current):
            return candidate
    return None


def _doubled(words: list[str], rng: random.Random) -> str:
    if not words:
        return ""
    i = rng.randrange(len(words))
    return " ".join(words[:i + 1] + words[i:])


async def invalid_turn_steps(benchmark: Benchmark, pool: Any, tasks: Sequence[Any], references: dict[str, Reference],
                             *, variants: int, max_turns: int, seed: int = 0) -> list[ExpertStep]:
    """``variants`` replays of each task's reference with invalid turns inserted (see the module docstring), on the
    workers of ``pool``; the reference steps after the insertions, in task then variant order. A variant draws from
    (``seed``, task key, variant) alone, never from scheduling."""
    if variants < 1 or max_turns < 1:
        raise ValueError(f"variants={variants}, max_turns={max_turns}: must be >= 1")

    async def one(worker, job: tuple[Any, int]) -> list[ExpertStep]:
        task, v = job
        key = benchmark.task_key(task)
        return await _variant(benchmark, worker, task, references[key], random.Random(f"{seed}:{key}:{v}"), max_turns)

    jobs = [(task, v) for task in tasks for v in range(variants)]
    return [s for steps in await pool.map(one, jobs) for s in steps]


async def _variant(benchmark: Benchmark, worker: Any, task: Any, reference: Reference, rng: random.Random,
                   max_turns: int) -> list[ExpertStep]:
    """One replay of ``reference`` with 1 to ``max_turns`` invalid turns before one of its steps; its steps after them,
    or none when an invalid action could not be drawn or the replay no longer succeeds."""
    ref_actions = list(reference.actions)
    at, count = rng.randrange(len(ref_actions)), rng.randint(1, max_turns)
    transitions = [await worker.areset(task)]
    actions: list[str] = []
    for t, action in enumerate(ref_actions):
        if t == at:
            for _ in range(count):
                junk = invalid_action(benchmark, rng, ref_actions, transitions[-1])
                if junk is None:
                    return []
                actions.append(junk)
                transitions.append(await worker.astep(junk))
        if transitions[-1].done:
            return []
        actions.append(action)
        transitions.append(await worker.astep(action))
    if not benchmark.accepts_reference(transitions[-1]):
        return []
    return replayed_steps(reference.task, actions, transitions, start=at + count)

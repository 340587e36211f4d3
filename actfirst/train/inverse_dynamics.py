"""Inverse-dynamics examples whose action only the reference next observation gives.

A reference step's inverse-dynamics example (``actfirst.train.sft``) shows the context c_t and the reference next
observation o_{t+1}, and asks for a_t; but c_t alone already gives a_t there (the next-action example of the same step
asks for it from c_t alone). A small model trained on them learns to answer from its memory of the references and
not from o_{t+1}: the rollout-bound demo's 96-epoch warm start, given "You focus on the baby brown bear." as the
reference next observation, proposes "focus on egg parrot", an animal of its own references (bench/RESULTS.md).

:func:`alternative_steps` makes, at each reference step, up to ``alternatives`` steps of the same context with another
action: one the step's admissible list holds, of the reference action's own command (its first word, ScienceWorld's
"focus on X" for another X, "go to Y" for another room), nearest to it first (:func:`nearest_first`: for "focus on
egg parrot", the room's other eggs), which B.5's validity accepts and whose observation, executed
in the simulator after the reference's earlier steps, differs from the reference next observation and from the other
alternatives'. Each is an :class:`~actfirst.train.sft.ExpertStep` whose action is the alternative and whose next
observation is what the simulator answered: an inverse-dynamics example from it can be solved only by reading o_{t+1}.
The context and its history are the reference's recorded ones (as the reference steps', so that the simulator's
listing order does not enter them); only the alternative's observation is live.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any

from actfirst.envs.base import Reference
from actfirst.envs.benchmarks import Benchmark
from actfirst.preparation.reference_cache import replay
from actfirst.train.sft import ExpertStep

TRIES = 3
"""Candidates executed per alternative wanted, at most, before a step gives fewer."""


def candidates(benchmark: Benchmark, step: ExpertStep) -> list[str]:
    """The admissible actions of ``step``'s context that share its action's command (first word), differ from it and
    B.5 accepts, sorted (the simulator's list order varies between loads)."""
    words = step.action.split()
    if not words or step.current.admissible is None:
        return []
    command = words[0]
    return sorted({a for a in step.current.admissible
                   if a.split()[:1] == [command] and a != step.action and benchmark.valid_action(a, step.current)})


def nearest_first(action: str, actions: Sequence[str], rng: random.Random) -> list[str]:
    """``actions`` with those sharing the most leading words with ``action`` first, in ``rng``'s order within each
    count ("focus on egg parrot": another "focus on egg ..." before "focus on fountain"): the alternatives that differ
    from the reference action where the observation names what differs."""
    words = action.split()

    def shared(other: str) -> int:
        n = 0
        for a, b in zip(words, other.split(), strict=False):
            if a != b:
                break
            n += 1
        return n

    keyed = [(rng.random(), a) for a in actions]
    return [a for _, a in sorted(keyed, key=lambda k: (-shared(k[1]), k[0]))]


async def alternative_steps(benchmark: Benchmark, pool: Any, tasks: Sequence[Any], references: dict[str, Reference],
                            steps: Sequence[ExpertStep], *, alternatives: int, seed: int = 0) -> list[ExpertStep]:
    """Up to ``alternatives`` steps per step of ``steps`` (the tasks' reference steps, ``expert_steps``) with another
    action and the simulator's observation of it (see the module docstring), on the workers of ``pool``; in the order
    of ``steps``. A step's draw depends on (``seed``, task, turn) alone, never on scheduling."""
    if alternatives < 1:
        raise ValueError(f"alternatives={alternatives}: must be >= 1")
    by_key = {benchmark.task_key(t): t for t in tasks}

    async def one(worker, step: ExpertStep) -> list[ExpertStep]:
        task = by_key[step.task]
        prefix = list(references[step.task].actions[:len(step.history)])
        rng = random.Random(f"{seed}:{step.task}:{len(step.history)}")
        pool_of = nearest_first(step.action, candidates(benchmark, step), rng)
        seen = {benchmark.normalize_observation(step.next_observation)}
        out: list[ExpertStep] = []
        for action in pool_of[:TRIES * alternatives]:
            executed, transitions = await replay(worker, task, prefix + [action])
            observation = transitions[-1].observation
            normalized = benchmark.normalize_observation(observation)
            if executed != prefix + [action] or normalized in seen:
                continue
            seen.add(normalized)
            out.append(dataclasses.replace(step, action=action, next_observation=observation))
            if len(out) == alternatives:
                break
        return out

    return [s for found in await pool.map(one, list(steps)) for s in found]

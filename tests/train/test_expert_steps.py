"""The expert steps the built models learn from (``actfirst.train.sft.expert_steps``), on the real ScienceWorld: each
observation is the reference's recorded one, so a preparation builds the same examples whatever order this load of
the simulator lists a room's contents in (it varies between loads: the 96-epoch warm start of the rollout-bound demo
played 18.8%, 37.5% and 56.2% on the same 32 episodes across three builds of one command, bench/RESULTS.md)."""

import asyncio
import dataclasses

from actfirst.envs.benchmarks import get_benchmark
from actfirst.envs.workers import EnvPool
from actfirst.preparation.build import load_run_config
from actfirst.preparation.reference_cache import load_references
from actfirst.train.sft import expert_steps

TASK = "lifespan-longest-lived/0"


def listed_in_another_order(observation: str) -> str:
    """The observation with its tab-indented lines in reverse order, as another load of the simulator might list a
    room's contents."""
    lines = observation.split("\n")
    listed = [i for i, line in enumerate(lines) if line.startswith("\t")]
    for i, line in zip(listed, reversed([lines[i] for i in listed]), strict=True):
        lines[i] = line
    return "\n".join(lines)


def test_every_observation_of_the_expert_steps_is_the_references_recorded_one():
    cfg = load_run_config(None, [])
    benchmark = get_benchmark(cfg.benchmark, cfg.env)
    reference = load_references(cfg.references)[TASK]
    recorded = [dataclasses.replace(t, observation=listed_in_another_order(t.observation))
                for t in reference.transitions]
    assert recorded[0].observation != reference.transitions[0].observation  # the reset lists the hallway's contents
    references = {TASK: dataclasses.replace(reference, transitions=recorded)}
    tasks = [t for t in benchmark.tasks("train") if benchmark.task_key(t) == TASK]
    with EnvPool(benchmark.env_spec(), size=1) as pool:
        steps = asyncio.run(expert_steps(benchmark, pool, tasks, references))
    assert [s.action for s in steps] == reference.actions
    for t, step in enumerate(steps):
        assert step.current.observation == recorded[t].observation
        assert step.next_observation == recorded[t + 1].observation
        assert [h.observation for h in step.history] == [r.observation for r in recorded[:t]]
        assert step.current.objects and step.current.templates  # the replay's own: the cache holds no objects

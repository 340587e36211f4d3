"""Fault injection: a benchmark whose environment takes long to start and whose step crashes or hangs its worker,
for the worker tests that need a restart or a hung call without waiting on a JVM. It is not registered: its workers
receive its class by reference (``Benchmark.env_spec``).

Its environment is a one-room stand-in: ``reset`` answers at once; ``step`` answers, ends the worker process
(``crash``: ``os._exit``, as a simulator's native crash would) or never answers (``hang``), as configured.
"""

from __future__ import annotations

import dataclasses
import os
import time

from actfirst.envs.base import TextEnv, Transition
from actfirst.envs.benchmarks import Benchmark
from actfirst.envs.checks import PASSED


@dataclasses.dataclass(kw_only=True, slots=True)
class FaultInjectionConfig:
    max_turns: int = 4
    start_delay_s: float = 0.0
    """How long every start of the environment takes (each restart's too)."""
    step: str = "answer"
    """What a step does: ``answer``, ``crash`` (the worker process exits) or ``hang`` (no reply, ever)."""


class FaultInjectionEnv(TextEnv):
    benchmark = "fault_injection"

    def __init__(self, config: FaultInjectionConfig) -> None:
        time.sleep(config.start_delay_s)
        self.max_turns, self.fault = config.max_turns, config.step
        self.turn = 0

    def reset(self, task: int, admissible: bool = True) -> Transition:
        self.turn = 0
        return Transition(observation=f"task {task}", admissible=("wait",), score=0.0, done=False, won=False)

    def step(self, action: str) -> Transition:
        if self.fault == "crash":
            os._exit(1)
        if self.fault == "hang":
            time.sleep(3600)
        self.turn += 1
        return Transition(observation="waited", admissible=("wait",), score=0.0, done=False, won=False,
                          turn=self.turn)

    def close(self) -> None:
        pass


class FaultInjectionBenchmark(Benchmark):
    name = "fault_injection"
    config_class = FaultInjectionConfig

    def make_env(self) -> TextEnv:
        return FaultInjectionEnv(self.config)

    def prompt_fields(self, current: Transition) -> dict[str, str]:
        return {}

    def valid_action(self, action: str, current: Transition) -> bool:
        return action in current.admissible

    def _check(self, reference, t, *, action, current, next, previous):
        return PASSED

    def task_key(self, task: int) -> str:
        return str(task)

    def task_type(self, task: int) -> str:
        return "any"

    def _tasks(self, split: str) -> list:
        return [0]


def fault_injection_spec(**config):
    """The worker spec of the fault-injection environment under ``config`` (``FaultInjectionConfig``'s fields)."""
    return FaultInjectionBenchmark(FaultInjectionConfig(**config)).env_spec()

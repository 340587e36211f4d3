"""Fault injection: the toy benchmark (``toy_benchmark.py``) with a simulator's faults, registered through
``benchmark_module: fault_injection_toy`` (``tests/toy`` on ``PYTHONPATH``; ``tests/train/test_faults.py``):

- ``fault_injection_reset``: every ``reset`` raises, as a simulator that cannot start an episode would (a broken JVM,
  a missing game file). Every episode fails before its first turn and every rollout batch gives no sample: the run
  must stop with one clear error (``max_empty_batches``), not spin.
- ``fault_injection_hang``: every ``step`` hangs once a flag file exists, as a stuck simulator would: Ctrl-C must
  still end the run promptly.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from toy_benchmark import ToyBenchmark, ToyConfig, ToyEnv, ToyTask

from actfirst.envs.base import TextEnv, Transition
from actfirst.envs.benchmarks import register_benchmark


class FaultInjectionResetEnv(ToyEnv):
    """The toy's corridor whose ``reset`` always raises."""

    def reset(self, task: ToyTask, admissible: bool = True) -> Transition:
        raise RuntimeError(f"fault injection: reset of {task} always fails")


@register_benchmark
class FaultInjectionResetBenchmark(ToyBenchmark):
    name = "fault_injection_reset"

    def make_env(self) -> TextEnv:
        return FaultInjectionResetEnv(self.config.max_turns)


@dataclasses.dataclass(kw_only=True, slots=True)
class FaultInjectionHangConfig(ToyConfig):
    hang_flag: str
    """A path: once a file is there, every ``step`` hangs (never answers)."""


class FaultInjectionHangEnv(ToyEnv):
    """The toy's corridor whose ``step`` never answers once the flag file exists."""

    def __init__(self, max_turns: int, hang_flag: str) -> None:
        super().__init__(max_turns)
        self.hang_flag = Path(hang_flag)

    def step(self, action: str) -> Transition:
        if self.hang_flag.exists():
            time.sleep(3600)
        return super().step(action)


@register_benchmark
class FaultInjectionHangBenchmark(ToyBenchmark):
    name = "fault_injection_hang"
    config_class = FaultInjectionHangConfig

    def make_env(self) -> TextEnv:
        return FaultInjectionHangEnv(self.config.max_turns, self.config.hang_flag)

"""Fault injection: the toy benchmark (``toy_benchmark.py``) whose every ``reset`` raises, as a simulator that
cannot start an episode would (a broken JVM, a missing game file). Every episode then fails before its first turn
and every rollout batch gives no sample: the run must stop with one clear error (``max_empty_batches``), not spin
(``tests/train/test_faults.py``). Registered as ``fault_injection_reset`` through ``benchmark_module:
fault_injection_toy`` (``tests/toy`` on ``PYTHONPATH``)."""

from __future__ import annotations

from toy_benchmark import ToyBenchmark, ToyEnv, ToyTask

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

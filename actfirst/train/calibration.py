"""The paper's calibration of Eq. 36 (000 Appendix C.5): l_fast and l_full from single requests on an idle engine,
on a run's student, contexts and budgets; then Eq. 36's predicted rollout speedup for T turns.

The engine admits one request at a time (b_max 1, fast actions wait for the slot), and the episodes are played one
after another on one environment worker, so every timed request is alone on the engine; its time is its in-slot
latency (admission to completion, ``GenerationResult.latency_s``; a full response's budget stages summed). Two passes
over the same training tasks, each the student's own episodes:

- full responses: think-then-act (Vanilla OPD), every turn a full response with the run's B.3 budget; nothing else
  runs while it decodes (the environment steps after it has finished);
- fast actions: the run's strategy without its full responses (``RolloutRunner(full_responses=False)``): inverse
  dynamics with the reference next observation while guidance holds, then next-action prediction, as the run's fast
  actions; a strategy without fast actions, or one that intervenes (UOPD), is replaced by next-action prediction
  (``no_id``). Each fast action runs alone; the environment steps after it.

l_fast and l_full are the medians over every request of their pass (the paper's per-request latencies); Eq. 36 then
gives T l_full / ((T - 1) l_fast + max(l_fast, l_full)) (``actfirst.train.speedup.eq36_speedup``).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from actfirst.core.config import RolloutConfig, SchedulerConfig
from actfirst.engine.core import ActFirstEngine
from actfirst.engine.request import RequestKind, SamplingSpec
from actfirst.envs.base import Reference
from actfirst.envs.benchmarks import Benchmark
from actfirst.envs.workers import EnvPool, EnvWorker
from actfirst.rollout.runner import EpisodeResult, RolloutRunner
from actfirst.rollout.strategies import RolloutStrategy, make_strategy
from actfirst.train.speedup import eq36_speedup

logger = logging.getLogger(__name__)

IDLE = SchedulerConfig(b_max=1, fast_action_admission="wait")
"""One request in the engine at a time."""


def spread(tasks: Sequence[Any], n: int) -> list[Any]:
    """``n`` of ``tasks``, evenly spaced (all of them when ``n`` >= their number)."""
    if n < 1:
        raise ValueError(f"episodes={n}: must be >= 1")
    if n >= len(tasks):
        return list(tasks)
    return [tasks[int((j + 0.5) * len(tasks) / n)] for j in range(n)]


def fast_action_strategy(strategy: RolloutStrategy) -> RolloutStrategy:
    """The strategy whose fast actions the calibration times: the run's, or next-action prediction where the run's
    has no fast actions or intervenes (see the module docstring)."""
    return strategy if strategy.fast_actions and not strategy.intervenes else make_strategy("no_id")


async def _play(runner: RolloutRunner, worker: EnvWorker, tasks: Sequence[Any], *, seed: int, label: str,
                progress: bool) -> list[EpisodeResult]:
    """Every task's episode, one after another, with a progress line and an ETA."""
    episodes, start = [], time.perf_counter()
    for j, task in enumerate(tasks):
        episodes.append(await runner.run_episode(task, worker, seed=seed + 1_031 * j))
        if progress:
            done = time.perf_counter() - start
            logger.info(f"[calibration] {label}: episode {j + 1}/{len(tasks)}, {done:.0f} s, ETA "
                        f"{done / (j + 1) * (len(tasks) - j - 1):.0f} s")
    return episodes


async def calibrate(engine: ActFirstEngine, tokenizer: PreTrainedTokenizerBase, benchmark: Benchmark,
                    tasks: Sequence[Any], pool: EnvPool, *, rollout: RolloutConfig, strategy: RolloutStrategy,
                    references: dict[str, Reference] | None, turns: Sequence[int] | None = None, seed: int = 0,
                    progress: bool = True) -> dict[str, Any]:
    """Time single requests on the idle ``engine`` (reconfigured to :data:`IDLE`; it must have nothing in flight)
    over ``tasks``' episodes played on ``pool``'s first worker (see the module docstring); returns l_fast and l_full
    (s), every latency, the requests' token counts, and Eq. 36's speedup for each of ``turns`` (None: the benchmark's
    turn limit and the mean turns of the think-then-act episodes). ``references``: the tasks' reference cache when
    ``strategy`` uses one."""
    if turns is not None and (not turns or min(turns) < 1):
        raise ValueError(f"turns={list(turns)}: need at least one T >= 1")
    engine.reconfigure(IDLE)
    warm = tokenizer.encode("warm up the engine", add_special_tokens=False)  # a first request's one-time costs
    await engine.generate(warm, RequestKind.FULL_RESPONSE, SamplingSpec(max_tokens=8, seed=seed))
    engine.records.clear()
    fast_strategy = fast_action_strategy(strategy)
    runners = {
        "full": RolloutRunner(engine=engine, tokenizer=tokenizer, benchmark=benchmark, pool=pool,
                              strategy=make_strategy("vanilla"), cfg=rollout, references=None, seed=seed),
        "fast": RolloutRunner(engine=engine, tokenizer=tokenizer, benchmark=benchmark, pool=pool,
                              strategy=fast_strategy, cfg=rollout, seed=seed, full_responses=False,
                              references=references if fast_strategy.uses_references else None)}
    played = {name: await _play(runner, pool.workers[0], tasks, seed=seed, label=f"{name} pass", progress=progress)
              for name, runner in runners.items()}
    full = [r for e in played["full"] for r in e.full_responses]
    fast = [t.fast for e in played["fast"] for t in e.turns if t.fast is not None]
    if not full or not fast:
        failures = [e.failure for es in played.values() for e in es if e.failure]
        raise RuntimeError(f"{len(full)} full responses and {len(fast)} fast actions timed: need both "
                           f"(failed episodes: {failures})")
    l_full, l_fast = statistics.median(r.latency_s for r in full), statistics.median(a.latency_s for a in fast)
    played = {name: statistics.mean(e.num_turns for e in es) for name, es in played.items()}
    if turns is None:
        turns = sorted({benchmark.max_turns, max(1, round(played["full"]))})
    return {
        "b_max": IDLE.b_max, "episodes": len(tasks), "tasks": [benchmark.task_key(t) for t in tasks],
        "fast_strategy": fast_strategy.name, "l_fast_s": l_fast, "l_full_s": l_full,
        "requests": {"full": len(full), "fast": len(fast)},
        "tokens_mean": {"full": statistics.mean(len(r.token_ids) for r in full),
                        "fast": statistics.mean(len(a.token_ids) for a in fast)},
        "latencies_s": {"full": [r.latency_s for r in full], "fast": [a.latency_s for a in fast]},
        "turns_played": played,
        "peak_in_flight": engine.peak_in_flight,
        "queue_wait_max_s": max(r.queue_wait_s for r in engine.records),
        "eq36": {str(t): eq36_speedup(l_fast=l_fast, l_full=l_full, turns=t) for t in turns}}

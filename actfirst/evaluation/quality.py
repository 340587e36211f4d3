"""Measuring a frozen checkpoint's rollout quality, the library under ``python -m actfirst.rollout_quality`` (Sec.
5.4, Appendix C.5, Figure 4): think-then-act, direct action without reference next observations, and ActFirst-OPD's
reference-conditioned interaction, played on the same tasks.

::

    report = await measure_quality(engine, tokenizer, benchmark, tasks, references=refs, rollout=cfg.rollout)
    print(report.table()); Path("quality.json").write_text(report.to_json())

Each strategy plays one episode per task: ``vanilla`` (think-then-act) executes its full response's action under the
training thinking budget (B.3); ``no_id`` (direct action) executes next-action-prediction fast actions from the
first turn; ``actfirst`` executes inverse-dynamics fast actions with the training transition checks and the
persistent NAP fallback. No full response is generated for a fast action's context and nothing is scored or updated
(the runner's ``full_responses=False``). Every request samples at temperature 1.0 and top-p 1.0 without top-k;
action-only requests stop at ``</action>`` or 512 generated tokens; an episode ends at the benchmark's turn limit.
Task i's turn t samples its action with the same seed under every strategy, a function of (``seed``, i, t) alone
(``actfirst.evaluation.evaluate.episode_seed``, ``actfirst.rollout.runner.matched_base``); the NAP request that replaces
an invalid inverse-dynamics proposal (B.5) samples with a seed of its own.

The environment's state after every transition (``TextEnv.state``, as ``Benchmark.state_source`` says: ALFWorld's
positive facts, ScienceWorld's look-around and inventory text as a stand-in, each with the success flag) feeds the
repetition rule of ``actfirst.evaluation.quality_metrics``; benchmarks without a state (WebShop, Search) are refused. An
episode whose worker died or whose environment raised counts as a failed task and is listed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from actfirst.core.config import RolloutConfig
from actfirst.envs.base import Reference
from actfirst.envs.benchmarks import Benchmark
from actfirst.evaluation.evaluate import MAX_TASKS, episode_seed, play_jobs, seed_stride
from actfirst.evaluation.quality_metrics import (
    STRATEGY_LABELS,
    EpisodeTrace,
    QualityEpisode,
    QualityReport,
    TraceTurn,
    unproductive_repetitions,
)

if TYPE_CHECKING:
    from actfirst.rollout.runner import EpisodeResult

logger = logging.getLogger(__name__)

STRATEGIES = tuple(STRATEGY_LABELS)
"""Figure 4's strategies: think-then-act, direct action, ActFirst-OPD."""
ACTION_TOKENS = 512
"""C.5: action-only requests stop at </action> or this many generated tokens."""


def quality_rollout_config(rollout: RolloutConfig, max_in_flight: int) -> RolloutConfig:
    """``rollout`` at C.5's settings: temperature 1.0, top-p 1.0, 512-token action-only requests, the training
    thinking budget, ``max_in_flight`` episodes at once."""
    budget = dataclasses.replace(rollout.budget, fast_action_tokens=ACTION_TOKENS)
    return dataclasses.replace(rollout, temperature=1.0, top_p=1.0, batch_tasks=max_in_flight, budget=budget)


def model_len_needed(cfg: RolloutConfig) -> int:
    """The prompt budget plus the longest response: a full response's or an action-only request's."""
    return cfg.max_prompt_tokens + max(cfg.budget.total, cfg.budget.fast_action_tokens)


def check_measurable(benchmark: Benchmark, engine_max_model_len: int, cfg: RolloutConfig) -> None:
    """Raise ``ValueError`` when the benchmark has no environment state, or a prompt plus the longest response does
    not fit the engine's max_model_len."""
    if benchmark.state_source is None:
        raise ValueError(f"benchmark {benchmark.name!r}: no environment state to compare (C.5's state-action pairs)")
    need = model_len_needed(cfg)
    if need > engine_max_model_len:
        raise ValueError(f"rollout.max_prompt_tokens={cfg.max_prompt_tokens} + the longest response "
                         f"({need - cfg.max_prompt_tokens} tokens) = {need} exceeds the engine's max_model_len="
                         f"{engine_max_model_len}")


def episode_trace(benchmark: Benchmark, episode: EpisodeResult) -> EpisodeTrace:
    """The repetition rule's record of a traced episode (``RolloutRunner(trace=True)``): each turn's action in the
    state before it, its C.5 validity there, and its feedback."""
    before, after = episode.transitions[:-1], episode.transitions[1:]
    turns = tuple(TraceTurn(state=state, action=turn.action, valid=benchmark.executed_valid(turn.action, current),
                            observation=nxt.observation)
                  for turn, current, state, nxt in zip(episode.turns, before, episode.states, after, strict=False))
    return EpisodeTrace(episode.transitions[0].observation if episode.transitions else "", turns)


def quality_episode(benchmark: Benchmark, strategy: str, index: int, episode: EpisodeResult) -> QualityEpisode:
    """The report's row of one played episode (a ``RolloutRunner`` ``EpisodeResult``)."""
    trace = episode_trace(benchmark, episode)
    return QualityEpisode(strategy=strategy, index=index, task=episode.task, task_type=episode.task_type,
                          success=episode.won and episode.failure is None, turns=episode.num_turns,
                          invalid_turns=sum(not t.valid for t in trace.turns),
                          repetitions=unproductive_repetitions(trace), seeds=[t.seed for t in episode.turns],
                          full_responses=len(episode.full_responses),
                          fallback_turn=episode.fallback_turn, failure=episode.failure)


async def measure_quality(engine, tokenizer, benchmark: Benchmark, tasks: Sequence[Any], *,
                          references: dict[str, Reference], rollout: RolloutConfig, seed: int = 42,
                          max_in_flight: int = 16, progress: bool = True) -> QualityReport:
    """Play every task once per strategy of Figure 4 at C.5's settings; see the module docstring."""
    from actfirst.envs.workers import EnvPool
    from actfirst.rollout.runner import RolloutRunner, matched_base
    from actfirst.rollout.strategies import make_strategy

    tasks = list(tasks)
    if not tasks or len(tasks) > MAX_TASKS:
        raise ValueError(f"{len(tasks)} tasks: need 1 to {MAX_TASKS}")
    if seed < 0 or max_in_flight < 1:
        raise ValueError(f"seed={seed}, max_in_flight={max_in_flight}: need seed >= 0 and max_in_flight >= 1")
    missing = [benchmark.task_key(t) for t in tasks if benchmark.task_key(t) not in references]
    if missing:
        raise ValueError(f"no reference for {len(missing)} of the {len(tasks)} tasks, e.g. {missing[:5]}")
    cfg = quality_rollout_config(rollout, max_in_flight)
    check_measurable(benchmark, engine.max_model_len, cfg)
    stride = seed_stride(benchmark, cfg)
    strategies = {name: make_strategy(name) for name in STRATEGIES}
    jobs = deque((index, name) for index in range(len(tasks)) for name in STRATEGIES)  # a task's episodes together
    total, episodes = len(jobs), []
    every = max(1, total // 20)
    started = time.perf_counter()

    with EnvPool(benchmark.env_spec(), size=min(max_in_flight, total), call_timeout_s=cfg.env_timeout_s) as pool:
        runners = {name: RolloutRunner(engine=engine, tokenizer=tokenizer, benchmark=benchmark, pool=pool,
                                       strategy=strategy, cfg=cfg, references=references, full_responses=False,
                                       trace=True) for name, strategy in strategies.items()}

        async def play(worker, job: tuple[int, str]) -> None:
            index, name = job
            base = matched_base(episode_seed(seed, index, stride), strategies[name])
            episode = await runners[name].run_episode(tasks[index], worker, seed=base)
            episodes.append(quality_episode(benchmark, name, index, episode))
            if episode.failure is not None:
                logger.warning(f"[quality] {name} task {episode.task}: episode failed ({episode.failure})")
            if progress and (len(episodes) % every == 0 or len(episodes) == total):
                logger.info(f"[quality {benchmark.name}] {len(episodes)}/{total} episodes, "
                            f"{len(episodes) / (time.perf_counter() - started):.2f} episodes/s")

        await play_jobs(pool.workers, jobs, play)

    meta = {"seed": seed, "num_tasks": len(tasks), "max_in_flight": max_in_flight, "state": benchmark.state_source,
            "rollout": dataclasses.asdict(cfg), "env": dataclasses.asdict(benchmark.config),
            "wall_s": time.perf_counter() - started}
    episodes.sort(key=lambda e: (STRATEGIES.index(e.strategy), e.index))
    return QualityReport(benchmark=benchmark.name, strategies=list(STRATEGIES), episodes=episodes, meta=meta)

"""Evaluating a student checkpoint as the run does, the library under ``python -m actfirst.eval`` (Appendix C.1,
C.4): think-then-act without references, the evaluation thinking budget, seeds 42, 43, 44; SR, Score (ScienceWorld,
WebShop), Round, mean and sample SD over the seeds, overall, per task type (ALFWorld: seen and unseen pooled) and per
evaluation split (``Benchmark.task_split``: ALFWorld's valid_seen and valid_unseen apart, as Table 1 reports them).

::

    report = await evaluate(engine, tokenizer, benchmark, benchmark.tasks("eval"), rollout=cfg.rollout)
    print(report.table()); Path("report.json").write_text(report.to_json())

Every task is played once per seed by the ``vanilla`` strategy (each turn executes its full response's action)
with ``rollout.budget.eval_first_stage`` / ``eval_total`` in place of the training budget. Up to ``max_in_flight``
episodes run at once on one engine and a pool of that many workers; a finished episode's worker takes the next
(seed, task) at once, so the pool stays full across episodes and seeds. Episode i of seed s samples with seeds
derived from (s, i) alone (never from scheduling), so a seed reproduces its run. An episode whose worker died or
whose environment raised counts as a failure and is listed in the report.

A training run's evaluation (its ``evaluation:`` section over its rollout, benchmark and tasks) is
:func:`run_evaluation`: the trainer plays it during the run, and ``python -m actfirst.eval --config`` plays it on a
checkpoint with the run's engine and scheduler (:func:`run_serving`), so both give the same episodes.

Also what the commands that serve a checkpoint share (``actfirst.eval``, ``actfirst.teacher_rollouts``,
``actfirst.rollout_quality``): the configs from ``key=value`` overrides, the in-process engine, the report's output.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from actfirst.core.config import (
    ConfigError,
    EngineConfig,
    EvaluationConfig,
    RolloutConfig,
    SchedulerConfig,
    TrainConfig,
)
from actfirst.core.files import write_atomically
from actfirst.core.schema import load_config, paths_unchecked
from actfirst.envs.benchmarks import Benchmark, get_benchmark
from actfirst.evaluation.report import EpisodeRecord, EvalReport, response_hash

logger = logging.getLogger(__name__)

EVAL_SEEDS = (42, 43, 44)
"""C.4's evaluation seeds."""


def eval_rollout_config(rollout: RolloutConfig, max_in_flight: int) -> RolloutConfig:
    """``rollout`` as evaluation runs it: think-then-act, the evaluation thinking budget (its first stage and total
    replace the training ones; the second stage is unchanged), ``max_in_flight`` episodes at once."""
    budget = dataclasses.replace(rollout.budget, first_stage=rollout.budget.eval_first_stage,
                                 total=rollout.budget.eval_total)
    return dataclasses.replace(rollout, strategy="vanilla", batch_tasks=max_in_flight, budget=budget)


MAX_TASKS = 1 << 20
"""Episode seeds leave room for this many tasks per evaluation seed."""


def episode_seed(seed: int, index: int, stride: int) -> int:
    """The base sampling seed of task ``index`` under evaluation seed ``seed``: a function of the two alone, so a
    seed reproduces its run whatever the scheduling, and on any prefix of the task list.

    The runner samples turn t's full response with ``base + 2t`` (its second stage with that plus the tokens
    before it); ``stride`` exceeds the largest such offset, so no two episodes of any seeds share a sampling seed.
    """
    if not 0 <= index < MAX_TASKS:
        raise ValueError(f"index={index}: must be in [0, {MAX_TASKS})")
    return (seed * MAX_TASKS + index) * stride


def check_fits(engine: Any, cfg: RolloutConfig, budget_key: str) -> None:
    """Raise when a prompt plus the thinking budget (``cfg.budget.total``, named ``budget_key`` in the message) does
    not fit the engine's max_model_len."""
    limit = engine.max_model_len
    need = cfg.max_prompt_tokens + cfg.budget.total
    if need > limit:
        raise ValueError(f"rollout.max_prompt_tokens={cfg.max_prompt_tokens} + {budget_key}={cfg.budget.total} = "
                         f"{need} exceeds the engine's max_model_len={limit}")


def seed_stride(benchmark: Benchmark, cfg: RolloutConfig) -> int:
    """Distance between two episodes' base seeds: above the runner's largest per-turn seed offset."""
    return 2 * benchmark.max_turns + cfg.budget.total + 2


async def play_jobs(workers: Sequence[Any], jobs: deque, play: Callable[[Any, Any], Awaitable[None]]) -> None:
    """Keep every worker busy: each takes the next job and awaits ``play(worker, job)`` until no job is left. An
    unexpected error stops the other workers too and is raised as itself."""

    async def slot(worker) -> None:
        while jobs:
            await play(worker, jobs.popleft())

    try:
        async with asyncio.TaskGroup() as group:
            for worker in workers:
                group.create_task(slot(worker))
    except BaseExceptionGroup as group_error:
        raise group_error.exceptions[0] from group_error.exceptions[0].__cause__


def order_rows(benchmark: Benchmark, types: Sequence[str]) -> list[str]:
    """Task types in report order: the benchmark's own order where it has one (ALFWorld: Table 1's), then sorted."""
    known = list(getattr(type(benchmark), "TASK_TYPES", {}).values())
    present = set(types)
    return [t for t in known if t in present] + sorted(present - set(known))


def pick_tasks(benchmark: Benchmark, tasks: Sequence[Any], n: int) -> list:
    """``n`` of ``tasks`` (0: all): the types share ``n`` as evenly as it allows (round-robin in list order), and
    each type's share is spread evenly over that type's tasks, so a subset of ALFWorld's eval split (valid_seen
    listed before valid_unseen) draws from both splits. Deterministic; returned interleaved by type."""
    tasks = list(tasks)
    if n <= 0 or n >= len(tasks):
        return tasks
    by_type: dict[str, list] = {}
    for task in tasks:
        by_type.setdefault(benchmark.task_type(task), []).append(task)
    counts = dict.fromkeys(by_type, 0)
    while sum(counts.values()) < n:
        for name, group in by_type.items():
            if counts[name] < len(group) and sum(counts.values()) < n:
                counts[name] += 1
    chosen = {name: [group[int((j + 0.5) * len(group) / counts[name])] for j in range(counts[name])]
              for name, group in by_type.items()}
    return [chosen[name][j] for j in range(max(counts.values())) for name in by_type if j < counts[name]]


async def evaluate(engine, tokenizer, benchmark: Benchmark, tasks: Sequence[Any], *,
                   seeds: Sequence[int] = EVAL_SEEDS, rollout: RolloutConfig, max_in_flight: int = 16,
                   progress: bool = True, pool: Any = None, shard: tuple[int, int] = (0, 1)) -> EvalReport:
    """Play every task once per seed with think-then-act and the evaluation budget; see the module docstring.

    ``pool``: an ``EnvPool`` of this benchmark to play on (at most ``max_in_flight`` of its workers; e.g. the
    training run's, between rollout batches); by default a pool of ``max_in_flight`` workers is started.
    ``shard=(rank, ranks)``: play only every ``ranks``-th (seed, task) episode from the ``rank``-th (each rank of a
    job plays its share on its own engine; :func:`merge_reports` joins the parts). An episode's sampling seeds do
    not depend on who plays it."""
    from actfirst.envs.workers import EnvPool
    from actfirst.rollout.runner import RolloutRunner
    from actfirst.rollout.strategies import make_strategy

    tasks, seeds = list(tasks), [int(s) for s in seeds]
    if not tasks:
        raise ValueError("tasks=[]: nothing to evaluate")
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(f"seeds={seeds}: need distinct seeds >= 0")
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight={max_in_flight}: must be >= 1")
    if len(tasks) > MAX_TASKS:
        raise ValueError(f"{len(tasks)} tasks: at most {MAX_TASKS}")
    cfg = eval_rollout_config(rollout, max_in_flight)
    check_fits(engine, cfg, "rollout.budget.eval_total")
    stride = seed_stride(benchmark, cfg)
    rank, ranks = shard
    if not 0 <= rank < ranks:
        raise ValueError(f"shard={shard}: need 0 <= rank < ranks")
    jobs = deque(job for i, job in enumerate((seed, index) for seed in seeds for index in range(len(tasks)))
                 if i % ranks == rank)
    total, records = len(jobs), []
    every = max(1, total // 20)
    started = time.perf_counter()

    with contextlib.nullcontext(pool) if pool is not None else \
            EnvPool(benchmark.env_spec(), size=max(1, min(max_in_flight, total)),
                    call_timeout_s=rollout.env_timeout_s) as env_pool:
        workers = env_pool.workers[:min(max_in_flight, total)]
        runner = RolloutRunner(engine=engine, tokenizer=tokenizer, benchmark=benchmark, pool=env_pool,
                               strategy=make_strategy("vanilla"), cfg=cfg, references=None, evaluation=True)

        async def play(worker, job: tuple[int, int]) -> None:
            seed, index = job
            episode = await runner.run_episode(tasks[index], worker, seed=episode_seed(seed, index, stride))
            records.append(EpisodeRecord(
                seed=seed, index=index, task=episode.task, task_type=episode.task_type,
                success=episode.won and episode.failure is None, score=float(episode.score),
                turns=episode.num_turns, invalid_turns=sum(not t.valid for t in episode.turns),
                actions=[t.action for t in episode.turns],
                response_tokens=[len(r.token_ids) for r in episode.full_responses],
                response_hashes=[response_hash(r.token_ids) for r in episode.full_responses],
                truncated_responses=sum(r.truncated for r in episode.full_responses), failure=episode.failure,
                split=benchmark.task_split(tasks[index])))
            if episode.failure is not None:
                logger.warning(f"[eval] seed {seed} task {episode.task}: episode failed ({episode.failure})")
            if progress and (len(records) % every == 0 or len(records) == total):
                wall = time.perf_counter() - started
                wins = sum(r.success for r in records)
                logger.info(f"[eval {benchmark.name}] {len(records)}/{total} episodes, SR so far "
                            f"{100 * wins / len(records):.1f}, {len(records) / wall:.2f} episodes/s")

        await play_jobs(workers, jobs, play)

    wall = time.perf_counter() - started
    meta = {"strategy": "vanilla", "references": None, "num_tasks": len(tasks), "max_in_flight": max_in_flight,
            "rollout": dataclasses.asdict(cfg), "env": dataclasses.asdict(benchmark.config), "wall_s": wall,
            "episodes_per_s": total / wall if wall > 0 else None,
            "transitions": sum(r.turns for r in records)}
    return _report(benchmark, seeds, records, meta)


def _report(benchmark: Benchmark, seeds: list[int], records: list[EpisodeRecord], meta: dict) -> EvalReport:
    order = {s: i for i, s in enumerate(seeds)}
    records = sorted(records, key=lambda r: (order[r.seed], r.index))
    rows = order_rows(benchmark, [r.task_type for r in records])
    return EvalReport(benchmark=benchmark.name, seeds=seeds, task_types=rows, episodes=records, meta=meta)


def merge_reports(parts: Sequence[EvalReport], benchmark: Benchmark) -> EvalReport:
    """One report of the episodes that ranks played as shards of one evaluation (``evaluate(shard=...)``): the
    wall-clock is the slowest part's, the throughput and transitions are summed."""
    if len({tuple(p.seeds) for p in parts}) != 1:
        raise ValueError(f"seeds {[p.seeds for p in parts]}: the parts are not shards of one evaluation")
    records = [r for p in parts for r in p.episodes]
    wall = max(p.meta["wall_s"] for p in parts)
    meta = {**parts[0].meta, "wall_s": wall, "episodes_per_s": len(records) / wall if wall > 0 else None,
            "transitions": sum(p.meta["transitions"] for p in parts), "shards": len(parts)}
    return _report(benchmark, list(parts[0].seeds), records, meta)


# -- a training run's evaluation ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class RunEvaluation:
    """What a training run's evaluation plays: its ``evaluation:`` section (defaults when the config has none), the
    benchmark of its ``env:``, the tasks of the section's split, and the run's rollout with evaluation's sampling."""

    spec: EvaluationConfig
    benchmark: Benchmark
    tasks: list
    rollout: RolloutConfig
    """The run's rollout section with ``spec``'s temperature and top-p (:func:`evaluate` applies the rest)."""

    async def play(self, engine: Any, tokenizer: Any, **kwargs: Any) -> EvalReport:
        """:func:`evaluate` of these tasks, seeds, sampling and episodes in flight (``kwargs``: ``progress``,
        ``pool``, ``shard``)."""
        return await evaluate(engine, tokenizer, self.benchmark, self.tasks, seeds=self.spec.seeds,
                              rollout=self.rollout, max_in_flight=self.spec.max_in_flight, **kwargs)


def run_evaluation(cfg: TrainConfig, benchmark: Benchmark | None = None) -> RunEvaluation:
    """The evaluation of the run of ``cfg`` (``benchmark``: its benchmark, when already built): the one definition
    that the trainer's evaluations and ``python -m actfirst.eval --config`` share."""
    spec = cfg.evaluation if cfg.evaluation is not None else EvaluationConfig()
    benchmark = benchmark if benchmark is not None else get_benchmark(cfg.benchmark, cfg.env)
    tasks = pick_tasks(benchmark, benchmark.tasks(spec.split), spec.tasks)
    return RunEvaluation(spec=spec, benchmark=benchmark, tasks=tasks, rollout=spec.sampling(cfg.rollout))


def run_serving(config: str, checkpoint: str, overrides: Sequence[str]) -> tuple[RunEvaluation, EngineConfig,
                                                                                   SchedulerConfig]:
    """The evaluation of the training run of ``config`` (``key=value`` overrides in the config's own keys:
    ``evaluation.tasks=8``, ``student.dtype=bfloat16``...) on ``checkpoint``, served as the run served its student:
    its ``student:`` engine with ``checkpoint`` as the model, its scheduler. The run's input paths (teacher,
    references) need not exist here. Raises ``ConfigError`` naming what does not fit."""
    with paths_unchecked():
        cfg = load_config(TrainConfig, config, list(overrides))
    engine_cfg = dataclasses.replace(cfg.student, model=str(checkpoint))
    plan = run_evaluation(cfg)
    check_serving(engine_cfg, cfg.scheduler, plan.rollout, "eval_total", engine_key="student")
    return plan, engine_cfg, cfg.scheduler


SAMPLING_KEYS = ("temperature", "top_p")
"""What evaluation samples with: its own keys (``evaluation.temperature``), never the rollout's."""


def benchmark_serving(checkpoint: str, benchmark_name: str, env_config: str | None,
                      overrides: Sequence[str]) -> tuple[RunEvaluation, EngineConfig, SchedulerConfig]:
    """An evaluation of ``checkpoint`` on a benchmark without a training config: ``evaluation.*`` overrides build
    its :class:`EvaluationConfig` (the training defaults otherwise: temperature 0.6, seeds 42/43/44...), the others
    go to :func:`serving_configs` (b_max the section's ``max_in_flight``). Raises ``ConfigError`` for a
    ``rollout.temperature`` or ``rollout.top_p`` (evaluation's own keys set them) and what does not fit."""
    spec_overrides = [o.removeprefix("evaluation.") for o in overrides if o.startswith("evaluation.")]
    rest = [o for o in overrides if not o.startswith("evaluation.")]
    for item in rest:
        key = item.partition("=")[0].removeprefix("rollout.")
        if item.startswith("rollout.") and key in SAMPLING_KEYS:
            raise ConfigError(f"{item}: evaluation samples with evaluation.{key}=..., as a training run's "
                              f"evaluation: section does")
    spec = _load(EvaluationConfig, spec_overrides, "evaluation")
    benchmark, rollout, engine_cfg, scheduler_cfg = serving_configs(
        checkpoint, benchmark_name, env_config, rest, max_in_flight=spec.max_in_flight, budget="eval_total")
    tasks = pick_tasks(benchmark, benchmark.tasks(spec.split), spec.tasks)
    plan = RunEvaluation(spec=spec, benchmark=benchmark, tasks=tasks, rollout=spec.sampling(rollout))
    return plan, engine_cfg, scheduler_cfg


# -- serving a checkpoint for a command ------------------------------------------------------------------------------


def split_overrides(overrides: Sequence[str]) -> dict[str, list[str]]:
    """``key=value`` overrides by target: ``rollout.``, ``engine.``, ``scheduler.`` prefixes (stripped), the rest
    for the benchmark's env config."""
    out: dict[str, list[str]] = {"env": [], "rollout": [], "engine": [], "scheduler": []}
    for item in overrides:
        head, dot, rest = item.partition(".")
        if dot and head in ("rollout", "engine", "scheduler") and "=" in rest and "=" not in head:
            out[head].append(rest)
        else:
            out["env"].append(item)
    return out


def _load(cls: type, overrides: list[str], prefix: str, base: dict[str, Any] | None = None) -> Any:
    """``cls`` from ``base`` values (JSON scalars are YAML too) overridden by ``overrides``; errors name
    ``prefix.key``."""
    defaults = [f"{key}={json.dumps(value)}" for key, value in (base or {}).items()]
    try:
        return load_config(cls, None, defaults + list(overrides))
    except ConfigError as e:
        raise ConfigError(f"{prefix}.{e}") from None


def serving_configs(model: str, benchmark_name: str, config: str | None, overrides: Sequence[str], *,
                    max_in_flight: int, budget: str) -> tuple[Benchmark, RolloutConfig, EngineConfig, SchedulerConfig]:
    """The benchmark and the configs for serving ``model`` on an in-process engine from ``key=value`` overrides (see
    :func:`split_overrides`): b_max ``max_in_flight``, ``max_model_len`` the prompt budget plus
    ``rollout.budget.<budget>`` (``eval_total`` or ``total``), bfloat16 on a GPU. Raises ``ConfigError`` naming
    every value that does not fit the model or the others."""
    import torch

    from actfirst.envs.benchmarks import load_benchmark

    groups = split_overrides(overrides)
    benchmark = load_benchmark(benchmark_name, config, groups["env"])
    rollout = _load(RolloutConfig, groups["rollout"], "rollout")
    scheduler_cfg = _load(SchedulerConfig, groups["scheduler"], "scheduler", {"b_max": max_in_flight})
    response = getattr(rollout.budget, budget)
    need = rollout.max_prompt_tokens + response
    engine_cfg = _load(EngineConfig, groups["engine"], "engine", {
        "model": model, "dtype": "bfloat16" if torch.cuda.is_available() else "float32",
        "max_model_len": need, "max_num_seqs": scheduler_cfg.b_max, "max_num_batched_tokens": max(8192, need)})
    check_serving(engine_cfg, scheduler_cfg, rollout, budget)
    return benchmark, rollout, engine_cfg, scheduler_cfg


def check_serving(engine_cfg: EngineConfig, scheduler_cfg: SchedulerConfig, rollout: RolloutConfig, budget: str, *,
                  engine_key: str = "engine") -> None:
    """Raise ``ConfigError`` naming every value that does not fit: the prompt budget plus ``rollout.budget.<budget>``
    against the engine's ``max_model_len`` and the model's positions, b_max against the engine's sequences
    (``engine_key``: what the config calls the engine section)."""
    from transformers import AutoConfig

    response = getattr(rollout.budget, budget)
    need = rollout.max_prompt_tokens + response
    positions = getattr(AutoConfig.from_pretrained(engine_cfg.model), "max_position_embeddings", None)
    problems = []
    if positions is not None and engine_cfg.max_model_len > positions:
        problems.append(f"{engine_key}.max_model_len={engine_cfg.max_model_len} exceeds the model's "
                        f"max_position_embeddings={positions} (lower rollout.max_prompt_tokens or "
                        f"rollout.budget.{budget})")
    if need > engine_cfg.max_model_len:
        problems.append(f"rollout.max_prompt_tokens={rollout.max_prompt_tokens} + rollout.budget.{budget}="
                        f"{response} = {need} exceeds {engine_key}.max_model_len={engine_cfg.max_model_len}")
    if scheduler_cfg.b_max > engine_cfg.max_num_seqs:
        problems.append(f"scheduler.b_max={scheduler_cfg.b_max} exceeds {engine_key}.max_num_seqs="
                        f"{engine_cfg.max_num_seqs}")
    if problems:
        raise ConfigError("; ".join(problems))


@contextlib.asynccontextmanager
async def served(engine_cfg: EngineConfig, scheduler_cfg: SchedulerConfig, *,
                 world_size: int = 1) -> AsyncIterator[tuple[Any, Any]]:
    """``engine_cfg.model`` on an in-process engine with its tokenizer, for a command's measurement (``world_size``
    > 1: this rank's engine of a job); the engine is shut down on exit."""
    from transformers import AutoTokenizer

    from actfirst.engine.core import ActFirstEngine

    engine = ActFirstEngine.from_config(engine_cfg, scheduler_cfg, world_size=world_size)
    try:
        yield engine, AutoTokenizer.from_pretrained(engine_cfg.model)
    finally:
        await engine.shutdown()


def save_report(report: Any, out: str | None) -> str:
    """A command's report: its JSON to ``out`` (when given); returns what the command prints, its table and where
    the JSON went."""
    if not out:
        return report.table()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_atomically(out, report.to_json())
    return f"{report.table()}\nwrote {out}"

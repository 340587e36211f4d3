"""Teacher rollouts as reference candidates (Appendix C.2: "ten rollouts per training task" of the teacher).

::

    candidates = await teacher_candidates(engine, tokenizer, benchmark, benchmark.tasks("train"), rollout=cfg.rollout)
    write_candidates("refs/teacher.jsonl", candidates)   # then: build_references(..., candidate_files=[...])

The teacher, served by the same in-process engine class as the student, plays every task ``per_task`` times
think-then-act (the ``vanilla`` strategy: each turn executes its full response's action) with the *training*
thinking budget and ``rollout.temperature`` (C.2 names neither; these are the settings the candidates are replayed
under). As in ``actfirst.evaluation``, up to ``max_in_flight`` episodes run at once on one engine and a pool of that
many workers kept full, and episode (index, repeat) samples with seeds derived from (seed, index, repeat) alone,
never from scheduling. The executed action sequences of the episodes that may become references are kept per task
key, deduplicated, in repeat order (``Benchmark.accepts_reference``: success; WebShop: any purchase with a positive
score, since C.2 ranks its candidates by score and then length); a task without one has no entry, and an episode
whose worker died or whose environment raised counts as a failure. The JSONL written by ``write_candidates`` is what
``actfirst.reference_cache`` reads (``candidate_files``); its candidates carry the source
``candidates:<file name>``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from actfirst.config import RolloutConfig
from actfirst.envs.benchmarks import Benchmark
from actfirst.evaluation import MAX_TASKS, check_fits, episode_seed, play_jobs, seed_stride
from actfirst.files import write_atomically

MAX_REPEATS = 1 << 10
"""Rollout seeds leave room for this many repeats per task."""


def teacher_rollout_config(rollout: RolloutConfig, max_in_flight: int) -> RolloutConfig:
    """``rollout`` as teacher rollouts run it: think-then-act with the training budget, ``max_in_flight`` at once."""
    return dataclasses.replace(rollout, strategy="vanilla", batch_tasks=max_in_flight)


def rollout_seed(seed: int, index: int, repeat: int, stride: int) -> int:
    """The base sampling seed of repeat ``repeat`` of task ``index``: a function of (seed, index, repeat) alone,
    distinct for every triple (``actfirst.evaluation.episode_seed`` with one evaluation seed per (seed, repeat))."""
    if seed < 0:
        raise ValueError(f"seed={seed}: must be >= 0")
    if not 0 <= repeat < MAX_REPEATS:
        raise ValueError(f"repeat={repeat}: must be in [0, {MAX_REPEATS})")
    return episode_seed(seed * MAX_REPEATS + repeat, index, stride)


async def teacher_candidates(engine, tokenizer, benchmark: Benchmark, tasks: Sequence[Any], *, per_task: int = 10,
                             rollout: RolloutConfig, max_in_flight: int = 16, seed: int = 0,
                             progress: bool = True) -> dict[str, list[list[str]]]:
    """The teacher's action sequences that may become references, by ``benchmark.task_key``; see the module
    docstring."""
    from actfirst.envs.workers import EnvPool
    from actfirst.rollout.runner import RolloutRunner
    from actfirst.rollout.strategies import make_strategy

    tasks = list(tasks)
    if not 1 <= per_task <= MAX_REPEATS:
        raise ValueError(f"per_task={per_task}: must be in [1, {MAX_REPEATS}]")
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight={max_in_flight}: must be >= 1")
    if seed < 0:
        raise ValueError(f"seed={seed}: must be >= 0")
    if len(tasks) > MAX_TASKS:
        raise ValueError(f"{len(tasks)} tasks: at most {MAX_TASKS}")
    keys = [benchmark.task_key(t) for t in tasks]
    if len(set(keys)) != len(keys):
        raise ValueError("task keys are not unique; check the task set")
    if not tasks:
        return {}
    cfg = teacher_rollout_config(rollout, max_in_flight)
    check_fits(engine, cfg, "rollout.budget.total")
    stride = seed_stride(benchmark, cfg)
    # Task-major: a task's repeats run side by side and share their first prompt in the prefix cache.
    jobs = deque((index, repeat) for index in range(len(tasks)) for repeat in range(per_task))
    total, finished, failures = len(jobs), 0, 0
    kept: dict[tuple[int, int], list[str]] = {}
    every = max(1, total // 20)
    started = time.perf_counter()

    with EnvPool(benchmark.env_spec(), size=min(max_in_flight, total), call_timeout_s=cfg.env_timeout_s) as pool:
        runner = RolloutRunner(engine=engine, tokenizer=tokenizer, benchmark=benchmark, pool=pool,
                               strategy=make_strategy("vanilla"), cfg=cfg, references=None)

        async def play(worker, job: tuple[int, int]) -> None:
            nonlocal finished, failures
            index, repeat = job
            episode = await runner.run_episode(tasks[index], worker, seed=rollout_seed(seed, index, repeat, stride))
            finished += 1
            if episode.failure is not None:
                failures += 1
                print(f"[teacher] task {episode.task} repeat {repeat}: episode failed ({episode.failure})",
                      file=sys.stderr, flush=True)
            elif benchmark.accepts_reference(episode):
                kept[index, repeat] = [t.action for t in episode.turns]
            if progress and (finished % every == 0 or finished == total):
                wall = time.perf_counter() - started
                print(f"[teacher {benchmark.name}] {finished}/{total} episodes, {len(kept)} kept, "
                      f"{failures} failed, {finished / wall:.2f} episodes/s", flush=True)

        await play_jobs(pool.workers, jobs, play)

    out: dict[str, list[list[str]]] = {}
    for index, key in enumerate(keys):
        seen: set[tuple[str, ...]] = set()
        for repeat in range(per_task):
            actions = kept.get((index, repeat))
            if actions is not None and tuple(actions) not in seen:
                seen.add(tuple(actions))
                out.setdefault(key, []).append(actions)
    return out


def write_candidates(path: str | Path, candidates: dict[str, list[list[str]]]) -> Path:
    """Write ``candidates`` as the JSONL ``actfirst.reference_cache.read_candidates`` reads (one
    ``{"task": key, "actions": [...]}`` per line), atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"task": key, "actions": list(actions)}) + "\n"
             for key, sequences in candidates.items() for actions in sequences]
    write_atomically(path, "".join(lines))
    return path

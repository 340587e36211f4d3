"""Playing the teacher's rollouts that become reference candidates (Appendix C.2: "ten rollouts per training task"
of the teacher), for ``python -m actfirst.teacher_rollouts`` and for preparation.

::

    candidates = await teacher_candidates(engine, tokenizer, benchmark, benchmark.tasks("train"), rollout=cfg.rollout)
    write_candidates("refs/teacher.jsonl", candidates)   # then: build_references(..., candidate_files=[...])

The teacher, served by the same in-process engine class as the student, plays every task ``per_task`` times
think-then-act (the ``vanilla`` strategy: each turn executes its full response's action) with the *training*
thinking budget and ``rollout.temperature`` (C.2 names neither; these are the settings the candidates are replayed
under). As in ``actfirst.evaluation.evaluate``, up to ``max_in_flight`` episodes run at once on one engine and a pool of
that many workers kept full, and episode (index, repeat) samples with seeds derived from (seed, index, repeat) alone,
never from scheduling. The executed action sequences of the episodes that may become references are kept per task
key, deduplicated, in repeat order (``Benchmark.accepts_reference``: success; WebShop: any purchase with a positive
score, since C.2 ranks its candidates by score and then length); a task without one has no entry, and an episode
whose worker died or whose environment raised counts as a failure. The JSONL written by ``write_candidates`` is what
``actfirst.preparation.reference_cache`` reads (``candidate_files``); its candidates carry the source
``candidates:<file name>``.

Preparation (``actfirst.preparation.build``) plays the tasks on every rank, each its every R-th task on its own engine
(:func:`play_share`), each finished task appended to that rank's journal of the candidates file
(``actfirst.core.journal``) so that a killed preparation resumes without replaying it, and merges the journals into the
file once every task is done (:func:`merge_candidates`). Seeds follow a task's index in the whole task set, so the
candidates do not depend on the number of ranks.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from actfirst.core.config import RolloutConfig
from actfirst.core.files import write_atomically
from actfirst.core.journal import Journal, format_eta, read_journals, remove_journals
from actfirst.envs.benchmarks import Benchmark
from actfirst.evaluation.evaluate import MAX_TASKS, check_fits, episode_seed, play_jobs, seed_stride

logger = logging.getLogger(__name__)

MAX_REPEATS = 1 << 10
"""Rollout seeds leave room for this many repeats per task."""


def teacher_rollout_config(rollout: RolloutConfig, max_in_flight: int) -> RolloutConfig:
    """``rollout`` as teacher rollouts run it: think-then-act with the training budget, ``max_in_flight`` at once."""
    return dataclasses.replace(rollout, strategy="vanilla", batch_tasks=max_in_flight)


def rollout_seed(seed: int, index: int, repeat: int, stride: int) -> int:
    """The base sampling seed of repeat ``repeat`` of task ``index``: a function of (seed, index, repeat) alone,
    distinct for every triple (``actfirst.evaluation.evaluate.episode_seed`` with one evaluation seed per
    (seed, repeat))."""
    if seed < 0:
        raise ValueError(f"seed={seed}: must be >= 0")
    if not 0 <= repeat < MAX_REPEATS:
        raise ValueError(f"repeat={repeat}: must be in [0, {MAX_REPEATS})")
    return episode_seed(seed * MAX_REPEATS + repeat, index, stride)


async def teacher_candidates(engine, tokenizer, benchmark: Benchmark, tasks: Sequence[Any], *, per_task: int = 10,
                             rollout: RolloutConfig, max_in_flight: int = 16, seed: int = 0,
                             indices: Sequence[int] | None = None,
                             on_task: Callable[[str, list[list[str]]], None] | None = None,
                             progress: str | None = "teacher") -> dict[str, list[list[str]]]:
    """The teacher's action sequences that may become references, by ``benchmark.task_key``; see the module
    docstring. ``indices``: each task's index in the whole task set, which its seeds derive from (default: its
    position here). ``on_task(key, sequences)`` is called as soon as all of a task's rollouts have finished (with
    ``[]`` when none may become a reference). ``progress``: the label of the progress lines (None: none)."""
    from actfirst.envs.workers import EnvPool
    from actfirst.rollout.runner import RolloutRunner
    from actfirst.rollout.strategies import make_strategy

    tasks = list(tasks)
    indices = list(range(len(tasks)) if indices is None else indices)
    _check_args(benchmark, tasks, indices, per_task, max_in_flight, seed)
    if not tasks:
        return {}
    keys = [benchmark.task_key(t) for t in tasks]
    cfg = teacher_rollout_config(rollout, max_in_flight)
    check_fits(engine, cfg, "rollout.budget.total")
    stride = seed_stride(benchmark, cfg)
    # Task-major: a task's repeats run side by side and share their first prompt in the prefix cache.
    jobs = deque((position, repeat) for position in range(len(tasks)) for repeat in range(per_task))
    total, finished, failures, tasks_done = len(jobs), 0, 0, 0
    left = [per_task] * len(tasks)
    kept: dict[tuple[int, int], list[str]] = {}
    every = max(1, total // 50)
    started = time.perf_counter()

    with EnvPool(benchmark.env_spec(), size=min(max_in_flight, total), call_timeout_s=cfg.env_timeout_s) as pool:
        runner = RolloutRunner(engine=engine, tokenizer=tokenizer, benchmark=benchmark, pool=pool,
                               strategy=make_strategy("vanilla"), cfg=cfg, references=None)

        async def play(worker, job: tuple[int, int]) -> None:
            nonlocal finished, failures, tasks_done
            position, repeat = job
            episode = await runner.run_episode(tasks[position], worker,
                                               seed=rollout_seed(seed, indices[position], repeat, stride))
            finished += 1
            left[position] -= 1
            if episode.failure is not None:
                failures += 1
                logger.warning(f"[teacher] task {episode.task} repeat {repeat}: episode failed ({episode.failure})")
            elif benchmark.accepts_reference(episode):
                kept[position, repeat] = [t.action for t in episode.turns]
            if left[position] == 0:
                tasks_done += 1
                if on_task is not None:
                    on_task(keys[position], _sequences(kept, position, per_task))
            if progress is not None and (finished % every == 0 or finished == total):
                rate = finished / (time.perf_counter() - started)
                logger.info(f"[{progress} {benchmark.name}] {tasks_done}/{len(tasks)} tasks, {finished}/{total} "
                            f"episodes, {len(kept)} kept, {failures} failed, {rate:.2f} episodes/s, "
                            f"ETA {format_eta((total - finished) / rate)}")

        await play_jobs(pool.workers, jobs, play)

    return {key: sequences for position, key in enumerate(keys)
            if (sequences := _sequences(kept, position, per_task))}


def _check_args(benchmark: Benchmark, tasks: list, indices: list[int], per_task: int, max_in_flight: int,
                seed: int) -> None:
    if not 1 <= per_task <= MAX_REPEATS:
        raise ValueError(f"per_task={per_task}: must be in [1, {MAX_REPEATS}]")
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight={max_in_flight}: must be >= 1")
    if seed < 0:
        raise ValueError(f"seed={seed}: must be >= 0")
    if len(indices) != len(tasks):
        raise ValueError(f"indices: {len(indices)} for {len(tasks)} tasks")
    if any(not 0 <= i < MAX_TASKS for i in indices) or len(set(indices)) != len(indices):
        raise ValueError(f"indices: must be distinct and in [0, {MAX_TASKS})")
    keys = [benchmark.task_key(t) for t in tasks]
    if len(set(keys)) != len(keys):
        raise ValueError("task keys are not unique; check the task set")


def _sequences(kept: dict[tuple[int, int], list[str]], position: int, per_task: int) -> list[list[str]]:
    """The kept action sequences of the task at ``position``, deduplicated, in repeat order."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for repeat in range(per_task):
        actions = kept.get((position, repeat))
        if actions is not None and tuple(actions) not in seen:
            seen.add(tuple(actions))
            out.append(actions)
    return out


async def play_share(engine, tokenizer, benchmark: Benchmark, tasks: Sequence[Any], *, out: str | Path,
                     rank: int = 0, world: int = 1, per_task: int, rollout: RolloutConfig, max_in_flight: int,
                     seed: int = 0, after_task: Callable[[str], None] | None = None) -> int:
    """Play the teacher rollouts of this rank's share of ``tasks`` (every ``world``-th from ``rank``) that no rank's
    journal of ``out`` holds yet (``actfirst.core.journal``): each task's line (``{"task": key, "candidates": [...]}``)
    is appended to this rank's journal as soon as its rollouts finish, and ``after_task(key)`` called after it.
    Seeds follow each task's index in ``tasks``, so the candidates do not depend on ``world``. Returns how many
    tasks were played; :func:`merge_candidates` writes the candidates file once every task is done."""
    tasks = list(tasks)
    done = read_journals(out)
    share = range(rank, len(tasks), world)
    mine = [i for i in share if benchmark.task_key(tasks[i]) not in done]
    label = "teacher" if world == 1 else f"teacher rank {rank}/{world}"
    logger.info(f"[{label}] {len(mine)} of {len(share)} tasks to play ({len(share) - len(mine)} done before), "
                f"{per_task} rollouts each, up to {max_in_flight} at once")
    if not mine:
        return 0
    with Journal(out, rank) as journal:
        def finished(key: str, sequences: list[list[str]]) -> None:
            journal.append(json.dumps({"task": key, "candidates": sequences}))
            if after_task is not None:
                after_task(key)

        await teacher_candidates(engine, tokenizer, benchmark, [tasks[i] for i in mine], per_task=per_task,
                                 rollout=rollout, max_in_flight=max_in_flight, seed=seed, indices=mine,
                                 on_task=finished, progress=label)
    return len(mine)


def merge_candidates(out: str | Path, keys: Sequence[str]) -> Path:
    """Write the candidates of the tasks ``keys`` from every rank's journal of ``out`` (:func:`play_share`) to
    ``out`` (:func:`write_candidates`, in the order of ``keys``), then drop the journals; returns the path. Refused
    while a task is missing (``RuntimeError`` naming how many)."""
    rows = {key: json.loads(line)["candidates"] for key, line in read_journals(out).items()}
    missing = [k for k in keys if k not in rows]
    if missing:
        raise RuntimeError(f"{out}: {len(missing)} of {len(keys)} tasks have no teacher rollouts yet (e.g. "
                           f"{missing[:3]}); rerun to play them")
    path = write_candidates(out, {key: rows[key] for key in keys if rows[key]})
    remove_journals(out)
    return path


def write_candidates(path: str | Path, candidates: dict[str, list[list[str]]]) -> Path:
    """Write ``candidates`` as the JSONL ``actfirst.preparation.reference_cache.read_candidates`` reads (one
    ``{"task": key, "actions": [...]}`` per line), atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"task": key, "actions": list(actions)}) + "\n"
             for key, sequences in candidates.items() for actions in sequences]
    write_atomically(path, "".join(lines))
    return path

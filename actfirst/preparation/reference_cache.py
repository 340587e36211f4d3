"""The reference cache (Appendix C.2): one reference trajectory per training task, replayed and cached before
training, by ``python -m actfirst.references`` or by preparation.

::

    with EnvPool(benchmark.env_spec(), size=4) as pool:
        await build_references(benchmark, benchmark.tasks("train"), pool, out="refs/alfworld.jsonl")
    references = load_references("refs/alfworld.jsonl", benchmark=benchmark)

Candidates per task: the benchmark's own (``Benchmark.candidates``: the simulator's gold path on ScienceWorld, the
planner's walkthrough stored with each ALFWorld game, the oracle solution built from each WebShop goal) and any
JSONL of candidate action sequences (one ``{"task": <key>, "actions": [...]}`` per line, e.g. teacher rollouts;
``<key>`` as ``Benchmark.task_key`` prints it). Every candidate is replayed in full under the training environment
configuration; replays that ``Benchmark.accepts_reference`` (success; WebShop: any purchase with a positive score)
are kept and the best by ``Benchmark.rank`` is selected (the fewest actions; WebShop: the highest score, then the
fewest actions); ScienceWorld candidates are first shortened while their replay still succeeds.

The cache is JSONL, one line per task, holding the actions and every observation o_1 ... o_{T+1} with the
per-step information the transition checks need (ALFWorld admissible sets, ScienceWorld action templates, WebShop
clickables); it holds no tokens, so it serves every student size. ``<out>.meta.json`` records the coverage. The
build appends each finished task to its journal, ``<out>.partial``, as it goes (an interrupted build resumes from
it) and publishes ``<out>`` only at 100% coverage, unless a partial cache is allowed, which the metadata then
records. Several ranks (``actfirst.preparation.build``) each replay every R-th task into their own journal
(:func:`replay_references`, ``actfirst.core.journal``), and one publishes the union (:func:`publish_references`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from actfirst.core.files import write_atomically
from actfirst.core.journal import Journal, format_eta, journal_path, read_journals, remove_journals
from actfirst.core.user_input import ConfigError, read_jsonl, read_text
from actfirst.envs.base import Reference, Transition
from actfirst.envs.benchmarks import Benchmark, benchmark_class
from actfirst.envs.workers import EnvPool, EnvWorker, WorkerDied

logger = logging.getLogger(__name__)


class PartialCacheError(ConfigError):
    """A reference cache does not cover every task (and partial use was not asked for)."""


async def replay(worker: EnvWorker, task: Any, actions: Sequence[str]) -> tuple[list[str], list[Transition]]:
    """Execute ``actions`` from a reset; stops at termination. Returns the executed actions and o_1..o_{T+1}."""
    transitions = [await worker.areset(task)]
    executed = []
    for action in actions:
        if transitions[-1].done:
            break
        transitions.append(await worker.astep(action))
        executed.append(action)
    return executed, transitions


def read_candidates(paths: Sequence[str | Path], key: str = "--candidates") -> dict[str, list[tuple[str, list[str]]]]:
    """Candidate action sequences by task key from JSONL files; a missing file or malformed line is refused naming
    ``key``, the file and the line."""
    out: dict[str, list[tuple[str, list[str]]]] = {}
    for path in paths:
        for n, row in read_jsonl(path, key):
            actions = row.get("actions")
            if "task" not in row or not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
                raise ConfigError(f"{key}={str(path)!r}: line {n} is not a candidate (want {{\"task\": <key>, "
                                  f"\"actions\": [<string>, ...]}}): {json.dumps(row)[:120]}")
            out.setdefault(str(row["task"]), []).append((f"candidates:{Path(path).name}", actions))
    return out


async def build_one(benchmark: Benchmark, worker: EnvWorker, task: Any, candidates: list[tuple[str, list[str]]],
                    shorten: bool) -> Reference | None:
    """Replay the benchmark's own and the given candidates of ``task``; the selected reference, or None when none
    succeeds. ``shorten``: shorten candidates where the benchmark does (C.2)."""
    best = None
    for source, actions in await benchmark.candidates(worker, task) + candidates:
        executed, transitions = await replay(worker, task, actions)
        if not benchmark.accepts_reference(transitions[-1]):
            continue
        valid_only = [a for a, t in zip(executed, transitions[1:], strict=False) if t.valid]
        if len(valid_only) < len(executed):  # e.g. ScienceWorld gold paths' "open door" no-ops (B.5 validity)
            trial, trial_transitions = await replay(worker, task, valid_only)
            if benchmark.accepts_reference(trial_transitions[-1]):
                executed, transitions = trial, trial_transitions
        if shorten and benchmark.shortens_candidates:
            shortened = await benchmark.shorten(worker, task, executed)
            if shortened != executed:
                executed, transitions = await replay(worker, task, shortened)
                if not benchmark.accepts_reference(transitions[-1]):
                    continue
        ref = Reference(benchmark.task_key(task), executed, [benchmark.slim(t) for t in transitions], source)
        if best is None or benchmark.rank(ref) < benchmark.rank(best):
            best = ref
    return best


def load_references(path: str | Path, *, benchmark: Benchmark | None = None, tasks: Sequence[str] = (),
                    allow_partial: bool = False, key: str = "references") -> dict[str, Reference]:
    """A cache by task key, its transitions of its benchmark's ``Benchmark.transition_class`` (``benchmark``'s, or
    that of the benchmark its metadata names). Refused (:class:`ConfigError` naming ``key`` and the path): a missing
    file or metadata, a malformed line, a cache of another benchmark or benchmark config than ``benchmark``'s (a
    turn limit may differ where every reference fits: ``TURN_LIMIT``), or of no known benchmark, coverage below 100%
    (unless ``allow_partial``: :class:`PartialCacheError`), and a cache without a reference for one of ``tasks``."""
    what = f"{key}={str(path)!r}"
    if not Path(f"{path}.meta.json").is_file():
        raise ConfigError(f"{what}: no {Path(path).name}.meta.json beside it: not a cache written by "
                          f"python -m actfirst.references build (or actfirst.prepare)")
    meta = json.loads(read_text(f"{path}.meta.json", f"{key} metadata"))
    if benchmark is not None:
        _check_cache_of(meta, benchmark, what)
        transition_class = benchmark.transition_class
    else:
        try:
            transition_class = benchmark_class(meta.get("benchmark")).transition_class
        except ValueError as e:
            raise ConfigError(f"{what}: its metadata names {e}") from None
    if meta["coverage"] < 1.0 and not allow_partial:
        raise PartialCacheError(f"{what}: coverage {meta['coverage']:.1%} ({meta['covered']}/{meta['tasks']}), "
                                f"missing {meta['missing'][:10]}; pass allow_partial=True to use it anyway")
    refs = {}
    for n, row in read_jsonl(path, key):
        try:
            ref = Reference.from_dict(row, transition_class)
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"{what}: line {n} is not a reference ({type(e).__name__}: {e})") from None
        refs[ref.task] = ref
    if benchmark is not None:
        _check_turn_limit(refs, meta, benchmark, what)
    missing = [t for t in tasks if t not in refs]
    if missing:
        raise ConfigError(f"{what}: no reference for {len(missing)} of the {len(tasks)} training tasks, e.g. "
                          f"{missing[:5]}")
    return refs


def transition_config(config: Any) -> dict[str, Any]:
    """A benchmark config as a cache's metadata records it: the keys that shape a training task's transitions (its
    ``EVALUATION_ONLY`` keys left out), as JSON values."""
    skip = _evaluation_only(config)
    return {k: v for k, v in json.loads(json.dumps(dataclasses.asdict(config))).items() if k not in skip}


def _evaluation_only(config: Any) -> tuple[str, ...]:
    return getattr(type(config), "EVALUATION_ONLY", ())


TURN_LIMIT = "max_turns"
"""The key of a benchmark config's turn limit (``Benchmark.max_turns``). The limit only marks a step
``Transition.truncated``, so a reference it never marked that fits in another limit has the same transitions under
it: a cache serves a run under another limit when each of its references does (the demo's 12-turn cache under the
papers' 30, 000 Sec. 5.1)."""


def _check_turn_limit(refs: dict[str, Reference], meta: dict[str, Any], benchmark: Benchmark, what: str) -> None:
    """Under a turn limit other than the cache's, every reference must fit in the run's, uncut by the cache's."""
    limit, built = benchmark.max_turns, meta.get("config", {}).get(TURN_LIMIT)
    if built == limit:
        return
    for ref in refs.values():
        if len(ref.actions) > limit or any(t.truncated for t in ref.transitions):
            raise ConfigError(f"{what}: built under {TURN_LIMIT}={built!r}; its reference of task {ref.task!r} "
                              f"({len(ref.actions)} actions) does not fit the run's {TURN_LIMIT}={limit} or was cut "
                              f"by the cache's; rebuild it or point references at this config's cache")


def _check_cache_of(meta: dict[str, Any], benchmark: Benchmark, what: str) -> None:
    """The cache's metadata must name ``benchmark`` and its config (every key of the run's config that the cache
    recorded, with the same value; the turn limit is checked against the references, ``_check_turn_limit``)."""
    if meta.get("benchmark") != benchmark.name:
        raise ConfigError(f"{what}: a cache of benchmark {meta.get('benchmark')!r}, not of {benchmark.name!r}")
    ours = transition_config(benchmark.config)
    theirs = {k: v for k, v in meta.get("config", {}).items() if k not in _evaluation_only(benchmark.config)}
    differ = [k for k in sorted(set(ours) | set(theirs)) if ours.get(k) != theirs.get(k) and k != TURN_LIMIT]
    if differ:
        k = differ[0]
        raise ConfigError(f"{what}: built under another {benchmark.name} config ({len(differ)} key(s) differ, e.g. "
                          f"{k}: cache {theirs.get(k)!r}, run {ours.get(k)!r}); rebuild it or point references at "
                          f"this config's cache")


async def build_references(benchmark: Benchmark, tasks: Sequence[Any], pool: EnvPool, *, out: str | Path,
                           candidate_files: Sequence[str | Path] = (), shorten: bool = True,
                           allow_partial: bool = False) -> dict[str, Any]:
    """Build the reference cache of ``tasks`` at ``out`` with the workers of ``pool`` (which must run
    ``benchmark.env_spec()``); returns the metadata written to ``<out>.meta.json``.

    Finished tasks go to ``<out>.partial`` as they finish, and a rerun resumes from it. Below 100% coverage nothing
    is published and ``PartialCacheError`` is raised, unless ``allow_partial``.
    """
    failed = await replay_references(benchmark, tasks, pool, out=out, candidate_files=candidate_files, shorten=shorten)
    return publish_references(benchmark, tasks, out=out, candidate_files=candidate_files, shorten=shorten,
                              allow_partial=allow_partial, failed=failed)


async def replay_references(benchmark: Benchmark, tasks: Sequence[Any], pool: EnvPool, *, out: str | Path,
                            candidate_files: Sequence[str | Path] = (), shorten: bool = True, rank: int = 0,
                            world: int = 1) -> dict[str, str]:
    """Select the references of this rank's share of ``tasks`` (every ``world``-th from ``rank``) that no rank's
    journal of ``out`` holds yet (``actfirst.core.journal``), appending each to this rank's journal as it finishes;
    returns why each task that got none failed. :func:`publish_references` then writes the cache."""
    spec = benchmark.env_spec()
    wrong = [w.spec for w in pool.workers if w.spec != spec]
    if wrong:
        raise ValueError(f"pool: its workers run {wrong[0]}, not the benchmark's configured {spec}")
    keys = [benchmark.task_key(t) for t in tasks]
    if len(set(keys)) != len(keys):
        raise ValueError("task keys are not unique; check the task set")
    candidates = read_candidates(candidate_files)
    unknown = sorted(set(candidates) - set(keys))
    if unknown and rank == 0:
        logger.warning(f"warning: candidates for {len(unknown)} tasks outside the task set ignored, e.g. "
                       f"{unknown[:3]}")
    done = read_journals(out)
    share = range(rank, len(tasks), world)
    queue: asyncio.Queue = asyncio.Queue()
    for i in share:
        if keys[i] not in done:
            queue.put_nowait(tasks[i])
    if len(share) > queue.qsize():
        logger.info(f"resuming: {len(share) - queue.qsize()} of {len(share)} tasks already in "
                    f"{journal_path(out, 0)}*")
    failed: dict[str, str] = {}
    start, finished, todo = time.monotonic(), 0, queue.qsize()

    async def run(worker: EnvWorker, journal: Journal) -> None:
        nonlocal finished
        while not queue.empty():
            task = queue.get_nowait()
            key = benchmark.task_key(task)
            try:
                ref = await build_one(benchmark, worker, task, candidates.get(key, []), shorten)
            except WorkerDied as e:
                failed[key] = f"worker died: {e}"
                continue
            finished += 1
            if ref is None:
                failed[key] = "no candidate replayed successfully"
            else:
                journal.append(ref.to_json())
            rate = finished / (time.monotonic() - start)
            logger.info(f"[{finished}/{todo}{_rank_label(rank, world)}] {key}: "
                        f"{'FAILED' if ref is None else f'{len(ref.actions)} actions ({ref.source})'}"
                        f" | {rate:.2f} tasks/s, ETA {format_eta((todo - finished) / rate)}")

    with Journal(out, rank) as journal:
        await asyncio.gather(*(run(w, journal) for w in pool.workers))
    return failed


def _rank_label(rank: int, world: int) -> str:
    return "" if world == 1 else f" rank {rank}/{world}"


def publish_references(benchmark: Benchmark, tasks: Sequence[Any], *, out: str | Path,
                       candidate_files: Sequence[str | Path] = (), shorten: bool = True, allow_partial: bool = False,
                       failed: dict[str, str] | None = None) -> dict[str, Any]:
    """Write the cache of ``tasks`` at ``out`` from every rank's journal of it (:func:`replay_references`) with
    ``<out>.meta.json`` (at 100% coverage, or below with ``allow_partial``; else ``PartialCacheError``), and drop the
    journals; returns the metadata. ``failed``: why tasks got no reference (recorded in the metadata)."""
    out = Path(out)
    keys = [benchmark.task_key(t) for t in tasks]
    done = read_journals(out)
    failed = {k: why for k, why in (failed or {}).items() if k not in done}
    covered = [k for k in keys if k in done]
    meta = {"benchmark": benchmark.name, "config": transition_config(benchmark.config), "tasks": len(keys),
            "covered": len(covered), "coverage": len(covered) / max(1, len(keys)),
            "missing": [k for k in keys if k not in done], "failures": failed,
            "built": time.strftime("%Y-%m-%dT%H:%M:%S"), "shortened": benchmark.shortens_candidates and shorten,
            "candidate_files": [str(p) for p in candidate_files]}
    logger.info(f"coverage {meta['coverage']:.1%} ({len(covered)}/{len(keys)})")
    if meta["coverage"] < 1.0 and not allow_partial:
        raise PartialCacheError(f"{len(keys) - len(covered)} tasks have no successful candidate (e.g. "
                                f"{meta['missing'][:5]}); {out} not written. Add candidates and rerun to resume "
                                f"from {journal_path(out, 0)}*, or allow a partial cache (--allow-partial).")
    write_atomically(Path(f"{out}.meta.json"), json.dumps(meta, indent=1))
    write_atomically(out, "".join(done[k] + "\n" for k in covered))
    remove_journals(out)
    logger.info(f"wrote {out} ({len(covered)} references){' PARTIAL' if meta['coverage'] < 1.0 else ''}")
    return meta

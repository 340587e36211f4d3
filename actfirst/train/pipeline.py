"""The training pipeline (C.3: "rollout collection and student optimization proceed asynchronously"): how an update's
rollouts share the time with its scoring and update, as one of three policies behind one interface
(:class:`Pipeline`, made by :func:`create_pipeline` from ``pipeline:``), each owning the task stream, the sample
buffer, the rollout batches collected ahead and the samples per episode that size them.

``pipeline: serial`` (:class:`SerialPipeline`) runs an update's phases one after the other: rollout batches of
``rollout.batch_tasks`` tasks until the buffer holds the update's samples, then scoring and the update, then the
weight sync. A rollout batch that gives more than the update needs leaves the rest in the buffer for the next update
(B.4: one version behind).

``pipeline: async`` (:class:`AsyncPipeline`, the default) collects the *next* update's samples while the teacher
scores and the student updates. The weights then enter the engine only once that collection ends, so its samples
are of version v when update v + 1 trains on them: one version behind, B.4's bound, and nothing they leave over
survives the update after (two versions behind: dropped). Collecting whole rollout batches of ``batch_tasks`` tasks
ahead (the old ``overlap``) therefore threw away whatever a batch gave beyond one update's samples: with batches of
twice an update's samples, the transitions per update doubled.

So the collection ahead is *sized and streamed* instead of fixed: it runs rollout batches one after another, each of
the tasks expected to give what the next update still lacks (its quota less the buffered samples that stay
eligible, over the samples per episode of the latest rollout batches: :meth:`SampleYield.tasks_for`), until the
buffer holds the quota; a batch that came short is followed at once by one for the shortfall, still during the
update. What is thrown away per update is what the last episodes give beyond the quota (under one episode's samples
on average), far below a whole batch's; serial drops too, whatever a batch holds beyond two updates' samples (on the
CPU demo a third of each batch, so there async collects fewer transitions per update than serial: bench/RESULTS.md).
An update's own collection (the first update's: nothing is known yet, so a whole batch) is sized the same way. Under
``batch: rollout`` (003's step: one rollout batch per update) the collection ahead is that one batch of
``batch_tasks`` tasks.

``pipeline: inflight`` (:class:`InflightPipeline`) collects ahead as ``async`` does, but the weights enter the
engine as soon as the update ends, between two engine steps, while the collection's requests continue (each token
keeps the version that produced it). The collection ahead may then outlast the weight sync: the next update starts
by waiting for it, and so does whatever needs a quiet engine (a probe, the engines' check, a checkpoint, an
evaluation: :meth:`Pipeline.quiesce`). A rollout batch counts in the update during whose step it ends
(``actfirst.train.update_record.UpdateRecords.count``).

Every pipeline stops the run when ``max_empty_batches`` rollout batches in a row give no sample while an update
collects (:class:`EmptyBatches`: every episode failed, so the collection would never end), and a shutdown cancels the
collection ahead and waits for it a bounded time (:meth:`Pipeline.stop`).

``collection:`` (:class:`Collection`) overrides how big the rollout batches are, whatever the pipeline:
``whole_batch`` collects every batch whole, as the papers do (000 C.5: "both methods use 16 tasks per rollout
batch"), so a method whose episodes are shorter executes fewer transitions for the same samples (000's Table 9:
38,616 against 55,525), part of its speedup (Sec. 5.4); ``sized`` sizes every batch as above, so that the
transitions per update are about equal for every method and the speedup is throughput alone. Unset, ``serial``
collects whole batches and ``async`` and ``inflight`` sized ones.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import dataclasses
import enum
import math
import random
import time
from collections.abc import Callable
from typing import Any, ClassVar

from actfirst.core.config import ConfigError, TrainConfig
from actfirst.core.user_input import UserError
from actfirst.engine.core import ActFirstEngine
from actfirst.rollout.runner import RolloutBatch, RolloutRunner
from actfirst.rollout.sample import Sample
from actfirst.train.buffer import SampleBuffer
from actfirst.train.clock import RunClock
from actfirst.train.update_record import UpdateRecord, UpdateRecords

YIELD_WINDOW = 10
"""Rollout batches whose samples per episode size the next collection."""
FAILURES_NAMED = 3
"""Episode failures a :class:`NoSamplesError` quotes."""


class NoSamplesError(UserError, RuntimeError):
    """``max_empty_batches`` rollout batches in a row gave no sample: the run cannot make progress (every episode
    failed). Its message names the benchmark, the update, the rank and the first failures, on one line."""


class PipelineKind(enum.StrEnum):
    """The policies of ``pipeline:`` (see the module docstring)."""

    SERIAL = "serial"
    ASYNC = "async"
    INFLIGHT = "inflight"


class Collection(enum.StrEnum):
    """The rollout batches of ``collection:``: whole ones, or sized to what the update lacks."""

    SIZED = "sized"
    WHOLE_BATCH = "whole_batch"


def check_layout(cfg: TrainConfig, world_size: int) -> None:
    """Refuse a batch that does not divide over ``world_size`` ranks, by key and value (before anything starts)."""
    if cfg.batch == "turns" and cfg.batch_samples % (world_size * cfg.num_minibatches):
        raise ConfigError(f"batch_samples={cfg.batch_samples}: must be a multiple of the ranks ({world_size}) x "
                          f"num_minibatches ({cfg.num_minibatches}), so that every optimizer step takes an equal share "
                          f"from every rank")
    per_rank = cfg.rollout.tasks_per_rank
    if per_rank is not None and per_rank * world_size != cfg.rollout.batch_tasks:
        raise ConfigError(f"rollout.tasks_per_rank={per_rank}: {world_size} ranks x {per_rank} is not "
                          f"rollout.batch_tasks={cfg.rollout.batch_tasks}; set one of them for this number of ranks "
                          f"(or tasks_per_rank=null to deal the batch over the ranks)")
    if cfg.rollout.batch_tasks < world_size:
        raise ConfigError(f"rollout.batch_tasks={cfg.rollout.batch_tasks}: fewer than the {world_size} ranks (each "
                          f"rank plays its share of every rollout batch)")


def share(total: int, rank: int, world_size: int) -> int:
    """Rank ``rank``'s part of ``total`` items dealt round-robin over ``world_size`` ranks."""
    return len(range(rank, total, world_size))


class SampleYield:
    """Samples per episode over the latest :data:`YIELD_WINDOW` rollout batches (sizes the batches collected ahead)."""

    def __init__(self) -> None:
        self.window: collections.deque[tuple[int, int]] = collections.deque(maxlen=YIELD_WINDOW)
        """(episodes, samples) of each recent rollout batch."""

    def add(self, episodes: int, samples: int) -> None:
        """Count a finished rollout batch."""
        self.window.append((episodes, samples))

    def per_episode(self) -> float | None:
        """Samples per episode over the window (None before any batch, or when no episode gave a sample)."""
        episodes, samples = (sum(x) for x in zip(*self.window, strict=True)) if self.window else (0, 0)
        return samples / episodes if episodes and samples else None

    def tasks_for(self, need: int, most: int) -> int:
        """The tasks of a rollout batch expected to give ``need`` samples (at least 1, at most ``most``; ``most``
        while nothing is known yet)."""
        if need < 1:
            raise ValueError(f"need={need}: a rollout batch is sized for at least one sample")
        per_episode = self.per_episode()
        return most if per_episode is None else min(most, max(1, math.ceil(need / per_episode)))

    def state_dict(self) -> list[list[int]]:
        return [list(x) for x in self.window]

    def load_state_dict(self, state: list[list[int]]) -> None:
        self.window.clear()
        self.window.extend((int(e), int(s)) for e, s in state)


class TaskStream:
    """This rank's training tasks, reshuffled every pass, handed out one rollout batch at a time."""

    def __init__(self, tasks: list[Any], seed: int) -> None:
        if not tasks:
            raise ValueError("no training tasks for this rank")
        self.tasks, self.rng, self.queue = tasks, random.Random(seed), collections.deque()

    def next(self, n: int) -> list[Any]:
        """The next ``n`` tasks (a new shuffled pass begins when the queue runs short)."""
        while len(self.queue) < n:
            order = list(self.tasks)
            self.rng.shuffle(order)
            self.queue.extend(order)
        return [self.queue.popleft() for _ in range(n)]

    def state_dict(self, key: Callable[[Any], str]) -> dict[str, Any]:
        """The shuffle's RNG state and the tasks still queued (by ``key(task)``)."""
        return {"rng": self.rng.getstate(), "queue": [key(t) for t in self.queue]}

    def load_state_dict(self, state: dict[str, Any], key: Callable[[Any], str]) -> None:
        """Continue the shuffle and the queue of :meth:`state_dict` (tasks found by ``key``)."""
        by_key = {key(t): t for t in self.tasks}
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.queue = collections.deque(by_key[k] for k in state["queue"])


@dataclasses.dataclass(slots=True)
class EmptyBatches:
    """The rollout batches in a row that gave no sample while one update collects, and their first failures: at
    ``limit`` of them the run stops (:class:`NoSamplesError`)."""

    limit: int
    benchmark: str
    rank: int
    update: int = 0
    count: int = 0
    failures: list[str] = dataclasses.field(default_factory=list)

    def check(self, batch: RolloutBatch, update: int) -> None:
        """Count ``batch``, collected for ``update``: one that gave a sample (or the first for another update) starts
        the count afresh; the ``limit``-th empty one in a row raises :class:`NoSamplesError`."""
        if update != self.update or batch.samples:
            self.update, self.count, self.failures = update, 0, []
        if batch.samples:
            return
        self.count += 1
        self.failures += [f"{e.task}: {e.failure}" for e in batch.episodes if e.failure][:FAILURES_NAMED]
        if self.count >= self.limit:
            failures = "; ".join(self.failures[:FAILURES_NAMED]) or "none (every episode ended without a turn)"
            raise NoSamplesError(
                f"max_empty_batches={self.limit}: {self.count} rollout batches in a row gave no sample for update "
                f"{update} on rank {self.rank} (benchmark {self.benchmark!r}: every episode failed); the first "
                f"failures: {' '.join(failures.split())}")


@dataclasses.dataclass(slots=True)
class Ahead:
    """The collection ahead: the next update's rollout batches, started during an update's step."""

    started_in: int
    """The update during whose step it started (its record gets ``overlapped`` and ``ahead_s``)."""
    task: asyncio.Task | None = None
    """Running, or finished and not awaited yet (None once awaited)."""
    t0: float | None = None
    ended: float | None = None
    ran: bool = False
    """Whether it started a rollout batch."""

    def seconds(self) -> float:
        """How long it ran, up to now while it runs."""
        return 0.0 if self.t0 is None else (self.ended or time.perf_counter()) - self.t0


class Pipeline(abc.ABC):
    """One rank's collection of samples for every update, under one of the policies of ``pipeline:`` (see the
    module docstring). :meth:`collect` is the step's first phase and :meth:`before_weights` comes before its weight
    sync; :meth:`close` ends an update's record; :meth:`quiesce` waits for the collection ahead, :meth:`stop`
    cancels it. The records of the updates are ``records``' (:class:`~actfirst.train.update_record.UpdateRecords`):
    the pipeline hands every finished rollout batch to it, tagged with the update it started in."""

    kind: ClassVar[PipelineKind]
    collection: ClassVar[Collection]
    """The rollout batches it collects unless ``collection:`` says otherwise."""
    keeps_in_flight: ClassVar[bool] = False
    """Whether the weights enter the engine while requests are in flight, which keep their tokens (``inflight``)."""

    def __init__(self, cfg: TrainConfig, *, rank: int, world_size: int, tasks: list[Any],
                 task_key: Callable[[Any], str], clock: RunClock, records: UpdateRecords,
                 on_batch: Callable[[RolloutBatch], None]) -> None:
        self.cfg, self.rank = cfg, rank
        self.task_key, self.clock, self.records, self.on_batch = task_key, clock, records, on_batch
        self.buffer = SampleBuffer()
        self.stream = TaskStream(tasks, cfg.seed + rank)
        self.sample_yield = SampleYield()
        """Samples per episode of the latest rollout batches: the size of the batches collected ahead."""
        self.whole_batches = Collection(cfg.collection or self.collection) is Collection.WHOLE_BATCH
        """Whether every rollout batch is a whole one (``collection:``), else sized to what the update lacks."""
        self.batch_tasks = share(cfg.rollout.batch_tasks, rank, world_size)
        """This rank's tasks of a whole rollout batch (its environment workers)."""
        self.quota = cfg.batch_samples // world_size
        """Full responses this rank contributes to every update (``batch: turns``)."""
        self.batch_index = 0
        """This rank's rollout batches so far (the curricula's n is one less)."""
        self.empty = EmptyBatches(cfg.max_empty_batches, cfg.benchmark, rank)
        self.ahead: Ahead | None = None
        self.runner: RolloutRunner | None = None
        """The rollout runner (:meth:`start`: it needs the engine and the environment workers)."""

    def start(self, runner: RolloutRunner) -> None:
        """Collect with ``runner`` from now on."""
        self.runner = runner

    @property
    def engine(self) -> ActFirstEngine:
        return self.runner.engine

    # -- the policy -------------------------------------------------------------------------------------------------

    @abc.abstractmethod
    def collects_ahead(self, update: int) -> bool:
        """Whether update ``update``'s step collects the next update's samples while it scores and updates."""

    @abc.abstractmethod
    async def before_weights(self) -> None:
        """What comes before the new weights enter the engine."""

    # -- the step ---------------------------------------------------------------------------------------------------

    async def collect(self, update: int) -> list[Sample]:
        """Phase 1 of ``update``: rollout batches until this rank's buffer holds its share of the update's batch
        (current or preceding weight version), which it returns; then, when the policy does, the next update's
        collection starts."""
        await self.quiesce()  # inflight: the collection ahead may have outlasted the weight sync
        version = self.engine.weight_version
        await self._fill(update, version, started_in=update)
        rollout = self.cfg.batch == "rollout"  # 003's step: every sample of its one rollout batch
        samples = self.buffer.take(self.buffer.num_eligible(version) if rollout else self.quota, version)
        self.records.open.staleness = version - min(s.weight_version for s in samples)
        self.records.open.spanning = sum(len(set(s.token_versions)) > 1 for s in samples)
        if self.collects_ahead(update):
            self.ahead = Ahead(started_in=update)
            self.ahead.task = asyncio.ensure_future(self._collect_ahead(self.ahead, update + 1, version + 1))
        return samples

    def close(self, update: int, wall_s: float) -> UpdateRecord:
        """``update``'s record, closed after its weight sync (``wall_s``: its step so far); the next one opens. The
        collection ahead it started gives it ``overlapped`` and ``ahead_s`` (up to now while it still runs)."""
        record = self.records.open
        if self.ahead is not None and self.ahead.started_in == update:
            record.overlapped, record.ahead_s = self.ahead.ran, self.ahead.seconds()
        return self.records.close(self.engine, self.buffer, wall_s)

    @property
    def running_ahead(self) -> bool:
        """Whether the collection ahead is running now."""
        return self.ahead is not None and self.ahead.task is not None and not self.ahead.task.done()

    async def quiesce(self) -> None:
        """Wait for the collection ahead, if one runs or has not been awaited (the wait adds to the open record's
        ``wait_s``); its error, if it failed, is raised here."""
        task = self.ahead.task if self.ahead is not None else None
        if task is None:
            return
        t0 = time.perf_counter()
        try:
            await task
        finally:
            self.ahead.task = None
        self.records.open.wait_s += time.perf_counter() - t0

    async def stop(self, timeout_s: float) -> None:
        """Cancel the collection ahead and wait, at most ``timeout_s``, for it to end (its episodes give their
        requests back); what it raises then is not this stop's concern."""
        task = self.ahead.task if self.ahead is not None else None
        if task is None:
            return
        self.ahead.task = None
        task.cancel()
        await asyncio.wait([task], timeout=timeout_s)
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: a failure it ended with is not logged as never retrieved

    # -- rollout batches --------------------------------------------------------------------------------------------

    async def _collect_ahead(self, ahead: Ahead, update: int, version: int) -> None:
        """The samples of ``update`` (the next), collected while this one scores and updates: with ``batch: turns``,
        rollout batches sized to what it still lacks until the buffer holds its share; with ``batch: rollout``, its
        one rollout batch. ``version``: the weights ``update`` trains."""
        ahead.t0 = time.perf_counter()
        try:
            await self._fill(update, version, started_in=ahead.started_in, ahead=ahead)
        finally:
            ahead.ended = time.perf_counter()

    async def _fill(self, update: int, version: int, *, started_in: int, ahead: Ahead | None = None) -> None:
        """Rollout batches collected for ``update`` (which trains under ``version``) until it lacks nothing;
        ``started_in``: the update whose step runs them."""
        while (need := self._still_needed(version)) > 0:
            if ahead is not None:
                ahead.ran = True
            batch = await self._run_batch(update, self.tasks_for(need))
            self._finish(batch, started_in)
            self.empty.check(batch, update)

    def _still_needed(self, version: int) -> int:
        """Samples the update that trains under ``version`` still lacks: its quota less the eligible buffered ones
        (``batch: rollout``: one batch's, so 1 until a rollout batch has given a sample)."""
        eligible = self.buffer.num_eligible(version)
        return (0 if eligible else 1) if self.cfg.batch == "rollout" else self.quota - eligible

    def tasks_for(self, need: int) -> int:
        """The tasks of the next rollout batch when the update it collects for lacks ``need`` samples: this rank's
        share of a whole rollout batch (``collection: whole_batch``; ``batch: rollout``, 003's step), else those
        expected to give ``need`` more samples (at most that share)."""
        if self.whole_batches or self.cfg.batch == "rollout":
            return self.batch_tasks
        return self.sample_yield.tasks_for(need, self.batch_tasks)

    async def _run_batch(self, update: int, tasks: int) -> RolloutBatch:
        """A rollout batch of the stream's next ``tasks`` tasks, collected for ``update`` (UOPD's r_n is that
        update's)."""
        if self.runner.intervention is not None:
            self.runner.intervention.update = update - 1
        self.batch_index += 1
        self.clock.open_window()
        return await self.runner.run_batch(self.stream.next(tasks), self.batch_index)

    def _finish(self, batch: RolloutBatch, started_in: int) -> None:
        """A finished rollout batch (started during ``started_in``'s step): its samples into the buffer, its counts
        into the record of the update it counts in."""
        self.buffer.add(batch.samples)
        self.sample_yield.add(len(batch.episodes), len(batch.samples))
        self.records.count(batch, started_in)
        self.on_batch(batch)

    # -- checkpoints ------------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's part of a checkpoint (``buffer``, ``tasks``, ``batch_index``, ``sample_yield``); nothing may
        be collected ahead then (:meth:`quiesce` first)."""
        if self.ahead is not None and self.ahead.task is not None:
            raise RuntimeError("a checkpoint while the collection ahead runs: quiesce first")
        return {"buffer": self.buffer.state_dict(), "tasks": self.stream.state_dict(self.task_key),
                "batch_index": self.batch_index, "sample_yield": self.sample_yield.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from this rank's :meth:`state_dict` (a checkpoint of the same number of ranks)."""
        self.buffer.load_state_dict(state["buffer"])
        self.stream.load_state_dict(state["tasks"], self.task_key)
        self.batch_index = state["batch_index"]
        self.sample_yield.load_state_dict(state.get("sample_yield", []))  # none in an older checkpoint

    def redeal(self, states: list[dict[str, Any]], *, rank: int, world_size: int, seed: int) -> None:
        """Continue from every saved rank's :meth:`state_dict` on another number of ranks: the buffered samples
        pooled and dealt (rank r takes every R-th), the rollout-batch counter the largest, the samples per episode
        pooled, and the task order afresh from ``seed``."""
        pooled = [s for state in states for s in state["buffer"]["samples"]]
        self.buffer.load_state_dict({"samples": pooled[rank::world_size], "num_added": 0, "num_consumed": 0,
                                     "num_dropped": 0})
        self.batch_index = max(state["batch_index"] for state in states)
        self.sample_yield.load_state_dict([x for state in states for x in state.get("sample_yield", [])])
        self.stream = TaskStream(self.stream.tasks, seed)


class SerialPipeline(Pipeline):
    """Rollouts, then scoring and the update, then the weight sync; whole rollout batches."""

    kind = PipelineKind.SERIAL
    collection = Collection.WHOLE_BATCH

    def collects_ahead(self, update: int) -> bool:
        return False

    async def before_weights(self) -> None:
        """Nothing runs besides the update."""


class AsyncPipeline(Pipeline):
    """The next update's samples collected during scoring and the update, in sized rollout batches; the weights
    enter the engine once that collection has ended."""

    kind = PipelineKind.ASYNC
    collection = Collection.SIZED

    def collects_ahead(self, update: int) -> bool:
        return update < self.cfg.num_updates  # nothing after the last

    async def before_weights(self) -> None:
        """Wait for the collection ahead (its samples are then all of the weights it started under)."""
        await self.quiesce()


class InflightPipeline(AsyncPipeline):
    """As :class:`AsyncPipeline`, but the weights enter the engine at once while the collection ahead goes on."""

    kind = PipelineKind.INFLIGHT
    keeps_in_flight = True

    async def before_weights(self) -> None:
        """Nothing: the weights enter between two engine steps, the requests in flight continuing under them."""


PIPELINES: dict[PipelineKind, type[Pipeline]] = {cls.kind: cls for cls in (SerialPipeline, AsyncPipeline,
                                                                            InflightPipeline)}


def create_pipeline(name: str, cfg: TrainConfig, **kwargs: Any) -> Pipeline:
    """The pipeline ``name`` (``pipeline:``) for ``cfg``; ``kwargs``: :class:`Pipeline`'s. An unknown name is a
    ``ValueError`` naming the known ones."""
    try:
        kind = PipelineKind(name)
    except ValueError:
        raise ValueError(f"pipeline={name!r}: not one of {[k.value for k in PipelineKind]}") from None
    return PIPELINES[kind](cfg, **kwargs)

"""The per-update metrics record: what one update did on this rank (:class:`UpdateRecord`), which update a rollout
batch counts in (:class:`UpdateRecords`), and the update's metrics line over every rank (:meth:`UpdateRecords.log`).

An update's record opens when the previous one closes (after its weight sync) and closes after its own sync: the
rollout batches that end in between count in it, and so do the engine's tokens and requests of that span, except
those of the probe, the engines' check and the evaluations (:meth:`UpdateRecords.left_out`). A checkpoint saves the
open record as it stands (``pipeline: inflight``: the rollout batches collected ahead that ended after the last
update's sync are in it), and a resumed run opens it again from there (:meth:`UpdateRecords.state_dict`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections import deque
from collections.abc import Iterator
from typing import Any

from actfirst.engine.core import ActFirstEngine, RequestRecord, summarize_records
from actfirst.engine.request import RequestKind
from actfirst.parallel.context import ParallelContext, all_gather_objects, reduce_max, reduce_sum
from actfirst.rollout.intervention import InterventionRecord, intervention_metrics
from actfirst.rollout.runner import RolloutBatch
from actfirst.train.buffer import SampleBuffer
from actfirst.train.clock import RunClock
from actfirst.train.metrics import ALIGNMENT_WINDOW, MetricsSink, rollout_counts, rollout_rates, summary_line
from actfirst.train.speedup import FIELDS as SPEEDUP_FIELDS
from actfirst.train.speedup import EpisodeLatencies, batch_times, speedups

logger = logging.getLogger(__name__)

PHASE_SECONDS = ("score_s", "update_s", "sync_s", "probe_s")
"""A step's phase times: the metrics line holds the slowest rank's, ``ranks`` (with several ranks) each rank's."""
_ENGINE_COUNTERS = {"generated": "num_generated_tokens", "discarded": "num_discarded_tokens",
                    "carried": "num_carried_tokens"}
"""The record's token counts and the engine counters they are spans of."""


@dataclasses.dataclass(slots=True)
class UpdateRecord:
    """What one update did on this rank, from the previous update's weight sync to its own (the probes and
    evaluations after it are not counted)."""

    update: int
    rollout_s: float = 0.0
    transitions: int = 0
    batches: int = 0
    failures: list[str] = dataclasses.field(default_factory=list)
    overlapped: bool = False
    """Whether rollouts were collected while this update scored and updated."""
    ahead_s: float = 0.0
    """How long the next update's collection ran (from the start of scoring and the update) up to its end or this
    record's close, whichever came first."""
    wait_s: float = 0.0
    """How long the update waited for the collection in flight (the weight sync's wait, and waits before it)."""
    staleness: int = 0
    """The most versions any sample of this update's batch was behind the weights it updated (B.4: at most 1)."""
    spanning: int = 0
    """Samples of this update's batch whose tokens come from two weight versions (``pipeline: inflight``)."""
    generated: int = 0
    """Tokens the engine generated (kept or discarded); engine counters start negative and :meth:`close` adds
    their ends."""
    discarded: int = 0
    carried: int = 0
    """Tokens of requests in flight when ``pipeline: inflight`` loaded new weights, kept (the engine's count)."""
    dropped: int = 0
    """Samples the staleness rule dropped."""
    wall_s: float = 0.0
    early: int = 0
    """Transitions completed within the first ``actfirst.train.clock.EARLY_WINDOW_S`` of the throughput window."""
    times: dict[str, float] = dataclasses.field(default_factory=lambda: dict.fromkeys(SPEEDUP_FIELDS, 0.0))
    """The rollout batches' measured completion times and Eq. 25/36's (``actfirst.train.speedup``), summed."""
    records: list[RequestRecord] = dataclasses.field(default_factory=list)
    """The engine's requests (queue statistics)."""
    interventions: list[InterventionRecord] = dataclasses.field(default_factory=list)
    """UOPD's decisions at the student turns of this update's rollout batches."""

    @classmethod
    def opened(cls, update: int, engine: ActFirstEngine, buffer: SampleBuffer) -> UpdateRecord:
        """``update``'s record, opened now (its engine and buffer counters count from here)."""
        return cls(update, **{k: -getattr(engine, c) for k, c in _ENGINE_COUNTERS.items()}, dropped=-buffer.num_dropped)

    def add_batch(self, batch: RolloutBatch, *, early: int, b_max: int) -> None:
        """Count a finished rollout batch (``early``: its transitions in the early throughput window)."""
        self.rollout_s += batch.wall_s
        self.transitions += batch.num_transitions
        self.early += early
        times = batch_times([EpisodeLatencies(e.num_turns, [r.latency_s for r in e.full_responses],
                                              [t.fast.latency_s for t in e.turns if t.fast is not None])
                             for e in batch.episodes], wall_s=batch.wall_s, b_max=b_max)
        self.times = {k: self.times[k] + times[k] for k in SPEEDUP_FIELDS}
        self.batches += 1
        self.failures += [f"{e.task}: {e.failure}" for e in batch.episodes if e.failure]
        self.interventions += [r for e in batch.episodes for r in e.interventions]

    def take_requests(self, engine: ActFirstEngine) -> None:
        """Move the engine's finished requests into this record (the engine's list starts afresh)."""
        self.records += engine.records
        engine.records.clear()

    def close(self, engine: ActFirstEngine, buffer: SampleBuffer, wall_s: float) -> None:
        """Take the counters' ends and the request records."""
        for key, counter in _ENGINE_COUNTERS.items():
            setattr(self, key, getattr(self, key) + getattr(engine, counter))
        self.dropped += buffer.num_dropped
        self.wall_s = wall_s
        self.take_requests(engine)

    def state_dict(self, engine: ActFirstEngine, buffer: SampleBuffer) -> dict[str, Any]:
        """This open record as plain data: its counts so far (the engine's and the buffer's up to now) and the
        engine's requests finished since it opened."""
        state = dataclasses.asdict(self)
        for key, counter in _ENGINE_COUNTERS.items():
            state[key] += getattr(engine, counter)
        state["dropped"] += buffer.num_dropped
        state["records"] = [{**dataclasses.asdict(r), "kind": int(r.kind)} for r in engine.records]
        return state

    @classmethod
    def restored(cls, states: list[dict[str, Any]], engine: ActFirstEngine, buffer: SampleBuffer) -> UpdateRecord:
        """The open record of :meth:`state_dict` (several: of the saved ranks this rank takes over, added up),
        opened again on this engine and buffer; its requests go back to the engine's list."""
        record = cls.opened(states[0]["update"], engine, buffer)
        for state in states:
            for field in dataclasses.fields(cls):
                name, value = field.name, state[field.name]
                if name == "records":
                    engine.records.extend(RequestRecord(**{**r, "kind": RequestKind(r["kind"])}) for r in value)
                elif name == "interventions":
                    record.interventions += [InterventionRecord(**r) for r in value]
                elif name == "times":
                    record.times = {k: record.times[k] + value.get(k, 0.0) for k in SPEEDUP_FIELDS}
                elif name in ("overlapped", "staleness", "spanning", "wait_s", "ahead_s"):
                    setattr(record, name, max(getattr(record, name), value))
                elif name != "update":
                    setattr(record, name, getattr(record, name) + value)
        return record



class UpdateRecords:
    """This rank's open update record, which update a finished rollout batch counts in, what is left out of every
    update, and the update's metrics line (see the module docstring)."""

    def __init__(self, *, clock: RunClock, ctx: ParallelContext, b_max: int, pipeline: str, uopd: bool) -> None:
        self.clock, self.ctx, self.b_max = clock, ctx, b_max
        self.pipeline, self.uopd = pipeline, uopd
        self.window: deque[dict[str, float]] = deque(maxlen=ALIGNMENT_WINDOW)
        """Appendix F's window: the rollout counts of the latest rollout batches."""
        self.open: UpdateRecord | None = None
        """The open update's record (:meth:`begin`; then every :meth:`close` opens the next)."""
        self.resumed: list[dict[str, Any]] = []
        """The open records a checkpoint saved, which :meth:`begin` opens again (:meth:`restore`)."""

    def begin(self, update: int, engine: ActFirstEngine, buffer: SampleBuffer) -> None:
        """Open ``update``'s record as the run starts (a resumed run: the one its checkpoint saved)."""
        self.open = UpdateRecord.opened(update, engine, buffer)
        if self.resumed:
            self.open = UpdateRecord.restored(self.resumed, engine, buffer)
            if self.open.update != update:
                raise ValueError(f"the checkpoint's open record is update {self.open.update}'s, not {update}'s")

    def count(self, batch: RolloutBatch, started_in: int) -> int:
        """Count a finished rollout batch that started during update ``started_in``'s step: in that update's record
        while it is open; once it has closed (``pipeline: inflight``: the batch outlasted the weight sync), in the
        open one, the next update's. Returns the update it counts in."""
        if started_in > self.open.update:
            raise ValueError(f"a rollout batch started in update {started_in}, whose record is not open yet "
                             f"(update {self.open.update}'s is)")
        self.window.append(rollout_counts(batch.episodes))
        early = self.clock.count_early(t.step_done for e in batch.episodes for t in e.turns)
        self.open.add_batch(batch, early=early, b_max=self.b_max)
        return self.open.update

    def close(self, engine: ActFirstEngine, buffer: SampleBuffer, wall_s: float) -> UpdateRecord:
        """Close the open update's record (after its weight sync; ``wall_s``: its step so far) and open the next."""
        record = self.open
        record.close(engine, buffer, wall_s)
        self.open = UpdateRecord.opened(record.update + 1, engine, buffer)
        return record

    @contextlib.contextmanager
    def left_out(self, engine: ActFirstEngine) -> Iterator[None]:
        """Leave what ``engine`` generates inside out of the open record (its tokens and its request records): the
        probe, the engines' check, an evaluation, on an engine that serves nothing else meanwhile."""
        before = {key: getattr(engine, counter) for key, counter in _ENGINE_COUNTERS.items()}
        held = len(engine.records)
        try:
            yield
        finally:
            for key, counter in _ENGINE_COUNTERS.items():
                setattr(self.open, key, getattr(self.open, key) - (getattr(engine, counter) - before[key]))
            del engine.records[held:]

    def state_dict(self, engine: ActFirstEngine, buffer: SampleBuffer) -> dict[str, Any]:
        """The window and the open record (a checkpoint's rank state: ``recent``, ``open_record``)."""
        return {"recent": list(self.window), "open_record": self.open.state_dict(engine, buffer)}

    def restore(self, states: list[dict[str, Any]], *, same_ranks: bool, rank: int, world_size: int) -> None:
        """Continue from the saved ranks' :meth:`state_dict`: on as many ranks (``same_ranks``: ``states`` is this
        rank's), its window and open record; on another number, Appendix F's window starts afresh and rank r takes
        over the open records of the saved ranks i with i % world_size == r (a checkpoint older than
        ``open_record``: none)."""
        if same_ranks:
            self.window.extend(states[0]["recent"])
        mine = states if same_ranks else states[rank::world_size]
        self.resumed = [s["open_record"] for s in mine if "open_record" in s]

    def log(self, record: UpdateRecord, metrics: dict[str, Any], *, version: int, buffered: int, batch_n: int,
            horizon: int, sink: MetricsSink | None) -> None:
        """Reduce ``record``'s figures over the ranks; rank 0 writes the metrics line (``sink``) and the terminal
        line. ``buffered``: the buffer's samples; ``batch_n``: the rollout batches so far less one; ``horizon``:
        the strategy's turn limit at it."""
        keys = sorted(rollout_counts([]))  # the same on every rank, whatever its window holds
        window = {k: sum(c.get(k, 0) for c in self.window) for k in keys}  # a key newer than a checkpoint: 0
        counts = [record.transitions, record.batches, record.generated, record.discarded, record.carried, buffered,
                  record.dropped, record.early, record.spanning]
        sums = reduce_sum([*counts, *[record.times[k] for k in SPEEDUP_FIELDS],
                           *[window[k] for k in keys]])  # one collective for every count of the update
        n = len(counts)
        transitions, batches, generated, discarded, carried, buffered, dropped, early, spanning = (
            int(x) for x in sums[:n])
        times = dict(zip(SPEEDUP_FIELDS, sums[n:n + len(SPEEDUP_FIELDS)], strict=True))
        slowest = reduce_max([record.rollout_s, record.wall_s, record.wait_s, record.staleness, record.ahead_s])
        per_rank = all_gather_objects({"rollout_s": record.rollout_s, "transitions": record.transitions,
                                       "failures": record.failures, "records": record.records,
                                       "interventions": record.interventions, "batch_n": batch_n,
                                       **{k: metrics.get(k, 0.0) for k in PHASE_SECONDS}})
        self.clock.count(transitions=transitions, early=early, rollout_times=times)
        if not self.ctx.lead:
            return
        failures = [f"rank {r}: {f}" if self.ctx.world_size > 1 else f for r, p in enumerate(per_rank)
                    for f in p["failures"]]
        phases = {k: max(p[k] for p in per_rank) for k in PHASE_SECONDS if k in metrics}  # the slowest rank's
        line = {
            **metrics, **phases, **rollout_rates(dict(zip(keys, sums[n + len(SPEEDUP_FIELDS):], strict=True))),
            **self.clock.throughput(),
            **{f"speedup/{k}": v for k, v in speedups(times).items()},
            **{f"speedup/run_{k}": v for k, v in speedups(self.clock.rollout_times).items()},
            "weight_version": version, "rollout_s": slowest[0], "rollout_batches": batches,
            "pipeline": self.pipeline, "pipeline/overlapped": record.overlapped, "pipeline/wait_s": slowest[2],
            "pipeline/max_staleness": int(slowest[3]),
            "pipeline/spanning_samples": spanning, "pipeline/ahead_s": slowest[4], "update_wall_s": slowest[1],
            "elapsed_s": self.clock.elapsed(),
            "env_steps_per_s": transitions / slowest[1] if slowest[1] > 0 else math.nan,
            "transitions": transitions, "total_transitions": self.clock.total_transitions,
            "failed_episodes": len(failures), "failures": failures,
            "generated_tokens": generated, "discarded_tokens": discarded, "carried_tokens": carried,
            "discarded_frac": discarded / generated if generated else 0.0,
            "buffer/size": buffered, "buffer/dropped": dropped, "world_size": self.ctx.world_size,
            "queue": summarize_records([r for p in per_rank for r in p["records"]]),
            "rollout/horizon": horizon,
            "rollout/batch_n": min(p["batch_n"] for p in per_rank),
            "rollout/batch_n_max": max(p["batch_n"] for p in per_rank),  # each rank counts its own rollout batches
        }
        if self.uopd:
            line.update(intervention_metrics([r for p in per_rank for r in p["interventions"]]))
        if self.ctx.world_size > 1:
            line["ranks"] = {k: [p[k] for p in per_rank] for k in ("rollout_s", "transitions", *phases)}
        self.clock.beat()  # before the metrics line: whoever sees update N's line sees its time in clock.jsonl
        sink.log(record.update, line)
        logger.info(summary_line(record.update, line))
        for failure in failures:
            logger.info("  episode failed: %s", failure)

"""ActFirstEngine: the asyncio front of the student's in-process vLLM engine.

Callers ``await engine.generate(...)``; one loop task runs schedule -> execute -> update:

1. the :class:`Scheduler` decides which requests vLLM sees (fast actions first, at most b_max);
2. vLLM runs one step;
3. new tokens are appended, finished requests leave the scheduler and their futures resolve.

Between steps the loop yields to the event loop, so a caller whose fast action just finished can submit its
next turn before the next step: full responses never block the environment.

Weight updates (``update_weights``) happen between steps, in one of two ways:

- by default, requests in flight at that moment are aborted in vLLM and requeued at the front of their queues with
  their partial outputs dropped: they restart under the new weights, so every result's tokens and log-probs come
  from a single weight version. The cost is the work they had done (``num_discarded_tokens``), bounded by one
  request's length per slot;
- with ``keep_in_flight`` (``pipeline: inflight``), requests continue: every token they generated stays, the
  tokens after the load come from the new weights (``num_carried_tokens`` counts the tokens kept). Their KV cache,
  computed under the old weights, stays in use for them. Each token carries the version that produced it
  (``GenerationResult.token_versions``), and its log-prob is that of the distribution it was sampled from, whichever
  version that was: log pi_old (Eq. 29-30).

No request that enters vLLM after an update may reuse a prefix computed under older weights. vLLM refuses to reset
its prefix cache while requests hold KV blocks, so instead every request enters vLLM with a cache salt naming the
weight version at that moment (vLLM mixes it into the hash of the first block, hence of every block after it): a
request that enters later can only hit blocks computed by requests that entered under the same version. A request
resumed after a preemption enters again, with the current version's salt, and recomputes its KV.

On CUDA the engine steps on a high-priority stream of its own and the trainer runs its update inside
:meth:`ActFirstEngine.update_phase`, on another (``actfirst.engine.streams``): decode steps never queue behind the
update's kernels, and the weights a sync gathers are the finished ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Iterable

import torch

from actfirst.core.config import EngineConfig, SchedulerConfig
from actfirst.engine.llm import VLLMEngine
from actfirst.engine.request import FINISH_REASONS, GenerationResult, Request, RequestKind, RequestStatus, SamplingSpec
from actfirst.engine.scheduler import Scheduler

_FINISH_STATUS = {"stop": RequestStatus.FINISHED_STOPPED, "length": RequestStatus.FINISHED_LENGTH,
                  "abort": RequestStatus.FINISHED_ABORTED}


@dataclasses.dataclass(slots=True)
class RequestRecord:
    """Per-request measurements kept for reports and invariant checks."""

    request_id: str
    kind: RequestKind
    arrival_seq: int
    admit_seqs: list[int]
    queue_wait_s: float
    """Waiting for admission (``GenerationResult.queue_wait_s``)."""
    latency_s: float
    """In-slot: admission to completion, the queue wait excluded (``GenerationResult.latency_s``)."""
    num_tokens: int
    num_preemptions: int


def summarize_records(records: list[RequestRecord]) -> dict[str, dict[str, float]]:
    """Queue wait and in-slot latency, apart (p50, p95, max; milliseconds), and counts (requests, preemptions,
    generated tokens) by request kind."""

    def pct(values: list[float], q: float) -> float:
        return 1e3 * sorted(values)[min(len(values) - 1, int(q * len(values)))]

    summary = {}
    for kind in RequestKind:
        recs = [r for r in records if r.kind == kind]
        if not recs:
            continue
        waits, lats = [r.queue_wait_s for r in recs], [r.latency_s for r in recs]
        summary[kind.name.lower()] = {
            "count": len(recs), "preemptions": sum(r.num_preemptions for r in recs),
            "tokens": sum(r.num_tokens for r in recs),
            "queue_wait_p50_ms": pct(waits, 0.5), "queue_wait_p95_ms": pct(waits, 0.95),
            "queue_wait_max_ms": 1e3 * max(waits),
            "latency_p50_ms": pct(lats, 0.5), "latency_p95_ms": pct(lats, 0.95), "latency_max_ms": 1e3 * max(lats),
        }
    return summary


class ActFirstEngine:
    """Fast-action-first generation on one in-process vLLM engine."""

    def __init__(self, vllm: VLLMEngine, scheduler_cfg: SchedulerConfig) -> None:
        self.vllm = vllm
        self.scheduler = Scheduler(scheduler_cfg)
        self.weight_version = 0
        self.records: list[RequestRecord] = []
        self.num_steps = 0
        self.num_generated_tokens = 0
        """Tokens vLLM generated, kept or not (a requeue at a weight update discards some)."""
        self.num_discarded_tokens = 0
        """Generated tokens thrown away by ``update_weights`` (their requests restart under the new weights)."""
        self.num_carried_tokens = 0
        """Generated tokens of requests in flight at a ``keep_in_flight`` update, kept across it."""
        self.peak_in_flight = 0
        """Most requests vLLM held at once (never above b_max: vLLM sees only admitted requests)."""
        self._requests: dict[str, Request] = {}  # unfinished, by engine request id
        self._by_id: dict[str, Request] = {}  # unfinished, by caller's request id
        self._wakeup = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._next_id = 0
        self.asleep = False
        """Between :meth:`sleep` and the next :meth:`update_weights`: the engine's GPU memory is free."""

    @classmethod
    def from_config(cls, engine_cfg: EngineConfig, scheduler_cfg: SchedulerConfig, *,
                    world_size: int = 1) -> ActFirstEngine:
        """An engine for this process; ``world_size`` > 1: one of the job's per-rank engines (every rank builds its
        own at the same time)."""
        if scheduler_cfg.b_max > engine_cfg.max_num_seqs:
            raise ValueError(f"scheduler.b_max={scheduler_cfg.b_max}: must not exceed "
                             f"engine.max_num_seqs={engine_cfg.max_num_seqs}")
        return cls(VLLMEngine(engine_cfg, world_size=world_size), scheduler_cfg)

    @property
    def max_model_len(self) -> int:
        """The most tokens a request's prompt and response may hold together (vLLM's ``max_model_len``)."""
        return int(self.vllm.engine.model_config.max_model_len)

    def reconfigure(self, scheduler_cfg: SchedulerConfig) -> None:
        """Replace the scheduling policy (b_max, admission) while idle; records are cleared."""
        if self.scheduler.has_work():
            raise RuntimeError("reconfigure needs an idle engine")
        self.scheduler = Scheduler(scheduler_cfg)
        self.records.clear()
        self.peak_in_flight = 0

    # -- API -----------------------------------------------------------------------------------------------------

    def submit(self, prompt_token_ids: list[int], kind: RequestKind, sampling: SamplingSpec,
               request_id: str | None = None) -> asyncio.Future:
        """Queue a request; the returned future resolves to its :class:`GenerationResult`."""
        if not prompt_token_ids:
            raise ValueError("prompt_token_ids=[]: a request needs at least one prompt token")
        if request_id is None:
            request_id = f"req-{self._next_id}"
            self._next_id += 1
        if request_id in self._by_id:
            raise ValueError(f"request_id={request_id!r}: already in flight")
        loop = asyncio.get_running_loop()
        request = Request(request_id, kind, prompt_token_ids, sampling, arrival_time=time.perf_counter(),
                          arrival_seq=self.scheduler.next_seq(), future=loop.create_future())
        self._by_id[request_id] = request
        self.scheduler.add_request(request)
        self._ensure_loop()
        self._wakeup.set()
        return request.future

    async def generate(self, prompt_token_ids: list[int], kind: RequestKind, sampling: SamplingSpec,
                       request_id: str | None = None) -> GenerationResult:
        return await self.submit(prompt_token_ids, kind, sampling, request_id)

    def abort(self, request_id: str) -> None:
        """Cancel a request; its future resolves with ``finish_reason="abort"`` and the tokens so far."""
        request = self._by_id.get(request_id)
        if request is None:
            return
        if request.status == RequestStatus.RUNNING:
            self.vllm.abort([request.engine_request_id])
        self._finish(request, RequestStatus.FINISHED_ABORTED)

    def update_phase(self) -> contextlib.AbstractContextManager[None]:
        """The context to run an update in, in the update's own thread (teacher scoring and the student's steps): on
        CUDA the update's stream, ordered after what this engine's thread queued before and finished on the GPU when
        the block ends, so that decode steps never queue behind an update kernel and the next weight gather reads
        the finished weights (``actfirst.engine.streams``); nothing on the CPU."""
        return self.vllm.streams.update_phase() if self.vllm.streams is not None else contextlib.nullcontext()

    def sleep(self) -> None:
        """Free the engine's GPU memory while the trainer updates (``student.sleep_level``); the next
        :meth:`update_weights` wakes it. Only between rollouts: nothing may be queued or running."""
        if self.scheduler.has_work():
            raise RuntimeError("sleep needs an idle engine (requests are queued or running)")
        self.vllm.sleep()
        self.asleep = True

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *,
                       keep_in_flight: bool = False) -> int:
        """Put new student weights into the running engine; returns the new weight version.

        By default requests in flight are requeued and restart under the new weights, and the prefix cache is reset
        (nothing holds a block then). With ``keep_in_flight`` they continue, keeping their tokens (see the module
        docstring); the prefix cache is not reset (vLLM refuses while blocks are held) and the cache salt keeps new
        requests off the old blocks. A sleeping engine gets its weight memory back first and its KV cache after the
        load (so both never coexist with the gathered weights).
        """
        in_flight = [*self.scheduler.running.values(), *self.scheduler.waiting]  # waiting: paused by preemption too
        if keep_in_flight:
            self.num_carried_tokens += sum(r.num_generated for r in in_flight)
        else:
            self.num_discarded_tokens += sum(r.num_generated for r in in_flight)
            requeued = self.scheduler.requeue_all()
            self.vllm.abort(r.engine_request_id for r in requeued)
            for request in requeued:
                self._requests.pop(request.engine_request_id, None)
        if self.asleep:
            self.vllm.wake_up(["weights"])
        self.vllm.load_weights(named_tensors)
        if self.asleep:
            self.vllm.wake_up(["kv_cache"])
            self.asleep = False
        if not keep_in_flight:
            self.vllm.reset_prefix_cache()
        self.weight_version += 1
        self._wakeup.set()
        return self.weight_version

    async def shutdown(self) -> None:
        """:meth:`close`, then tear vLLM down (see ``VLLMEngine.shutdown``): for an engine that is done for good."""
        await self.close()
        self.vllm.shutdown()

    async def close(self) -> None:
        """Abort everything still queued or running and stop the loop task."""
        for request_id in list(self._by_id):
            self.abort(request_id)
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass
            self._loop_task = None

    # -- the loop ------------------------------------------------------------------------------------------------

    def _ensure_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop_task is None or self._loop_task.done() or self._loop_task.get_loop() is not loop:
            # A new event loop (e.g. a second asyncio.run) needs its own Event and loop task.
            self._wakeup = asyncio.Event()
            self._loop_task = loop.create_task(self._run())

    async def _run(self) -> None:
        while True:
            if not self.scheduler.has_work():
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                self.step()
            except Exception as exc:  # fail every waiter rather than hang them
                for request in list(self._by_id.values()):
                    if not request.future.done():
                        request.future.set_exception(exc)
                raise
            await asyncio.sleep(0)  # let callers react to finished requests before the next step

    def step(self) -> None:
        """Schedule, execute one vLLM step, update from its output."""
        # 1. Schedule.
        sched = self.scheduler.schedule()
        self.vllm.abort(r.engine_request_id for r in sched.preempted)
        for request in sched.preempted:
            self._requests.pop(request.engine_request_id, None)
        for request in sched.admitted:
            self._requests[request.engine_request_id] = request
            self.vllm.add(request.engine_request_id, request.prompt_token_ids + request.output_token_ids,
                          request.sampling, num_generated=request.num_generated,
                          cache_salt=f"weights-v{self.weight_version}")
        if not self.scheduler.running:
            return
        self.peak_in_flight = max(self.peak_in_flight, self.vllm.num_unfinished())
        # 2. Execute.
        outputs = self.vllm.step()
        self.num_steps += 1
        # 3. Update.
        for out in outputs:
            request = self._requests.get(out.engine_request_id)
            if request is None or request.status != RequestStatus.RUNNING:
                continue  # output of an attempt that was preempted or requeued
            request.output_token_ids += out.new_token_ids
            self.num_generated_tokens += len(out.new_token_ids)
            request.output_logprobs += out.new_logprobs
            request.output_versions += [self.weight_version] * len(out.new_token_ids)
            stopped = request.num_preemptions > 0 and self._stop_across_resume(request)
            if stopped:
                self.vllm.abort([request.engine_request_id])
                self._finish(request, RequestStatus.FINISHED_STOPPED)
            elif out.finish_reason is not None:
                self._finish(request, _FINISH_STATUS[out.finish_reason])

    def _stop_across_resume(self, request: Request) -> bool:
        """After a resume vLLM only sees the new text, so a stop string spanning the pause point is ours to find."""
        if not request.sampling.stop:
            return False
        tail = self.vllm.decode(request.output_token_ids[-32:])
        return any(stop in tail for stop in request.sampling.stop)

    def _finish(self, request: Request, status: RequestStatus) -> None:
        self.scheduler.finish_request(request, status)
        self._requests.pop(request.engine_request_id, None)
        self._by_id.pop(request.request_id, None)
        text = self.vllm.decode(request.output_token_ids)
        for stop in request.sampling.stop:  # keep text up to and including the first stop string
            cut = text.find(stop)
            if cut >= 0:
                text = text[: cut + len(stop)]
        latency = request.in_slot_s
        result = GenerationResult(
            request_id=request.request_id, kind=request.kind, token_ids=list(request.output_token_ids), text=text,
            logprobs=list(request.output_logprobs), finish_reason=FINISH_REASONS[status],
            weight_version=request.output_versions[0] if request.output_versions else self.weight_version,
            token_versions=list(request.output_versions), queue_wait_s=request.queue_wait_s, latency_s=latency,
            num_preemptions=request.num_preemptions)
        self.records.append(RequestRecord(request.request_id, request.kind, request.arrival_seq,
                                          list(request.admit_seqs), request.queue_wait_s, latency,
                                          request.num_generated, request.num_preemptions))
        if request.future is not None and not request.future.done():
            request.future.set_result(result)

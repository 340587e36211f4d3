"""Generation requests: the two kinds, the state machine, sampling settings and results."""

from __future__ import annotations

import asyncio
import dataclasses
import enum


class RequestKind(enum.IntEnum):
    """The two request classes of ActFirst-OPD; a lower value is admitted first (paper Sec. 4.3)."""

    FAST_ACTION = 0
    """Action only, no reasoning; it advances the environment, so it is on the critical path."""
    FULL_RESPONSE = 1
    """Think-then-act response for distillation; generated asynchronously, never blocks the environment."""


class RequestStatus(enum.IntEnum):
    """Request states. States change only inside :class:`~actfirst.engine.scheduler.Scheduler` methods."""

    WAITING = 0
    PREEMPTED = 1
    """Paused to free a slot for a fast action; keeps its generated tokens and resumes where it stopped."""
    RUNNING = 2
    # Anything after RUNNING is a finished status.
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.RUNNING


FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class SamplingSpec:
    """What to generate for one request."""

    max_tokens: int
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    """Stop strings (e.g. ``("</action>",)``); the stop string is kept in the output."""
    temperature: float = 1.0
    """0: greedy decoding (evaluation only: there is no sampled policy, so the log-probs are no log pi_old)."""
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens!r}: must be >= 1")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens={self.min_tokens!r}: must be in [0, max_tokens={self.max_tokens}]")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature!r}: must be >= 0 (0: greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p!r}: must be in (0, 1]")


@dataclasses.dataclass(kw_only=True, slots=True)
class GenerationResult:
    """A finished request. ``logprobs[i]`` is the log-probability of ``token_ids[i]`` under the distribution it
    was sampled from (temperature and top-p applied): log pi_old in the OPD loss (paper Eq. 29-30)."""

    request_id: str
    kind: RequestKind
    token_ids: list[int]
    text: str
    logprobs: list[float]
    finish_reason: str
    weight_version: int
    """Version of the weights that generated the first token (the engine's version when no token was generated).
    Without ``keep_in_flight`` weight updates every token has it (see ``ActFirstEngine.update_weights``)."""
    token_versions: list[int]
    """``token_versions[i]``: the version of the weights that generated ``token_ids[i]`` (non-decreasing; two or
    more versions only when a ``keep_in_flight`` update fell inside the request)."""
    queue_wait_s: float
    """Time spent waiting for admission: before the first, and while paused by preemption or requeued by a weight
    update."""
    latency_s: float
    """In-slot time: admission to completion, the queue wait excluded. A request that left its slot (preempted, or
    requeued by a weight update) and came back has the sum of its in-slot spans, the span whose tokens a requeue
    dropped included (the slot was held). ``queue_wait_s + latency_s`` is submission to completion."""
    num_preemptions: int


class Request:
    """One request as the scheduler and the engine loop track it."""

    def __init__(self, request_id: str, kind: RequestKind, prompt_token_ids: list[int], sampling: SamplingSpec,
                 *, arrival_time: float, arrival_seq: int, future: asyncio.Future | None = None) -> None:
        self.request_id = request_id
        self.kind = kind
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling = sampling
        self.arrival_time = arrival_time
        self.arrival_seq = arrival_seq
        """Position in the global order of scheduler events (for priority-inversion checks)."""
        self.future = future
        self.status = RequestStatus.WAITING
        self.output_token_ids: list[int] = []
        self.output_logprobs: list[float] = []
        self.output_versions: list[int] = []
        """The weight version that generated each output token."""
        self.num_preemptions = 0
        self.attempt = 0
        """Bumped each time the request is (re)submitted to vLLM, which needs fresh request ids."""
        self.admit_seqs: list[int] = []
        self.wait_started = arrival_time
        self.queue_wait_s = 0.0
        self.slot_started = arrival_time
        """When it was last admitted (meaningful while RUNNING)."""
        self.in_slot_s = 0.0
        """Summed in-slot spans so far (``GenerationResult.latency_s``)."""
        self.finished_time: float | None = None

    @property
    def engine_request_id(self) -> str:
        return f"{self.request_id}#{self.attempt}"

    @property
    def num_generated(self) -> int:
        return len(self.output_token_ids)

    def clear_output(self) -> None:
        """Drop generated tokens (they came from weights that are no longer current)."""
        self.output_token_ids.clear()
        self.output_logprobs.clear()
        self.output_versions.clear()

    def __repr__(self) -> str:
        return f"Request({self.request_id!r}, {self.kind.name}, {self.status.name}, {self.num_generated} tokens)"

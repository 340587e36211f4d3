"""Admission control in front of vLLM: one cap b_max shared by fast actions and full responses.

NOTE: vLLM's own priority policy does not preempt a running request when ``max_num_seqs`` is reached, so a
fast action arriving behind many full responses would wait for one of them to finish. This scheduler decides
which requests vLLM sees: vLLM's ``max_num_seqs`` is kept >= b_max and every admitted request runs at once.

Rules (paper Sec. 4.3, Appendix A.2):
1. At most b_max requests are admitted (running) at any time.
2. A waiting fast action is always admitted before any waiting full response; within a kind, FCFS.
3. Full responses are admitted whenever no fast action waits and a slot is free, so they never starve while
   no fast action waits.
4. When a fast action waits and all b_max slots are taken, ``fast_action_admission`` decides:
   ``wait`` (for any slot to free up), ``reserve`` (full responses never hold the last ``reserved_fast_slots``
   slots, so a slot is usually free), or ``preempt`` (the latest-admitted running full response is paused,
   keeping its tokens, and resumes first among full responses). See bench/rollout_speedup.py for the measured
   comparison that picked the default.
"""

from __future__ import annotations

import dataclasses
import time

from actfirst.core.config import SchedulerConfig
from actfirst.engine.queue import FastFirstQueue
from actfirst.engine.request import Request, RequestKind, RequestStatus


@dataclasses.dataclass(slots=True)
class SchedulerOutput:
    """What the engine loop must do to vLLM before its next step."""

    admitted: list[Request]
    """Requests to submit (a resumed request continues from its prompt plus its generated tokens)."""
    preempted: list[Request]
    """Running requests to abort in vLLM; they keep their tokens and wait to resume."""

    @classmethod
    def make_empty(cls) -> SchedulerOutput:
        return cls(admitted=[], preempted=[])


@dataclasses.dataclass(slots=True)
class AdmissionSample:
    """Number of admitted requests right after one scheduling decision."""

    time: float
    num_fast_actions: int
    num_full_responses: int


class Scheduler:
    """Fast-action-first admission under one shared cap b_max."""

    def __init__(self, cfg: SchedulerConfig) -> None:
        self.b_max = cfg.b_max
        self.policy = cfg.fast_action_admission
        reserve = min(cfg.reserved_fast_slots, cfg.b_max - 1) if cfg.fast_action_admission == "reserve" else 0
        self.full_response_cap = cfg.b_max - reserve
        """Slots full responses may hold (b_max minus the reserved fast-action slots)."""
        self.waiting = FastFirstQueue()
        self.running: dict[str, Request] = {}  # request_id -> request, in admission order
        self.num_running_full = 0
        self.event_seq = 0
        """A logical clock over arrivals and admissions."""
        self.admission_samples: list[AdmissionSample] = []

    # -- requests in ---------------------------------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.add(request)

    def next_seq(self) -> int:
        self.event_seq += 1
        return self.event_seq

    def has_work(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    # -- the decision ---------------------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Admit waiting requests (fast actions first), preempting full responses if the policy says so."""
        out = SchedulerOutput.make_empty()
        # First, fast actions.
        while self.waiting.num_waiting(RequestKind.FAST_ACTION):
            if len(self.running) >= self.b_max:
                if self.policy != "preempt" or self.num_running_full == 0:
                    break
                out.preempted.append(self._preempt_latest_full_response())
            out.admitted.append(self._admit(self.waiting.pop(RequestKind.FAST_ACTION)))
        # Next, full responses, only while no fast action waits.
        while (self.waiting.num_waiting(RequestKind.FULL_RESPONSE)
               and not self.waiting.num_waiting(RequestKind.FAST_ACTION)
               and len(self.running) < self.b_max
               and self.num_running_full < self.full_response_cap):
            out.admitted.append(self._admit(self.waiting.pop(RequestKind.FULL_RESPONSE)))
        assert len(self.running) <= self.b_max, (len(self.running), self.b_max)
        if out.admitted or out.preempted:
            self._sample()
        return out

    def _admit(self, request: Request) -> Request:
        now = time.perf_counter()
        request.queue_wait_s += now - request.wait_started
        request.slot_started = now
        request.status = RequestStatus.RUNNING
        request.attempt += 1
        request.admit_seqs.append(self.next_seq())
        self.running[request.request_id] = request
        self.num_running_full += request.kind == RequestKind.FULL_RESPONSE
        return request

    def _remove_running(self, request: Request, now: float) -> None:
        """Free the request's slot at ``now`` (its in-slot span ends)."""
        del self.running[request.request_id]
        self.num_running_full -= request.kind == RequestKind.FULL_RESPONSE
        request.in_slot_s += now - request.slot_started

    def _preempt_latest_full_response(self) -> Request:
        victim = next(r for r in reversed(self.running.values()) if r.kind == RequestKind.FULL_RESPONSE)
        now = time.perf_counter()
        self._remove_running(victim, now)
        victim.status = RequestStatus.PREEMPTED
        victim.num_preemptions += 1
        victim.wait_started = now
        # It arrived before every waiting full response (FCFS within a kind), so it goes back in front.
        self.waiting.prepend(victim)
        return victim

    # -- requests out ---------------------------------------------------------------------------------------------

    def finish_request(self, request: Request, status: RequestStatus) -> None:
        """Move a running or waiting request to a finished status (a waiting one's queue wait ends here)."""
        assert status.is_finished, status
        now = time.perf_counter()
        if request.request_id in self.running:
            self._remove_running(request, now)
            self._sample()
        elif not request.status.is_finished:
            self.waiting.remove(request)
            request.queue_wait_s += now - request.wait_started
        request.status = status
        request.finished_time = now

    def requeue_all(self) -> list[Request]:
        """Send every running request back to the front of its queue and drop every partial output.

        Used when the weights change: no result may mix tokens from two weight versions. Returns the requests
        that were running (they must be aborted in vLLM).
        """
        was_running = sorted(self.running.values(), key=lambda r: r.arrival_seq, reverse=True)
        now = time.perf_counter()
        for request in was_running:
            self._remove_running(request, now)
            request.status = RequestStatus.WAITING
            request.wait_started = now
            self.waiting.prepend(request)
        for request in self.waiting:
            request.clear_output()
        self._sample()
        return was_running

    def _sample(self) -> None:
        full = self.num_running_full
        self.admission_samples.append(AdmissionSample(time.perf_counter(), len(self.running) - full, full))

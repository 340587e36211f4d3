"""The admission scheduler on its own (no vLLM): exact counts after each decision."""

import pytest

from actfirst.core.config import SchedulerConfig
from actfirst.engine.request import Request, RequestKind, RequestStatus, SamplingSpec
from actfirst.engine.scheduler import Scheduler

FAST, FULL = RequestKind.FAST_ACTION, RequestKind.FULL_RESPONSE


def make_scheduler(b_max: int, policy: str = "wait", reserved: int = 0) -> Scheduler:
    return Scheduler(SchedulerConfig(b_max=b_max, fast_action_admission=policy, reserved_fast_slots=reserved))


def add(sched: Scheduler, kind: RequestKind, name: str) -> Request:
    req = Request(name, kind, [1, 2, 3], SamplingSpec(max_tokens=4), arrival_time=0.0, arrival_seq=sched.next_seq())
    sched.add_request(req)
    return req


def ids(requests):
    return [r.request_id for r in requests]


def test_fast_actions_admitted_before_earlier_full_responses():
    sched = make_scheduler(b_max=3)
    for i in range(3):
        add(sched, FULL, f"full{i}")
    add(sched, FAST, "fast0")
    add(sched, FAST, "fast1")
    out = sched.schedule()
    # 3 slots: both fast actions first (FCFS among them), then the oldest full response.
    assert ids(out.admitted) == ["fast0", "fast1", "full0"]
    assert out.preempted == []
    assert sched.waiting.num_waiting(FULL) == 2


def test_wait_policy_blocks_full_responses_while_a_fast_action_waits():
    sched = make_scheduler(b_max=2, policy="wait")
    f0, f1 = add(sched, FULL, "full0"), add(sched, FULL, "full1")
    sched.schedule()
    add(sched, FULL, "full2")
    add(sched, FAST, "fast0")
    assert sched.schedule().admitted == []  # cap reached: the fast action waits, nothing is preempted
    sched.finish_request(f0, RequestStatus.FINISHED_LENGTH)
    # One slot freed: it goes to the fast action, not to full2 which waits too.
    assert ids(sched.schedule().admitted) == ["fast0"]
    sched.finish_request(f1, RequestStatus.FINISHED_LENGTH)
    assert ids(sched.schedule().admitted) == ["full2"]  # no fast action waits: full responses do not starve


def test_preempt_policy_pauses_the_latest_full_response_and_resumes_it_first():
    sched = make_scheduler(b_max=2, policy="preempt")
    add(sched, FULL, "full0"), add(sched, FULL, "full1"), add(sched, FULL, "full2")
    sched.schedule()
    fast = add(sched, FAST, "fast0")
    out = sched.schedule()
    assert ids(out.preempted) == ["full1"] and ids(out.admitted) == ["fast0"]
    full1 = out.preempted[0]
    assert full1.status == RequestStatus.PREEMPTED and full1.num_preemptions == 1
    # full1 arrived before full2, so it resumes first.
    assert sched.waiting.peek(FULL) is full1
    sched.finish_request(fast, RequestStatus.FINISHED_STOPPED)
    assert ids(sched.schedule().admitted) == ["full1"]
    assert len(sched.running) == 2


def test_preempt_with_only_fast_actions_running_waits():
    sched = make_scheduler(b_max=1, policy="preempt")
    add(sched, FAST, "fast0")
    sched.schedule()
    add(sched, FAST, "fast1")
    out = sched.schedule()
    assert out.admitted == [] and out.preempted == []


@pytest.mark.parametrize("b_max,reserved,full_cap", [(8, 3, 5), (4, 16, 1), (1, 1, 1)])
def test_reserve_policy_keeps_slots_for_fast_actions(b_max, reserved, full_cap):
    sched = make_scheduler(b_max=b_max, policy="reserve", reserved=reserved)
    for i in range(b_max + 2):
        add(sched, FULL, f"full{i}")
    out = sched.schedule()
    # Reserve is capped at b_max - 1 so full responses always get at least one slot.
    assert len(out.admitted) == full_cap
    add(sched, FAST, "fast0")
    if b_max > full_cap:
        assert ids(sched.schedule().admitted) == ["fast0"]


def test_requeue_all_drops_partial_outputs_and_keeps_fcfs_order():
    sched = make_scheduler(b_max=2, policy="preempt")
    reqs = [add(sched, FULL, f"full{i}") for i in range(3)]
    sched.schedule()
    add(sched, FAST, "fast0")
    paused = sched.schedule().preempted[0]
    for r in reqs:
        r.output_token_ids += [7, 7]
        r.output_logprobs += [-1.0, -1.0]
    was_running = sched.requeue_all()
    assert sorted(ids(was_running)) == ["fast0", "full0"]
    assert sched.running == {}
    assert all(r.num_generated == 0 for r in reqs)
    assert paused.request_id == "full1"
    # Everything goes back in arrival order, fast actions first.
    out = sched.schedule()
    assert ids(out.admitted) == ["fast0", "full0"]


def test_cap_never_exceeded_under_random_workload():
    import random

    rng = random.Random(0)
    for policy in ("wait", "reserve", "preempt"):
        sched = make_scheduler(b_max=5, policy=policy, reserved=2)
        live = []
        for step in range(300):
            for _ in range(rng.randint(0, 3)):
                add(sched, rng.choice([FAST, FULL]), f"r{step}-{rng.random()}")
            out = sched.schedule()
            assert len(sched.running) <= 5
            for r in out.admitted:
                if r.kind == FULL:
                    assert sched.waiting.num_waiting(FAST) == 0  # never a full response before a waiting fast action
            live = list(sched.running.values())
            for r in rng.sample(live, k=min(len(live), rng.randint(0, 3))):
                sched.finish_request(r, RequestStatus.FINISHED_LENGTH)

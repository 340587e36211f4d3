"""Estimates and bounds for the rollout-speedup benchmark (paper Eq. 22-26, Eq. 36, and a step model).

- ``ideal``: Eq. 36, from single-request latencies, overlap assumed free.
- ``concurrency_bound``: Eq. 25-26 on the measured Vanilla time (dependency chain and b_max slot time).
- ``throughput_bound``: ActFirst cannot finish before N T (l_fast + l_full) tokens are decoded at the best rate
  the engine reaches with at most min(b_max, N (T + 1)) running requests (concurrency sweep), nor before its
  dependency chain (Eq. 22); on the measured Vanilla time.
- ``step_model``: both schedules replayed step by step (every running request gains one token per engine step,
  a step with c running requests takes c / rate(c) from the concurrency sweep, same admission policy). It keeps
  what the throughput bound drops, the ramp-up and the tail at low concurrency, so its ratio to the measurement
  is the efficiency of the scheduler and engine loop themselves.
"""

from __future__ import annotations

import itertools
from collections import deque


def rate_at(rates: dict[int, float], concurrency: float) -> float:
    """Decode rate (tokens/s) at ``concurrency`` running requests, linear between sweep points, flat outside."""
    points = sorted(rates.items())
    if concurrency <= points[0][0]:
        return points[0][1] * concurrency / points[0][0]
    for (c0, r0), (c1, r1) in itertools.pairwise(points):
        if concurrency <= c1:
            return r0 + (r1 - r0) * (concurrency - c0) / (c1 - c0)
    return points[-1][1]


def attainable_rate(rates: dict[int, float], concurrency: int) -> float:
    """Best decode rate with at most ``concurrency`` running requests."""
    return max(rate_at(rates, c) for c in sorted({*rates, concurrency}) if c <= concurrency)


def simulate_batch(strategy: str, *, num_tasks: int, turns: int, fast_tokens: int, full_tokens: int, b_max: int,
                   policy: str, rates: dict[int, float], reserved_fast_slots: int = 16) -> float:
    """Completion time of one batch under the step model (see the module docstring)."""
    fast_q: deque[list] = deque()
    full_q: deque[list] = deque()
    running: list[list] = []  # [remaining tokens, task, is_fast], in admission order
    turn = [0] * num_tasks

    def submit(task: int) -> None:
        full_q.append([full_tokens, task, False])
        if strategy == "actfirst":
            fast_q.append([fast_tokens, task, True])

    for task in range(num_tasks):
        submit(task)
    reserve = min(reserved_fast_slots, b_max - 1) if policy == "reserve" else 0
    elapsed = 0.0
    while fast_q or full_q or running:
        while fast_q:
            if len(running) >= b_max:
                fulls = [r for r in running if not r[2]]
                if policy != "preempt" or not fulls:
                    break
                running.remove(fulls[-1])
                full_q.appendleft(fulls[-1])
            running.append(fast_q.popleft())
        while (full_q and not fast_q and len(running) < b_max
               and sum(not r[2] for r in running) < b_max - reserve):
            running.append(full_q.popleft())
        elapsed += len(running) / rate_at(rates, len(running))
        for r in running:
            r[0] -= 1
        for r in [r for r in running if r[0] == 0]:
            running.remove(r)
            releases_turn = r[2] if strategy == "actfirst" else not r[2]
            if releases_turn:
                turn[r[1]] += 1
                if turn[r[1]] < turns:
                    submit(r[1])
    return elapsed


def estimates(*, num_tasks: int, num_batches: int, turns: int, fast_tokens: int, full_tokens: int, b_max: int,
              policy: str, lat_fast: list[float], lat_full: list[float], rates: dict[int, float],
              c_vanilla: float, speedup: float) -> dict[str, float]:
    """All estimates and bounds for one measured setting (``c_vanilla``: measured Vanilla time, all batches)."""
    n = num_tasks
    rate = attainable_rate(rates, min(b_max, n * (turns + 1)))
    ideal_v = ideal_a = bound_conc = bound_tput = 0.0
    for b in range(num_batches):
        fast, full = lat_fast[b * n:(b + 1) * n], lat_full[b * n:(b + 1) * n]
        ideal_v += max(turns * f for f in full)  # Eq. 36
        ideal_a += max((turns - 1) * a + max(a, f) for a, f in zip(fast, full, strict=True))
        dependency = max((turns - 1) * a + f for a, f in zip(fast, full, strict=True))  # Eq. 22
        slot_time = turns * sum(a + f for a, f in zip(fast, full, strict=True)) / b_max  # Eq. 24
        bound_conc += max(dependency, slot_time)  # Eq. 25
        bound_tput += max(dependency, n * turns * (fast_tokens + full_tokens) / rate)
    kw = dict(num_tasks=n, turns=turns, fast_tokens=fast_tokens, full_tokens=full_tokens, b_max=b_max, rates=rates)
    step_model = simulate_batch("vanilla", policy="wait", **kw) / simulate_batch("actfirst", policy=policy, **kw)
    out = {"ideal": ideal_v / ideal_a, "concurrency_bound": c_vanilla / bound_conc,
           "throughput_bound": c_vanilla / bound_tput, "step_model": step_model}
    out["pct_of_throughput_bound"] = 100 * speedup / out["throughput_bound"]
    out["pct_of_step_model"] = 100 * speedup / step_model
    return out

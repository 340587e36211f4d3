"""Shared timing helpers of the micro-benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_time(fn: Callable[[], object], device: str, reps: int, warmup: bool = True) -> float:
    """Median time of ``fn`` in seconds over ``reps`` runs, after one warm-up run (and compile) unless the caller ran
    it (``warmup=False``).

    On CUDA the runs are queued back to back, each between two CUDA events, and the host waits once at the end: a
    run's time is the GPU's, from its first kernel's start to its last one's end, with the host's launch cost
    hidden behind the queue whenever the host runs ahead of the GPU (timing each run from the host, with a sync
    after it, adds the launch cost and the sync's round trip to every run: about 1 ms, more than the ops'
    kernels at a million tokens). An op that syncs the host inside still pays its launches in its time. On the
    CPU: wall time per run."""
    if warmup:
        fn()
        sync(device)
    if device == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        times = [start.elapsed_time(end) / 1e3 for start, end in events]
    else:
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]

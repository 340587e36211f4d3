"""Shared timing helpers of the micro-benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_time(fn: Callable[[], object], device: str, reps: int, warmup: bool = True) -> float:
    """Median wall time of ``fn`` in seconds over ``reps`` runs, after one warm-up run (and compile) unless the
    caller ran it (``warmup=False``)."""
    if warmup:
        fn()
        sync(device)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]

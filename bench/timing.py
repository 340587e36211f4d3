"""Shared timing helper of the micro-benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def median_time(fn: Callable[[], object], device: str, reps: int) -> float:
    """Median wall time of ``fn`` in seconds over ``reps`` runs, after one warm-up run (and compile)."""
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]

"""Scoring and the update off the event loop, in a thread of their own in every pipeline (the event loop keeps
serving the engine: the rollouts collected ahead), and the CPU split between that thread and the engine.

The CPU split (:func:`update_threads`): vLLM's CPU engine runs its OpenMP threads (``OMP_NUM_THREADS``) on the event
loop's thread and ignores ``torch.set_num_threads`` after it starts. Scoring and the update get their own torch
thread count (:func:`set_torch_threads`, per thread under OpenMP): the rank's cores less the engine's. The same under
``serial``, whose engine idles during the update: the pipelines then differ only in their schedule, and on the shared
2-core VM a second OpenMP thread made the update slower, not faster (16.5 s against 5.8 s per update with one,
bench/RESULTS.md); ``parallel.cpu_update_threads`` sets another count. On a GPU the update runs on the device beside
the engine (colocated); its host threads are left as they are.
"""

from __future__ import annotations

import os

import torch


def update_threads(setting: int | None, *, engine_threads: int, ranks_here: int) -> int:
    """The torch threads for scoring and the update on the CPU: ``setting`` (``parallel.cpu_update_threads``) when
    given, else this rank's share of the process's cores (``ranks_here``: the node's ranks) less the engine's
    ``engine_threads``, at least 1, whatever the pipeline (see the module docstring)."""
    if setting is not None:
        return setting
    return max(1, len(os.sched_getaffinity(0)) // max(1, ranks_here) - engine_threads)


def set_torch_threads(n: int) -> int:
    """Set the calling thread's torch (OpenMP) threads to ``n`` and return what torch reports. vLLM's CPU worker
    replaces ``torch.set_num_threads`` by a no-op once it has started, so this calls the function it replaced
    (``torch._C.set_num_threads``)."""
    torch._C.set_num_threads(n)  # torch.set_num_threads itself, under a name vLLM leaves
    return torch.get_num_threads()

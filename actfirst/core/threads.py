"""How many threads a process computes with. torch's and vLLM's CPU thread pools read ``OMP_NUM_THREADS`` when torch
is imported (vLLM's CPU worker ignores ``torch.set_num_threads``; two threads each on a shared 2-core machine stall),
so it is fixed before that: ``actfirst/__init__.py`` calls :func:`fix_thread_count` before any module of the
package imports torch, in every process that imports the package (a command, a rank, a spawned child). A value
already in the environment is kept. What a process then actually computes with is :func:`thread_counts`, which
runs record (``run_summary.json``, the comparison's outputs)."""

from __future__ import annotations

import ctypes
import os
from typing import Any

DEFAULT_OMP_THREADS = "1"
"""``OMP_NUM_THREADS`` unless the environment sets it (torchrun's default per rank)."""


def fix_thread_count() -> None:
    """Set ``OMP_NUM_THREADS`` to :data:`DEFAULT_OMP_THREADS` unless it is set; before torch is imported. An OpenMP
    runtime already loaded (``LD_PRELOAD``: vLLM's CPU engine preloads torch's libgomp and its environment reaches
    child processes) read the variable when the process started, so it is told the same by ``omp_set_num_threads``."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    os.environ["OMP_NUM_THREADS"] = DEFAULT_OMP_THREADS
    set_threads = getattr(ctypes.CDLL(None), "omp_set_num_threads", None)  # None: no runtime loaded yet
    if set_threads is not None:
        set_threads(int(DEFAULT_OMP_THREADS))


def thread_counts() -> dict[str, Any]:
    """This process's threads as they are now: torch's intra-op and inter-op threads, ``OMP_NUM_THREADS``, the
    machine's cores and the cores this process may run on."""
    import torch

    return {"torch_threads": torch.get_num_threads(), "torch_interop_threads": torch.get_num_interop_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0))}

"""Scoring and the update off the event loop, in a thread of their own in every pipeline (:class:`UpdateThread`: the
event loop keeps serving the engine, the rollouts collected ahead), and the CPU split between that thread and the
engine.

The CPU split (:func:`update_threads`): vLLM's CPU engine runs its OpenMP threads (``OMP_NUM_THREADS``) on the event
loop's thread and ignores ``torch.set_num_threads`` after it starts. Scoring and the update get their own torch
thread count (:func:`set_torch_threads`, per thread under OpenMP): the rank's cores less the engine's. The same under
``serial``, whose engine idles during the update: the pipelines then differ only in their schedule, and on the shared
2-core VM a second OpenMP thread made the update slower, not faster (16.5 s against 5.8 s per update with one,
bench/RESULTS.md); ``parallel.cpu_update_threads`` sets another count. On a GPU the update runs on the device beside
the engine (colocated); its host threads are left as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")


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


class UpdateThread:
    """The thread that scoring and the update run in, one job at a time, awaited from the event loop: a daemon
    thread of its own, not the loop's default executor, so that a shutdown waits for the job in progress a bounded
    time (:meth:`close`) and an interpreter that exits never joins it."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.AbstractEventLoop, asyncio.Future] | None] = (
            queue.SimpleQueue())
        self.thread = threading.Thread(target=self._serve, name="actfirst-update", daemon=True)

    async def run(self, work: Callable[[], T]) -> T:
        """``work()`` in the thread; its result, or its error raised here."""
        if self.thread.ident is None:
            self.thread.start()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.jobs.put((work, loop, future))
        return await future

    def close(self, timeout_s: float) -> bool:
        """Let the job in progress finish (at most ``timeout_s``) and end the thread; whether it has ended."""
        if self.thread.ident is None:
            return True
        self.jobs.put(None)
        self.thread.join(timeout_s)
        return not self.thread.is_alive()

    def _serve(self) -> None:
        while (job := self.jobs.get()) is not None:
            work, loop, future = job
            try:
                outcome = (work(), None)
            except BaseException as e:  # handed to the awaiting coroutine, whatever it is
                outcome = (None, e)
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody awaits it any more
                loop.call_soon_threadsafe(_settle, future, *outcome)


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():  # cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)

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

Cores kept apart (:class:`CpuSplit`, ``parallel.cpu_pin_cores``): the paper's rollouts, trainer and teacher run on
disjoint GPUs (4/2/2, Appendix C.3); here the rank's cores are dealt out instead: the engine's threads (the event
loop's thread, pinned before the engine starts, and every thread it starts after), then scoring and the update (the
update thread and its OpenMP threads), then the environment workers and their simulators (pinned in the worker
before its environment starts). Where no core is left for the workers they share the engine's: the rollouts' side,
as on the paper's rollout GPUs, the trainer's cores kept to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class CpuSplit:
    """How one rank's CPU cores serve the engine, scoring and the update, and the environment workers."""

    engine_threads: int
    """The engine's OpenMP threads (``OMP_NUM_THREADS``: vLLM's CPU worker fixes them)."""
    update_threads: int
    """The torch threads scoring and the update run on."""
    engine_cores: tuple[int, ...] | None = None
    """The cores of the event loop's thread and the threads it starts (None: not pinned, nor the others)."""
    trainer_cores: tuple[int, ...] | None = None
    """The update thread's."""
    worker_cores: tuple[int, ...] | None = None
    """The environment workers' and their simulators'."""

    def describe(self) -> str:
        """One line: the threads, and the cores of each side when pinned."""
        threads = f"engine {self.engine_threads} thread(s), scoring and the update {self.update_threads}"
        if self.engine_cores is None:
            return f"{threads}; cores shared (parallel.cpu_pin_cores: false)"
        return (f"{threads}; cores: engine {_cores(self.engine_cores)}, trainer {_cores(self.trainer_cores)}, "
                f"environment workers {_cores(self.worker_cores)}")


def cpu_split(setting: int | None, *, pin: bool, engine_threads: int, local_rank: int, ranks_here: int) -> CpuSplit:
    """This rank's split (see the module docstring). Unpinned: ``setting`` (``parallel.cpu_update_threads``)
    threads for scoring and the update, or :func:`update_threads`'s. With ``pin``, this rank's share of the
    process's cores (``os.sched_getaffinity``; ``ranks_here`` ranks on the node, this one ``local_rank``) dealt
    out: the engine's ``engine_threads`` first, then ``setting`` cores for the update (null: half of those left,
    rounded up), the rest the workers' (the engine's when none is left). A rank with one core keeps every side on
    it."""
    if not pin:
        return CpuSplit(engine_threads, update_threads(setting, engine_threads=engine_threads, ranks_here=ranks_here))
    available = sorted(os.sched_getaffinity(0))
    share = max(1, len(available) // max(1, ranks_here))
    mine = tuple(available[local_rank * share:(local_rank + 1) * share] or available[-share:])
    if len(mine) == 1:
        return CpuSplit(engine_threads, setting or 1, mine, mine, mine)
    e = min(max(1, engine_threads), len(mine) - 1)
    left = len(mine) - e
    trainer = mine[e:e + min(left, setting or -(-left // 2))]
    return CpuSplit(engine_threads, len(trainer), mine[:e], trainer, mine[e + len(trainer):] or mine[:e])


def pin_this_thread(cores: tuple[int, ...] | None) -> None:
    """Keep the calling thread (and the threads it starts from now on) to ``cores``; None: leave it."""
    if cores is not None:
        os.sched_setaffinity(0, cores)  # pid 0: the calling thread (Linux)


def _cores(cores: tuple[int, ...] | None) -> str:
    return ",".join(map(str, cores or ()))


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

    def __init__(self, cores: tuple[int, ...] | None = None) -> None:
        self.cores = cores
        """The cores it runs on (:attr:`CpuSplit.trainer_cores`; None: the process's)."""
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
        pin_this_thread(self.cores)  # before its first job: the OpenMP threads it starts inherit the cores
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

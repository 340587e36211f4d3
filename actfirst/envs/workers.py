"""Environments in worker processes, so the process driving the engine never waits on a simulator.

Each ``EnvWorker`` owns one environment in a spawned process and answers ``reset``/``step`` over a pipe, from
synchronous code (``call``) or from the asyncio loop that drives the engine (``acall``: the pipe and the process
sentinel are watched by the loop). An exception inside the environment raises ``EnvError`` with the worker's
traceback. A worker whose environment cannot start raises ``EnvStartError`` (``actfirst.envs.startup``), the
benchmark's own (handed on from the worker as it is) or one naming how the worker failed to start; an ``EnvPool``
then closes the workers it had started.

A worker is dead when its process ended or a process it started (ScienceWorld's JVM) ended or is a zombie. Whatever
is left of a dead worker is killed and the worker restarted, and the death is reported by ``WorkerDied`` with its
reason, never silently: a death during a call fails that call (an environment error raised while a child is dead
is a death too); a death found before a call fails a ``step`` (its episode's state is gone), while any other call
(``reset``: a new episode) runs on the restarted worker. Until such a call, every ``step`` on a restarted worker
raises ``WorkerDied`` too: its environment has no episode to continue. ``close`` (also on Ctrl-C and at interpreter
exit) stops every worker and kills whatever the worker started if it outlives it.

``acall`` never blocks the loop: what may take long runs in a thread of its own while the loop serves every other
request, episode and update, each step bounded. That is a start or restart (at most :data:`_START_TIMEOUT_S` for
the new environment), and the drain of the reply a cancelled call still owes (at most until that call's limit, the
start-up limit for a call without one; a reply that does not come by then counts as a hung worker: killed and
restarted). A cancelled ``acall`` leaves its thread running to its end, and the next call waits for it; ``close``
cuts it short by killing the process it waits on.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import functools
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import psutil

from actfirst.core.user_input import UserError
from actfirst.envs.base import EnvFactory
from actfirst.envs.startup import EnvStartError

__all__ = ["EnvError", "EnvPool", "EnvWorker", "WorkerDied"]

T = TypeVar("T")
R = TypeVar("R")

_START_TIMEOUT_S = 120.0
"""How long a worker may take to build its environment (ScienceWorld: start a JVM), and at least how long the
first call after a (re)start may take (a fresh simulator's first task load is part of its start)."""
_CONTINUES_EPISODE = frozenset({"step", "state", "admissible"})
"""Calls that need the state of the episode in flight (every other call starts from scratch)."""


class EnvError(RuntimeError):
    """The environment raised inside its worker; the message holds the worker's traceback."""


class WorkerDied(RuntimeError):
    """The worker (or a process it started) died; the worker has been restarted, the episode is lost."""


def _worker_main(conn, spec: EnvFactory, cores: tuple[int, ...] | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it closes the workers
    if cores is not None:  # before the environment: the simulator it starts (a JVM) inherits them
        os.sched_setaffinity(0, cores)
    try:
        env = spec.make_env()
    except UserError as e:  # one the user can fix (a simulator that cannot start): handed on as it is
        conn.send(("refused", e))
        return
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ok", os.getpid()))
    try:
        while True:
            try:
                method, args = conn.recv()
            except EOFError:  # the parent is gone
                return
            if method == "close":
                return
            try:
                reply = ("ok", getattr(env, method)(*args))
            except Exception:
                reply = ("error", traceback.format_exc())
            try:
                conn.send(reply)
            except (BrokenPipeError, OSError):  # the parent is gone
                return
    finally:
        env.close()


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _kill(processes: list[psutil.Process]) -> None:
    for process in processes:
        try:
            if process.is_running():  # False also when the pid now belongs to another process
                process.kill()
        except psutil.NoSuchProcess:
            pass


def _gone(process: psutil.Process | int) -> bool:
    """Whether ``process`` (or pid) ended: gone, or a zombie (also a killed process whose threads are still
    exiting, which cannot be waited for yet)."""
    try:
        process = psutil.Process(process) if isinstance(process, int) else process
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _in_thread(fn: Callable[[], Any], name: str) -> concurrent.futures.Future:
    """Run ``fn`` in a daemon thread of its own (not the loop's default executor, which the update's thread and
    others use meanwhile); its future, already running, so that no caller's cancellation can keep ``fn`` from
    running to its end."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_running_or_notify_cancel()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as e:  # the awaiting call raises it
            future.set_exception(e)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def _exit_reason(code: int | None) -> str:
    return f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"


_LIVE: weakref.WeakSet[EnvWorker] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for worker in list(_LIVE):
        worker.close()


class EnvWorker:
    """One environment in its own process."""

    def __init__(self, spec: EnvFactory, call_timeout_s: float | None = None,
                 cores: tuple[int, ...] | None = None):
        self.spec = spec
        self.call_timeout_s = call_timeout_s
        """``acall`` waits at most this long for a reply; then the worker counts as dead (None: no limit). The first
        call after a (re)start may take the start-up time if that is longer."""
        self.cores = cores
        """The cores the worker and its simulator run on (None: the parent's)."""
        self.restarts = 0
        self.last_death: str | None = None
        """The ``WorkerDied`` message of the latest death (also of one a ``reset`` ran past)."""
        self._proc: mp.process.BaseProcess | None = None
        self._conn = None
        self._children: list[tuple[psutil.Process, str]] = []  # what the worker started, with names
        self._busy = False
        self._episode_lost = False  # restarted since the last call that starts from scratch
        self._pending = False  # a reply is owed (a cancelled acall leaves one behind; the next call drains it)
        self._reply_due: float | None = None  # when the owed reply is due (time.monotonic(); None: no limit)
        self._fresh = False  # (re)started since the last call: the next call gets the start-up time
        self._lock = threading.RLock()
        """Held while the worker starts, restarts, drains, runs a synchronous call or closes: ``acall`` runs the
        blocking ones in a thread, and ``close`` may come meanwhile."""
        self._off_loop_step: concurrent.futures.Future | None = None
        """What ``acall`` last ran in a thread (a cancelled call leaves it running; the next call waits for it)."""
        self._closing = False  # close() is waiting for a start in a thread, which it cut short

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None else None

    def start(self) -> None:
        """Start the process (if not started) and wait until its environment is built (at most
        :data:`_START_TIMEOUT_S`). One that cannot start leaves nothing running and raises ``EnvStartError`` (the
        environment's own, or one naming how the worker failed), or ``EnvError`` for any other exception of the
        environment's start; a process that cannot be started (a spec that cannot be pickled) raises its own error."""
        with self._lock:
            if self._proc is not None:
                return
            ctx = mp.get_context("spawn")
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(child, self.spec, self.cores), daemon=True,
                               name=f"env-{self.spec.benchmark}")
            try:
                proc.start()  # a spec that cannot be pickled raises here, before any process runs
            except BaseException:
                parent.close()
                child.close()
                raise
            self._proc = proc
            child.close()
            self._conn = parent
            _LIVE.add(self)
            pid = self._proc.pid
            try:
                if parent.poll(_START_TIMEOUT_S):
                    status, payload = parent.recv()
                else:
                    status, payload = "died", f"did not start within {_START_TIMEOUT_S:.0f} s (killed)"
            except (EOFError, OSError):
                self._proc.join(5)
                status, payload = "died", f"exited while starting ({_exit_reason(self._proc.exitcode)})"
            if status != "ok":
                self._discard()
                if self._closing:
                    raise WorkerDied(f"{self.spec.benchmark} worker was closed while it started")
                if status == "refused":
                    raise payload
                if status == "error":
                    raise EnvError(f"{self.spec.benchmark} environment error in worker {pid} as it started:\n"
                                   f"{payload}")
                raise EnvStartError(self.spec.benchmark, f"its environment worker {pid} {payload}")
            self._children = []
            for process in _descendants(self._proc.pid):
                try:
                    self._children.append((process, process.name()))
                except psutil.NoSuchProcess:
                    pass
            self._fresh = True

    def pids(self) -> list[int]:
        """The worker's process id and those of everything it started (e.g. its JVM)."""
        pid = self.pid
        return [] if pid is None else [pid] + [p.pid for p in _descendants(pid)]

    def memory_bytes(self) -> int:
        """Resident memory of the worker and everything it started (e.g. its JVM)."""
        total = 0
        for pid in self.pids():
            try:
                total += psutil.Process(pid).memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total

    def _death(self, *, wait: bool = True) -> str | None:
        """Why the started worker is dead (its process ended, or a process it started ended or is a zombie), or
        None while it lives. ``wait``: wait (at most 5 s) for the exit status of an ended process, which the reason
        names; the loop's own check before a call does not."""
        if not self._proc.is_alive() or _gone(self._proc.pid):
            if wait:
                self._proc.join(timeout=5)  # the exit status, once the last thread has exited
            return f"died ({_exit_reason(self._proc.exitcode)})"
        for process, name in self._children:
            if _gone(process):
                return f"lost its child {process.pid} ({name})"
        return None

    def _restart(self, reason: str) -> str:
        """Kill what is left of the dead worker and start it again; returns the ``WorkerDied`` message."""
        with self._lock:
            self._check_open()
            pid = self.pid
            self._cleanup(self._known_processes())
            self.restarts += 1
            self._episode_lost = True
            self.start()
            self.last_death = f"{self.spec.benchmark} worker {pid} {reason}; restarted as {self.pid}"
            return self.last_death

    def _restart_closed(self) -> str:
        """``_restart`` of a worker that closed its pipe (its reason once its exit status is known)."""
        self._check_open()
        self._proc.join(timeout=5)
        return self._restart(self._death() or "closed its pipe")

    def _check_open(self) -> None:
        if self._proc is None or self._closing:  # closed while the call waited: nothing to restart
            raise WorkerDied(f"{self.spec.benchmark} worker was closed during the call")

    def _known_processes(self) -> list[psutil.Process]:
        return [p for p, _ in self._children] + _descendants(self._proc.pid)

    def _prepare(self) -> None:
        """Before a call: start the worker if it is not running, take the reply a cancelled call owes, restart a
        dead worker. Blocks (a start: up to :data:`_START_TIMEOUT_S`)."""
        with self._lock:
            if self._proc is None:
                self.start()
                return
            if self._pending:
                self._drain()
            reason = self._death()
            if reason is not None:
                self._restart(reason)

    def _drain(self) -> None:
        """Take the reply a cancelled call owes, waiting at most until it was due (the start-up limit for a call
        without a limit); a worker whose reply has not come by then is hung: killed and restarted. The reply itself
        is dropped (a death it reports restarts the worker)."""
        due = self._reply_due
        if self._conn.poll(_START_TIMEOUT_S if due is None else max(0.0, due - time.monotonic())):
            with contextlib.suppress(EnvError, WorkerDied):  # a death has restarted the worker, losing the episode
                self._settle(*self._read())
        else:
            self._pending = False
            self._restart("gave no reply to a cancelled call within its limit (killed)")

    def _read(self) -> tuple[str, Any]:
        """The owed reply as (status, payload): ``ok`` and the result, ``error`` and the environment's traceback,
        or ``eof`` (None) when the worker closed its pipe."""
        try:
            status, payload = self._conn.recv()
        except (EOFError, OSError):
            status, payload = "eof", None
        self._pending = False
        return status, payload

    def _settle(self, status: str, payload: Any) -> Any:
        """The result of a reply read by :meth:`_read`; a worker that closed its pipe, or whose environment failed
        because a process it relies on died, is restarted (``WorkerDied``), an environment error is ``EnvError``."""
        if status == "ok":
            return payload
        if status == "eof":
            raise WorkerDied(self._restart_closed())
        self._check_open()
        reason = self._death()
        if reason is not None:  # the environment failed because a process it relies on died
            error = payload.strip().splitlines()[-1]
            raise WorkerDied(f"{self._restart(reason)} (the environment raised {error})")
        raise EnvError(f"{self.spec.benchmark} environment error in worker {self.pid}:\n{payload}")

    def _claim(self) -> None:
        if self._busy:
            raise RuntimeError(f"{self.spec.benchmark} worker {self.pid}: one call at a time (a worker plays one "
                               f"episode)")

    def _send(self, method: str, args: tuple) -> float | None:
        """Send the call to the started worker; returns how long its reply may take: ``call_timeout_s``, or at least
        :data:`_START_TIMEOUT_S` for the first call after a (re)start. A broken pipe raises ``BrokenPipeError`` or
        ``OSError`` (the caller restarts the worker)."""
        if method in _CONTINUES_EPISODE and self._episode_lost:
            raise WorkerDied(f"{self.last_death}; its episode is lost (reset to start a new one)")
        self._episode_lost = False
        self._conn.send((method, args))
        self._pending = True
        first, self._fresh = self._fresh, False
        limit_s = self.call_timeout_s
        if first and limit_s is not None:
            limit_s = max(limit_s, _START_TIMEOUT_S)
        self._reply_due = None if limit_s is None else time.monotonic() + limit_s
        return limit_s

    def call(self, method: str, *args: Any) -> Any:
        """Run ``env.<method>(*args)`` in the worker and return its result."""
        self._claim()
        with self._lock:
            self._prepare()
            try:
                self._send(method, args)
            except (BrokenPipeError, OSError):
                raise WorkerDied(self._restart_closed()) from None
            return self._settle(*self._read())

    async def acall(self, method: str, *args: Any) -> Any:
        """``call`` from the asyncio loop, which it never blocks: the reply is awaited on the pipe and the process
        sentinel, a start, restart or drain runs in a thread (see the module docstring)."""
        self._claim()
        self._busy = True
        try:
            if self._off_loop_step is not None:  # what a cancelled call left running (its outcome was that call's)
                with contextlib.suppress(Exception):
                    await asyncio.wrap_future(self._off_loop_step)
                self._off_loop_step = None
            if self._proc is None or self._pending or self._death(wait=False) is not None:
                await self._off_loop(self._prepare)
            try:
                limit_s = self._send(method, args)
            except (BrokenPipeError, OSError):
                raise WorkerDied(await self._off_loop(self._restart_closed)) from None
            try:  # not asyncio.wait_for: on 3.11 it can swallow a cancel that comes with the reply (gh-86296)
                async with asyncio.timeout(limit_s):
                    await self._wait_readable()
            except TimeoutError:
                self._pending = False
                raise WorkerDied(await self._off_loop(
                    self._restart, f"gave no reply to {method} within {limit_s:g} s (killed)")) from None
            status, payload = self._read()  # a process that ended without replying leaves the pipe at EOF
            return payload if status == "ok" else await self._off_loop(self._settle, status, payload)
        finally:
            self._busy = False

    async def _off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` (bounded, blocking) in a thread of its own while the loop goes on."""
        step = self._off_loop_step = _in_thread(functools.partial(fn, *args), name=f"env-{self.spec.benchmark}")
        try:
            return await asyncio.wrap_future(step)
        finally:
            if step.done():  # else the caller was cancelled: the next call waits for it
                self._off_loop_step = None

    async def _wait_readable(self) -> None:
        loop = asyncio.get_running_loop()
        ready = loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        fds = (self._conn.fileno(), self._proc.sentinel)
        for fd in fds:
            loop.add_reader(fd, wake)
        try:
            await ready
        finally:
            for fd in fds:
                loop.remove_reader(fd)

    def reset(self, task: Any, admissible: bool = True):
        return self.call("reset", task, admissible)

    def step(self, action: str):
        return self.call("step", action)

    async def areset(self, task: Any, admissible: bool = True):
        """``TextEnv.reset``: with ``admissible=False`` the episode's lists are built only where asked for."""
        return await self.acall("reset", task, admissible)

    async def astep(self, action: str):
        return await self.acall("step", action)

    async def astate(self):
        """The environment's state after its last reset or step (``TextEnv.state``; C.5's rollout quality)."""
        return await self.acall("state")

    def _cleanup(self, processes: list[psutil.Process]) -> None:
        """Forget the worker after killing its process (if still alive) and ``processes``."""
        self._conn.close()
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        _kill(processes)
        self._proc = self._conn = None
        self._children = []

    def _discard(self) -> None:
        """Kill and forget a worker that failed to start."""
        _LIVE.discard(self)
        self._cleanup(self._known_processes())

    def _kill_now(self) -> None:
        """Kill the worker process and whatever it started, without waiting for the lock (``close`` ends a start
        or drain that a thread waits on this way: it then fails at once)."""
        pid = self.pid
        if pid is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                _kill([*_descendants(pid), psutil.Process(pid)])

    def close(self, timeout: float = 10.0) -> None:
        """Stop the worker: ask it to close its environment, then kill what is left (its JVM included); one still in
        a call (cancelled, its reply owed) is killed at once. A start, restart or drain that a thread runs meanwhile
        is cut short first."""
        self._closing = True
        try:
            while not self._lock.acquire(timeout=0.1):
                self._kill_now()
            try:
                self._close(timeout)
            finally:
                self._lock.release()
        finally:
            self._closing = False

    def _close(self, timeout: float) -> None:
        if self._proc is None:
            return
        _LIVE.discard(self)
        processes = self._known_processes()
        if not self._pending:  # a worker still in a call (a cancelled one's reply owed) would take it first: killed
            try:
                self._conn.send(("close", ()))
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(timeout)
        self._cleanup(processes)


class EnvPool:
    """``size`` workers of one environment spec; a context manager that closes them all."""

    def __init__(self, spec: EnvFactory, size: int, call_timeout_s: float | None = None,
                 cores: tuple[int, ...] | None = None):
        if size < 1:
            raise ValueError(f"size={size}: must be >= 1")
        self.workers = [EnvWorker(spec, call_timeout_s, cores) for _ in range(size)]

    def start(self) -> EnvPool:
        """Start every worker; when one cannot start, close those started and raise its error."""
        try:
            for worker in self.workers:
                worker.start()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for worker in self.workers:
            worker.close()

    async def map(self, play: Callable[[EnvWorker, T], Awaitable[R]], items: Sequence[T]) -> list[R]:
        """``play(worker, item)`` for every item, each worker taking the next item as it finishes one; the results
        in the order of ``items``."""
        queue = list(enumerate(items))
        out: dict[int, R] = {}

        async def slot(worker: EnvWorker) -> None:
            while queue:
                i, item = queue.pop(0)
                out[i] = await play(worker, item)

        await asyncio.gather(*(slot(w) for w in self.workers))
        return [out[i] for i in range(len(items))]

    def __enter__(self) -> EnvPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

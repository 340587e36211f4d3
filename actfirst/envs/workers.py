"""Environments in worker processes, so the process driving the engine never waits on a simulator.

Each ``EnvWorker`` owns one environment in a spawned process and answers ``reset``/``step`` over a pipe, from
synchronous code (``call``) or from the asyncio loop that drives the engine (``acall``: the pipe and the process
sentinel are watched by the loop, no thread is used). A worker that dies mid-call is restarted and the call raises
``WorkerDied`` with the reason, so its episode is reported as failed, never silently dropped; an exception inside the
environment raises ``EnvError`` with the worker's traceback. ``close`` (also on Ctrl-C and at interpreter exit)
stops every worker and kills whatever the worker started (ScienceWorld's JVM) if it outlives it.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import multiprocessing as mp
import os
import signal
import traceback
import weakref
from typing import Any

from actfirst.envs.base import TextEnv

BENCHMARKS = ("alfworld", "scienceworld", "webshop")
_START_TIMEOUT_S = 120.0


class EnvError(RuntimeError):
    """The environment raised inside its worker; the message holds the worker's traceback."""


class WorkerDied(RuntimeError):
    """The worker process ended during a call; the worker has been restarted, the episode is lost."""


@dataclasses.dataclass(frozen=True, slots=True)
class EnvSpec:
    """Which environment a worker builds: the benchmark and its constructor arguments."""

    benchmark: str
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.benchmark not in BENCHMARKS:
            raise ValueError(f"benchmark={self.benchmark!r}: not one of {BENCHMARKS}")


def make_env(spec: EnvSpec) -> TextEnv:
    """Build the environment ``spec`` names (in the calling process)."""
    if spec.benchmark == "scienceworld":
        from actfirst.envs.scienceworld_env import ScienceWorldTextEnv

        return ScienceWorldTextEnv(**spec.kwargs)
    if spec.benchmark == "alfworld":
        from actfirst.envs.alfworld_env import ALFWorldTextEnv

        return ALFWorldTextEnv(**spec.kwargs)
    from actfirst.envs.webshop_env import WebShopTextEnv

    return WebShopTextEnv(**spec.kwargs)


def _worker_main(conn, spec: EnvSpec) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it closes the workers
    try:
        env = make_env(spec)
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


def _descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


_LIVE: weakref.WeakSet[EnvWorker] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for worker in list(_LIVE):
        worker.close()


class EnvWorker:
    """One environment in its own process."""

    def __init__(self, spec: EnvSpec):
        self.spec = spec
        self.restarts = 0
        self._proc: mp.process.BaseProcess | None = None
        self._conn = None
        self._children: list[int] = []
        self._busy = False
        self._pending = False  # a reply is owed (a cancelled acall leaves one behind; the next call drains it)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Start the process (if not running) and wait until its environment is built."""
        if self._proc is not None and self._proc.is_alive():
            return
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=_worker_main, args=(child, self.spec), daemon=True,
                                 name=f"env-{self.spec.benchmark}")
        self._proc.start()
        child.close()
        self._conn = parent
        _LIVE.add(self)
        try:
            if not parent.poll(_START_TIMEOUT_S):
                raise WorkerDied(f"{self.spec.benchmark} worker did not start within {_START_TIMEOUT_S:.0f} s")
            status, payload = parent.recv()
        except (EOFError, OSError):
            self._proc.join(5)
            status, payload = "died", f"{self.spec.benchmark} worker exited while starting ({self._proc.exitcode})"
        except WorkerDied as e:
            status, payload = "died", str(e)
        if status != "ok":
            self.close()
            raise (EnvError if status == "error" else WorkerDied)(payload)
        self._children = _descendants(self._proc.pid)

    def pids(self) -> list[int]:
        """The worker's process id and those of everything it started (e.g. its JVM)."""
        return [] if self._proc is None else [self._proc.pid] + _descendants(self._proc.pid)

    def memory_bytes(self) -> int:
        """Resident memory of the worker and everything it started (e.g. its JVM)."""
        import psutil

        total = 0
        for pid in self.pids():
            try:
                total += psutil.Process(pid).memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total

    def _receive(self) -> Any:
        try:
            status, payload = self._conn.recv()
        except (EOFError, OSError):
            self._died()
        self._pending = False
        if status == "error":
            raise EnvError(f"{self.spec.benchmark} environment error in worker {self.pid}:\n{payload}")
        return payload

    def _died(self) -> None:
        self._pending = False
        self._proc.join(timeout=5)
        code = self._proc.exitcode
        reason = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        pid = self.pid
        self._cleanup(self._children)
        self.restarts += 1
        self.start()
        raise WorkerDied(f"{self.spec.benchmark} worker {pid} died ({reason}); restarted as {self.pid}")

    def _send(self, method: str, args: tuple) -> None:
        if self._busy:
            raise RuntimeError(f"{self.spec.benchmark} worker {self.pid}: one call at a time (a worker plays one "
                               f"episode)")
        self.start()
        if self._pending:  # the reply to a cancelled call
            try:
                self._receive()
            except EnvError:
                pass
        try:
            self._conn.send((method, args))
        except (BrokenPipeError, OSError):
            self._died()
        self._pending = True

    def call(self, method: str, *args: Any) -> Any:
        """Run ``env.<method>(*args)`` in the worker and return its result."""
        self._send(method, args)
        return self._receive()

    async def acall(self, method: str, *args: Any) -> Any:
        """``call`` from the asyncio loop: waits on the pipe and the process sentinel, never blocks the loop."""
        self._send(method, args)
        self._busy = True
        try:
            await self._wait_readable()
        finally:
            self._busy = False
        if not self._conn.poll(0):
            self._died()
        return self._receive()

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

    def reset(self, task: Any):
        return self.call("reset", task)

    def step(self, action: str):
        return self.call("step", action)

    async def areset(self, task: Any):
        return await self.acall("reset", task)

    async def astep(self, action: str):
        return await self.acall("step", action)

    def _cleanup(self, children: list[int]) -> None:
        """Forget the process after killing it (if still alive) and ``children``."""
        self._conn.close()
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        _kill(children)
        self._proc = self._conn = None
        self._children = []

    def close(self, timeout: float = 10.0) -> None:
        """Stop the worker: ask it to close its environment, then kill what is left (its JVM included)."""
        if self._proc is None:
            return
        _LIVE.discard(self)
        children = self._children + _descendants(self._proc.pid)
        try:
            self._conn.send(("close", ()))
        except (BrokenPipeError, OSError):
            pass
        self._proc.join(timeout)
        self._cleanup(children)


class EnvPool:
    """``size`` workers of one environment spec; a context manager that closes them all."""

    def __init__(self, spec: EnvSpec, size: int):
        if size < 1:
            raise ValueError(f"size={size}: must be >= 1")
        self.workers = [EnvWorker(spec) for _ in range(size)]

    def start(self) -> EnvPool:
        for worker in self.workers:
            worker.start()
        return self

    def close(self) -> None:
        for worker in self.workers:
            worker.close()

    def __enter__(self) -> EnvPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

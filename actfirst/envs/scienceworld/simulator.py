"""Starting ScienceWorld's simulator: its Scala server in a JVM, which ``scienceworld.ScienceWorldEnv`` launches
through py4j, under our JVM options. Every start (an environment's, the task enumeration's) goes through
:func:`start_simulator`.

A start that fails raises ``EnvStartError`` naming the command that failed and the first lines of its output. py4j
discards the JVM's output and, when the JVM exits before printing its port, fails with a bare ``ValueError`` (and the
library's ``__del__`` with an ``AttributeError``), so after a failed start its command is run once more alone
(``run_alone``: with stdin closed it ends at once) to read what it says. A ``scienceworld`` package that does not
import fails the same way. py4j waits for the port with no limit: a JVM still silent after ``START_TIMEOUT_S`` is
killed, and the start fails saying so (a worker's start has its own bound; the task enumeration, in the command's
own process, had none).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from typing import Any

import psutil

from actfirst.envs.startup import EnvStartError, first_lines, import_simulator, run_alone, shown

BENCHMARK = "scienceworld"
# One JVM per environment: a serial collector and one processor each keep many JVMs from fighting over the cores.
# Measured on the 2-core VM (bench/env_throughput.py, 16 workers): 8.1 vs 4.0 steps/s, 272 vs 426 MiB per worker.
JVM_OPTIONS = "-XX:+UseSerialGC -XX:ActiveProcessorCount=1"


START_TIMEOUT_S = 120.0
"""How long a JVM may take to print its port before it is killed and the start fails."""


def start_simulator(step_limit: int, jvm_options: str = JVM_OPTIONS, *,
                    timeout_s: float = START_TIMEOUT_S) -> Any:
    """A started simulator (a ``scienceworld.ScienceWorldEnv``, no task loaded) that ends an episode itself after
    ``step_limit`` moves; its JVM runs with ``jvm_options`` before the user's own ``JAVA_TOOL_OPTIONS``. Raises
    ``EnvStartError`` when it cannot start, or has not printed its port within ``timeout_s`` (see the module
    docstring)."""
    library = import_simulator(BENCHMARK, "scienceworld")
    with _java_tool_options(jvm_options) as options:
        watch = _StartWatch(timeout_s)
        try:
            simulator = _simulator_class(library.ScienceWorldEnv)("", envStepLimit=step_limit)
        except Exception as e:
            if watch.stop():
                raise _timed_out(options, timeout_s) from e
            raise _start_error(e, options) from e
        if watch.stop():  # killed as its port came: a dead simulator
            with contextlib.suppress(Exception):
                simulator.close()
            raise _timed_out(options, timeout_s)
        return simulator


class _StartWatch:
    """Kills a py4j gateway JVM that this process starts from now on and that is still starting after ``timeout_s``
    (with what it started: a wrapper's children hold its pipe), unless :meth:`stop` came first; py4j's wait for its
    port then ends."""

    def __init__(self, timeout_s: float) -> None:
        self.before = {p.pid for p in psutil.Process().children()}
        self.killed = False
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._watch, args=(timeout_s,), name="jvm-start-watch", daemon=True)
        self.thread.start()

    def stop(self) -> bool:
        """End the watch; whether it killed the JVM."""
        with self.lock:
            self.done.set()
        self.thread.join()
        return self.killed

    def _watch(self, timeout_s: float) -> None:
        if self.done.wait(timeout_s):
            return
        with self.lock:
            if self.done.is_set():
                return
            for child in psutil.Process().children():
                with contextlib.suppress(psutil.Error):
                    if child.pid not in self.before and "py4j.GatewayServer" in child.cmdline():
                        for process in [*child.children(recursive=True), child]:
                            with contextlib.suppress(psutil.Error):
                                process.kill()
                        self.killed = True


def _timed_out(jvm_options: str, timeout_s: float) -> EnvStartError:
    """The error of a start whose JVM printed no port within ``timeout_s``."""
    command, _ = launch_command()
    return EnvStartError(BENCHMARK, f"`{shown(command, {'JAVA_TOOL_OPTIONS': jvm_options})}` printed no port within "
                                    f"{timeout_s:g} s (killed)")


@contextlib.contextmanager
def _java_tool_options(jvm_options: str) -> Iterator[str]:
    """``JAVA_TOOL_OPTIONS`` (read by the JVM as it starts) set to ``jvm_options`` and the user's own, restored
    after; yields the value."""
    user_options = os.environ.get("JAVA_TOOL_OPTIONS")
    os.environ["JAVA_TOOL_OPTIONS"] = options = f"{jvm_options} {user_options or ''}".strip()
    try:
        yield options
    finally:
        if user_options is None:
            del os.environ["JAVA_TOOL_OPTIONS"]
        else:
            os.environ["JAVA_TOOL_OPTIONS"] = user_options


@functools.cache
def _simulator_class(library_class: type) -> type:
    """``scienceworld.ScienceWorldEnv`` with a ``__del__`` that a failed start survives (the library's closes a
    gateway that was never made: an AttributeError printed after every failed start)."""

    class Simulator(library_class):
        def __del__(self) -> None:
            if hasattr(self, "_gateway"):
                super().__del__()

    return Simulator


def launch_command() -> tuple[list[str], str]:
    """The command py4j's ``launch_gateway`` runs for ``ScienceWorldEnv`` (``java`` on PATH, py4j's jar and the
    simulator's) and the directory it runs it in."""
    from py4j.java_gateway import find_jar_path
    from scienceworld.constants import BASEPATH, JAR_PATH

    classpath = os.pathsep.join((find_jar_path(), JAR_PATH))
    return ["java", "-classpath", classpath, "py4j.GatewayServer", "--die-on-broken-pipe", "0"], BASEPATH


def _start_error(error: Exception, jvm_options: str) -> EnvStartError:
    """Why the simulator's start failed with ``error``: its launch command run alone, with what it printed (the
    JVM's notice of ``JAVA_TOOL_OPTIONS`` left out: the command shows them)."""
    command, cwd = launch_command()
    failed = f"`{shown(command, {'JAVA_TOOL_OPTIONS': jvm_options})}`"
    alone = run_alone(command, cwd=cwd)
    if alone is None:  # the JVM starts by itself: what failed came after it
        return EnvStartError(BENCHMARK, f"{failed} started, but py4j then raised {type(error).__name__}",
                             first_lines(str(error)))
    how, output = alone
    said = "\n".join(line for line in output.splitlines() if not line.startswith("Picked up JAVA_TOOL_OPTIONS"))
    return EnvStartError(BENCHMARK, f"{failed} {how}", first_lines(said))

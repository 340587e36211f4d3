"""Starting ScienceWorld's simulator: its Scala server in a JVM, which ``scienceworld.ScienceWorldEnv`` launches
through py4j, under our JVM options. Every start (an environment's, the task enumeration's) goes through
:func:`start_simulator`.

A start that fails raises ``EnvStartError`` naming the command that failed and the first lines of its output. py4j
discards the JVM's output and, when the JVM exits before printing its port, fails with a bare ``ValueError`` (and the
library's ``__del__`` with an ``AttributeError``), so after a failed start its command is run once more alone
(``run_alone``: with stdin closed it ends at once) to read what it says. A ``scienceworld`` package that does not
import fails the same way.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any

from actfirst.envs.startup import EnvStartError, first_lines, import_simulator, run_alone, shown

BENCHMARK = "scienceworld"
# One JVM per environment: a serial collector and one processor each keep many JVMs from fighting over the cores.
# Measured on the 2-core VM (bench/env_throughput.py, 16 workers): 8.1 vs 4.0 steps/s, 272 vs 426 MiB per worker.
JVM_OPTIONS = "-XX:+UseSerialGC -XX:ActiveProcessorCount=1"


def start_simulator(step_limit: int, jvm_options: str = JVM_OPTIONS) -> Any:
    """A started simulator (a ``scienceworld.ScienceWorldEnv``, no task loaded) that ends an episode itself after
    ``step_limit`` moves; its JVM runs with ``jvm_options`` before the user's own ``JAVA_TOOL_OPTIONS``. Raises
    ``EnvStartError`` when it cannot start (see the module docstring)."""
    library = import_simulator(BENCHMARK, "scienceworld")
    with _java_tool_options(jvm_options) as options:
        try:
            return _simulator_class(library.ScienceWorldEnv)("", envStepLimit=step_limit)
        except Exception as e:
            raise _start_error(e, options) from e


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

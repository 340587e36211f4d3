"""How a simulator that cannot start is reported, whichever benchmark: one error, :class:`EnvStartError`, raised
wherever the simulator first starts (a task enumeration that asks it, preparation, a worker's start), which every
command prints as one line (``actfirst.core.user_input.command``) instead of a library's traceback.

A benchmark's package raises it from its own start: :func:`import_simulator` for its simulator's package (missing or
broken), :func:`run_alone` to learn why a start command failed when the library that ran it kept its output (py4j
sends the JVM's to /dev/null). Workers hand it on from their process as it is (``actfirst.envs.workers``).
"""

from __future__ import annotations

import importlib
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from types import ModuleType

from actfirst.core.user_input import UserError

OUTPUT_LINES = 3
"""How many lines of a failed command's output the error quotes."""
RUN_ALONE_TIMEOUT_S = 30.0
"""How long :func:`run_alone` lets a start command run before it counts as hanging (and is killed)."""


class EnvStartError(UserError, RuntimeError):
    """A benchmark's simulator could not start: ``benchmark``, ``failed`` (the command and how it failed, e.g.
    ``\\`java ...\\` exited with status 1``) and ``output`` (the first lines of what it printed, joined by " | ";
    may be empty). Picklable, so that a worker or a child process can hand it on."""

    def __init__(self, benchmark: str, failed: str, output: str = "") -> None:
        super().__init__(benchmark, failed, output)
        self.benchmark, self.failed, self.output = benchmark, failed, output

    def __str__(self) -> str:
        return f"{self.benchmark}: the simulator could not start: {self.failed}" + \
            (f": {self.output}" if self.output else "")


def first_lines(text: str, n: int = OUTPUT_LINES) -> str:
    """The first ``n`` non-blank lines of ``text``, stripped, joined by " | " (one line)."""
    return " | ".join([line.strip() for line in text.splitlines() if line.strip()][:n])


def import_simulator(benchmark: str, module: str) -> ModuleType:
    """``importlib.import_module(module)``: the simulator's package of ``benchmark``; any failure (not installed,
    broken) raises :class:`EnvStartError` naming the import and the error."""
    try:
        return importlib.import_module(module)
    except Exception as e:
        raise EnvStartError(benchmark, f"`import {module}` raised {type(e).__name__}", first_lines(str(e))) from e


def shown(command: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """``command`` as a shell would take it, its program resolved on PATH, after the ``env`` variables it needs."""
    program = shutil.which(command[0]) or command[0]
    variables = [f"{k}={shlex.quote(v)}" for k, v in (env or {}).items()]
    return " ".join([*variables, shlex.join([program, *command[1:]])])


def run_alone(command: Sequence[str], *, cwd: str | None = None,
              timeout_s: float = RUN_ALONE_TIMEOUT_S) -> tuple[str, str] | None:
    """Run a simulator's start ``command`` by itself (stdin closed, so a server that waits on it ends; stdout and
    stderr kept together) to see whether it fails: ``(how, output)`` (``how``: "exited with status 1", "could not
    be run (No such file or directory)", ...; ``output``: what it printed), or None when it exited with status 0.
    It runs with this process's environment. A command still running after ``timeout_s`` is killed ("did not end
    within ...")."""
    try:
        done = subprocess.run(list(command), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, cwd=cwd, timeout=timeout_s)
    except OSError as e:
        return f"could not be run ({e.strerror or e})", ""
    except subprocess.TimeoutExpired as e:
        return f"did not end within {timeout_s:g} s", (e.output or b"").decode(errors="replace")
    if done.returncode == 0:
        return None
    how = f"was killed by signal {-done.returncode}" if done.returncode < 0 else \
        f"exited with status {done.returncode}"
    return how, done.stdout.decode(errors="replace")

"""A simulator that cannot start ends what started it with one line (``EnvStartError``) naming the benchmark, the
command that failed and the first lines of its output, leaving nothing running: from the task enumeration of
``python -m actfirst.run`` on the demo config, and from a worker's start.

Faults are injected into the real simulator's start: a ``java`` first on PATH that exits 1 or hangs without a word
(fault-injection scripts), and a ``scienceworld`` package that raises on import (a fault-injection package first on
``sys.path``).
"""

import os
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from actfirst.envs.benchmarks import get_benchmark
from actfirst.envs.startup import EnvStartError
from actfirst.envs.workers import EnvPool, EnvWorker

SAYS = "fault injection: this java cannot start"


@pytest.fixture
def broken_java(tmp_path):
    """A directory whose ``java`` (a fault-injection script) prints :data:`SAYS` on stderr and exits 1."""
    bin_dir = tmp_path / "fault-injection-bin"
    bin_dir.mkdir()
    java = bin_dir / "java"
    java.write_text(f"#!/bin/sh\necho '{SAYS}' >&2\nexit 1\n")
    java.chmod(0o755)
    return java


def test_a_jvm_that_never_prints_its_port_is_killed_and_named_fault_injection(tmp_path, monkeypatch):
    """py4j waits for the JVM's port with no limit: a ``java`` that hangs silently (a fault-injection script) is
    killed after the start's timeout, with everything it started, and the start fails naming it (before: the task
    enumeration of ``python -m actfirst.run`` waited forever)."""
    from actfirst.envs.scienceworld.simulator import start_simulator

    bin_dir = tmp_path / "fault-injection-bin"
    bin_dir.mkdir()
    (bin_dir / "java").write_text("#!/bin/sh\nsleep 600\n")
    (bin_dir / "java").chmod(0o755)
    marker = uuid.uuid4().hex
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("ACTFIRST_TEST_RUN", marker)
    started = time.monotonic()
    with pytest.raises(EnvStartError) as error:
        start_simulator(step_limit=10, timeout_s=2)
    took = time.monotonic() - started
    assert 2 <= took < 20, took
    assert str(error.value).startswith("scienceworld: the simulator could not start: `JAVA_TOOL_OPTIONS="), error.value
    assert str(error.value).endswith("py4j.GatewayServer --die-on-broken-pipe 0` printed no port within 2 s (killed)")
    assert f"{bin_dir}/java -classpath" in str(error.value)
    deadline = time.monotonic() + 10
    while (left := processes_with("ACTFIRST_TEST_RUN", marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in left if p.pid != os.getpid()] == []


def processes_with(name: str, value: str) -> list[psutil.Process]:
    """Every process whose environment has ``name=value``."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(name) == value:
                found.append(process)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return found


def test_the_run_ends_in_one_line_when_java_cannot_start_fault_injection(broken_java, tmp_path):
    """``python -m actfirst.run`` on the demo config with a broken java: the task enumeration's simulator is the
    first to start, and the run ends with exit status 1 and one line on stderr, no traceback (nor the simulator
    library's own error from its ``__del__``), nothing left running (every process that inherited a marker in its
    environment has ended)."""
    marker = uuid.uuid4().hex
    env = {**os.environ, "PATH": f"{broken_java.parent}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
           "ACTFIRST_TEST_RUN": marker}
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "actfirst.run", f"out_dir={tmp_path / 'run'}"], env=env,
                         capture_output=True, text=True, timeout=300)
    print(f"the run ended in {time.monotonic() - started:.1f} s")
    lines = run.stderr.splitlines()
    assert run.returncode == 1 and len(lines) == 1, run.stderr
    assert lines[0].startswith("python -m actfirst.run: error: scienceworld: the simulator could not start: `"), lines
    assert f" {broken_java} -classpath " in lines[0] and "py4j.GatewayServer" in lines[0]
    assert lines[0].endswith(f"` exited with status 1: {SAYS}"), lines[0]
    assert processes_with("ACTFIRST_TEST_RUN", marker) == []


def test_a_worker_whose_java_cannot_start_fault_injection(broken_java, monkeypatch):
    """A pool's worker that cannot start its simulator raises the simulator's own ``EnvStartError`` (handed on from
    the worker process), and the pool leaves no worker running."""
    monkeypatch.setenv("PATH", f"{broken_java.parent}{os.pathsep}{os.environ['PATH']}")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(EnvStartError) as error:
        EnvPool(get_benchmark("scienceworld").env_spec(), size=2).start()
    message = str(error.value)
    assert message.startswith("scienceworld: the simulator could not start: `") and str(broken_java) in message
    assert message.endswith(f"` exited with status 1: {SAYS}"), message
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before
            and "resource_tracker" not in " ".join(p.cmdline())]  # multiprocessing's, one per parent process
    assert psutil.wait_procs(left, timeout=10)[1] == []


def test_a_simulator_package_that_does_not_import_fault_injection(tmp_path, monkeypatch):
    """A ``scienceworld`` package that raises on import (first on the worker's ``sys.path``) fails the worker's
    start with ``EnvStartError`` naming the import and its error."""
    package = tmp_path / "fault-injection-packages" / "scienceworld"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('fault injection: a broken scienceworld')\n")
    monkeypatch.syspath_prepend(str(package.parent))
    worker = EnvWorker(get_benchmark("scienceworld").env_spec())
    with pytest.raises(EnvStartError) as error:
        worker.start()
    assert str(error.value) == ("scienceworld: the simulator could not start: `import scienceworld` raised "
                                "ImportError: fault injection: a broken scienceworld")
    assert worker.pid is None

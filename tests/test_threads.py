"""Importing the package fixes ``OMP_NUM_THREADS`` before torch is imported, so torch computes with that many
threads; a value in the environment is kept; what a process computes with is recorded."""

import json
import os
import subprocess
import sys

PROBE = ("import json, os, actfirst, torch; from actfirst.core.threads import thread_counts; "
         "print(json.dumps(thread_counts()))")


def counts(env_threads: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if env_threads is not None:
        env["OMP_NUM_THREADS"] = env_threads
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_the_thread_count_is_fixed_before_torch():
    fixed = counts(None)
    assert (fixed["OMP_NUM_THREADS"], fixed["torch_threads"]) == ("1", 1)
    assert fixed["usable_cores"] <= fixed["cores"]
    given = counts("2")  # the environment's own value wins
    assert (given["OMP_NUM_THREADS"], given["torch_threads"]) == ("2", 2)


def test_an_openmp_runtime_loaded_at_start_is_told_too():
    """A child of a process that ran vLLM's CPU engine inherits ``LD_PRELOAD`` of torch's libgomp, which reads
    ``OMP_NUM_THREADS`` before Python runs: the package still fixes the count."""
    import torch

    gomp = os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300,
                          env={**env, "LD_PRELOAD": gomp})
    assert proc.returncode == 0, proc.stderr[-2000:]
    fixed = json.loads(proc.stdout.splitlines()[-1])
    assert (fixed["OMP_NUM_THREADS"], fixed["torch_threads"]) == ("1", 1)

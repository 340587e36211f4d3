"""The commands that start environment workers import no torch, scipy, transformers or vLLM at their top.

An environment worker is a spawned process, and a spawned process runs the parent's main module again (as
``__mp_main__``) before it does anything else: for ``python -m actfirst.eval`` that is ``actfirst/eval.py``. What
that module imports at its top, every worker imports again. With torch and scipy there, 16 ScienceWorld workers took
36.7 s to start on the 2-core VM instead of 13.6 s (bench/RESULTS.md, "Environment workers and the command's
imports"). The commands import those where they use them.
"""

import subprocess
import sys

import pytest

HEAVY = ("torch", "scipy", "transformers", "vllm")
COMMANDS = ("run", "eval", "prepare", "compare", "references", "rollout_quality", "teacher_rollouts", "make_teacher")
"""The ``python -m actfirst.<command>`` commands whose process, or a child it starts, runs environment workers."""


@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_that_starts_environment_workers_imports_nothing_heavy_at_its_top(command):
    probe = (f"import sys, actfirst.{command}; "
             f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [], (f"importing actfirst.{command} imports {done.stdout.strip()}, which each of its "
                                       f"spawned environment workers would import again")

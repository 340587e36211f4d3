#!/usr/bin/env bash
# Set up (or check) the venv, then run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${ACTFIRST_VENV:-.venv}
"$VENV/bin/ruff" check .  # the project's rules (pyproject.toml), before the tests
export OMP_NUM_THREADS=1  # vLLM on 2-core CPUs; tests/conftest.py also sets TRITON_INTERPRET without a GPU
# One pytest-xdist worker per CPU (at most 4), each taking whole files, so that a file's module fixtures (trained
# models, simulators) are built once. The tests' processes run one thread each: one worker would leave CPUs idle.
# The files go out longest first (tests/file_durations.json, ordered by tests/conftest.py): xdist's own reordering,
# by the number of tests in a file, would start the few-test whole-run files last and leave one worker idle.
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider -n logical --maxprocesses 4 --dist loadfile \
  --no-loadscope-reorder tests "$@"

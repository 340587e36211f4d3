#!/usr/bin/env bash
# Set up (or check) the venv, then run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=1  # vLLM on 2-core CPUs; tests/conftest.py also sets TRITON_INTERPRET without a GPU
exec "${ACTFIRST_VENV:-.venv}/bin/python" -m pytest -q -p no:cacheprovider tests "$@"

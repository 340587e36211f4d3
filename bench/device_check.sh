#!/usr/bin/env bash
# One prepared GPU check (for the lent H200, one call under 8 minutes: the timeouts below add up to 450 s): compiled
# Triton kernels against the float64 references, then the micro-benchmarks at Qwen3 shapes, N = 1,024 (the
# vocabulary-split path) and 65,536. Writes logs and JSON to $OUT (or runs/device).
#   run from the repository root on the GPU machine: bash bench/device_check.sh
# Liger and Cut Cross-Entropy are benchmarked when installed; the device machine cannot download, so carry their
# pure-Python wheels in .whl/ (python3 -m pip download --no-deps -d .whl liger-kernel cut-cross-entropy).
set -uo pipefail
OUT=${OUT:-runs/device}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_PRINT_AUTOTUNING=1 TRITON_CACHE_AUTOTUNING=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
# The package without the native CPU ops (not needed on the GPU); kernels/ becomes actfirst.kernels.
ACTFIRST_NO_NATIVE=1 python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
# The compile check is CI's (CPU); here the kernels run.
timeout 110 python3 -m pytest -q -x tests/kernels --ignore tests/kernels/test_compile_check.py 2>&1 \
  | tee "$OUT/kernel_tests.log" | tail -5
timeout 280 python3 bench/bench_logprob_gather.py --tokens 1024 65536 --models 0.6B 8B \
  --providers eager fused liger cce --reps 5 --out "$OUT/logprob_gather.json" 2>&1 | tee "$OUT/logprob_gather.log" | tail -40
timeout 60 python3 bench/bench_ppo_loss.py --tokens 1048576 8388608 33554432 --out "$OUT/ppo_loss.json" 2>&1 \
  | tee "$OUT/ppo_loss.log" | tail -12

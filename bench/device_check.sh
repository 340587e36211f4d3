#!/usr/bin/env bash
# One prepared GPU check (for the lent H200, under 8 minutes): compiled Triton kernels against the float64
# references, then the micro-benchmarks at Qwen3 shapes. Writes logs and JSON to $OUT (or runs/device).
#   run from the repository root on the GPU machine: bash bench/device_check.sh
set -uo pipefail
OUT=${OUT:-runs/device}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
# The package without the native CPU ops (not needed on the GPU); kernels/ becomes actfirst.kernels.
ACTFIRST_NO_NATIVE=1 python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
timeout 150 python3 -m pytest -q -x tests/kernels 2>&1 | tee "$OUT/kernel_tests.log" | tail -5
timeout 200 python3 bench/bench_logprob_gather.py --tokens 8192 65536 --models 0.6B 8B \
  --providers eager fused liger --reps 5 --out "$OUT/logprob_gather.json" 2>&1 | tee "$OUT/logprob_gather.log" | tail -30
timeout 60 python3 bench/bench_ppo_loss.py --tokens 1048576 8388608 33554432 --out "$OUT/ppo_loss.json" 2>&1 \
  | tee "$OUT/ppo_loss.log" | tail -12

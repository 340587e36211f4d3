#!/usr/bin/env bash
# One prepared GPU check for a lent H200: one call under 8 minutes (the timeouts below add up to 455 s;
# the kernel tests pay for most Triton compiles, which the benchmarks then find in Triton's cache). Compiled
# Triton kernels against the float64 references; the LM head's gradient error with bf16 and fp32 accumulation; each
# CUDA path (fused, chunked) of teacher scoring (fwd) and of the student update (fwd_bwd) at N = 1,024 / 16,384 /
# 65,536 for the Qwen3 0.6B and 8B heads, against Liger-Kernel and Cut Cross-Entropy in the same run, with the
# dispatcher's pick; the PPO token loss against the copy bound. Logs and JSON go to $OUT (default runs/device).
#   GPU:           bash bench/device_check.sh
#   CPU dry run:   SHRUNKEN=1 PYTHON=.venv/bin/python bash bench/device_check.sh
# SHRUNKEN=1 runs every step on tiny shapes (V = 1,000, H / 64, a few dozen tokens) under the Triton interpreter,
# without the install step (the package is already installed there), so that the script and the benchmarks it calls
# are exercised end to end on a machine without a GPU; its times are not speed measurements.
# Liger and Cut Cross-Entropy are benchmarked when installed; the device machine cannot download, so carry their
# pure-Python wheels in .whl/ (python3 -m pip download --no-deps -d .whl liger-kernel cut-cross-entropy).
set -uo pipefail
OUT=${OUT:-runs/device}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_PRINT_AUTOTUNING=1 TRITON_CACHE_AUTOTUNING=1
if [[ "${SHRUNKEN:-0}" == 1 ]]; then
  export TRITON_INTERPRET=1
  TOKENS="16 32 48" PPO_TOKENS="5000 20000" GRAD_ARGS="--shrunken --tokens 512 --chunks 64"
  BENCH_ARGS="--shrunken --reps 1" PPO_ARGS="--backend triton --reps 2"
  echo "shrunken dry run on the CPU (Triton interpreter): not a speed measurement" | tee "$OUT/gpu.txt"
else
  TOKENS="1024 16384 65536" PPO_TOKENS="1048576 8388608 33554432" GRAD_ARGS="--tokens 16384"
  BENCH_ARGS="--reps 5" PPO_ARGS="--reps 20"
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
  if compgen -G ".whl/*.whl" >/dev/null; then
    timeout 15 "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site
  fi
  # The package without the native CPU ops (not needed on the GPU); kernels/ becomes actfirst.kernels.
  ACTFIRST_NO_NATIVE=1 timeout 30 "$PY" -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
fi
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
# The compile check is CI's (CPU); here the kernels run.
timeout 95 "$PY" -m pytest -q -p no:cacheprovider tests/kernels --ignore tests/kernels/test_compile_check.py 2>&1 \
  | tee "$OUT/kernel_tests.log" | tail -5
# shellcheck disable=SC2086  # the argument lists are meant to split
timeout 30 "$PY" bench/head_grad_error.py $GRAD_ARGS --out "$OUT/head_grad_error.json" 2>&1 \
  | tee "$OUT/head_grad_error.log" | tail -7
# shellcheck disable=SC2086
timeout 240 "$PY" bench/bench_logprob_gather.py --tokens $TOKENS --models 0.6B 8B $BENCH_ARGS \
  --out "$OUT/logprob_gather.json" 2>&1 | tee "$OUT/logprob_gather.log" | tail -16
# shellcheck disable=SC2086
timeout 45 "$PY" bench/bench_ppo_loss.py --tokens $PPO_TOKENS $PPO_ARGS --out "$OUT/ppo_loss.json" 2>&1 \
  | tee "$OUT/ppo_loss.log" | tail -12

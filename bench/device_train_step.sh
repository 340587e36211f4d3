#!/usr/bin/env bash
# The training step on a lent GPU (one call, under 8 minutes: the timeout below is 420 s): a randomly initialized
# Qwen3-1.7B student (FSDP2 on one rank, bfloat16 compute over float32 master weights) and a Qwen3-8B-shaped teacher
# (bfloat16, whole) through teacher scoring, two updates and the weight sync's gather, on a batch shaped like the
# paper's: 64 full responses of up to 512 tokens on contexts of up to 3,584 (bench/train_step.py). The device image
# has torch, Triton and transformers but no vLLM: the engine's own load is not timed. Writes JSON and a log to $OUT.
#   on the GPU machine, from the repository root: bash bench/device_train_step.sh
#   a dry run on a CPU (tiny shapes, the same code path): SHRUNKEN=1 bash bench/device_train_step.sh
set -uo pipefail
OUT=${OUT:-runs/device}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ "${SHRUNKEN:-0}" = 1 ]; then
  shapes=(--student tiny --teacher small --responses 8 --response-tokens 64 --context-tokens 256
          --micro-batch-tokens 2048 --compute-dtype float32 --teacher-dtype float32)
else
  nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
  # The package without the native CPU ops (not needed on the GPU); kernels/ becomes actfirst.kernels.
  ACTFIRST_NO_NATIVE=1 "$PYTHON" -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
  shapes=(--student 1.7B --teacher 8B --compute-dtype bfloat16 --teacher-dtype bfloat16)
fi
timeout 420 "$PYTHON" bench/train_step.py "${shapes[@]}" --updates 2 --nproc-per-node 1 \
  --out "$OUT/train_step.json" 2>&1 | tee "$OUT/train_step.log" | tail -12

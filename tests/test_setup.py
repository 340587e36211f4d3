"""scripts/setup.sh's flash-attn decision (scripts/flash_attn_wheel.py): the prebuilt wheel named as flash-attn's
releases name them for the installed torch, CUDA, C++ ABI and Python, or a reason to skip it; never a source build.
The script as a whole is run into a fresh venv by hand (its output in the closing note of issue 43)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
SPEC = importlib.util.spec_from_file_location("flash_attn_wheel", ROOT / "scripts" / "flash_attn_wheel.py")
flash_attn_wheel = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(flash_attn_wheel)


def test_the_wheel_that_matches_torch_cuda_abi_and_python():
    url, _ = flash_attn_wheel.wheel_url("2.8.3", "2.8.0+cu128", "12.8", True, "3.11")
    assert url == ("https://github.com/Dao-AILab/flash-attention/releases/download/v2.8.3/"
                   "flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp311-cp311-linux_x86_64.whl")
    url, _ = flash_attn_wheel.wheel_url("2.9.0", "2.13.0", "13.0", False, "3.12", machine="aarch64")
    assert url.endswith("/v2.9.0/flash_attn-2.9.0+cu13torch2.13cxx11abiFALSE-cp312-cp312-linux_aarch64.whl")


def test_no_wheel_to_try_says_why():
    assert flash_attn_wheel.wheel_url("2.8.3", "2.13.0+cpu", None, True, "3.11") == \
        (None, "torch 2.13.0+cpu is not a CUDA build")
    url, why = flash_attn_wheel.wheel_url("2.8.3", "2.13.0", "13.0", True, "3.11", system="Darwin")
    assert url is None and why == "flash-attn publishes wheels for Linux only, not Darwin"


def test_the_command_on_this_cpu_machine_skips_without_asking_anything():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "flash_attn_wheel.py")], capture_output=True,
                          text=True, timeout=120, check=True)
    import torch

    expected = f"skip: torch {torch.__version__} is not a CUDA build"
    assert torch.version.cuda is not None or proc.stdout.strip() == expected

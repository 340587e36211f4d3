"""Which prebuilt flash-attn wheel matches this environment, if any (scripts/setup.sh on a GPU machine).

    python scripts/flash_attn_wheel.py              # prints the wheel's URL, or "skip: <why>" (exit status 0 both)

flash-attn publishes, for each release, wheels built for one CUDA major version, torch minor version, C++ ABI and
Python version, named as its own setup.py looks them up; anything else makes ``pip install flash-attn`` build from
source (hours with nvcc, a failure without). This prints the URL of the wheel that matches the installed torch (its
version, its CUDA, its C++ ABI) and Python, for the newest flash-attn on PyPI, or why there is none to try; setup.sh
installs it and, if pip cannot (no such asset), skips flash-attn with one line.
"""

from __future__ import annotations

import platform
import re
import subprocess
import sys

RELEASES = "https://github.com/Dao-AILab/flash-attention/releases/download"


def wheel_url(flash_version: str, torch_version: str, cuda_version: str | None, cxx11_abi: bool, python: str,
              machine: str = "x86_64", system: str = "Linux") -> tuple[str | None, str]:
    """(the URL of the flash-attn ``flash_version`` wheel for that environment, or None and why). ``torch_version``
    as ``torch.__version__`` ("2.13.0+cu130"), ``cuda_version`` as ``torch.version.cuda`` (None: a CPU torch),
    ``python`` as "3.11"."""
    if system != "Linux":
        return None, f"flash-attn publishes wheels for Linux only, not {system}"
    if cuda_version is None:
        return None, f"torch {torch_version} is not a CUDA build"
    torch_minor = ".".join(torch_version.split("+")[0].split(".")[:2])
    cuda_major = cuda_version.split(".")[0]
    tag = f"cp{python.replace('.', '')}"
    name = (f"flash_attn-{flash_version}+cu{cuda_major}torch{torch_minor}cxx11abi{str(cxx11_abi).upper()}-{tag}-"
            f"{tag}-linux_{machine}.whl")
    return f"{RELEASES}/v{flash_version}/{name}", ""


def newest_flash_attn() -> str | None:
    """The newest flash-attn version on the package index (``pip index versions``), None when it cannot be asked."""
    proc = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "flash-attn"], capture_output=True,
                          text=True, timeout=120)
    found = re.search(r"^flash[-_]attn \(([^)]+)\)", proc.stdout, re.M)
    return found[1] if found else None


def main() -> int:
    """Print the matching wheel's URL, or ``skip: <why>``."""
    try:
        import torch
    except ImportError:
        print("skip: torch is not installed")
        return 0
    if torch.version.cuda is None:
        print(f"skip: torch {torch.__version__} is not a CUDA build")
        return 0
    version = newest_flash_attn()
    if version is None:
        print("skip: the package index could not be asked for flash-attn's versions")
        return 0
    url, why = wheel_url(version, torch.__version__, torch.version.cuda, bool(torch._C._GLIBCXX_USE_CXX11_ABI),
                         f"{sys.version_info.major}.{sys.version_info.minor}", platform.machine(), platform.system())
    print(url if url is not None else f"skip: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

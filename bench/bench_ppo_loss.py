"""Micro-benchmark of the dual-clipped PPO token loss (loss and d loss / d logp) against torch eager and compile.

Bytes moved: the op must read logp, logp_old, logp_teacher and the mask (fp32) and the sample indices (int64), and
write the gradient (fp32): 28 bytes a token, the count that GB/s and "% of copy" use, against a copy bandwidth
measured in the same run. The Triton path moves 40 (a first pass sums the mask per sample: mask and indices read
twice); its backward hands the gradient over without a pass when the upstream gradient is 1. Each call starts with
``logp.grad = None``, so that accumulating into an old gradient is not timed. On CUDA a run's time is the GPU's
between CUDA events, the runs queued back to back (``timing.median_time``): timed from the host with a sync after
each, every provider took about 1 ms at 1M and 8M tokens alike (bench/RESULTS.md, 2026-12-04), the launch and sync
cost rather than the kernels. One Markdown row per (N, provider) is printed as it is measured.

    python bench/bench_ppo_loss.py [--tokens 1048576 8388608 33554432]
    python bench/bench_ppo_loss.py --tokens 4096 20000 --reps 2     # CPU dry run (TRITON_INTERPRET=1)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from timing import median_time

from actfirst.core.user_input import check_writable_file, command
from actfirst.kernels.dispatch import ppo_loss
from actfirst.kernels.ppo_loss import ppo_loss_reference

BYTES_PER_TOKEN = 28


def make(n: int, device: str, num_samples: int):
    gen = torch.Generator(device=device).manual_seed(0)
    logp_old = -torch.rand(n, device=device, generator=gen) * 5
    logp = (logp_old + 0.3 * torch.randn(n, device=device, generator=gen)).requires_grad_(True)
    logp_t = logp_old + torch.randn(n, device=device, generator=gen)
    mask = (torch.rand(n, device=device, generator=gen) > 0.1).float()
    sample_idx = torch.sort(torch.randint(0, num_samples, (n,), device=device, generator=gen)).values
    return logp, logp_old, logp_t, mask, sample_idx


def copy_bandwidth(device: str) -> float:
    """Measured GB/s of a large device copy (read + write)."""
    x = torch.empty(256 * 2**20 // 4, device=device)
    y = torch.empty_like(x)
    return 2 * x.numel() * 4 / median_time(lambda: y.copy_(x), device, 10) / 1e9


def providers(logp, old, teacher, mask, idx, num_samples: int, backend: str | None) -> dict:
    """Zero-argument functions running loss and backward, each from a fresh ``logp.grad``."""
    compiled = torch.compile(ppo_loss_reference, dynamic=False)

    def call(op):
        def run():
            logp.grad = None
            op(logp, old, teacher, mask, idx, num_samples)[0].backward()
        return run

    return {"eager": call(ppo_loss_reference), "compile": call(compiled),
            "fused": call(lambda *a: ppo_loss(*a, backend=backend))}


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", type=int, nargs="+", default=[65_536, 262_144, 1_048_576])
    parser.add_argument("--providers", nargs="+", default=["eager", "compile", "fused"])
    parser.add_argument("--backend", default=None, help="force the fused op's backend (triton on the CPU: dry run)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", default="runs/bench/ppo_loss.json")
    args = parser.parse_args(argv)
    check_writable_file(args.out, "--out")
    dev = args.device
    ceiling = copy_bandwidth(dev)
    timed = "CUDA events" if dev == "cuda" else "wall time"
    print(f"> the PPO token loss, forward + backward (median of {args.reps} runs, {timed}); {BYTES_PER_TOKEN} bytes a "
          f"token; a device copy here: {ceiling:.1f} GB/s ({dev})", flush=True)
    print("| N | provider | ms | GB/s (of copy) | copy bound ms |\n|---:|---|---:|---|---:|", flush=True)
    rows = []
    for n in args.tokens:
        inputs = make(n, dev, num_samples=max(1, n // 512))
        num_samples = int(inputs[-1].max()) + 1
        for name, fn in providers(*inputs, num_samples, args.backend).items():
            if name not in args.providers:
                continue
            seconds = median_time(fn, dev, args.reps)
            gbps = BYTES_PER_TOKEN * n / seconds / 1e9
            rows.append({"provider": name, "n": n, "ms": seconds * 1e3, "gb_per_s": gbps,
                         "pct_of_copy_bandwidth": 100 * gbps / ceiling})
            print(f"| {n:,} | {name} | {seconds * 1e3:.3f} | {gbps:.1f} ({100 * gbps / ceiling:.0f}%) | "
                  f"{BYTES_PER_TOKEN * n / ceiling / 1e6:.3f} |", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": dev, "copy_gb_per_s": ceiling, "bytes_per_token": BYTES_PER_TOKEN,
                               "rows": rows}, indent=2))
    print(f"wrote {out}")
    return 0

if __name__ == "__main__":
    sys.exit(main())

"""Micro-benchmark of the dual-clipped PPO token loss (loss and d loss / d logp) against torch eager and compile.

Achieved bandwidth counts the bytes the fused op must move: read logp, logp_old, logp_teacher and the token
weight, write the gradient (5 x 4 bytes per token in fp32), against a copy bandwidth measured on the same machine.

    python bench/bench_ppo_loss.py [--tokens 65536 262144 1048576]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from timing import median_time

from actfirst.kernels.dispatch import ppo_loss
from actfirst.kernels.ppo_loss import ppo_loss_reference


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", type=int, nargs="+", default=[65_536, 262_144, 1_048_576])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", default="runs/bench/ppo_loss.json")
    args = parser.parse_args()
    dev = args.device
    ceiling = copy_bandwidth(dev)
    print(f"copy bandwidth on this machine: {ceiling:.1f} GB/s ({dev})", flush=True)
    compiled = torch.compile(ppo_loss_reference, dynamic=False)
    rows = []
    for n in args.tokens:
        logp, old, teacher, mask, idx = make(n, dev, num_samples=max(1, n // 512))
        num_samples = int(idx.max()) + 1
        providers = {
            "eager": lambda: ppo_loss_reference(logp, old, teacher, mask, idx, num_samples)[0].backward(),
            "compile": lambda: compiled(logp, old, teacher, mask, idx, num_samples)[0].backward(),
            "fused": lambda: ppo_loss(logp, old, teacher, mask, idx, num_samples)[0].backward(),
        }
        for name, fn in providers.items():
            seconds = median_time(fn, dev, args.reps)
            gbps = 20 * n / seconds / 1e9
            rows.append({"provider": name, "n": n, "ms": seconds * 1e3, "gb_per_s": gbps,
                         "pct_of_copy_bandwidth": 100 * gbps / ceiling})
            print(f"  N={n:8d} {name:8s} {seconds * 1e3:8.3f} ms {gbps:7.1f} GB/s ({100 * gbps / ceiling:.0f}% of copy)",
                  flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": dev, "copy_gb_per_s": ceiling, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

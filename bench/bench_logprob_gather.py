"""Micro-benchmark of the fused log-prob gather against torch eager, torch.compile, Liger and Cut Cross-Entropy.

Providers: ``eager`` (matmul + log_softmax + gather), ``compile`` (the same under torch.compile), ``fused`` (our
dispatcher: Triton on CUDA, the native op on the CPU), ``liger`` (Liger-Kernel's fused linear cross-entropy,
whose per-token loss is -logp, CUDA only), ``cce`` (Apple's Cut Cross-Entropy, ``cut-cross-entropy`` on PyPI, at
its defaults, which skip backward blocks of negligible probability; per-token loss -logp, CUDA only),
``fused_ppo`` (op 3: the PPO loss straight from hidden states, fwd_bwd only). Modes: ``fwd`` (teacher scoring)
and ``fwd_bwd`` (student update). ``liger`` and ``cce`` are imported only when asked for, and skipped with a
message when their package is not installed.

Each (provider, shape, mode) runs in its own subprocess so that peak memory (CUDA: max_memory_allocated; CPU:
peak RSS) is its own. Reports time, peak memory above the inputs, achieved TFLOP/s (2NVH forward, 6NVH forward
plus backward, the model FLOPs of the unfused computation) against a matmul ceiling measured on the same machine.

    python bench/bench_logprob_gather.py                  # CPU: Qwen3 H at a few hundred tokens
    python bench/bench_logprob_gather.py --tokens 1024 8192 65536 --models 0.6B 1.7B 4B 8B   # GPU (1,024: split path)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import torch
from timing import median_time

QWEN3_V = 151_936
QWEN3_H = {"0.6B": 1024, "1.7B": 2048, "4B": 2560, "8B": 4096}
OPTIONAL = {"liger": "liger_kernel", "cce": "cut_cross_entropy"}  # provider -> the package it needs


def setup(provider: str, n: int, h: int, v: int, dtype: torch.dtype, device: str, mode: str):
    """Inputs and a zero-argument function that runs the op once (and its backward in fwd_bwd mode)."""
    gen = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(n, h, device=device, dtype=dtype, generator=gen)
    weight = torch.randn(v, h, device=device, dtype=dtype, generator=gen).div_(h**0.5)  # in place: no temporary
    targets = torch.randint(0, v, (n,), device=device, generator=gen)
    train = mode == "fwd_bwd"
    hidden.requires_grad_(train)
    weight.requires_grad_(train)

    def eager(hid, w, y):
        logits = (hid @ w.T).float()
        return torch.log_softmax(logits, -1).gather(-1, y[:, None])[:, 0]

    if provider == "eager":
        op = eager
    elif provider == "compile":
        op = torch.compile(eager, dynamic=False)
    elif provider == "fused":
        from actfirst.kernels.dispatch import logprob_gather

        def op(hid, w, y):
            return logprob_gather(hid, w, y)[0]
    elif provider == "fused_ppo":
        # Op 3: the PPO loss straight from hidden states (its cost is that of the gather's forward + backward).
        from actfirst.kernels.dispatch import ppo_loss_from_hidden

        zeros = torch.zeros(n, device=device)
        ones = torch.ones(n, device=device)
        idx = torch.arange(n, device=device) // 256

        def op(hid, w, y):
            return ppo_loss_from_hidden(hid, w, y, zeros - 5, zeros - 4, ones, idx, int(idx.max()) + 1)[0]
    elif provider == "liger":
        from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

        def op(hid, w, y):
            out = LigerFusedLinearCrossEntropyFunction.apply(hid, w, y, None, None, -100, 0.0, 0.0, "none")
            return -(out[0] if isinstance(out, tuple) else out)
    elif provider == "cce":
        from cut_cross_entropy import linear_cross_entropy

        def op(hid, w, y):
            return -linear_cross_entropy(hid, w, y, reduction="none")
    else:
        raise ValueError(f"provider={provider!r}")

    def run():
        if train:
            hidden.grad = weight.grad = None
            op(hidden, weight, targets).sum().backward()
        else:
            with torch.no_grad():
                op(hidden, weight, targets)

    return run


def matmul_ceiling(device: str, dtype: torch.dtype) -> float:
    """Measured TFLOP/s of a large square matmul on this machine."""
    k = 4096 if device == "cuda" else 2048
    a = torch.randn(k, k, device=device, dtype=dtype)
    b = torch.randn(k, k, device=device, dtype=dtype)
    return 2 * k**3 / median_time(lambda: a @ b, device, reps=10 if device == "cuda" else 3) / 1e12




def measure_one(args) -> dict:
    """Run in a subprocess: time and peak memory of one (provider, shape, mode)."""
    device, dtype = args.device, getattr(torch, args.dtype)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    run = setup(args.provider, args.n, args.h, args.v, dtype, device, args.mode)
    base = torch.cuda.memory_allocated() if device == "cuda" \
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    seconds = median_time(run, device, args.reps)
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    flops = (2 if args.mode == "fwd" else 6) * args.n * args.v * args.h
    return {"provider": args.provider, "n": args.n, "h": args.h, "v": args.v, "mode": args.mode, "dtype": args.dtype,
            "ms": seconds * 1e3, "peak_mib": peak / 2**20, "tflops": flops / seconds / 1e12}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on the CPU")
    parser.add_argument("--tokens", type=int, nargs="+", default=None)
    parser.add_argument("--models", nargs="+", default=None, choices=list(QWEN3_H))
    parser.add_argument("--providers", nargs="+", default=None)
    parser.add_argument("--modes", nargs="+", default=["fwd", "fwd_bwd"])
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--out", default="runs/bench/logprob_gather.json")
    # internal: one measurement in a subprocess
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--provider", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--h", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--v", type=int, default=QWEN3_V, help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cuda = args.device == "cuda"
    args.dtype = args.dtype or ("bfloat16" if cuda else "float32")
    args.reps = args.reps or (10 if cuda else 2)
    if args.one:
        print(json.dumps(measure_one(args)))
        return
    tokens = args.tokens or ([8192, 16384, 32768, 65536] if cuda else [256, 1024])
    models = args.models or (list(QWEN3_H) if cuda else ["0.6B", "1.7B"])
    providers = args.providers or (["eager", "compile", "fused", "liger", "cce"] if cuda else ["eager", "fused"])
    for provider in [p for p in providers if p in OPTIONAL and importlib.util.find_spec(OPTIONAL[p]) is None]:
        print(f"skipping {provider}: {OPTIONAL[provider]} is not installed", flush=True)
        providers.remove(provider)
    ceiling = matmul_ceiling(args.device, getattr(torch, args.dtype))
    print(f"matmul ceiling on this machine: {ceiling:.2f} TFLOP/s ({args.dtype}, {args.device})", flush=True)
    rows = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every cell: a run stopped by a timeout keeps what it measured
        out.write_text(json.dumps({"device": args.device, "dtype": args.dtype, "matmul_tflops": ceiling,
                                   "rows": rows}, indent=2))

    for model in models:
        for n in tokens:
            for mode in args.modes:
                for provider in providers:
                    cmd = [sys.executable, __file__, "--one", "--device", args.device, "--dtype", args.dtype,
                           "--provider", provider, "--n", str(n), "--h", str(QWEN3_H[model]), "--mode", mode,
                           "--reps", str(args.reps)]
                    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
                    if proc.returncode != 0:
                        err = (proc.stderr.strip().splitlines() or ["?"])[-1]
                        print(f"  {model} N={n} {mode} {provider}: failed ({err})", flush=True)
                        continue
                    row = json.loads(proc.stdout.strip().splitlines()[-1])
                    row.update(model=model, pct_of_matmul=100 * row["tflops"] / ceiling)
                    rows.append(row)
                    save()
                    print(f"  {model:4s} N={n:6d} {mode:7s} {provider:8s} {row['ms']:9.1f} ms "
                          f"{row['peak_mib']:9.1f} MiB {row['tflops']:7.3f} TFLOP/s ({row['pct_of_matmul']:.0f}% "
                          f"of matmul)", flush=True)
    save()
    print("| model | N | mode | provider | ms | peak MiB | TFLOP/s | % of matmul |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['n']} | {r['mode']} | {r['provider']} | {r['ms']:.1f} | {r['peak_mib']:.0f} | "
              f"{r['tflops']:.3f} | {r['pct_of_matmul']:.0f}% |")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

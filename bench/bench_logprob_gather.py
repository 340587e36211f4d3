"""Micro-benchmark of the LM-head ops against torch eager, Liger-Kernel and Cut Cross-Entropy.

Modes: ``fwd`` (teacher scoring: per-token log-probs under no_grad) and ``fwd_bwd`` (the student update: a scalar
loss and its backward). Providers:

- ``fused``, ``chunked``: our dispatcher with that path forced (fwd: ``logprob_gather``; fwd_bwd:
  ``ppo_loss_from_hidden``, the student's op, which forms its gradients in the forward);
- ``gather`` (fwd_bwd): ``logprob_gather`` then sum and backward (recomputing), on the dispatcher's own path;
- ``eager``: matmul + log_softmax + gather (+ sum and backward);
- ``liger``: Liger-Kernel's fused linear cross-entropy (fwd: reduction "none", -logp per token; fwd_bwd: "sum", its
  gradient-in-forward path); ``cce``: Cut Cross-Entropy with the same reductions, at its defaults. Both are skipped
  with a message when not installed.

Each cell runs in this process: a warm-up (compiles, autotuning), then the median of ``reps`` runs; the peak memory
above the inputs is measured after the warm-up (CUDA ``max_memory_allocated``, gradients included; not measured on the
CPU). TFLOP/s counts the unfused computation (2NVH forward, 6NVH forward + backward) against a matmul measured in
the same run. For each (model, N, mode) the summary names the dispatcher's pick (the path it takes at that shape and
free memory) with the cost model's estimates, and compares our best path and the pick with the faster of Liger and CCE;
its Markdown row is printed as soon as that cell's providers have run. Times are CUDA events around runs queued
back to back (``timing.median_time``).

    python bench/bench_logprob_gather.py --tokens 1024 16384 65536 --models 0.6B 8B      # GPU
    python bench/bench_logprob_gather.py --cells 1.7B:1536:fwd_bwd 1.7B:16384:fwd_bwd 8B:16384:fwd   # device check
    python bench/bench_logprob_gather.py --shrunken --tokens 32 64 128                    # CPU dry run (interpreter)
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import sys
from pathlib import Path

import torch
from timing import median_time, sync

from actfirst.core.user_input import check_writable_file, command
from actfirst.kernels import paths
from actfirst.kernels.dispatch import last_path, logprob_gather, ppo_loss_from_hidden

QWEN3_V = 151_936
QWEN3_H = {"0.6B": 1024, "1.7B": 2048, "4B": 2560, "8B": 4096}
SHRUNKEN_V, SHRUNKEN_H_DIVISOR = 1000, 64  # --shrunken: V = 1,000 and H / 64 (16 for 0.6B, 64 for 8B)
OURS = ("fused", "chunked", "gather")
OPTIONAL = {"liger": "liger_kernel", "cce": "cut_cross_entropy"}  # provider -> the package it needs


def _ours(provider: str, n: int, v: int, device: str, mode: str):
    """Our op for a provider and mode, as a function of (hidden, weight, targets) returning what to sum/backward."""
    if mode == "fwd":
        return lambda hid, w, y: logprob_gather(hid, w, y, path=provider, backend="triton")[0]
    if provider == "gather":
        return lambda hid, w, y: logprob_gather(hid, w, y, backend="triton")[0].sum()
    # The student's op on a batch of responses of 256 tokens; old and teacher log-probs near a random model's
    # (about -log V), so that the tokens take the unclipped branch and have a gradient.
    logp_old = torch.full((n,), -math.log(v), device=device)
    logp_teacher = logp_old + 0.5
    ones, idx = torch.ones(n, device=device), torch.arange(n, device=device) // 256
    return lambda hid, w, y: ppo_loss_from_hidden(hid, w, y, logp_old, logp_teacher, ones, idx, n // 256 + 1,
                                                  path=provider, backend="triton")[0]


def _theirs(provider: str, mode: str):
    """A baseline as a function of (hidden, weight, targets): -loss per token (fwd) or the summed loss (fwd_bwd)."""
    reduction = "none" if mode == "fwd" else "sum"
    if provider == "eager":
        def op(hid, w, y):
            logp = torch.log_softmax((hid @ w.T).float(), -1).gather(-1, y[:, None])[:, 0]
            return logp if mode == "fwd" else -logp.sum()
    elif provider == "liger":
        from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

        def op(hid, w, y):
            out = LigerFusedLinearCrossEntropyFunction.apply(hid, w, y, None, None, -100, 0.0, 0.0, reduction)
            return out[0] if isinstance(out, tuple) else out
    elif provider == "cce":
        from cut_cross_entropy import linear_cross_entropy

        def op(hid, w, y):
            return linear_cross_entropy(hid, w, y, reduction=reduction)
    else:
        raise ValueError(f"provider={provider!r}")
    return op


def setup(provider: str, n: int, h: int, v: int, dtype: torch.dtype, device: str, mode: str):
    """Inputs and a zero-argument function that runs the op once (and its backward in fwd_bwd mode)."""
    gen = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(n, h, device=device, dtype=dtype, generator=gen)
    weight = torch.randn(v, h, device=device, dtype=dtype, generator=gen).div_(h**0.5)  # in place: no temporary
    targets = torch.randint(0, v, (n,), device=device, generator=gen)
    train = mode == "fwd_bwd"
    hidden.requires_grad_(train)
    weight.requires_grad_(train)
    op = _ours(provider, n, v, device, mode) if provider in OURS else _theirs(provider, mode)

    def run():
        if train:
            hidden.grad = weight.grad = None
            op(hidden, weight, targets).backward()
        else:
            with torch.no_grad():
                op(hidden, weight, targets)

    return run


def matmul_ceiling(device: str, dtype: torch.dtype) -> float:
    """Measured TFLOP/s of a large square matmul on this machine."""
    k = 4096 if device == "cuda" else 512
    a = torch.randn(k, k, device=device, dtype=dtype)
    b = torch.randn(k, k, device=device, dtype=dtype)
    return 2 * k**3 / median_time(lambda: a @ b, device, reps=10 if device == "cuda" else 3) / 1e12


def measure(provider: str, n: int, h: int, v: int, mode: str, args) -> dict:
    """Time and peak memory of one cell; the dispatcher's plan for our providers."""
    cuda, dtype = args.device == "cuda", getattr(torch, args.dtype)
    run = setup(provider, n, h, v, dtype, args.device, mode)
    base = torch.cuda.memory_allocated() if cuda else 0
    run()  # warm-up: compiles and autotuning, outside the peak and the timing
    sync(args.device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    seconds = median_time(run, args.device, args.reps, warmup=False)
    row = {"provider": provider, "n": n, "h": h, "v": v, "mode": mode, "dtype": args.dtype, "ms": seconds * 1e3,
           "peak_mib": (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else None,
           "tflops": (2 if mode == "fwd" else 6) * n * v * h / seconds / 1e12}
    if provider in OURS:
        plan = last_path("logprob_gather" if mode == "fwd" or provider == "gather" else "ppo_loss_from_hidden")
        row.update(path=plan.path, chunk_rows=plan.chunk_rows, vocab_block=plan.vocab_block,
                   budget_mib=plan.budget_bytes / 2**20, estimate_ms=plan.estimate_ms,
                   pick=paths.cheapest(plan.estimate_ms))
    return row


def run_cell(provider: str, n: int, h: int, v: int, mode: str, args) -> dict:
    """:func:`measure`, with an out-of-memory or other error recorded instead of raised; memory freed after."""
    try:
        return measure(provider, n, h, v, mode, args)
    except torch.OutOfMemoryError:
        return {"provider": provider, "n": n, "h": h, "mode": mode, "error": "out of memory"}
    except Exception as exc:  # noqa: BLE001 - a failing baseline must not stop the others
        return {"provider": provider, "n": n, "h": h, "mode": mode, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()


SUMMARY_PROVIDERS = ("fused", "chunked", "gather", "liger", "cce", "eager")


def summary_header(providers: list[str]) -> str:
    """The summary table's header: one column per provider that runs (see :func:`summary_row`)."""
    shown = [p for p in SUMMARY_PROVIDERS if p in providers]
    return "\n".join(["| model | N | mode | " + " | ".join(f"{p} ms / MiB" for p in shown)
                      + " | pick (est. fused / chunked ms) | pick vs best of Liger, CCE: time, peak |",
                      "|---" * (len(shown) + 5) + "|"])


def summary_row(providers: list[str], rows: list[dict]) -> str:
    """One (model, N, mode) of :func:`summary_header`'s table, from its cells' ``rows``: each provider's ms / peak MiB,
    the dispatcher's pick, and the pick against the faster of Liger and CCE."""
    c = {r["provider"]: r for r in rows}
    model, n, mode = rows[0]["model"], rows[0]["n"], rows[0]["mode"]

    def cell(p):
        r = c.get(p)
        if r is None or "error" in r:
            return "-" if r is None else r["error"][:40]
        peak = "-" if r["peak_mib"] is None else f"{r['peak_mib']:.0f}"
        return f"{r['ms']:.2f} / {peak}"

    planned = next((r for p in ("fused", "chunked") if "pick" in (r := c.get(p, {}))), None)
    pick = "-" if planned is None else (f"{planned['pick']} ({planned['estimate_ms']['fused']:.3g} / "
                                        f"{planned['estimate_ms']['chunked']:.3g})")
    theirs = [c[p] for p in ("liger", "cce") if p in c and "ms" in c[p]]
    ratio = "-"
    if planned is not None and theirs and "ms" in c.get(planned["pick"], {}):
        mine, best = c[planned["pick"]], min(theirs, key=lambda r: r["ms"])
        peak = "-" if mine["peak_mib"] is None else f"{mine['peak_mib'] / max(best['peak_mib'], 1e-9):.2f}x"
        ratio = f"{mine['ms'] / best['ms']:.2f}x, {peak}"
    shown = [p for p in SUMMARY_PROVIDERS if p in providers]
    return f"| {model} | {n} | {mode} | " + " | ".join(cell(p) for p in shown) + f" | {pick} | {ratio} |"


def parse_cell(text: str) -> tuple[str, int, str]:
    """``MODEL:N:MODE`` (``1.7B:16384:fwd_bwd``) as (model, N, mode); ValueError naming what is wrong."""
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in QWEN3_H or parts[2] not in ("fwd", "fwd_bwd") or not parts[1].isdigit():
        raise ValueError(f"--cells {text!r}: must be MODEL:N:MODE with MODEL one of {list(QWEN3_H)}, N tokens and "
                         "MODE fwd or fwd_bwd")
    return parts[0], int(parts[1]), parts[2]


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on the CPU")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 16384, 65536])
    parser.add_argument("--models", nargs="+", default=["0.6B", "8B"], choices=list(QWEN3_H))
    parser.add_argument("--providers", nargs="+", default=["fused", "chunked", "gather", "liger", "cce", "eager"])
    parser.add_argument("--modes", nargs="+", default=["fwd", "fwd_bwd"])
    parser.add_argument("--cells", nargs="+", default=None, metavar="MODEL:N:MODE",
                        help="these (model, N, mode) only, in this order (default: --models x --tokens x --modes)")
    parser.add_argument("--eager-max-tokens", type=int, default=1024, help="skip eager above this N")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--shrunken", action="store_true", help=f"V = {SHRUNKEN_V}, H / {SHRUNKEN_H_DIVISOR}")
    parser.add_argument("--out", default="runs/bench/logprob_gather.json")
    args = parser.parse_args(argv)
    check_writable_file(args.out, "--out")
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    providers = list(args.providers)
    for provider in [p for p in providers if p in OPTIONAL and importlib.util.find_spec(OPTIONAL[p]) is None]:
        print(f"skipping {provider}: {OPTIONAL[provider]} is not installed", flush=True)
        providers.remove(provider)
    ceiling = matmul_ceiling(args.device, getattr(torch, args.dtype))
    print(f"matmul ceiling on this machine: {ceiling:.2f} TFLOP/s ({args.dtype}, {args.device})", flush=True)
    try:
        cells = ([parse_cell(c) for c in args.cells] if args.cells else
                 [(m, n, mode) for m in args.models for n in args.tokens for mode in args.modes])
    except ValueError as error:
        parser.error(str(error))
    v = SHRUNKEN_V if args.shrunken else QWEN3_V
    out, rows = Path(args.out), []
    out.parent.mkdir(parents=True, exist_ok=True)
    print(summary_header(providers), flush=True)
    for model, n, mode in cells:
        h = QWEN3_H[model] // (SHRUNKEN_H_DIVISOR if args.shrunken else 1)
        done = []
        for provider in providers:
            if (provider == "eager" and n > args.eager_max_tokens) or (provider == "gather" and mode == "fwd"):
                continue
            row = run_cell(provider, n, h, v, mode, args)
            row.update(model=model, n=n, mode=mode, pct_of_matmul=100 * row.get("tflops", 0.0) / ceiling)
            rows.append(row)
            done.append(row)
            # after every cell: a run stopped by a timeout keeps what it measured
            out.write_text(json.dumps({"device": args.device, "dtype": args.dtype, "matmul_tflops": ceiling,
                                       "shrunken": args.shrunken, "rows": rows}, indent=2))
            print(f"  {model:4s} N={n:6d} {mode:7s} {provider:8s} " + (row.get("error") or (
                f"{row['ms']:9.2f} ms {row['peak_mib'] or 0:9.1f} MiB {row['tflops']:7.2f} TFLOP/s "
                f"({row['pct_of_matmul']:.0f}% of matmul)" + (f" path {row['path']}, pick {row['pick']}"
                                                               if "pick" in row else ""))), flush=True)
        if done:
            print(summary_row(providers, done), flush=True)  # the table's row for this cell, as it ends
    print(f"wrote {out}")
    failed = [r for r in rows if r["provider"] in OURS and "error" in r and r["error"] != "out of memory"]
    if failed:
        raise SystemExit(f"{len(failed)} of our cells failed: {failed}")
    return 0

if __name__ == "__main__":
    sys.exit(main())

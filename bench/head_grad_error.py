"""Error of the LM head's gradient against float64 when it accumulates across row chunks in bf16 (the default) or in
fp32 (``head_grad_dtype=torch.float32``): op 3, ``ppo_loss_from_hidden``, chunked path.

bf16 hidden states and head at Qwen3 shapes (or shrunken ones), the PPO batch of bench_logprob_gather.py with
advantages spread around 0; the float64 reference is formed chunk by chunk from the same bf16 inputs. Per model and
N: the chunk count, and per accumulation dtype ||dW - dW64|| / ||dW64|| and max |dW - dW64| / max |dW64| (and the
same for d hidden, which does not accumulate across chunks).

    python bench/head_grad_error.py --tokens 16384 --models 0.6B 8B          # GPU: the dispatcher's chunks
    python bench/head_grad_error.py --shrunken --tokens 2048 --chunks 128    # CPU (TRITON_INTERPRET=1)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from actfirst.core.user_input import check_writable_file, command
from actfirst.kernels.dispatch import last_path, ppo_loss_from_hidden
from actfirst.kernels.ppo_loss import ppo_loss_reference

QWEN3_V, QWEN3_H = 151_936, {"0.6B": 1024, "1.7B": 2048, "4B": 2560, "8B": 4096}
SHRUNKEN_V, SHRUNKEN_H_DIVISOR = 1000, 64
REFERENCE_CHUNK = 256


def make(n: int, h: int, v: int, device: str):
    gen = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(n, h, device=device, dtype=torch.bfloat16, generator=gen)
    weight = torch.randn(v, h, device=device, dtype=torch.bfloat16, generator=gen).div_(h**0.5)
    targets = torch.randint(0, v, (n,), device=device, generator=gen)
    logp_old = -math.log(v) + 0.3 * torch.randn(n, device=device, generator=gen)
    logp_teacher = logp_old + torch.randn(n, device=device, generator=gen)
    mask = (torch.rand(n, device=device, generator=gen) > 0.1).float()
    sample_idx = torch.arange(n, device=device) // 256
    return hidden, weight, targets, logp_old, logp_teacher, mask, sample_idx


def reference(hidden, weight, targets, logp_old, logp_teacher, mask, sample_idx, num_samples):
    """(d hidden, d weight) in float64, chunk by chunk of rows."""
    h64, w64 = hidden.double(), weight.double()
    logp = torch.cat([torch.log_softmax(h64[r:r + REFERENCE_CHUNK] @ w64.T, -1)
                      .gather(-1, targets[r:r + REFERENCE_CHUNK, None])[:, 0]
                      for r in range(0, len(targets), REFERENCE_CHUNK)]).requires_grad_(True)
    ppo_loss_reference(logp, logp_old.double(), logp_teacher.double(), mask, sample_idx, num_samples)[0].backward()
    grad_h, grad_w = torch.empty_like(h64), torch.zeros_like(w64)
    for r in range(0, len(targets), REFERENCE_CHUNK):
        hc = h64[r:r + REFERENCE_CHUNK]
        g = -torch.softmax(hc @ w64.T, -1) * logp.grad[r:r + REFERENCE_CHUNK, None]
        g[torch.arange(len(hc)), targets[r:r + REFERENCE_CHUNK]] += logp.grad[r:r + REFERENCE_CHUNK]
        grad_h[r:r + REFERENCE_CHUNK] = g @ w64
        grad_w += g.T @ hc
    return grad_h, grad_w


def errors(got: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    diff = got.double() - ref
    return {"rel_frobenius": (diff.norm() / ref.norm()).item(), "max_rel": (diff.abs().max() / ref.abs().max()).item()}


def measure(n: int, h: int, v: int, args) -> list[dict]:
    inputs = make(n, h, v, args.device)
    num_samples = int(inputs[-1].max()) + 1
    ref_h, ref_w = reference(*inputs, num_samples)
    chunk_bytes = None if args.chunks is None else 4 * v * math.ceil(n / args.chunks)
    rows = []
    for name, dtype in (("bf16", None), ("fp32", torch.float32)):
        hidden, weight = (t.clone().requires_grad_(True) for t in inputs[:2])
        loss, *_ = ppo_loss_from_hidden(hidden, weight, *inputs[2:], num_samples, backend="triton", path="chunked",
                                        chunk_bytes=chunk_bytes, head_grad_dtype=dtype)
        loss.backward()
        chunks = math.ceil(n / last_path("ppo_loss_from_hidden").chunk_rows)
        rows.append({"n": n, "h": h, "v": v, "accumulation": name, "chunks": chunks,
                     "d_weight": errors(weight.grad, ref_w), "d_hidden": errors(hidden.grad, ref_h)})
    return rows


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", type=int, nargs="+", default=[16384])
    parser.add_argument("--models", nargs="+", default=["0.6B", "8B"], choices=list(QWEN3_H))
    parser.add_argument("--chunks", type=int, default=None, help="row chunks (default: the dispatcher's budget)")
    parser.add_argument("--shrunken", action="store_true", help=f"V = {SHRUNKEN_V}, H / {SHRUNKEN_H_DIVISOR}")
    parser.add_argument("--out", default="runs/bench/head_grad_error.json")
    args = parser.parse_args(argv)
    check_writable_file(args.out, "--out")
    v = SHRUNKEN_V if args.shrunken else QWEN3_V
    results = []
    print("| model | N | chunks | accumulation | dW rel. Frobenius | dW max rel. | dh rel. Frobenius |\n"
          "|---|---|---|---|---|---|---|")
    for model in args.models:
        h = QWEN3_H[model] // (SHRUNKEN_H_DIVISOR if args.shrunken else 1)
        for n in args.tokens:
            for r in measure(n, h, v, args):
                results.append({"model": model, **r})
                print(f"| {model} | {n} | {r['chunks']} | {r['accumulation']} | {r['d_weight']['rel_frobenius']:.2e}"
                      f" | {r['d_weight']['max_rel']:.2e} | {r['d_hidden']['rel_frobenius']:.2e} |", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": args.device, "shrunken": args.shrunken, "rows": results}, indent=2))
    print(f"wrote {out}")
    return 0

if __name__ == "__main__":
    sys.exit(main())

"""A decode step beside an update, on one CUDA stream and on two (``actfirst.engine.streams``): how long the engine
waits for its tokens while the trainer updates on the same GPU.

    python bench/stream_interference.py --out runs/device/stream_interference.json     # the lent GPU
    python bench/stream_interference.py --shrunken --out /tmp/streams.json             # CPU dry run

The decode step: one of Qwen3-1.7B's shapes (vLLM is not on the lent GPU, so not vLLM's own, but of its size) for
``--sequences`` sequences of ``--context`` tokens of KV cache, random bfloat16 weights: per layer RMSNorm, the QKV
projection, attention of one query per sequence over its KV cache (SDPA, grouped KV heads), the output projection,
RMSNorm and the SwiGLU MLP; then the final norm, the LM head and the argmax. Captured once as a CUDA graph and
replayed, as vLLM replays its decode graphs.

The update: the student's own (``StudentUpdater``: a random Qwen3-1.7B under FSDP2 at one rank, bfloat16 compute
over float32 master weights, activation checkpointing, SDPA on one-sample rows of ``--update-tokens``), back to back
in a thread of its own for the span of a measurement.

Three modes, each ``--window-s`` seconds of decode steps: ``alone`` (no update), ``shared`` (the update's thread on
the decode's stream: one stream, as before issue 45) and ``split`` (the decode on the engine's high-priority stream,
the update inside ``StreamSplit.update_phase`` on its own: what the trainer does now). Per mode: the decode step's
latency on the host from its launch to its tokens (what the engine waits: time queued behind update kernels
included), p50 / p95 / max, and its GPU time between events around the replay (its kernels, slowed by what the
update holds of the SMs); the updates' seconds each over the same span. Each mode's row is printed as it ends.
CPU (``--shrunken``): no streams and no graphs (the decode runs eagerly, the modes are the same code path): the
code path only.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import sys
import threading
import time
from pathlib import Path

import torch
from memory_probe import row_samples
from train_step import SHAPES, student

from actfirst.core.files import write_atomically
from actfirst.core.user_input import check_writable_file, command

HEADER = ("| mode | decode steps | host latency ms, p50 / p95 / max | GPU ms per step, p50 | update s each (updates) |"
          "\n|---|---|---|---|---|")


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * weight


class DecodeStep:
    """One decode step of a Qwen3 shape over a static KV cache (see the module docstring); ``__call__`` reads the
    static input ``x`` and writes the next tokens."""

    def __init__(self, shape: str, sequences: int, context: int, device: torch.device, dtype: torch.dtype) -> None:
        hidden, layers, heads, kv, head_dim, inter, vocab, _ = SHAPES[shape]
        gen = torch.Generator(device=device).manual_seed(0)

        def weight(*size: int) -> torch.Tensor:
            return (torch.randn(*size, device=device, dtype=dtype, generator=gen) / size[0] ** 0.5)

        self.heads, self.kv, self.head_dim, self.context = heads, kv, head_dim, context
        self.layers = [{"qkv": weight(hidden, (heads + 2 * kv) * head_dim), "o": weight(heads * head_dim, hidden),
                        "gate_up": weight(hidden, 2 * inter), "down": weight(inter, hidden),
                        "k": weight(sequences, kv, context + 1, head_dim),  # the context, then the new token
                        "v": weight(sequences, kv, context + 1, head_dim),
                        "norm1": torch.ones(hidden, device=device, dtype=dtype),
                        "norm2": torch.ones(hidden, device=device, dtype=dtype)} for _ in range(layers)]
        self.head = weight(hidden, vocab)
        self.x = torch.randn(sequences, hidden, device=device, dtype=dtype, generator=gen)
        self.tokens = torch.zeros(sequences, dtype=torch.long, device=device)

    def __call__(self) -> None:
        x, (n, h, kv, d) = self.x, (self.x.shape[0], self.heads, self.kv, self.head_dim)
        for layer in self.layers:
            q, k, v = (rms_norm(x, layer["norm1"]) @ layer["qkv"]).split((h * d, kv * d, kv * d), -1)
            layer["k"][:, :, self.context].copy_(k.view(n, kv, d))  # the new token's KV into its slot
            layer["v"][:, :, self.context].copy_(v.view(n, kv, d))
            att = torch.nn.functional.scaled_dot_product_attention(q.view(n, h, 1, d), layer["k"], layer["v"],
                                                                   enable_gqa=True)
            x = x + att.reshape(n, h * d) @ layer["o"]
            gate, up = (rms_norm(x, layer["norm2"]) @ layer["gate_up"]).chunk(2, -1)
            x = x + (torch.nn.functional.silu(gate) * up) @ layer["down"]
        self.tokens.copy_((x @ self.head).argmax(-1))


def capture(step: DecodeStep, device: torch.device):
    """The step as a zero-argument replay: a CUDA graph on a GPU (warmed up on a side stream, as torch asks), the
    step itself on the CPU."""
    if device.type != "cuda":
        return step
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


class UpdateLoop:
    """The student's updates back to back in a thread of their own, inside ``phase()`` (a stream context), until
    stopped; counts them and their seconds."""

    def __init__(self, updater: object, samples: list, phase, device: torch.device) -> None:
        self.updater, self.samples, self.phase, self.device = updater, samples, phase, device
        self.stop, self.started = threading.Event(), threading.Event()
        self.seconds: list[float] = []
        self.thread = threading.Thread(target=self._run, name="update", daemon=True)

    def _run(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        while not self.stop.is_set():
            t0 = time.perf_counter()
            with self.phase():
                self.started.set()
                self.updater.update(self.samples, current_version=0)
                if self.device.type == "cuda":  # its own kernels done: the seconds are the update's
                    torch.cuda.current_stream(self.device).synchronize()
            self.seconds.append(time.perf_counter() - t0)

    def __enter__(self) -> UpdateLoop:
        self.thread.start()
        self.started.wait()
        time.sleep(0.5)  # the update's queue filled
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def decode_window(replay, device: torch.device, stream, window_s: float) -> dict:
    """Decode steps on ``stream`` for ``window_s`` seconds: each one's host latency (launch to tokens) and its GPU
    time between events around the replay, in ms."""
    cuda = device.type == "cuda"
    host, gpu = [], []
    with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
        deadline = time.perf_counter() + window_s
        while time.perf_counter() < deadline:
            start = torch.cuda.Event(enable_timing=True) if cuda else None
            end = torch.cuda.Event(enable_timing=True) if cuda else None
            t0 = time.perf_counter()
            if cuda:
                start.record()
            replay()
            if cuda:
                end.record()
                end.synchronize()
                gpu.append(start.elapsed_time(end))
            host.append(1e3 * (time.perf_counter() - t0))
    return {"host_ms": host, "gpu_ms": gpu}


def percentile(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def row(mode: str, window: dict, updates: list[float]) -> dict:
    """One mode's figures, printed as a row of :data:`HEADER`."""
    host, gpu = window["host_ms"], window["gpu_ms"]
    r = {"mode": mode, "steps": len(host), "host_p50_ms": percentile(host, 0.5), "host_p95_ms": percentile(host, 0.95),
         "host_max_ms": max(host), "gpu_p50_ms": percentile(gpu, 0.5) if gpu else None,
         "update_s": sum(updates) / len(updates) if updates else None, "updates": len(updates)}
    gpu_cell = "-" if r["gpu_p50_ms"] is None else f"{r['gpu_p50_ms']:.2f}"
    update_cell = "-" if r["update_s"] is None else f"{r['update_s']:.2f} ({r['updates']})"
    print(f"| {mode} | {r['steps']} | {r['host_p50_ms']:.2f} / {r['host_p95_ms']:.2f} / {r['host_max_ms']:.2f} | "
          f"{gpu_cell} | {update_cell} |", flush=True)
    return r


def measure(args: argparse.Namespace) -> dict:
    """Build, warm up, then the three modes (see the module docstring); ``--out`` rewritten after each."""
    from actfirst.core.config import LossConfig, OptimConfig
    from actfirst.engine.streams import stream_split
    from actfirst.parallel.context import init_parallel
    from actfirst.train.student import StudentUpdater

    ctx = init_parallel()
    cuda = ctx.device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    policy = student(args.shape, compute_dtype=dtype, attention="sdpa", activation_checkpointing=True, ctx=ctx,
                     seed=0)
    updater = StudentUpdater(policy, optim=OptimConfig(lr=1e-6), loss=LossConfig(), temperature=1.0,
                             num_updates=1000, micro_batch_tokens=args.update_tokens)
    samples = row_samples(args.update_tokens * args.update_rows, args.update_rows, SHAPES[args.shape][6], seed=0)
    updater.update(samples, current_version=0)  # warm-up: autotuning, AdamW's moments
    replay = capture(DecodeStep(args.shape, args.sequences, args.context, ctx.device, dtype), ctx.device)
    split = stream_split()
    shared = torch.cuda.Stream(ctx.device) if cuda else None
    result = {"device": torch.cuda.get_device_name(ctx.device) if cuda else "cpu",
              "date": datetime.date.today().isoformat(), "args": vars(args), "modes": []}
    print(f"> decode: {args.shape}'s shapes, {args.sequences} sequences x {args.context:,} tokens of KV cache, "
          f"{'a CUDA graph' if cuda else 'eager (CPU: no graphs, no streams)'}; update: {args.shape} student, "
          f"{args.update_rows} rows of {args.update_tokens:,} tokens; {args.window_s:.0f} s per mode", flush=True)
    print(HEADER, flush=True)
    modes = {
        "alone": (None, split.engine if split else None),
        "shared": (lambda: torch.cuda.stream(shared) if cuda else contextlib.nullcontext(), shared),
        "split": (split.update_phase if split else contextlib.nullcontext, split.engine if split else None),
    }
    for mode, (phase, decode_stream) in modes.items():
        if phase is None:
            window, updates = decode_window(replay, ctx.device, decode_stream, args.window_s), []
        else:
            with UpdateLoop(updater, samples, phase, ctx.device) as loop:
                window = decode_window(replay, ctx.device, decode_stream, args.window_s)
            updates = loop.seconds
        result["modes"].append(row(mode, window, updates))
        write_atomically(args.out, json.dumps(result, indent=1))
    return result


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--update-tokens", type=int, default=4096, help="one sample per row")
    parser.add_argument("--update-rows", type=int, default=2, help="rows (micro-batches) per update")
    parser.add_argument("--window-s", type=float, default=3.0)
    parser.add_argument("--shrunken", action="store_true", help="tiny shapes (the CPU dry run)")
    parser.add_argument("--out", default="runs/device/stream_interference.json")
    args = parser.parse_args(argv)
    args.shape = "tiny" if args.shrunken else "1.7B"
    check_writable_file(args.out, "--out")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    measure(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

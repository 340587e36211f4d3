"""Bytes autograd keeps per token and decoder layer, measured on the real Hugging Face layers (issue 31).

    python bench/activation_probe.py                         # every shape, into actfirst/parallel/activation_bytes.json
    python bench/activation_probe.py --shapes Qwen3-1.7B --tokens 256 512 --out /tmp/a.json

Each shape (``SHAPES``: the published Qwen3 0.6B / 1.7B / 4B / 8B and Qwen2.5 1.5B / 3B / 7B configs; two decoder
layers and a 512-word vocabulary instead of the real depth and vocabulary) is built in bfloat16, the dtype FSDP2
computes in on the GPU (``parallel.compute_dtype``), and run forward once per row length T with ``inputs_embeds``
that require a gradient, as the output of the layer below would (no backward runs: the forward decides what is
kept). A ``torch.autograd.graph.saved_tensors_hooks`` pack hook sees every tensor autograd keeps for the
backward; each distinct storage is counted once (views of one storage, a tensor kept by two layers), parameters
not at all (they are the model's, counted by the memory plan). A tensor is charged to the decoder layer whose
forward saved it first; the second layer's bytes are the per-layer figure, the first layer's surplus is what the
layers share (rotary cos / sin, a mask made once per forward).

Rows, as the trainer packs them (``actfirst.train.packing``: position ids that restart per sample, no mask given):
- ``one``: one sample, SDPA (transformers passes no mask: the causal path, grouped-query heads unexpanded);
- ``packed_sdpa``: two samples of T/2, SDPA: transformers builds a dense [T, T] boolean mask, which rules out the
  flash path and expands the KV heads (``repeat_kv``);
- ``packed_flex``: two samples, flex attention with a block mask (transformers expands the KV heads here too when
  heads / KV heads is not a power of two: Qwen2.5-1.5B and 7B).
Each with and without activation checkpointing (``checkpoint_blocks``: non-reentrant ``torch.utils.checkpoint``
around each decoder layer, what ``parallel.activation_checkpointing`` does before ``fully_shard``); with it, a
layer keeps only its inputs and the backward recomputes one layer at a time, which then holds the uncheckpointed
figure once.

Fit, per shape and row kind: bytes(T) = a T + b T^2 per layer by least squares over ``--tokens`` (b is the dense
mask's T x T term; it fits to zero elsewhere). ``a`` is compared with the formula the memory plan used before,
2 (6 h + 4 I + q + 2 kv). The coefficients, with the command, date and machine, go to ``--out`` (JSON, written
atomically after every shape; a rerun keeps the shapes already there with the same lengths, so an interrupted run
resumes), by default ``actfirst/parallel/activation_bytes.json``, which the memory plan reads
(``actfirst.parallel.memory_plan``).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import torch
import transformers
from torch.utils.checkpoint import checkpoint

from actfirst.core.files import write_atomically
from actfirst.parallel.memory_plan import ACTIVATIONS, SHAPES

ROWS = {"one": ("sdpa", 1), "packed_sdpa": ("sdpa", 2), "packed_flex": ("flex_attention", 2)}


class CheckpointedBlock(torch.nn.Module):
    """A decoder layer whose forward keeps only its inputs; the backward recomputes it (non-reentrant)."""

    def __init__(self, block: torch.nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, *args, **kwargs):
        return checkpoint(self.block, *args, use_reentrant=False, **kwargs)


def checkpoint_blocks(model: torch.nn.Module) -> None:
    """Wrap each decoder layer of ``model`` (a transformers ``Qwen3Model`` / ``Qwen2Model``) in a checkpoint. The
    same non-reentrant checkpoint as ``actfirst.parallel.checkpointing``'s, as a wrapper: the composable form keeps a
    layer's input outside autograd's saved-tensor hooks, where the probe's count would not see it."""
    model.layers = torch.nn.ModuleList(CheckpointedBlock(b) for b in model.layers)


def allow_flex_forward_for_backward_on_cpu() -> None:
    """Let flex attention's forward run eagerly on the CPU with inputs that require a gradient.

    torch refuses that (its CPU kernels have no backward), but the probe needs only the forward: the tensors
    ``FlexAttentionAutogradOp`` saves there are the ones it saves on the GPU (query, key, value, output, log-sum-exp
    and the block mask's index tensors). transformers' compiled call is replaced by the eager function for the same
    reason (no compiler is needed for a forward that counts bytes).
    """
    import torch.nn.attention.flex_attention as flex
    import transformers.integrations.flex_attention as hf_flex

    flex._validate_device = lambda *args: None
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")  # eager on purpose
    hf_flex.compile_friendly_flex_attention = lambda q, k, v, training=False, **kw: flex.flex_attention(q, k, v, **kw)


def build(shape: str, attention: str, layers: int = 2) -> torch.nn.Module:
    """A bfloat16 decoder of ``shape``'s layer dimensions with ``layers`` layers (random weights)."""
    from transformers import Qwen2Config, Qwen2Model, Qwen3Config, Qwen3Model

    arch, h, heads, kv, hd, inter = SHAPES[shape][:6]
    config_cls, model_cls = (Qwen3Config, Qwen3Model) if arch == "qwen3" else (Qwen2Config, Qwen2Model)
    config = config_cls(vocab_size=512, hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
                        num_key_value_heads=kv, head_dim=hd, intermediate_size=inter, max_position_embeddings=40960,
                        attn_implementation=attention)
    torch.manual_seed(0)
    return model_cls(config).to(torch.bfloat16).train()


def saved_bytes(model: torch.nn.Module, tokens: int, samples: int) -> list[int]:
    """Bytes autograd keeps per decoder layer for one forward of a ``tokens``-long row of ``samples`` samples."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set[int] = set()
    per_layer = [0] * (len(model.layers) + 1)  # the last entry: kept outside the layers (final norm)
    current = [len(model.layers)]
    handles = []
    for i, layer in enumerate(model.layers):
        handles.append(layer.register_forward_pre_hook(lambda m, a, i=i: current.__setitem__(0, i)))
        handles.append(layer.register_forward_hook(lambda m, a, o: current.__setitem__(0, len(per_layer) - 1)))

    kept: list[torch.Tensor] = []  # alive until the forward ends, so that no address is reused meanwhile

    def pack(t: torch.Tensor) -> None:
        # Nothing goes into the graph (no backward runs): a graph node holding its own output would be a reference
        # cycle, and every forward's activations would wait for the garbage collector.
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen and storage.data_ptr() not in params:
            seen.add(storage.data_ptr())
            per_layer[current[0]] += storage.nbytes()
            kept.append(t)

    h = model.config.hidden_size
    embeds = torch.randn(1, tokens, h, dtype=torch.bfloat16, requires_grad=True)
    position_ids = torch.cat([torch.arange(tokens // samples)] * samples)[None]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda _: None):
        model(inputs_embeds=embeds, position_ids=position_ids, use_cache=False)
    kept.clear()  # the graph's nodes hold ``pack`` (and so ``kept``): a cycle through C++ the collector cannot see
    for handle in handles:
        handle.remove()
    return per_layer


def fit(tokens: list[int], values: list[int], quadratic: bool) -> tuple[float, float]:
    """(a, b) of values = a T + b T^2 by least squares (b = 0 unless ``quadratic``)."""
    t = torch.tensor(tokens, dtype=torch.float64)
    x = torch.stack([t, t * t], 1) if quadratic else t[:, None]
    coef = torch.linalg.lstsq(x, torch.tensor(values, dtype=torch.float64)[:, None]).solution[:, 0].tolist()
    return coef[0], (coef[1] if quadratic else 0.0)


def old_formula(shape: str) -> int:
    """The memory plan's earlier estimate of bytes per token and layer: 2 (6 h + 4 I + q + 2 kv)."""
    _, h, heads, kv, hd, inter = SHAPES[shape][:6]
    return 2 * (6 * h + 4 * inter + heads * hd + 2 * kv * hd)


def probe_shape(shape: str, tokens: list[int]) -> dict:
    """Every row kind, with and without checkpointing, for one shape: raw bytes and the fitted coefficients."""
    result = {"old_formula": old_formula(shape)}
    for row, (attention, samples) in ROWS.items():
        for ckpt in (False, True):
            model = build(shape, attention)
            if ckpt:
                checkpoint_blocks(model)
            raw = [saved_bytes(model, t, samples) for t in tokens]
            del model
            gc.collect()  # transformers' modules hold reference cycles: free this model's weights now
            quadratic = len(tokens) > 2
            a, b = fit(tokens, [r[1] for r in raw], quadratic)
            shared_a, shared_b = fit(tokens, [r[0] - r[1] for r in raw], quadratic)
            outside, _ = fit(tokens, [r[-1] for r in raw], False)
            key = row + ("_checkpointed" if ckpt else "")
            result[key] = {"per_token": a, "per_token_sq": b, "shared_per_token": shared_a,
                           "shared_per_token_sq": shared_b, "outside_per_token": outside,
                           "raw": {str(t): r for t, r in zip(tokens, raw, strict=True)}}
            print(f"{shape:13s} {key:26s} {a:9.0f} B/token/layer  + {b:7.3f} T  (old formula {old_formula(shape)}, "
                  f"x{a / old_formula(shape):.2f})", flush=True)
    return result


def machine() -> str:
    """This machine in words: CPU model, cores, torch and transformers versions."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return (f"{platform.machine()} {cpu or 'CPU'}, {os.cpu_count()} cores; torch {torch.__version__}, "
            f"transformers {transformers.__version__}")


def main(argv: list[str] | None = None) -> None:
    """Measure, print, write ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--tokens", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--out", type=Path, default=ACTIVATIONS)
    args = parser.parse_args(argv)
    if any(t % 2 or t < 4 for t in args.tokens) or len(set(args.tokens)) < 2:
        sys.exit(f"--tokens={args.tokens}: need at least two distinct even lengths >= 4")
    torch.set_num_threads(1)
    allow_flex_forward_for_backward_on_cpu()
    record = {
        "command": " ".join(["python bench/activation_probe.py", *(sys.argv[1:] if argv is None else argv)]),
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "dtype": "bfloat16 (parameters and compute, as FSDP2's param_dtype on the GPU)",
        "tokens": args.tokens, "seconds": 0.0, "shapes": {},
    }
    if args.out.exists():  # resume: shapes measured with the same lengths are kept
        before = json.loads(args.out.read_text())
        if before.get("tokens") == args.tokens:
            record["shapes"], record["seconds"] = before["shapes"], before["seconds"]
    todo = [s for s in args.shapes if s not in record["shapes"]]
    started = last = time.time()
    for i, shape in enumerate(todo):
        record["shapes"][shape] = probe_shape(shape, args.tokens)
        record["seconds"] = round(record["seconds"] + time.time() - last, 1)
        last = time.time()
        write_atomically(args.out, json.dumps(record, indent=1) + "\n")  # after every shape
        gc.collect()
        eta = (last - started) / (i + 1) * (len(todo) - i - 1)
        print(f"[{i + 1}/{len(todo)}] {shape} written to {args.out}; ETA {eta:.0f} s", flush=True)
    print(f"{args.out}: {len(record['shapes'])} shapes")


if __name__ == "__main__":
    main()

"""Peak host memory per rank while the student is loaded and sharded: ``from_pretrained`` in float32 on every rank
(how the trainer loaded it before issue 31) against the meta device filled from safetensors
(``actfirst.models.loading``, how it loads now).

    python bench/host_memory.py [--layers 8] [--ranks 2] [--dir /tmp/host_memory_model]

The model has Qwen3-0.6B's widths (hidden 1024, 16/8 heads of 128, MLP 3072, the 151,936-row vocabulary, tied
embeddings) and ``--layers`` of its 28 layers, saved once in bfloat16 as the Hub's checkpoints are. Each way runs in
fresh processes, one per rank over gloo (torchrun's environment); each rank reports its VmHWM after its imports and
after the student is sharded, and what its shard holds.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp

WAYS = ("from_pretrained", "meta")


def build(model_dir: Path, layers: int) -> int:
    """Qwen3-0.6B's widths with ``layers`` layers, random, saved in bfloat16 (once); returns its parameter count."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=151_936, hidden_size=1024, num_hidden_layers=layers, num_attention_heads=16,
                         num_key_value_heads=8, head_dim=128, intermediate_size=3072, tie_word_embeddings=True)
    if not (model_dir / "config.json").is_file():
        Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(model_dir)
    with torch.device("meta"):
        return sum(p.numel() for p in Qwen3ForCausalLM(config).parameters())


def rank_main(rank: int, world: int, way: str, model_dir: str, out: str) -> None:
    """One rank: the student loaded ``way``, sharded; a JSON line of its peaks into ``out``."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    from transformers import AutoModelForCausalLM

    from actfirst.models.loading import empty_model, host_peak_gib, load_weights
    from actfirst.parallel.context import init_parallel, shutdown_parallel
    from actfirst.parallel.fsdp import apply_fsdp
    from actfirst.train.head import LMHeadModel

    ctx = init_parallel()
    start = host_peak_gib()
    if way == "from_pretrained":
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        policy = LMHeadModel(model)
        apply_fsdp(policy, policy.blocks, ctx.mesh)
    else:
        model = empty_model(model_dir, torch.float32)
        policy = LMHeadModel(model)
        apply_fsdp(policy, policy.blocks, ctx.mesh)
        load_weights(model, model_dir, ctx.device)
    shard = sum(p.to_local().numel() * p.dtype.itemsize for p in policy.parameters()) / 2**30
    row = {"way": way, "rank": rank, "start_gib": start, "peak_gib": host_peak_gib(), "shard_gib": shard}
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")
    shutdown_parallel()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "host_memory_model")
    args = parser.parse_args(argv)
    params = build(args.dir / f"layers{args.layers}", args.layers)
    print(f"model: Qwen3-0.6B widths, {args.layers} layers, {params / 1e6:.1f}M parameters "
          f"({params * 4 / 2**30:.2f} GiB float32), {args.ranks} ranks")
    print("| way | rank | VmHWM after imports (GiB) | VmHWM after the sharded student (GiB) | added | shard (GiB) |")
    print("|---|---:|---:|---:|---:|---:|")
    for way in WAYS:
        out = Path(tempfile.mkdtemp()) / "rows.jsonl"
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
        mp.spawn(rank_main, args=(args.ranks, way, str(args.dir / f"layers{args.layers}"), str(out)),
                 nprocs=args.ranks)
        for row in sorted((json.loads(line) for line in out.read_text().splitlines()), key=lambda r: r["rank"]):
            print(f"| {way} | {row['rank']} | {row['start_gib']:.2f} | {row['peak_gib']:.2f} | "
                  f"{row['peak_gib'] - row['start_gib']:.2f} | {row['shard_gib']:.2f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""One training update timed phase by phase: teacher scoring, the student update, the weight gather of the sync.

    python bench/train_step.py --student 1.7B --teacher 8B --nproc-per-node 1 --compute-dtype bfloat16
    python bench/train_step.py --student tiny --teacher tiny --nproc-per-node 2        # a CPU check

Rollouts are excluded: a batch shaped like the paper's (``--responses`` full responses of up to
``--response-tokens`` tokens on contexts of up to ``--context-tokens``; lengths drawn between half and all of it)
is made of random token ids and log-probs; each rank takes every R-th response, the share of the batch a rank
contributes to the trainer's update. The models are
randomly initialized Qwen3 shapes (``SHAPES``: the published configs of Qwen3-0.6B, 1.7B, 4B, 8B) on each rank's
device; the student is FSDP2-sharded exactly as the trainer shards it (float32 master weights, ``--compute-dtype``
compute), the teacher replicated or sharded. Each update runs: ``TeacherScorer.score`` -> ``StudentUpdater.update``
-> the weight sync's bucketed gather cast to the engine's dtype (``gathered_parameters``; the engine's own load is
not part of it: vLLM may be absent, as on the lent GPU).

Per phase and rank: wall-clock, tokens/s (context plus response tokens through the forward), and peak memory (GPU:
``max_memory_allocated`` since the phase began; CPU: the process's peak RSS so far). Rank 0 prints a table and
writes ``--out`` (JSON). Several ranks start through the same elastic launcher as ``python -m actfirst.run``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import torch

from actfirst.user_input import check_writable_file, command

SHAPES = {
    # hidden, layers, heads, kv heads, head_dim, intermediate, vocab, tied embeddings (Qwen3's config.json files)
    "0.6B": (1024, 28, 16, 8, 128, 3072, 151936, True),
    "1.7B": (2048, 28, 16, 8, 128, 6144, 151936, True),
    "4B": (2560, 36, 32, 8, 128, 9728, 151936, True),
    "8B": (4096, 36, 32, 8, 128, 12288, 151936, False),
    "tiny": (64, 2, 2, 1, 32, 128, 512, True),
    "small": (128, 4, 4, 2, 32, 384, 2048, False),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--student", default="1.7B", choices=sorted(SHAPES))
    parser.add_argument("--teacher", default="8B", choices=sorted(SHAPES))
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument("--responses", type=int, default=64, help="full responses per update, over all ranks")
    parser.add_argument("--response-tokens", type=int, default=512)
    parser.add_argument("--context-tokens", type=int, default=3584)
    parser.add_argument("--micro-batch-tokens", type=int, default=8192)
    parser.add_argument("--compute-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--teacher-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--teacher-placement", default="replicate", choices=["replicate", "shard"])
    parser.add_argument("--engine-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--sync-bucket-mb", type=int, default=1024)
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/train_step.json")
    args = parser.parse_args(argv)
    if args.responses % args.nproc_per_node:
        parser.error(f"--responses={args.responses}: must be a multiple of --nproc-per-node={args.nproc_per_node}")
    return args


def qwen3(shape: str, dtype: torch.dtype, device: torch.device, seed: int) -> torch.nn.Module:
    """A randomly initialized Qwen3 model of ``shape``, made on ``device``."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    hidden, layers, heads, kv, head_dim, inter, vocab, tied = SHAPES[shape]
    cfg = Qwen3Config(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, head_dim=head_dim, intermediate_size=inter, vocab_size=vocab,
                      tie_word_embeddings=tied, max_position_embeddings=8192)
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(cfg, dtype=dtype)


def batch(args: argparse.Namespace, rank: int, world: int, vocab: int) -> list:
    """This rank's share of a random batch of the paper's shape (the same global batch whatever the ranks)."""
    from actfirst.sample import Sample

    gen = torch.Generator().manual_seed(args.seed)
    out = []
    for i in range(args.responses):
        c = int(torch.randint(args.context_tokens // 2, args.context_tokens + 1, (), generator=gen))
        r = int(torch.randint(args.response_tokens // 2, args.response_tokens + 1, (), generator=gen))
        ids = torch.randint(0, vocab, (c + r,), generator=gen).tolist()
        old = (-torch.rand(r, generator=gen) * 4).tolist()
        if i % world == rank:
            out.append(Sample(context_ids=ids[:c], response_ids=ids[c:], loss_mask=[1] * r, logprobs=old,
                              weight_version=0, task=f"t{i}", turn=0, strategy="bench"))
    return out


class Phase:
    """Wall-clock and peak memory of one phase on this rank."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __enter__(self) -> Phase:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_mib = torch.cuda.max_memory_allocated(self.device) / 2**20
        else:
            self.peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        self.seconds = time.perf_counter() - self.t0


def run_rank(args: argparse.Namespace) -> dict | None:
    """Build the models, time ``--updates`` updates; rank 0 returns the summary of every rank's figures."""
    from actfirst.kernels.dispatch import last_path

    from actfirst.config import LossConfig, OptimConfig
    from actfirst.parallel.context import all_gather_objects, init_parallel
    from actfirst.parallel.fsdp import apply_fsdp
    from actfirst.parallel.weight_sync import gathered_parameters
    from actfirst.train.head import LMHeadModel
    from actfirst.train.student import StudentUpdater
    from actfirst.train.teacher import TeacherScorer

    ctx = init_parallel()
    dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32}
    with Phase(ctx.device) as build:
        teacher = TeacherScorer(qwen3(args.teacher, dtypes[args.teacher_dtype], ctx.device, args.seed + 1),
                                micro_batch_tokens=args.micro_batch_tokens, device=ctx.device,
                                shard=ctx if args.teacher_placement == "shard" else None, name=args.teacher)
        policy = LMHeadModel(qwen3(args.student, torch.float32, ctx.device, args.seed))
        apply_fsdp(policy, policy.blocks, ctx.mesh, param_dtype=dtypes[args.compute_dtype])
        updater = StudentUpdater(policy, optim=OptimConfig(lr=1e-6), loss=LossConfig(), temperature=1.0,
                                 num_updates=args.updates, micro_batch_tokens=args.micro_batch_tokens)
    samples = batch(args, ctx.rank, ctx.world_size, SHAPES[args.student][6])
    tokens = sum(s.num_tokens for s in samples)
    rows = []
    for update in range(1, args.updates + 1):
        with Phase(ctx.device) as score:
            teacher.score(samples)
        with Phase(ctx.device) as step:
            metrics = updater.update(samples, current_version=0)
        with Phase(ctx.device) as sync:
            gathered = sum(t.numel() for _, t in gathered_parameters(
                policy.model, dtype=dtypes[args.engine_dtype], bucket_bytes=args.sync_bucket_mb << 20))
        rows.append({"update": update, "score_s": score.seconds, "score_peak_mib": score.peak_mib,
                     "update_s": step.seconds, "update_peak_mib": step.peak_mib, "sync_s": sync.seconds,
                     "sync_peak_mib": sync.peak_mib, "loss": metrics["loss"], "skipped": metrics["skipped"],
                     "gathered_params": gathered, "score_path": last_path("logprob_gather").path,
                     "update_path": last_path("ppo_loss_from_hidden").path})
    mine = {"rank": ctx.rank, "tokens": tokens, "samples": len(samples), "build_s": build.seconds,
            "build_peak_mib": build.peak_mib, "updates": rows}
    ranks = all_gather_objects(mine)
    return summarize(args, ranks, ctx.device) if ctx.lead else None


def summarize(args: argparse.Namespace, ranks: list[dict], device: torch.device) -> dict:
    """Per update: the slowest rank's phase times, global tokens/s, each rank's peak."""
    total = sum(r["tokens"] for r in ranks)
    updates = []
    for i in range(args.updates):
        per = [r["updates"][i] for r in ranks]
        row = {"update": i + 1, "tokens": total, "loss": per[0]["loss"], "skipped": per[0]["skipped"],
               "score_path": per[0]["score_path"], "update_path": per[0]["update_path"]}
        for phase in ("score", "update", "sync"):
            seconds = max(p[f"{phase}_s"] for p in per)
            row[f"{phase}_s"] = seconds
            row[f"{phase}_tok_per_s"] = total / seconds if phase != "sync" else None
            row[f"{phase}_peak_mib_per_rank"] = [p[f"{phase}_peak_mib"] for p in per]
        updates.append(row)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"args": vars(args), "device": device_name, "world_size": len(ranks),
            "samples_per_rank": [r["samples"] for r in ranks], "tokens_per_rank": [r["tokens"] for r in ranks],
            "build_s": max(r["build_s"] for r in ranks), "updates": updates,
            "peak_mib_per_rank": [max(max(u[f"{p}_peak_mib"] for p in ("score", "update", "sync"))
                                      for u in r["updates"]) for r in ranks]}


def table(result: dict) -> str:
    """The summary as a Markdown table."""
    peak = "peak RSS" if result["device"] == "cpu" else "peak GPU memory"
    lines = [f"{result['args']['student']} student / {result['args']['teacher']} teacher on {result['world_size']} "
             f"rank(s) of {result['device']}; {sum(result['tokens_per_rank']):,} tokens per update "
             f"({result['args']['responses']} responses); build {result['build_s']:.1f} s",
             f"| update | scoring s (tok/s) | update s (tok/s) | sync gather s | {peak} per rank, MiB | head paths |",
             "|---|---|---|---|---|---|"]
    for u in result["updates"]:
        peaks = ", ".join(f"{max(a, b, c):,.0f}" for a, b, c in zip(u["score_peak_mib_per_rank"],
                                                                      u["update_peak_mib_per_rank"],
                                                                      u["sync_peak_mib_per_rank"]))
        lines.append(f"| {u['update']} | {u['score_s']:.2f} ({u['score_tok_per_s']:,.0f}) | {u['update_s']:.2f} "
                     f"({u['update_tok_per_s']:,.0f}) | {u['sync_s']:.2f} | {peaks} | {u['score_path']} / "
                     f"{u['update_path']} |")
    return "\n".join(lines)


@command
def main(argv: list[str] | None = None) -> int:
    """Start the ranks (through the elastic launcher when several), time, print and write the result."""
    from actfirst.parallel.context import launched_as_rank
    from actfirst.parallel.launch import launch_ranks

    args = parse_args(argv)
    check_writable_file(args.out, "--out")
    if not launched_as_rank() and args.nproc_per_node > 1:
        return launch_ranks(args.nproc_per_node, [os.path.abspath(__file__), *(argv or sys.argv[1:])])
    result = run_rank(args)
    if result is not None:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(table(result), flush=True)
        print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

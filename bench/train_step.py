"""Training updates timed phase by phase: teacher scoring, the student's forward and backward, AdamW's step, the
weight gather of the sync; then, optionally, the trainer's checkpoint saved and loaded back.

    python bench/train_step.py --student 1.7B --teacher 8B --nproc-per-node 1 --attention flex_attention \
        --activation-checkpointing --checkpoint-dir /tmp/ckpt                              # the lent GPU
    python bench/train_step.py --student tiny --teacher tiny --nproc-per-node 2            # a CPU check

Rollouts are excluded: a batch shaped like the paper's (``--responses`` full responses of up to
``--response-tokens`` tokens on contexts of up to ``--context-tokens``; lengths drawn between half and all of it)
is made of random token ids and log-probs; each rank takes every R-th response, the share of the batch a rank
contributes to the trainer's update. The models are randomly initialized Qwen3 shapes (``SHAPES``: the published
configs of Qwen3-0.6B, 1.7B, 4B, 8B) on each rank's device, both with ``--attention``; the student is built as the
trainer builds it (:func:`student`: float32 master weights, activation checkpointing per block when asked, FSDP2 with
``--compute-dtype`` compute), the teacher replicated or sharded. Each update runs: ``TeacherScorer.score`` ->
``StudentUpdater.update`` (its AdamW steps metered apart through the optimizer's step hooks) -> the weight sync's
bucketed gather cast to the engine's dtype (``gathered_parameters``; the engine's own load is not part of it: vLLM
may be absent, as on the lent GPU). ``--checkpoint-dir``: after the updates, ``save_training_checkpoint`` (AdamW's
sharded state through DCP, the full student as safetensors) and ``load_training_checkpoint`` into a zeroed optimizer,
with the bytes written and a check that the loaded state equals the saved one.

Per phase and rank (:class:`Meter`): wall-clock, tokens/s (context plus response tokens through the forward), and
peak memory (GPU: ``max_memory_allocated`` and ``max_memory_reserved`` since the phase began; CPU: the process's
peak RSS so far). Rank 0 prints Markdown tables and writes ``--out`` (JSON). Several ranks start through the same
elastic launcher as ``python -m actfirst.run``.
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

from actfirst.core.files import write_atomically
from actfirst.core.user_input import check_writable_file, command

SHAPES = {
    # hidden, layers, heads, kv heads, head_dim, intermediate, vocab, tied embeddings (Qwen3's config.json files)
    "0.6B": (1024, 28, 16, 8, 128, 3072, 151936, True),
    "1.7B": (2048, 28, 16, 8, 128, 6144, 151936, True),
    "4B": (2560, 36, 32, 8, 128, 9728, 151936, True),
    "8B": (4096, 36, 32, 8, 128, 12288, 151936, False),
    "tiny": (64, 2, 2, 1, 32, 128, 512, True),
    "small": (128, 4, 4, 2, 32, 384, 2048, False),
}

ATTENTION = ("auto", "sdpa", "flex_attention", "flash_attention_2")
"""``parallel.attention``'s values (``actfirst.train.packing.attention_implementation``)."""


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
    parser.add_argument("--attention", default="auto", choices=ATTENTION,
                        help="student's and teacher's attention (sdpa: padded rows, one per sample)")
    parser.add_argument("--activation-checkpointing", action="store_true", help="recompute each student block")
    parser.add_argument("--checkpoint-dir", default=None, help="save and load the trainer's checkpoint here")
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
    from actfirst.rollout.sample import Sample

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


MiB = 2**20


class Meter:
    """Wall-clock and peak memory per named phase on this rank: :meth:`switch` ends the running phase and starts the
    next. On a GPU each switch synchronizes the device, reads ``max_memory_allocated`` and ``max_memory_reserved``
    (the caching allocator's footprint) since the last switch and resets both; on the CPU the process's peak RSS so
    far stands for both. A phase entered several times adds its seconds and keeps its largest peaks."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}
        self.allocated_mib: dict[str, float] = {}
        self.reserved_mib: dict[str, float] = {}
        self.current: str | None = None
        self.t0 = time.perf_counter()

    def switch(self, name: str | None) -> None:
        """End the running phase (if any) and start ``name`` (None: none)."""
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        if self.current is not None:
            if cuda:
                allocated = torch.cuda.max_memory_allocated(self.device) / MiB
                reserved = torch.cuda.max_memory_reserved(self.device) / MiB
            else:
                allocated = reserved = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
            c = self.current
            self.seconds[c] = self.seconds.get(c, 0.0) + now - self.t0
            self.allocated_mib[c] = max(self.allocated_mib.get(c, 0.0), allocated)
            self.reserved_mib[c] = max(self.reserved_mib.get(c, 0.0), reserved)
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        self.current, self.t0 = name, now

    def record(self, *phases: str) -> dict[str, float]:
        """``<phase>_s``, ``<phase>_peak_mib`` (allocated) and ``<phase>_reserved_mib`` of ``phases``; resets them."""
        out = {}
        for p in phases:
            out.update({f"{p}_s": self.seconds.pop(p, 0.0), f"{p}_peak_mib": self.allocated_mib.pop(p, 0.0),
                        f"{p}_reserved_mib": self.reserved_mib.pop(p, 0.0)})
        return out

    def around_optimizer_steps(self, optimizer: torch.optim.Optimizer) -> None:
        """Meter ``optimizer``'s steps as the phase ``step`` inside an update (the rest of it is ``fwd_bwd``), through
        the optimizer's own step hooks."""
        optimizer.register_step_pre_hook(lambda *_: self.switch("step"))
        optimizer.register_step_post_hook(lambda *_: self.switch("fwd_bwd"))


def set_attention(model: torch.nn.Module, attention: str, compute_dtype: torch.dtype) -> None:
    """Run the student ``model`` (a Hugging Face causal LM) with what ``parallel.attention`` = ``attention`` means
    on its device for a forward and backward in ``compute_dtype``, as the trainer does."""
    from actfirst.train.packing import attention_implementation

    device = next(model.parameters()).device
    model.set_attn_implementation(attention_implementation(attention, device, compute_dtype, backward=True))


def student(shape: str, *, compute_dtype: torch.dtype, attention: str, activation_checkpointing: bool,
            ctx: object, seed: int) -> torch.nn.Module:
    """A randomly initialized student of ``shape`` as the trainer builds it: float32 master weights, the attention
    implementation, activation checkpointing per block (optional), FSDP2 over ``ctx.mesh`` computing in
    ``compute_dtype``. Returns the LMHeadModel."""
    from actfirst.parallel.checkpointing import apply_activation_checkpointing
    from actfirst.parallel.fsdp import apply_fsdp
    from actfirst.train.head import LMHeadModel

    policy = LMHeadModel(qwen3(shape, torch.float32, ctx.device, seed))
    set_attention(policy.model, attention, compute_dtype)
    policy.model.train()
    if activation_checkpointing:
        apply_activation_checkpointing(policy, policy.blocks)
    apply_fsdp(policy, policy.blocks, ctx.mesh, param_dtype=compute_dtype)
    return policy


DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def run_rank(args: argparse.Namespace) -> dict | None:
    """Build the models, time ``--updates`` updates (and the checkpoint round trip); rank 0 returns the summary of
    every rank's figures."""
    from actfirst.core.config import LossConfig, OptimConfig
    from actfirst.kernels.dispatch import last_path
    from actfirst.parallel.context import all_gather_objects, init_parallel
    from actfirst.parallel.weight_sync import gathered_parameters
    from actfirst.train.student import StudentUpdater
    from actfirst.train.teacher import TeacherScorer

    ctx = init_parallel()
    meter = Meter(ctx.device)
    meter.switch("build")
    teacher_model = qwen3(args.teacher, DTYPES[args.teacher_dtype], ctx.device, args.seed + 1)
    teacher = TeacherScorer(teacher_model, attention=args.attention, micro_batch_tokens=args.micro_batch_tokens,
                            device=ctx.device,
                            shard=ctx if args.teacher_placement == "shard" else None, name=args.teacher)
    policy = student(args.student, compute_dtype=DTYPES[args.compute_dtype], attention=args.attention,
                     activation_checkpointing=args.activation_checkpointing, ctx=ctx, seed=args.seed)
    updater = StudentUpdater(policy, optim=OptimConfig(lr=1e-6), loss=LossConfig(), temperature=1.0,
                             num_updates=args.updates, micro_batch_tokens=args.micro_batch_tokens)
    meter.around_optimizer_steps(updater.optimizer)
    meter.switch(None)
    build = meter.record("build")
    samples = batch(args, ctx.rank, ctx.world_size, SHAPES[args.student][6])
    tokens = sum(s.num_tokens for s in samples)
    rows = []
    for update in range(1, args.updates + 1):
        for s in samples:  # a scored sample keeps its scores (UOPD's): each update's batch is a new one
            s.teacher_logprobs = None
        meter.switch("score")
        teacher.score(samples)
        meter.switch("fwd_bwd")
        metrics = updater.update(samples, current_version=0)
        meter.switch("sync")
        gathered = sum(t.numel() for _, t in gathered_parameters(
            policy.model, dtype=DTYPES[args.engine_dtype], bucket_bytes=args.sync_bucket_mb << 20))
        meter.switch(None)
        rows.append({"update": update, **meter.record("score", "fwd_bwd", "step", "sync"), "loss": metrics["loss"],
                     "skipped": metrics["skipped"], "gathered_params": gathered,
                     "score_path": last_path("logprob_gather").path,
                     "update_path": last_path("ppo_loss_from_hidden").path})
    mine = {"rank": ctx.rank, "tokens": tokens, "samples": len(samples), "build_s": build["build_s"],
            "build_peak_mib": build["build_peak_mib"], "build_reserved_mib": build["build_reserved_mib"],
            "updates": rows}
    if args.checkpoint_dir:
        mine["checkpoint"] = checkpoint_round_trip(Path(args.checkpoint_dir), args.updates, ctx, policy,
                                                   updater.optimizer, meter)
    ranks = all_gather_objects(mine)
    return summarize(args, ranks, ctx.device) if ctx.lead else None


def checkpoint_round_trip(directory: Path, update: int, ctx: object, policy: torch.nn.Module,
                          optimizer: torch.optim.Optimizer, meter: Meter) -> dict:
    """The trainer's checkpoint of the student and its optimizer (``save_training_checkpoint``: AdamW's sharded state
    by DCP, the full float32 student gathered to rank 0 as safetensors), then the optimizer loaded back by DCP
    (``load_training_checkpoint``) into a zeroed state: seconds, peak memory, bytes on disk, and whether every
    loaded moment equals the saved one (float64 sums of this rank's shards, compared exactly)."""
    from actfirst.models.tokenizers import train_env_bpe_tokenizer
    from actfirst.train.state import OPTIMIZER_DIR, load_training_checkpoint, save_training_checkpoint

    # The checkpoint's tokenizer files: a tiny BPE (the models are random; its files are a few kB of the total).
    tokenizer = train_env_bpe_tokenizer(["a random-init student has no tokenizer of its own"], vocab_size=300)
    sums = _moment_sums(optimizer)
    meter.switch("save")
    save_training_checkpoint(directory, update=update, keep=1, ctx=ctx, policy=policy, optimizer=optimizer,
                             tokenizer=tokenizer, trainer_state={}, rank_state={})
    meter.switch(None)
    path = directory / "checkpoints" / f"update_{update:06d}"
    for state in optimizer.state.values():
        for value in state.values():
            value.zero_()
    meter.switch("load")
    load_training_checkpoint(path, ctx=ctx, policy=policy, optimizer=optimizer)
    meter.switch(None)
    files = [p for p in path.rglob("*") if p.is_file()]
    dcp_bytes = sum(p.stat().st_size for p in files if OPTIMIZER_DIR in p.relative_to(path).parts)
    return {**meter.record("save", "load"), "dcp_bytes": dcp_bytes,
            "total_bytes": sum(p.stat().st_size for p in files),
            "student_bytes": sum(p.stat().st_size for p in files if p.suffix == ".safetensors"),
            "round_trip_equal": _moment_sums(optimizer) == sums}


def _moment_sums(optimizer: torch.optim.Optimizer) -> list[float]:
    """float64 sums of this rank's shards of every optimizer state tensor (moments and step counts), in order."""
    from torch.distributed.tensor import DTensor

    return [float((v.to_local() if isinstance(v, DTensor) else v).double().sum())
            for state in optimizer.state.values() for v in state.values()]


PHASES = ("score", "fwd_bwd", "step", "sync")
"""An update's phases: teacher scoring, the student's forward and backward, AdamW's step, the weight-sync gather."""


def summarize(args: argparse.Namespace, ranks: list[dict], device: torch.device) -> dict:
    """Per update: the slowest rank's phase times, global tokens/s, each rank's peaks; the checkpoint likewise."""
    total = sum(r["tokens"] for r in ranks)
    updates = []
    for i in range(args.updates):
        per = [r["updates"][i] for r in ranks]
        row = {"update": i + 1, "tokens": total, "loss": per[0]["loss"], "skipped": per[0]["skipped"],
               "gathered_params": per[0]["gathered_params"], "score_path": per[0]["score_path"],
               "update_path": per[0]["update_path"]}
        for phase in PHASES:
            row[f"{phase}_s"] = max(p[f"{phase}_s"] for p in per)
            row[f"{phase}_tok_per_s"] = total / row[f"{phase}_s"] if phase in ("score", "fwd_bwd") else None
            row[f"{phase}_peak_mib_per_rank"] = [p[f"{phase}_peak_mib"] for p in per]
            row[f"{phase}_reserved_mib_per_rank"] = [p[f"{phase}_reserved_mib"] for p in per]
        updates.append(row)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result = {"args": vars(args), "device": device_name, "world_size": len(ranks),
              "samples_per_rank": [r["samples"] for r in ranks], "tokens_per_rank": [r["tokens"] for r in ranks],
              "build_s": max(r["build_s"] for r in ranks), "updates": updates,
              "peak_mib_per_rank": [max(u[f"{p}_peak_mib"] for p in PHASES for u in r["updates"]) for r in ranks],
              "reserved_mib_per_rank": [max(u[f"{p}_reserved_mib"] for p in PHASES for u in r["updates"])
                                        for r in ranks]}
    if "checkpoint" in ranks[0]:
        ckpt = [r["checkpoint"] for r in ranks]
        result["checkpoint"] = {**{f"{p}_s": max(c[f"{p}_s"] for c in ckpt) for p in ("save", "load")},
                                **{f"{p}_{m}_mib_per_rank": [c[f"{p}_{m}_mib"] for c in ckpt]
                                   for p in ("save", "load") for m in ("peak", "reserved")},
                                "dcp_bytes": ckpt[0]["dcp_bytes"], "student_bytes": ckpt[0]["student_bytes"],
                                "total_bytes": ckpt[0]["total_bytes"],
                                "round_trip_equal": all(c["round_trip_equal"] for c in ckpt)}
    return result


def _peaks(allocated: list[float], reserved: list[float]) -> str:
    return ", ".join(f"{a:,.0f} / {r:,.0f}" for a, r in zip(allocated, reserved, strict=True))


def table(result: dict) -> str:
    """The summary as Markdown tables with a caption (the rows ``bench/device_check.sh`` collects)."""
    a = result["args"]
    cpu = result["device"] == "cpu"
    memory = "peak RSS MiB (allocated / reserved: the same on the CPU)" if cpu else "peak MiB, allocated / reserved"
    caption = (f"> {a['student']} student / {a['teacher']} teacher on {result['world_size']} rank(s) of "
               f"{result['device']}; {sum(result['tokens_per_rank']):,} tokens per update ({a['responses']} "
               f"responses); attention {a['attention']}, activation checkpointing "
               f"{'on' if a['activation_checkpointing'] else 'off'}; build {result['build_s']:.1f} s")
    lines = [caption, "", f"| update | phase | seconds | tokens/s | {memory} per rank | head path |",
             "|---|---|---|---|---|---|"]
    for u in result["updates"]:
        for phase in PHASES:
            rate = "" if u[f"{phase}_tok_per_s"] is None else f"{u[f'{phase}_tok_per_s']:,.0f}"
            peaks = _peaks(u[f"{phase}_peak_mib_per_rank"], u[f"{phase}_reserved_mib_per_rank"])
            path = {"score": u["score_path"], "fwd_bwd": u["update_path"]}.get(phase, "")
            lines.append(f"| {u['update']} | {phase} | {u[f'{phase}_s']:.2f} | {rate} | {peaks} | {path} |")
    if "checkpoint" in result:
        c = result["checkpoint"]
        lines += ["", f"| checkpoint | seconds | {memory} per rank | bytes | loaded state equal |",
                  "|---|---|---|---|---|"]
        sizes = {"save": f"{c['total_bytes']:,} ({c['dcp_bytes']:,} DCP optimizer, {c['student_bytes']:,} student "
                         "safetensors)", "load": f"{c['dcp_bytes']:,} (DCP optimizer)"}
        for p, size in sizes.items():
            peaks = _peaks(c[f"{p}_peak_mib_per_rank"], c[f"{p}_reserved_mib_per_rank"])
            equal = c["round_trip_equal"] if p == "load" else ""
            lines.append(f"| {p} | {c[f'{p}_s']:.2f} | {peaks} | {size} | {equal} |")
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
        write_atomically(args.out, json.dumps(result, indent=1))
        print(table(result), flush=True)
        print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

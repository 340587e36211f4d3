"""The colocated fit on an 80 GB card, measured on one GPU: one rank of configs/train/alfworld/qwen3-1.7b.yaml beside
a ballast of vLLM's share, the student loaded through the trainer's own path, each phase's peaks against the plan.

    python bench/colocated_fit.py --out runs/device/colocated_fit.json          # the lent GPU (no vLLM there)
    python bench/colocated_fit.py --shrunken --out /tmp/colocated_fit.json      # CPU dry run: tiny shapes

In order, at world size 1:

1. the caching allocator capped (``torch.cuda.set_per_process_memory_fraction``) to an 80 GB card (79.6 GiB, what
   an H100 reports) plus what a rank of one holds beyond a rank of eight: FSDP2 at one rank keeps the whole float32
   student, its gradients and AdamW's two moments (16 P bytes) where each of 8 ranks keeps an eighth. So what fits
   here fits a rank of the 8-GPU node, and its peak there is the peak here less 14 P (the "at 8 ranks" column);
2. a ballast of the student engine's share (``student.gpu_memory_utilization`` x 79.6 GiB), held to the end:
   vLLM's weights, KV cache and CUDA graphs (vLLM is not installed on the lent GPU);
3. a random Qwen3-1.7B written to a directory (safetensors, bfloat16 as published; in /dev/shm when it has room);
4. the student through the trainer's loading path: ``empty_model`` (meta, float32) -> its attention ->
   activation checkpointing -> ``apply_fsdp`` -> ``load_weights`` from that directory;
5. the teacher, a random Qwen3-8B built on the device in the config's dtype, replicated (``TeacherScorer``);
6. two updates: teacher scoring, the student's forward and backward and AdamW's step (``StudentUpdater``), then
   the weight sync's bucketed gather (``gathered_parameters``, the engine's dtype, ``parallel.sync_bucket_mb``); on
   ``--responses`` samples of the config's longest (3,584 context + 512 response tokens), two to a row. As in the
   trainer, the update runs in a thread of its own inside ``StreamSplit.update_phase`` and everything else in this
   thread on the engine's stream (``actfirst.engine.streams``): the caching allocator keeps each stream's blocks
   apart, which the peaks then include.

Each phase's Markdown row is printed as it ends (seconds, tokens/s, allocated and reserved peaks, the reserved peak
at 8 ranks, the plan's phase at 8 ranks from ``bench/memory_plan.py`` and their ratio) and ``--out`` is rewritten,
so a timeout keeps what finished. Update 2 gives the MFU by matmul FLOPs (6 P a token for the student's forward
and backward, 8 P counting the recompute; 2 P for the teacher's scoring) against a bfloat16 matmul measured first.
CPU (``--shrunken``): tiny shapes, no cap, peak RSS for both peaks: the code path only.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from bench_logprob_gather import matmul_ceiling
from memory_plan import load_train_config
from memory_probe import row_samples
from train_step import DTYPES, SHAPES, Meter, qwen3

from actfirst.core.files import write_atomically
from actfirst.core.user_input import check_writable_file, command
from actfirst.parallel.memory_plan import load_activations, params, plan

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "train" / "alfworld" / "qwen3-1.7b.yaml"
CARD_GIB = 79.6
"""An 80 GB card as an H100 reports it (bench/memory_targets.yaml's 80GB)."""
RANKS = 8
GIB, MIB = 2**30, 2**20
PLAN_PHASE = {"score": "score", "fwd_bwd": "update", "step": "update", "sync": "rollout"}
"""Which of the plan's phases a measured phase is in (the sync's bucket is counted in the plan's rollout phase)."""
HEADER = ("| update | phase | seconds | tokens/s | allocated / reserved peak MiB | reserved at 8 ranks GiB | "
          "plan at 8 ranks GiB | reserved / plan |\n|---|---|---|---|---|---|---|---|")


class Report:
    """The rows so far: each printed as it ends and the JSON rewritten (``--out``)."""

    def __init__(self, out: str, meta: dict, extra_shards_gib: float, plan_phases: dict[str, float]) -> None:
        self.out, self.result = out, {**meta, "rows": []}
        self.extra_shards_gib, self.plan_phases = extra_shards_gib, plan_phases

    def row(self, meter: Meter, phase: str, update: int | None = None, tokens: int | None = None) -> dict:
        r = meter.record(phase)
        seconds, allocated, reserved = r[f"{phase}_s"], r[f"{phase}_peak_mib"], r[f"{phase}_reserved_mib"]
        at_8 = reserved / 1024 - self.extra_shards_gib
        planned = self.plan_phases.get(PLAN_PHASE.get(phase, ""))
        row = {"update": update, "phase": phase, "seconds": seconds, "tokens": tokens, "allocated_mib": allocated,
               "reserved_mib": reserved, "reserved_at_8_ranks_gib": at_8, "plan_gib": planned}
        self.result["rows"].append(row)
        write_atomically(self.out, json.dumps(self.result, indent=1))
        rate = f"{tokens / seconds:,.0f}" if tokens else ""
        ratio = f"{at_8 / planned:.2f}" if planned else "-"
        print(f"| {update or '-'} | {phase} | {seconds:.2f} | {rate} | {allocated:,.0f} / {reserved:,.0f} | "
              f"{at_8:.1f} | {f'{planned:.1f}' if planned else '-'} | {ratio} |", flush=True)
        return row


def model_directory(size_bytes: int, in_memory: bool) -> Path:
    """A fresh directory for the random student: with ``in_memory``, in /dev/shm (the lent VM's disk writes 0.5
    GB/s) when it has twice the room; else in the temporary directory."""
    shm = Path("/dev/shm")
    base = shm if in_memory and shm.is_dir() and shutil.disk_usage(shm).free > 2 * size_bytes else None
    return Path(tempfile.mkdtemp(prefix="colocated_student_", dir=base))


def load_student(model_dir: Path, cfg: object, ctx: object, compute: torch.dtype) -> torch.nn.Module:
    """The trainer's loading path (``Trainer._build_models``): meta -> attention -> checkpointing -> FSDP2 -> weights
    from the directory. Returns the LMHeadModel."""
    from actfirst.train.head import load_policy
    from actfirst.train.packing import attention_implementation

    return load_policy(model_dir, mesh=ctx.mesh, device=ctx.device, compute_dtype=compute,
                       attention=attention_implementation(cfg.parallel.attention, ctx.device, compute, backward=True),
                       activation_checkpointing=cfg.parallel.activation_checkpointing)


def run_updates(args: argparse.Namespace, cfg: object, ctx: object, meter: Meter, report: Report, policy, teacher,
                p_student: int, p_teacher: int) -> None:
    """Two updates, phase by phase (score, fwd_bwd, step, sync), each row as it ends; then the MFU of update 2."""
    from actfirst.engine.streams import stream_split
    from actfirst.parallel.weight_sync import gathered_parameters
    from actfirst.train.student import StudentUpdater

    updater = StudentUpdater(policy, optim=cfg.optim, loss=cfg.loss, temperature=cfg.rollout.temperature,
                             num_updates=cfg.num_updates, micro_batch_tokens=cfg.micro_batch_tokens)
    meter.around_optimizer_steps(updater.optimizer)
    per_sample = cfg.rollout.max_prompt_tokens + cfg.rollout.budget.total if not args.shrunken else 256
    samples = row_samples(per_sample * args.responses, args.responses, SHAPES[args.student][6], seed=0)
    tokens = sum(s.num_tokens for s in samples)
    split = stream_split()

    def update() -> None:  # the trainer's update thread: on the update's stream (actfirst.engine.streams)
        if ctx.device.type == "cuda":
            torch.cuda.set_device(ctx.device)
        with split.update_phase() if split is not None else contextlib.nullcontext():
            meter.switch("score")
            teacher.score(samples)
            meter.switch("fwd_bwd")
            updater.update(samples, current_version=0)

    rows = {}
    with ThreadPoolExecutor(1, thread_name_prefix="update") as pool:
        for number in (1, 2):
            for s in samples:
                s.teacher_logprobs = None
            pool.submit(update).result()
            meter.switch("sync")  # this (the engine's) thread, on its stream, as the trainer's weight sync
            for _ in gathered_parameters(policy.model, dtype=DTYPES[cfg.student.dtype],
                                         bucket_bytes=cfg.parallel.sync_bucket_mb << 20):
                pass
            meter.switch(None)
            for phase in ("score", "fwd_bwd", "step", "sync"):
                rows[phase] = report.row(meter, phase, number, tokens if phase in ("score", "fwd_bwd") else None)
    ceiling = matmul_ceiling(ctx.device.type, torch.bfloat16 if ctx.device.type == "cuda" else torch.float32)
    student = 6 * p_student * tokens / rows["fwd_bwd"]["seconds"] / 1e12
    scoring = 2 * p_teacher * tokens / rows["score"]["seconds"] / 1e12
    report.result["mfu"] = {"matmul_tflops": ceiling, "student_tflops": student, "teacher_tflops": scoring}
    write_atomically(report.out, json.dumps(report.result, indent=1))
    print(f"> update 2, by matmul FLOPs (attention not counted): the student's forward and backward "
          f"{student:.0f} TFLOP/s = {100 * student / ceiling:.0f}% of the {ceiling:.0f} TFLOP/s a square matmul "
          f"reaches here ({100 * student * 4 / 3 / ceiling:.0f}% counting the recompute); the teacher's scoring "
          f"{scoring:.0f} TFLOP/s = {100 * scoring / ceiling:.0f}%", flush=True)


def measure(args: argparse.Namespace) -> int:
    """Every phase in order (see the module docstring); 1 when a phase ran out of memory under the cap."""
    from actfirst.engine.streams import stream_split
    from actfirst.parallel.context import init_parallel
    from actfirst.train.teacher import TeacherScorer

    cfg = load_train_config(CONFIG)
    ctx = init_parallel()
    cuda = ctx.device.type == "cuda"
    compute = DTYPES[cfg.parallel.compute_dtype] if cuda else torch.float32
    p_published = params(f"Qwen3-{args.student}")[0] if cuda else 0
    extra_shards_gib = 16 * p_published * (1 - 1 / RANKS) / GIB
    cap_gib = CARD_GIB + extra_shards_gib
    ballast_gib = cfg.student.gpu_memory_utilization * (CARD_GIB if cuda else args.shrunken_card_gib)
    planned = plan(cfg, "Qwen3-1.7B", "Qwen3-8B", gpu_gib=CARD_GIB, ranks=RANKS, measured=load_activations())
    name = torch.cuda.get_device_name(ctx.device) if cuda else "cpu"
    report = Report(args.out, {"device": name, "date": datetime.date.today().isoformat(), "args": vars(args),
                               "cap_gib": cap_gib if cuda else None, "ballast_gib": ballast_gib,
                               "extra_shards_gib": extra_shards_gib, "plan_at_8_ranks": planned},
                    extra_shards_gib, planned["phases"] if cuda else {})
    print(f"> {args.student} student / {args.teacher} teacher, {CONFIG.relative_to(ROOT)} at world size 1 on {name}: "
          + (f"allocator capped at {cap_gib:.1f} GiB (79.6 + {extra_shards_gib:.1f}: a rank of one's shards beyond "
             "a rank of eight's), " if cuda else "no cap (CPU: peak RSS), ")
          + f"ballast {ballast_gib:.1f} GiB (student.gpu_memory_utilization {cfg.student.gpu_memory_utilization}); "
          f"{args.responses} responses; the plan's peak at 8 ranks {planned['peak']:.1f} GiB", flush=True)
    print(HEADER, flush=True)
    if cuda:
        torch.cuda.set_per_process_memory_fraction(cap_gib * GIB / torch.cuda.get_device_properties(ctx.device)
                                                   .total_memory, ctx.device)
        torch.cuda.set_stream(stream_split().engine)  # this thread is the trainer's event loop: the engine's stream
    meter = Meter(ctx.device)
    directory = None
    try:
        meter.switch("ballast")
        ballast = torch.empty(int(ballast_gib * GIB), dtype=torch.uint8, device=ctx.device)  # held to the end
        report.result["ballast_bytes_held"] = ballast.numel()
        meter.switch("directory")
        model = qwen3(args.student, torch.bfloat16, ctx.device, seed=0)
        directory = model_directory(2 * sum(p.numel() for p in model.parameters()), in_memory=cuda)
        model.save_pretrained(directory)
        del model
        meter.switch(None)
        report.row(meter, "ballast")
        report.row(meter, "directory")
        meter.switch("student")
        policy = load_student(directory, cfg, ctx, compute)
        meter.switch("teacher")
        teacher_model = qwen3(args.teacher, DTYPES[cfg.teacher_dtype] if cuda else torch.float32, ctx.device, seed=1)
        teacher = TeacherScorer(teacher_model, attention=cfg.parallel.attention, device=ctx.device,
                                micro_batch_tokens=cfg.micro_batch_tokens, name=args.teacher)
        meter.switch(None)
        report.row(meter, "student")
        report.row(meter, "teacher")
        p_student = sum(p.numel() for p in policy.model.parameters())
        p_teacher = sum(p.numel() for p in teacher_model.parameters())
        run_updates(args, cfg, ctx, meter, report, policy, teacher, p_student, p_teacher)
    except torch.OutOfMemoryError as error:
        print(f"| - | {meter.current} | out of memory under the cap: {str(error).splitlines()[0][:120]} |", flush=True)
        return 1
    finally:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--responses", type=int, default=16, help="samples per update (two to a micro-batch)")
    parser.add_argument("--shrunken", action="store_true", help="tiny student, small teacher (the CPU dry run)")
    parser.add_argument("--shrunken-card-gib", type=float, default=0.25, help="--shrunken: the card the ballast "
                        "is a share of")
    parser.add_argument("--out", default="runs/device/colocated_fit.json")
    args = parser.parse_args(argv)
    args.student, args.teacher = ("tiny", "small") if args.shrunken else ("1.7B", "8B")
    check_writable_file(args.out, "--out")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())

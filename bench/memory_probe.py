"""Peak GPU memory of a whole student update under FSDP2 on one rank, against the memory plan's prediction.

    python bench/memory_probe.py --shapes 1.7B 4B --out runs/device/memory_probe.json          # the lent GPU
    python bench/memory_probe.py --shapes tiny --tokens 512 --out /tmp/memory_probe.json       # a CPU dry run

Where ``bench/activation_probe.py`` counts the bytes autograd keeps per layer on the CPU, this runs the real thing on
a device: per shape (random init from the published Qwen3 config, no download) and activation checkpointing off
and on, a student built as the trainer builds it (``train_step.student``: float32 master weights, checkpointing per
block, FSDP2 at world size 1 computing in bfloat16), updated on two rows as the trainer packs them: two samples
in one row of ``--tokens`` (8,192) and one sample of ``--tokens`` / 2 (4,096), each sample ending in a response of
up to 512 tokens, with each ``--attention`` (flex attention's block mask, and SDPA, which gives a packed row a dense
mask; flex is not run on the CPU, where torch has no FlexAttention backward). ``--samples 2`` keeps the packed row
alone.

Each case: the caching allocator emptied, an update (``StudentUpdater.update``: forward, backward, AdamW step) as
the warm-up (compiles; AdamW's moments exist from then on, as in a run), the peaks reset, a second update measured:
``max_memory_allocated`` and ``max_memory_reserved`` against the memory plan's update-phase terms at one rank
(student shards + transient + activations of the row; no teacher, engine or slack). A case that runs out of memory
is recorded as such. The JSON (``--out``) is rewritten after every case, and each case's Markdown row is printed
as it ends, so a run stopped by a timeout keeps what it measured. CPU: peak RSS stands for both peaks (only the
code path is checked there).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import sys
import time
from pathlib import Path

import torch
from train_step import ATTENTION, SHAPES, Meter, set_attention, student

from actfirst.core.files import write_atomically
from actfirst.core.user_input import check_writable_file, command
from actfirst.parallel.memory_plan import load_activations, packed_row, student_update_gib

MiB = 2**20
RESPONSE_TOKENS = 512


def predicted_mib(shape: str, tokens: int, samples: int, attention: str, checkpointing: bool) -> float | None:
    """The memory plan's update phase of the student alone for one row of ``tokens`` at one rank (its shards, the
    update's transients and the measured activations: ``actfirst.parallel.memory_plan.student_update_gib``), in MiB;
    None for a shape the plan has not measured (the dry run's tiny one)."""
    measured, name = load_activations(), f"Qwen3-{shape}"
    if name not in measured:
        return None
    row = "one" if samples == 1 else packed_row(attention)
    own = student_update_gib(name, tokens=tokens, row=row, checkpointed=checkpointing, ranks=1, measured=measured)
    return own["update"] * 1024


def row_samples(tokens: int, samples: int, vocab: int, seed: int) -> list:
    """``samples`` samples of ``tokens`` // ``samples`` tokens each (a response of at most 512 at the end), with
    random ids, sampling and teacher log-probs: one packed row of the trainer."""
    from actfirst.rollout.sample import Sample

    gen = torch.Generator().manual_seed(seed)
    length = tokens // samples
    response = min(RESPONSE_TOKENS, length // 2)
    out = []
    for i in range(samples):
        ids = torch.randint(0, vocab, (length,), generator=gen).tolist()
        old = (-torch.rand(response, generator=gen) * 4).tolist()
        out.append(Sample(context_ids=ids[:-response], response_ids=ids[-response:], loss_mask=[1] * response,
                          logprobs=old, weight_version=0, task=f"t{i}", turn=0, strategy="probe",
                          teacher_logprobs=[x + 0.5 for x in old]))
    return out


def run_case(updater: object, meter: Meter, samples: list) -> dict:
    """Warm-up update, then the measured one: seconds, allocated and reserved peak (MiB), or the error."""
    device = meter.device
    if device.type == "cuda":
        torch.cuda.empty_cache()
    try:
        updater.update(samples, current_version=0)
        meter.switch("update")
        updater.update(samples, current_version=0)
        meter.switch(None)
    except torch.OutOfMemoryError as e:
        meter.switch(None)
        updater.optimizer.zero_grad(set_to_none=True)
        return {"error": "out of memory", "detail": str(e).split("\n")[0][:200]}
    r = meter.record("update")
    return {"seconds": r["update_s"], "allocated_mib": r["update_peak_mib"], "reserved_mib": r["update_reserved_mib"],
            "measured": device.type == "cuda"}


def cases(args: argparse.Namespace) -> list[tuple[str, bool, int, str]]:
    """(shape, checkpointing, samples in the row, attention) in run order: a shape's checkpointing on (the shipped
    configs' setting: first, should a timeout cut the run short), then off."""
    return [(shape, ckpt, samples, attention) for shape in args.shapes for ckpt in (True, False)
            for samples in args.samples for attention in args.attention]


def markdown_row(c: dict) -> str:
    """One case as a row of :data:`HEADER`."""
    where = (f"| {c['shape']} | {c['samples']} x {c['tokens'] // c['samples']:,} | {c['attention']} | "
             f"{'on' if c['checkpointing'] else 'off'} | ")
    predicted = "-" if c["predicted_mib"] is None else f"{c['predicted_mib']:,.0f}"
    if "error" in c:
        return where + f"{c['error']} | - | {predicted} | - | - |"
    ratio = ("- (CPU: RSS)" if not c["measured"] else "-" if c["predicted_mib"] is None
             else f"{c['allocated_mib'] / c['predicted_mib']:.2f}")
    return where + (f"{c['allocated_mib']:,.0f} | {c['reserved_mib']:,.0f} | {predicted} | {ratio} | "
                    f"{c['seconds']:.2f} |")


HEADER = ("| student | row (samples x tokens) | attention | checkpointing | allocated peak MiB | reserved peak MiB | "
          "plan MiB | allocated / plan | update s |\n|---|---|---|---|---|---|---|---|---|")


def probe(args: argparse.Namespace) -> dict:
    """Every case (see the module docstring); writes ``--out`` after each and prints its row."""
    from actfirst.core.config import LossConfig, OptimConfig
    from actfirst.parallel.context import init_parallel
    from actfirst.train.student import StudentUpdater

    ctx = init_parallel()
    meter = Meter(ctx.device)
    device = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else "cpu"
    result = {"device": device, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
              "args": vars(args), "cases": []}
    print(HEADER, flush=True)
    started, todo = time.perf_counter(), cases(args)
    dtype = torch.bfloat16 if ctx.device.type == "cuda" else torch.float32  # the student's compute dtype
    model_key, updater = None, None
    for i, (shape, ckpt, samples, attention) in enumerate(todo):
        c = {"shape": shape, "checkpointing": ckpt, "samples": samples, "attention": attention,
             "tokens": args.tokens if samples == 2 else args.tokens // 2}
        c["predicted_mib"] = predicted_mib(shape, c["tokens"], samples, attention, ckpt)
        if attention == "flex_attention" and ctx.device.type == "cpu":
            c["error"] = "not run on the CPU (no FlexAttention backward)"
        else:
            if model_key != (shape, ckpt):  # one student per shape and checkpointing; attention switches in place
                policy = updater = None  # the previous student freed before the next is built
                gc.collect()
                if ctx.device.type == "cuda":
                    torch.cuda.empty_cache()
                policy = student(shape, compute_dtype=dtype, attention=attention, activation_checkpointing=ckpt,
                                 ctx=ctx, seed=args.seed)
                updater = StudentUpdater(policy, optim=OptimConfig(lr=1e-6), loss=LossConfig(), temperature=1.0,
                                         num_updates=2 * len(todo), micro_batch_tokens=args.tokens)
                model_key = (shape, ckpt)
            set_attention(updater.policy.model, attention, dtype)
            c.update(run_case(updater, meter, row_samples(c["tokens"], samples, SHAPES[shape][6], args.seed)))
        result["cases"].append(c)
        write_atomically(args.out, json.dumps(result, indent=1))
        left = (time.perf_counter() - started) / (i + 1) * (len(todo) - i - 1)
        print(markdown_row(c), flush=True)
        print(f"  case {i + 1}/{len(todo)} done after {time.perf_counter() - started:.0f} s; ETA {left:.0f} s",
              flush=True)
    return result


@command
def main(argv: list[str] | None = None) -> int:
    """Parse, probe, write."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["1.7B", "4B"], choices=sorted(SHAPES))
    parser.add_argument("--tokens", type=int, default=8192, help="the two-sample row; the one-sample row is half")
    parser.add_argument("--attention", nargs="+", default=["flex_attention", "sdpa"], choices=ATTENTION)
    parser.add_argument("--samples", type=int, nargs="+", default=[2, 1], choices=[1, 2],
                        help="rows of two samples of --tokens / 2 and of one sample of --tokens / 2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/memory_probe.json")
    args = parser.parse_args(argv)
    if args.tokens < 8 or args.tokens % 2:
        parser.error(f"--tokens={args.tokens}: must be even and at least 8")
    check_writable_file(args.out, "--out")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    probe(args)
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

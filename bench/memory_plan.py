"""GPU memory per rank for the paper's settings, colocated (one process per GPU: engine + trainer + teacher).

    python bench/memory_plan.py                      # 8 x 80 GB and 8 x 141 GB, the paper configs' values
    python bench/memory_plan.py --gpu-gib 80 --ranks 8 --micro-batch-tokens 4096 --teacher shard

Arithmetic, per rank of R (GiB = 2**30 bytes):

- student under FSDP2: float32 parameters + float32 gradients + AdamW's two float32 moments = 16 bytes per
  parameter, sharded: 16 P / R. Transient: the root unit (embeddings, final norm, head) whole in the compute dtype
  for the forward and backward, plus one block's all-gathered parameters and unsharded gradients (2 x block).
- activations of one micro-batch (``micro_batch_tokens``, bfloat16, no recomputation): per token and layer the
  tensors autograd keeps: 2 bytes x (6 h + 4 I + q + 2 kv) (h hidden, I intermediate, q = heads x head_dim,
  kv = KV heads x head_dim), an estimate; the fused head adds no [tokens x vocab] logits.
- teacher (bfloat16): 2 bytes per parameter replicated; sharded 2 P / R plus its root unit and one block whole.
- engine: vLLM takes ``gpu_memory_utilization`` of the GPU (weights, KV cache, its activations).
- weight sync: one bucket of gathered weights (``sync_bucket_mb``) while the engine's weights are being replaced.
- slack: the CUDA context, NCCL buffers and the caching allocator's fragmentation (``--slack-gib``, 3 GiB).

Peak = max(rollout phase: engine + student shards + teacher; update phase: engine (unless asleep) + student shards
+ transients + activations + teacher). ``student.sleep_level`` 1 or 2 frees the engine's share during the update;
2 also drops its weights, which the sync replaces anyway (level 2 is what a setting that needs sleep should use).
These are estimates to check against a measured step (``bench/train_step.py``, ``bench/RESULTS.md``).
"""

from __future__ import annotations

import argparse

from train_step import SHAPES

GIB = 2**30


def params(shape: str) -> tuple[int, int, int]:
    """(all parameters, one block's, the root unit's) of a Qwen3 shape."""
    h, layers, heads, kv, hd, inter, vocab, tied = SHAPES[shape]
    block = h * heads * hd * 2 + h * kv * hd * 2 + 3 * h * inter + 2 * h + 2 * hd
    root = vocab * h * (1 if tied else 2) + h
    return layers * block + root, block, root


def activation_bytes(shape: str, tokens: int) -> int:
    h, layers, heads, kv, hd, inter, _, _ = SHAPES[shape]
    return 2 * (6 * h + 4 * inter + heads * hd + 2 * kv * hd) * layers * tokens


def plan(student: str, teacher: str, *, gpu_gib: float, ranks: int, utilization: float, micro_batch_tokens: int,
         teacher_placement: str, bucket_mb: int, slack_gib: float = 3.0) -> dict[str, float]:
    """One setting's per-rank memory in GiB and what it needs."""
    p, block, root = params(student)
    tp, tblock, troot = params(teacher)
    shards = 16 * p / ranks / GIB
    transient = (2 * root + 2 * 2 * block) / GIB
    acts = activation_bytes(student, micro_batch_tokens) / GIB
    whole_teacher = teacher_placement == "replicate"
    teacher_gib = 2 * tp / GIB if whole_teacher else (2 * tp / ranks + 2 * troot + 2 * tblock) / GIB
    engine = utilization * gpu_gib
    sync = bucket_mb / 1024
    rollout = engine + shards + teacher_gib + slack_gib
    update = shards + transient + acts + teacher_gib + slack_gib
    peak_awake = max(rollout, update + engine, rollout + sync)
    peak_asleep = max(rollout, update, rollout + sync)
    needs = "colocated" if peak_awake <= gpu_gib else ("sleep level 2" if peak_asleep <= gpu_gib else "does not fit")
    return {"student_shards": shards, "transient": transient, "activations": acts, "teacher": teacher_gib,
            "engine": engine, "sync_bucket": sync, "peak_awake": peak_awake, "peak_asleep": peak_asleep,
            "needs": needs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu-gib", type=float, nargs="+", default=[80.0, 141.0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    parser.add_argument("--micro-batch-tokens", type=int, default=8192)
    parser.add_argument("--teacher", default="replicate", choices=["replicate", "shard"])
    parser.add_argument("--sync-bucket-mb", type=int, default=1024)
    parser.add_argument("--slack-gib", type=float, default=3.0)
    args = parser.parse_args()
    head = ("| GPU | student | shards | transient | activations | teacher | engine | peak awake | peak asleep | "
            "needs |")
    print(head + "\n" + "|---" * (head.count("|") - 1) + "|")
    for gpu in args.gpu_gib:
        for student in ("0.6B", "1.7B", "4B"):
            r = plan(student, "8B", gpu_gib=gpu, ranks=args.ranks, utilization=args.gpu_memory_utilization,
                     micro_batch_tokens=args.micro_batch_tokens, teacher_placement=args.teacher,
                     bucket_mb=args.sync_bucket_mb, slack_gib=args.slack_gib)
            print(f"| {gpu:.0f} GiB | Qwen3-{student} | {r['student_shards']:.1f} | {r['transient']:.1f} | "
                  f"{r['activations']:.1f} | {r['teacher']:.1f} | {r['engine']:.1f} | {r['peak_awake']:.1f} | "
                  f"{r['peak_asleep']:.1f} | {r['needs']} |")


if __name__ == "__main__":
    main()

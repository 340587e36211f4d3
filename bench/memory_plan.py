"""GPU memory per rank of every shipped training config, colocated (one process per GPU: engines + trainer + teacher).

    python bench/memory_plan.py                          # every config in bench/memory_targets.yaml, 80 and 141 GB
    python bench/memory_plan.py --config configs/train/alfworld/qwen3-4b.yaml micro_batch_tokens=8192 --student Qwen3-4B
    python bench/memory_plan.py --layers                 # measured bytes per token and layer against the old formula

Each config is loaded through actfirst's own config loading (``load_config``, its ``base:`` files and overrides;
input paths unchecked), so every value below is the one the run uses. ``bench/memory_targets.yaml`` is the plan's
input: the GPU each shipped config is sized for (``gpu``) and the published model shapes its placeholder paths stand
for. ``tests/test_memory_plan.py`` fails when a config under configs/train/ is missing there or its peak exceeds its
GPU. docs/memory.md has the table and the arithmetic; per rank of R (GiB = 2**30 bytes):

- student under FSDP2: float32 parameters, float32 gradients and AdamW's two moments, sharded: 16 P / R.
- update transients: the root unit (embeddings, final norm, an untied head) whole in bfloat16 from the first forward
  to the end of the backward (2 root), the LM-head gradient the fused op (``kernels.dispatch``) computes in the forward
  and holds until the backward (2 V h, bfloat16), one block gathered and the next prefetched (2 x 2 block) with its
  bfloat16 gradient and float32 reduce-scatter buffer (6 block); at the end of the backward the root's own bfloat16
  gradient and its float32 reduce-scatter buffer (6 root) instead of the activations.
- activations of one micro-batch (``micro_batch_tokens`` = T, or one sample when that is longer, with several
  samples): per layer a T + b T^2 bytes with a, b measured on the real Hugging Face layers
  (``bench/activation_probe.py`` -> ``bench/activation_bytes.json``), for packed rows through a block mask
  (flash-attn varlen or flex attention: the flex measurement) or, for ``parallel.attention: sdpa``, whose samples
  get padded rows of their own (``actfirst.train.packing``), one sample of T tokens (a bound). With
  ``parallel.activation_checkpointing`` every layer keeps its input only and the backward recomputes one layer at a
  time (its full figure once).
- teacher (its dtype): whole on every rank, or sharded (1/R, plus its root and two blocks gathered); scoring a
  micro-batch holds about one layer's activations at a time (no gradient), bounded by the measured figure.
- engines: vLLM takes ``gpu_memory_utilization`` x the GPU (its weights, KV cache and activations); UOPD adds the
  teacher's engine at ``uopd.teacher_gpu_memory_utilization``, which never sleeps. ``student.sleep_level`` 1 or 2
  frees the student engine's share during scoring and the update.
- weight sync: one bucket of gathered weights (``parallel.sync_bucket_mb``) while the engine is awake.
- slack: the CUDA context, NCCL buffers and the caching allocator's fragmentation (``--slack-gib``, 3 GiB).

Peak = max(rollout + sync bucket; scoring; update). The KV column is what the student engine keeps for its KV cache
(its share minus bfloat16 weights and ``ENGINE_WORKSPACE_GIB`` for its activations), in tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml
from activation_probe import OUT as ACTIVATIONS
from activation_probe import SHAPES

from actfirst.core.config import ConfigError, TrainConfig
from actfirst.core.schema import load_config, paths_unchecked
from actfirst.core.user_input import command
from actfirst.rollout.strategies import STRATEGIES

ROOT = Path(__file__).resolve().parents[1]
TARGETS = Path(__file__).with_name("memory_targets.yaml")
GIB = 2**30
ENGINE_WORKSPACE_GIB = 2.0
"""vLLM's own activations and sampler buffers at ``max_num_batched_tokens`` 8,192 (an estimate)."""


def params(shape: str) -> tuple[int, int, int]:
    """(all parameters, one block's, the root unit's) of a published shape."""
    arch, h, heads, kv, hd, inter, layers, vocab, tied = SHAPES[shape]
    q, k = heads * hd, kv * hd
    block = 2 * h * q + 2 * h * k + 3 * h * inter + 2 * h + (2 * hd if arch == "qwen3" else q + 2 * k)
    root = vocab * h * (1 if tied else 2) + h
    return layers * block + root, block, root


def load_targets(path: Path = TARGETS) -> dict:
    """The plan's input: GPUs by name (GiB), ranks, and each shipped config's GPU and model shapes."""
    targets = yaml.safe_load(path.read_text())
    for name, entry in targets["configs"].items():
        for key in ("student", "teacher"):
            if entry[key] not in SHAPES:
                raise ConfigError(f"{path.name}: {name}: {key}={entry[key]!r}: must be one of {list(SHAPES)}")
        if entry["gpu"] not in targets["gpus"]:
            raise ConfigError(f"{path.name}: {name}: gpu={entry['gpu']!r}: must be one of {list(targets['gpus'])}")
    return targets


def load_activations(path: Path = ACTIVATIONS) -> dict:
    """The measured coefficients (``bench/activation_probe.py``'s output)."""
    return json.loads(path.read_text())["shapes"]


def load_train_config(path: Path, overrides: list[str] | None = None) -> TrainConfig:
    """A training config as the run loads it, but for its input paths (unchecked: the shipped ones are placeholders)
    and its ``env:`` section (dropped: the simulators' settings and data, such as ALFWorld's games on disk, take no
    GPU memory)."""
    with paths_unchecked():
        return load_config(TrainConfig, path, [*(overrides or []), "env=null"])


def activation_gib(measured: dict, row: str, tokens: int, layers: int, checkpointed: bool) -> float:
    """Bytes autograd keeps for one ``tokens``-long micro-batch over ``layers`` layers, in GiB."""
    full = measured[row]

    def per_layer(m: dict) -> float:
        return m["per_token"] * tokens + m["per_token_sq"] * tokens**2

    once = (full["shared_per_token"] * tokens + full["shared_per_token_sq"] * tokens**2
            + full["outside_per_token"] * tokens)
    if not checkpointed:
        return (layers * per_layer(full) + once) / GIB
    return (layers * per_layer(measured[row + "_checkpointed"]) + per_layer(full) + once) / GIB


def row_kind(attention: str) -> str:
    """The measured row kind that bounds a micro-batch of several samples under ``parallel.attention`` =
    ``attention``: SDPA's padded rows (``actfirst.train.packing``: one causal sample per row) by one sample of all
    its tokens, else a packed row's block mask (flash-attn varlen or flex attention: ``auto`` on a GPU)."""
    return "one" if attention == "sdpa" else "packed_flex"


def student_update_gib(student: str, *, tokens: int, row: str, checkpointed: bool, ranks: int,
                       measured: dict) -> dict[str, float]:
    """The student's part of the update phase at one rank, in GiB: its shards, the transients the update holds, the
    activations of one ``tokens``-long micro-batch of kind ``row`` ("one", "packed_sdpa", "packed_flex"), and
    ``update``, their peak (see the module docstring)."""
    _, h, _, _, _, _, layers, vocab, _ = SHAPES[student]
    p, block, root = params(student)
    shards = 16 * p / ranks / GIB
    acts = activation_gib(measured[student], row, tokens, layers, checkpointed)
    held = (2 * root + 2 * vocab * h + 2 * 2 * block + 6 * block) / GIB
    end_of_backward = (2 * root + 6 * root) / GIB
    return {"student_shards": shards, "transients": held, "activations": acts,
            "update": shards + max(held + acts, end_of_backward)}


def plan(cfg: TrainConfig, student: str, teacher: str, *, gpu_gib: float, ranks: int, measured: dict,
         slack_gib: float = 3.0) -> dict:
    """One config's per-rank memory in GiB (see the module docstring)."""
    _, _, _, kv, hd, _, layers, _, _ = SHAPES[student]
    p, _, _ = params(student)
    tp, tblock, troot = params(teacher)
    # a sample longer than micro_batch_tokens gets a micro-batch of its own
    longest = cfg.rollout.max_prompt_tokens + max(cfg.rollout.budget.total, cfg.rollout.budget.fast_action_tokens)
    tokens, row = max(cfg.micro_batch_tokens, longest), row_kind(cfg.parallel.attention)
    own = student_update_gib(student, tokens=tokens, row=row, checkpointed=cfg.parallel.activation_checkpointing,
                             ranks=ranks, measured=measured)
    shards = own["student_shards"]
    tbytes = {"bfloat16": 2, "float16": 2, "float32": 4}[cfg.teacher_dtype]
    teacher_gib = (tbytes * tp if cfg.parallel.teacher == "replicate"
                   else tbytes * (tp / ranks + troot + 2 * tblock)) / GIB
    teacher_scoring = activation_gib(measured[teacher], row, tokens, 1, False) * tbytes / 2
    engine = cfg.student.gpu_memory_utilization * gpu_gib
    second = cfg.uopd.teacher_gpu_memory_utilization * gpu_gib if STRATEGIES[cfg.rollout.strategy].intervenes else 0.0
    awake_in_update = engine if cfg.student.sleep_level == 0 else 0.0
    resident = shards + teacher_gib + second + slack_gib
    phases = {
        "rollout": resident + engine + cfg.parallel.sync_bucket_mb / 1024,
        "score": resident + awake_in_update + teacher_scoring,
        "update": resident - shards + awake_in_update + own["update"],
    }
    kv_gib = engine - 2 * p / GIB - ENGINE_WORKSPACE_GIB
    kv_tokens = max(0.0, kv_gib) * GIB / (layers * 2 * kv * hd * 2)
    teacher_kv = second - 2 * tp / GIB - ENGINE_WORKSPACE_GIB if second else None
    peak = max(phases.values())
    return {"student_shards": shards, "transients": own["transients"], "activations": own["activations"],
            "teacher": teacher_gib,
            "engines": engine + second, "phases": phases, "peak": peak, "gpu_gib": gpu_gib,
            "kv_tokens": kv_tokens, "teacher_kv_gib": teacher_kv, "fits": peak <= gpu_gib and kv_gib > 0
            and (teacher_kv is None or teacher_kv > 0)}


def settings(cfg: TrainConfig) -> str:
    """What the table shows of a config's memory-relevant values."""
    parts = [f"T={cfg.micro_batch_tokens}", f"engine {cfg.student.gpu_memory_utilization}"]
    if STRATEGIES[cfg.rollout.strategy].intervenes:
        parts.append(f"+ teacher engine {cfg.uopd.teacher_gpu_memory_utilization}")
    if cfg.parallel.activation_checkpointing:
        parts.append("AC")
    if cfg.parallel.teacher == "shard":
        parts.append("teacher sharded")
    if cfg.student.sleep_level:
        parts.append(f"sleep {cfg.student.sleep_level}")
    return ", ".join(parts)


def table(targets: dict, measured: dict, gpus: list[str], slack_gib: float) -> list[str]:
    """Markdown rows, one per config in ``targets``: the terms that do not depend on the GPU, then the peak (and the
    engines' share) on each GPU in ``gpus``, the KV cache and whether it fits on its own GPU."""
    head = ("| config | student / teacher | settings | shards | transients | activations | teacher | "
            + " | ".join(f"peak on {g} (engines)" for g in gpus) + " | its GPU | KV tokens there | fits |")
    rows = [head, "|---" * (head.count("|") - 1) + "|"]
    for name, entry in targets["configs"].items():
        cfg = load_train_config(ROOT / "configs" / "train" / name)
        r = {g: plan(cfg, entry["student"], entry["teacher"], gpu_gib=targets["gpus"][g], ranks=targets["ranks"],
                     measured=measured, slack_gib=slack_gib) for g in {*gpus, entry["gpu"]}}
        own = r[entry["gpu"]]
        peaks = " | ".join(f"{r[g]['peak']:.1f} ({r[g]['engines']:.1f})" for g in gpus)
        rows.append(f"| {name} | {entry['student']} / {entry['teacher']} | {settings(cfg)} | "
                    f"{own['student_shards']:.1f} | {own['transients']:.1f} | {own['activations']:.1f} | "
                    f"{own['teacher']:.1f} | {peaks} | {entry['gpu']} | {own['kv_tokens'] / 1000:.0f}k | "
                    f"{'yes' if own['fits'] else 'NO'} |")
    return rows


def layer_table(measured: dict) -> list[str]:
    """Markdown rows: the measured bytes per token and layer of each shape against the formula used before."""
    head = ("| shape | old formula | one sample | packed, SDPA (dense mask) | packed, flex (block mask) | "
            "checkpointed | measured / old (one sample) |")
    rows = [head, "|---" * (head.count("|") - 1) + "|"]
    for shape, m in measured.items():
        dense = f"{m['packed_sdpa']['per_token']:,.0f} + {m['packed_sdpa']['per_token_sq']:.2f} T"
        rows.append(f"| {shape} | {m['old_formula']:,} | {m['one']['per_token']:,.0f} | {dense} | "
                    f"{m['packed_flex']['per_token']:,.0f} | {m['one_checkpointed']['per_token']:,.0f} | "
                    f"{m['one']['per_token'] / m['old_formula']:.2f} |")
    return rows


@command
def main(argv: list[str] | None = None) -> int:
    """Print the table (every shipped config), or one config's figures with overrides (``--config``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, help="one training config (its shapes: --student, --teacher)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides for --config (key=value)")
    parser.add_argument("--student", default="Qwen3-1.7B", choices=list(SHAPES))
    parser.add_argument("--teacher", default="Qwen3-8B", choices=list(SHAPES))
    parser.add_argument("--gpus", nargs="+", default=None, help="GPU names of memory_targets.yaml (default: all)")
    parser.add_argument("--slack-gib", type=float, default=3.0)
    parser.add_argument("--layers", action="store_true", help="print the measured bytes per token and layer instead")
    args = parser.parse_args(argv)
    targets, measured = load_targets(), load_activations()
    if args.layers:
        print("\n".join(layer_table(measured)))
        return 0
    gpus = args.gpus or list(targets["gpus"])
    unknown = [g for g in gpus if g not in targets["gpus"]]
    if unknown:
        raise ConfigError(f"--gpus={unknown}: must be among {list(targets['gpus'])}")
    if args.config is None:
        print("\n".join(table(targets, measured, gpus, args.slack_gib)))
        return 0
    cfg = load_train_config(args.config, args.overrides)
    for gpu in gpus:
        r = plan(cfg, args.student, args.teacher, gpu_gib=targets["gpus"][gpu], ranks=targets["ranks"],
                 measured=measured, slack_gib=args.slack_gib)
        figures = {k: round(v, 1) for k, v in {**r, **r.pop("phases")}.items() if isinstance(v, float)}
        print(f"{gpu} ({settings(cfg)}): fits={r['fits']} {json.dumps(figures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

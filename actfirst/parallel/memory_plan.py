"""GPU memory per rank of a training config, colocated (one process per GPU: engines + trainer + teacher): what
``python -m actfirst.run --dry-run`` prints for one run and ``bench/memory_plan.py`` for every shipped config
(docs/memory.md has the table and the arithmetic). Per rank of R (GiB = 2**30 bytes):

- student under FSDP2: float32 parameters, float32 gradients and AdamW's two moments, sharded: 16 P / R.
- update transients: the root unit (embeddings, final norm, an untied head) whole in bfloat16 from the first forward
  to the end of the backward (2 root), the LM-head gradient the fused op (``kernels.dispatch``) computes in the forward
  and holds until the backward (2 V h, bfloat16), one block gathered and the next prefetched (2 x 2 block) with its
  bfloat16 gradient and float32 reduce-scatter buffer (6 block); at the end of the backward the root's own bfloat16
  gradient and its float32 reduce-scatter buffer (6 root) instead of the activations.
- activations of one micro-batch (``micro_batch_tokens`` = T, packed with several samples): per layer a T + b T^2
  bytes with a, b measured on the real Hugging Face layers (``bench/activation_probe.py`` ->
  ``activation_bytes.json`` beside this module), for packed rows through SDPA's dense mask
  (``parallel.attention: sdpa``) or a block mask (flash-attn varlen or flex attention: the flex measurement). With
  ``parallel.activation_checkpointing`` every layer keeps its input only and the backward recomputes one layer at a
  time (its full figure once).
- teacher (its dtype): whole on every rank, or sharded (1/R, plus its root and two blocks gathered); scoring a
  micro-batch holds about one layer's activations at a time (no gradient), bounded by the measured figure.
- engines: vLLM takes ``gpu_memory_utilization`` x the GPU (its weights, KV cache and activations); UOPD adds the
  teacher's engine at ``uopd.teacher_gpu_memory_utilization``, which never sleeps. ``student.sleep_level`` 1 or 2
  frees the student engine's share during scoring and the update.
- weight sync: one bucket of gathered weights (``parallel.sync_bucket_mb``) while the engine is awake.
- slack: the CUDA context, NCCL buffers and the caching allocator's fragmentation (3 GiB).

Peak = max(rollout + sync bucket; scoring; update). The KV figure is what the student engine keeps for its KV cache
(its share minus bfloat16 weights and :data:`ENGINE_WORKSPACE_GIB` for its activations), in tokens.

The activation bytes are measured for the published shapes (:data:`SHAPES`) only; :func:`model_shape` finds which
one a model is (from its ``config.json``, else from its name).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from actfirst.core.config import TrainConfig
from actfirst.rollout.strategies import STRATEGIES

GIB = 2**30
ACTIVATIONS = Path(__file__).with_name("activation_bytes.json")
"""The measured bytes per token and layer (``bench/activation_probe.py`` writes them)."""
ENGINE_WORKSPACE_GIB = 2.0
"""vLLM's own activations and sampler buffers at ``max_num_batched_tokens`` 8,192 (an estimate)."""
SLACK_GIB = 3.0
"""The CUDA context, NCCL buffers and the caching allocator's fragmentation."""
GPUS = {"80GB": 79.6, "141GB": 140.4}
"""The GPU classes the shipped configs are sized for, in GiB as their smallest card reports it (80GB: an H100's
81,559 MiB; 141GB: an H200's 143,771 MiB)."""
SHAPES = {
    # architecture, hidden, heads, KV heads, head_dim, intermediate, layers, vocabulary, tied embeddings
    # (the published config.json files; the probe builds two layers of each, the memory plan counts all)
    "Qwen3-0.6B": ("qwen3", 1024, 16, 8, 128, 3072, 28, 151936, True),
    "Qwen3-1.7B": ("qwen3", 2048, 16, 8, 128, 6144, 28, 151936, True),
    "Qwen3-4B": ("qwen3", 2560, 32, 8, 128, 9728, 36, 151936, True),
    "Qwen3-8B": ("qwen3", 4096, 32, 8, 128, 12288, 36, 151936, False),
    "Qwen2.5-1.5B": ("qwen2", 1536, 12, 2, 128, 8960, 28, 151936, True),
    "Qwen2.5-3B": ("qwen2", 2048, 16, 2, 128, 11008, 36, 151936, True),
    "Qwen2.5-7B": ("qwen2", 3584, 28, 4, 128, 18944, 28, 152064, False),
}


def load_activations(path: Path = ACTIVATIONS) -> dict:
    """The measured coefficients (``bench/activation_probe.py``'s output), by shape."""
    return json.loads(path.read_text())["shapes"]


def model_shape(name: str, model_dir: Path | None) -> tuple[str | None, str]:
    """The published shape (a key of :data:`SHAPES`) of the model named ``name``, and how it was found: from the
    ``config.json`` of ``model_dir`` (its resolved directory) when there is one, every dimension compared; else from
    the name (``/models/Qwen3-1.7B``, ``Qwen/Qwen3-8B``, ``alfworld-teacher-qwen3-8b``: the longest shape named in
    it). ``(None, why)`` when neither tells."""
    config = model_dir / "config.json" if model_dir is not None else None
    if config is not None and config.is_file():
        c = json.loads(config.read_text())
        heads = c.get("num_attention_heads", 0)
        dims = (c.get("model_type"), c.get("hidden_size"), heads, c.get("num_key_value_heads", heads),
                c.get("head_dim") or c.get("hidden_size", 0) // max(heads, 1), c.get("intermediate_size"),
                c.get("num_hidden_layers"), c.get("vocab_size"), bool(c.get("tie_word_embeddings", False)))
        found = [shape for shape, published in SHAPES.items() if published == dims]
        if found:
            return found[0], f"from {config}"
        return None, f"its config.json (hidden {dims[1]}, {dims[6]} layers) is none of the measured {list(SHAPES)}"
    lowered = re.sub(r"[^a-z0-9.]", "-", name.lower())
    named = sorted((s for s in SHAPES if re.search(rf"(^|-){re.escape(s.lower())}($|-)", lowered)), key=len)
    if named:
        return named[-1], "from its name; the model is not here"
    return None, f"the model is not here and its name names none of the measured {list(SHAPES)}"


def params(shape: str) -> tuple[int, int, int]:
    """(all parameters, one block's, the root unit's) of a published shape."""
    arch, h, heads, kv, hd, inter, layers, vocab, tied = SHAPES[shape]
    q, k = heads * hd, kv * hd
    block = 2 * h * q + 2 * h * k + 3 * h * inter + 2 * h + (2 * hd if arch == "qwen3" else q + 2 * k)
    root = vocab * h * (1 if tied else 2) + h
    return layers * block + root, block, root


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


def packed_row(attention: str) -> str:
    """The measured row kind of a packed micro-batch under ``parallel.attention`` = ``attention``: a dense mask
    through SDPA, else a block mask (flash-attn varlen or flex attention: ``auto`` on a GPU)."""
    return "packed_sdpa" if attention == "sdpa" else "packed_flex"


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
         slack_gib: float = SLACK_GIB) -> dict:
    """One config's per-rank memory in GiB with a ``student`` and a ``teacher`` of those published shapes (see the
    module docstring): every term, each phase's total, the peak, the KV cache in tokens and whether it fits."""
    _, _, _, kv, hd, _, layers, _, _ = SHAPES[student]
    p, _, _ = params(student)
    tp, tblock, troot = params(teacher)
    tokens, row = cfg.micro_batch_tokens, packed_row(cfg.parallel.attention)
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
    """A config's memory-relevant values, in a few words."""
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

"""The memory plan over every shipped training config (actfirst.parallel.memory_plan through bench/memory_plan.py),
and the probe it reads.

Each config under configs/train/ states its GPU in bench/memory_targets.yaml; its planned peak per rank, from the
activation bytes measured on the real Hugging Face layers (actfirst/parallel/activation_bytes.json), must fit that GPU.
"""

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import activation_probe as probe  # noqa: E402
import memory_plan  # noqa: E402

from actfirst.parallel.memory_plan import GPUS, load_activations, model_shape, plan  # noqa: E402

TRAIN = ROOT / "configs" / "train"
SHIPPED = sorted(p.relative_to(TRAIN).as_posix() for p in TRAIN.rglob("*.yaml"))
TARGETS = memory_plan.load_targets()
MEASURED = load_activations()


def planned(name: str, overrides: list[str] | None = None, gpu: str | None = None) -> dict:
    entry = TARGETS["configs"][name]
    cfg = memory_plan.load_train_config(TRAIN / name, overrides)
    return plan(cfg, entry["student"], entry["teacher"], gpu_gib=GPUS[gpu or entry["gpu"]],
                            ranks=TARGETS["ranks"], measured=MEASURED)


def test_every_shipped_config_states_its_gpu():
    assert sorted(TARGETS["configs"]) == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_config_fits_its_gpu(name):
    r = planned(name)
    phases = ", ".join(f"{k} {v:.1f}" for k, v in r["phases"].items())
    assert r["fits"], (f"{name}: planned peak {r['peak']:.1f} GiB per rank on {TARGETS['configs'][name]['gpu']} "
                       f"({r['gpu_gib']} GiB; {phases}; KV tokens {r['kv_tokens']:.0f}): see docs/memory.md")


def test_the_plan_refuses_what_does_not_fit():
    """The same 4B config with twice the micro-batch and without checkpointing exceeds an 80 GB GPU."""
    r = planned("alfworld/qwen3-4b.yaml", ["micro_batch_tokens=16384", "parallel.activation_checkpointing=false"],
                gpu="80GB")
    assert not r["fits"] and r["peak"] > GPUS["80GB"]


def test_the_plan_reads_the_config_values():
    """Checkpointing, micro-batch size and UOPD's second engine, as loaded through actfirst's config loading."""
    off = planned("alfworld/qwen3-1.7b.yaml", ["parallel.activation_checkpointing=false"])
    on = planned("alfworld/qwen3-1.7b.yaml", ["parallel.activation_checkpointing=true"])
    assert on["activations"] < off["activations"] / 4
    half = planned("alfworld/qwen3-1.7b.yaml", ["parallel.activation_checkpointing=false", "micro_batch_tokens=4096"])
    assert half["activations"] < off["activations"] / 2  # linear in T, plus the dense mask's T^2 on main
    gpu = GPUS[TARGETS["configs"]["alfworld/uopd-qwen2.5-3b.yaml"]["gpu"]]
    uopd = memory_plan.load_train_config(TRAIN / "alfworld/uopd-qwen2.5-3b.yaml")
    expected = (uopd.student.gpu_memory_utilization + uopd.uopd.teacher_gpu_memory_utilization) * gpu
    assert planned("alfworld/uopd-qwen2.5-3b.yaml")["engines"] == pytest.approx(expected)
    opd = memory_plan.load_train_config(TRAIN / "alfworld/opd-qwen2.5-3b.yaml")
    assert planned("alfworld/opd-qwen2.5-3b.yaml")["engines"] == pytest.approx(opd.student.gpu_memory_utilization * gpu)


def test_measured_coefficients_cover_every_shape_and_row():
    record = json.loads(probe.ACTIVATIONS.read_text())
    assert record["command"].startswith("python bench/activation_probe.py") and record["date"] and record["machine"]
    rows = {row + suffix for row in probe.ROWS for suffix in ("", "_checkpointed")}
    for shape in probe.SHAPES:
        assert rows <= set(record["shapes"][shape]), shape


@pytest.fixture
def tiny(monkeypatch):
    """A Qwen3 shape small enough to probe in a second (hidden 64, 4 heads, 2 KV heads, head_dim 16)."""
    monkeypatch.setitem(probe.SHAPES, "tiny", ("qwen3", 64, 4, 2, 16, 128, 2, 512, True))
    probe.allow_flex_forward_for_backward_on_cpu()
    return "tiny"


def test_probe_counts_what_autograd_keeps(tiny):
    """Checkpointed layers keep their bfloat16 input only; the dense mask of a packed SDPA row adds a T x T bias per
    layer (2 bytes each) and expanded KV heads; flex attention's block mask adds no T^2 term."""
    torch.set_num_threads(1)
    h, tokens = 64, [32, 64, 128]

    def second_layer(attention: str, samples: int, checkpointed: bool = False) -> list[int]:
        model = probe.build(tiny, attention)
        if checkpointed:
            probe.checkpoint_blocks(model)
        return [probe.saved_bytes(model, t, samples)[1] for t in tokens]

    assert second_layer("sdpa", 1, checkpointed=True) == [2 * h * t for t in tokens]
    a_one, b_one = probe.fit(tokens, second_layer("sdpa", 1), quadratic=True)
    a_dense, b_dense = probe.fit(tokens, second_layer("sdpa", 2), quadratic=True)
    a_flex, b_flex = probe.fit(tokens, second_layer("flex_attention", 2), quadratic=True)
    assert abs(b_one) < 1e-6 and abs(b_flex) < 1e-6
    assert b_dense == pytest.approx(2.0)
    assert a_dense > a_one and a_flex >= a_one
    assert a_one > probe.old_formula(tiny)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_config_states_tasks_per_rank_for_its_node(name):
    """Each engine's share of a rollout batch is written in the config and adds up to the batch on the node's ranks
    (the trainer refuses a run on another number of ranks: tests/test_configs.py)."""
    cfg = memory_plan.load_train_config(TRAIN / name)
    assert cfg.rollout.tasks_per_rank is not None
    assert cfg.rollout.tasks_per_rank * TARGETS["ranks"] == cfg.rollout.batch_tasks


def test_a_model_shape_from_its_config_json_else_from_its_name(tmp_path):
    """The dry run's shapes: every shipped config's placeholder paths name the shapes memory_targets.yaml states;
    a model directory is matched by its config.json, dimension for dimension."""
    for name, entry in TARGETS["configs"].items():
        cfg = memory_plan.load_train_config(TRAIN / name)
        assert model_shape(cfg.student.model, None)[0] == entry["student"], name
        assert model_shape(cfg.teacher, None)[0] == entry["teacher"], name
    assert model_shape("Qwen/Qwen3-8B", None) == ("Qwen3-8B", "from its name; the model is not here")
    assert model_shape("/models/my-model", None)[0] is None
    arch, h, heads, kv, hd, inter, layers, vocab, tied = ("qwen3", 2048, 16, 8, 128, 6144, 28, 151936, True)
    config = {"model_type": arch, "hidden_size": h, "num_attention_heads": heads, "num_key_value_heads": kv,
              "head_dim": hd, "intermediate_size": inter, "num_hidden_layers": layers, "vocab_size": vocab,
              "tie_word_embeddings": tied}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert model_shape("/models/renamed", tmp_path)[0] == "Qwen3-1.7B"  # the config, not the name
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2}))
    shape, why = model_shape("Qwen/Qwen3-1.7B", tmp_path)
    assert shape is None and "none of the measured" in why

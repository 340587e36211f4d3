"""Models built on the meta device, sharded, then filled from safetensors (``actfirst.models.loading``): on 1 and 2
gloo ranks the student's full parameters and buffers equal ``from_pretrained``'s exactly, so do its logits, tied
weights stay one parameter, and each rank holds only its shard; the teacher (replicated or sharded) likewise in its
dtype; a checkpoint that lacks a tensor is refused naming it."""

import copy
import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from train_helpers import random_samples, spawn_ranks

from actfirst.core.config import ModelConfig
from actfirst.models.build import build_model
from actfirst.models.loading import WeightsError, empty_model, load_weights, local_shape_and_offset


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory):
    """A tiny Qwen3 with ``lm_head`` tied to ``embed_tokens`` (as Qwen3-0.6B to 4B), saved in bfloat16 (as the Hub's
    Qwen3 checkpoints are), with an odd MLP width that 2 ranks cut unevenly."""
    cfg = ModelConfig(tokenizer="env-bpe", hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=32, intermediate_size=97, tie_word_embeddings=True, seed=3)
    out = build_model(cfg, tmp_path_factory.mktemp("tied") / "tied")
    weights = load_file(out / "model.safetensors")
    assert "lm_head.weight" not in weights  # a tied checkpoint holds the embedding only
    save_file({k: v.to(torch.bfloat16) for k, v in weights.items()}, out / "model.safetensors",
              metadata={"format": "pt"})
    return out


def _logits(head, samples):
    """The logits at every supervised position of one packed row (whole weights inside the root's forward)."""
    from actfirst.train.packing import pack

    (mb,) = pack(samples, 10_000, head.layout)
    with torch.no_grad():
        return head(mb, lambda hidden, weight: hidden @ weight.T)


def load_rank(cases, samples):
    """One rank: for each (model directory, dtype) of ``cases``, what :func:`compare_loads` finds."""
    from actfirst.parallel.context import init_parallel

    ctx = init_parallel()
    return [compare_loads(ctx, model_dir, getattr(torch, dtype), samples) for model_dir, dtype in cases]


def compare_loads(ctx, model_dir, dtype, samples):
    """``from_pretrained`` whole, and the same model loaded sharded on meta: what each holds."""
    from transformers import AutoModelForCausalLM

    from actfirst.parallel.fsdp import apply_fsdp, full_tensor
    from actfirst.train.head import LMHeadModel

    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model = empty_model(model_dir, dtype)
    policy = LMHeadModel(model)
    apply_fsdp(policy, policy.blocks, ctx.mesh)
    load_weights(model, model_dir, ctx.device)
    embed, gate = model.model.embed_tokens.weight, model.model.layers[0].mlp.gate_proj.weight
    return {
        "reference": {k: v.clone() for k, v in reference.state_dict().items()},
        "loaded": {k: full_tensor(v).clone() for k, v in model.state_dict().items()},
        "reference_buffers": dict(reference.named_buffers()),
        "loaded_buffers": {k: v.clone() for k, v in model.named_buffers()},
        "tied": model.lm_head.weight is embed, "reference_tied": reference.lm_head.weight is
        reference.model.embed_tokens.weight,
        "local_rows": [embed.to_local().shape[0], gate.to_local().shape[0]],
        "chunk_rows": [len(torch.chunk(torch.empty(t.shape[0]), ctx.world_size)[ctx.rank]) for t in (embed, gate)],
        "meta": [n for n, p in model.named_parameters() if p.to_local().is_meta],
        "reference_logits": _logits(LMHeadModel(reference), samples), "logits": _logits(policy, samples),
        "config": model.config.to_dict() == reference.config.to_dict(),
        "generation_config": model.generation_config.to_dict() == reference.generation_config.to_dict(),
    }


@pytest.mark.parametrize("world", [1, 2])
def test_sharded_load_equals_from_pretrained(tied_dir, tiny_model_dir, vocab_size, gen, world):
    samples = random_samples(gen, 3, vocab_size, scored=False)
    cases = [(str(tied_dir), "float32"), (str(tiny_model_dir), "float32"), (str(tied_dir), "bfloat16")]
    for rank, results in enumerate(spawn_ranks(load_rank, world, cases, samples)):
        for (model_dir, dtype), got in zip(cases, results, strict=True):
            where = f"{model_dir} {dtype} rank {rank}/{world}"
            assert list(got["loaded"]) == list(got["reference"]), where
            for name, tensor in got["reference"].items():
                assert got["loaded"][name].dtype == tensor.dtype and torch.equal(got["loaded"][name], tensor), \
                    f"{where}: {name}"
            assert list(got["loaded_buffers"]) == list(got["reference_buffers"]) != [], where  # rotary inv_freq
            for name, buffer in got["reference_buffers"].items():
                assert torch.equal(got["loaded_buffers"][name], buffer), f"{where}: {name}"
            assert torch.equal(got["logits"], got["reference_logits"]), where
            assert got["tied"] == got["reference_tied"] == (model_dir == str(tied_dir)), where
            assert got["local_rows"] == got["chunk_rows"], where  # this rank's rows only
            assert got["meta"] == [] and got["config"] and got["generation_config"], where


def teacher_rank(teacher_dir, student_dir, samples):
    """One rank: a replicated and a sharded teacher, as :func:`teacher_scores` finds them."""
    from actfirst.parallel.context import init_parallel

    ctx = init_parallel()
    return [teacher_scores(ctx, teacher_dir, student_dir, shard, samples) for shard in (False, True)]


def teacher_scores(ctx, teacher_dir, student_dir, shard, samples):
    """The teacher's scores, loaded through ``TeacherScorer.load`` and from ``from_pretrained``."""
    from transformers import AutoModelForCausalLM

    from actfirst.train.teacher import TeacherScorer

    kwargs = {"micro_batch_tokens": 60, "device": ctx.device}
    scorer = TeacherScorer.load(teacher_dir, student_tokenizer=student_dir, dtype="bfloat16",
                                shard=ctx if shard else None, **kwargs)
    reference = TeacherScorer(AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.bfloat16),
                              shard=ctx if shard else None, **kwargs)
    scored = samples[ctx.rank::ctx.world_size]
    expected = copy.deepcopy(scored)
    scorer.score(scored)
    reference.score(expected)
    dtypes = {p.dtype for p in scorer.head.parameters()}
    return {"got": [s.teacher_logprobs for s in scored], "expected": [s.teacher_logprobs for s in expected],
            "dtypes": dtypes, "eval": not scorer.head.model.training}


def test_teacher_loads_in_its_dtype_replicated_and_sharded(tied_dir, tiny_model_dir, vocab_size, gen):
    samples = random_samples(gen, 5, vocab_size, max_context=20, max_response=8, scored=False)
    for results in spawn_ranks(teacher_rank, 2, str(tied_dir), str(tiny_model_dir), samples):
        for got in results:
            assert got["got"] == got["expected"] and all(got["got"])
            assert got["dtypes"] == {torch.bfloat16} and got["eval"]


def test_a_missing_tensor_is_named(tiny_model_dir, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tiny_model_dir.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            (broken / f.name).write_bytes(f.read_bytes())
    weights = load_file(tiny_model_dir / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    # Split over two files with an index, as large checkpoints are.
    names = sorted(weights)
    parts = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in parts.items():
        save_file({k: weights[k] for k in keys}, broken / file, metadata={"format": "pt"})
    (broken / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: file for file, keys in parts.items() for k in keys}}))
    with pytest.raises(WeightsError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight'") as err:
        load_weights(empty_model(broken, torch.float32), broken, torch.device("cpu"))
    assert str(broken) in str(err.value)


def test_a_checkpoint_split_over_files_loads(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    split = tmp_path / "split"
    AutoModelForCausalLM.from_pretrained(tiny_model_dir).save_pretrained(split, max_shard_size="100KB")
    assert len(list(split.glob("*.safetensors"))) > 1
    model = empty_model(split, torch.float32)
    load_weights(model, split, torch.device("cpu"))
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert all(torch.equal(v, reference.state_dict()[k]) for k, v in model.state_dict().items())
    assert all(torch.equal(b, dict(reference.named_buffers())[k]) for k, b in model.named_buffers())


@pytest.mark.parametrize("rows,ranks", [(5, 4), (8, 2), (1, 2), (7, 3)])
def test_local_shape_and_offset_cut_as_torch_chunk(rows, ranks):
    from torch.distributed.tensor import Replicate, Shard

    whole = torch.arange(rows * 3).reshape(rows, 3)
    chunks = list(torch.chunk(whole, ranks)) + [whole[rows:]] * ranks  # the ranks past the last chunk: empty
    for k in range(ranks):
        shape, offset = local_shape_and_offset((rows, 3), [0, k], (2, ranks), [Replicate(), Shard(0)])
        assert torch.equal(whole[offset[0]:offset[0] + shape[0]], chunks[k]) and shape[1] == 3 and offset[1] == 0

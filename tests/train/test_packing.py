"""Packing: layout, alignment, a packed forward equal to separate per-sample forwards, the mask each attention
implementation gets, and ``parallel.attention``."""

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch
from train_helpers import random_samples
from transformers import Qwen3ForCausalLM

from actfirst.train.packing import final_hidden, pack


def test_layout_alignment_and_budget(gen):
    samples = random_samples(gen, 9, 500, max_context=20, max_response=10)
    samples[4].context_ids = list(range(60))  # longer than the budget: its own row
    mbs = pack(samples, max_tokens=40)
    seen = []
    for mb in mbs:
        assert mb.num_tokens <= 40 or mb.samples == [4]
        assert mb.samples == sorted(mb.samples)
        offset = 0
        for i in mb.samples:
            s = samples[i]
            row = mb.input_ids[offset:offset + s.num_tokens].tolist()
            assert row == s.context_ids + s.response_ids
            assert mb.position_ids[offset:offset + s.num_tokens].tolist() == list(range(s.num_tokens))
            sel = mb.sample_idx == i
            # The hidden state at index p scores token p + 1: the first response token is scored at the last
            # context token; every response token (masked ones too) is there, in order.
            assert mb.positions[sel].tolist() == list(range(offset + len(s.context_ids) - 1, offset + s.num_tokens - 1))
            assert mb.targets[sel].tolist() == s.response_ids
            assert mb.mask[sel].tolist() == [float(m) for m in s.loss_mask]
            torch.testing.assert_close(mb.logp_old[sel], torch.tensor(s.logprobs, dtype=torch.float32))
            torch.testing.assert_close(mb.logp_teacher[sel], torch.tensor(s.teacher_logprobs, dtype=torch.float32))
            offset += s.num_tokens
            seen.append(i)
        assert offset == mb.num_tokens  # no padding
        assert torch.equal(mb.targets, mb.input_ids[mb.positions + 1])
    assert sorted(seen) == list(range(9))
    # First fit: no two rows could have been one.
    loads = [mb.num_tokens for mb in mbs]
    assert all(a + b > 40 for k, a in enumerate(loads) for b in loads[k + 1:])


def test_teacher_logprobs_all_or_none(gen):
    samples = random_samples(gen, 3, 100)
    samples[1].teacher_logprobs = None
    with pytest.raises(ValueError, match="teacher_logprobs=None for sample 1"):
        pack(samples, 64)
    for s in samples:
        s.teacher_logprobs = None
    assert all(mb.logp_teacher is None for mb in pack(samples, 64))
    with pytest.raises(ValueError, match="max_tokens=0"):
        pack(samples, 0)


def separate_hidden(model, sample):
    ids = torch.tensor([sample.context_ids + sample.response_ids])
    h = model.model(input_ids=ids, use_cache=False).last_hidden_state[0]
    c = len(sample.context_ids)
    return h[c - 1:c - 1 + len(sample.response_ids)]


# Eager attention takes its softmax in float32 whatever the dtype (transformers), hence its looser float64 bound.
@pytest.mark.parametrize("attn,dtype,atol", [("sdpa", torch.float64, 1e-10), ("eager", torch.float64, 2e-6),
                                             ("sdpa", torch.float32, 2e-5), ("eager", torch.float32, 2e-5)])
def test_packed_forward_equals_separate_forwards(tiny_model_dir, gen, attn, dtype, atol):
    model = Qwen3ForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype, attn_implementation=attn).eval()
    samples = random_samples(gen, 6, model.config.vocab_size, max_context=30, max_response=12)
    (mb,) = pack(samples, max_tokens=10_000)
    assert len(mb.samples) == 6
    with torch.no_grad():
        packed = final_hidden(model, mb)
        expected = torch.cat([separate_hidden(model, samples[i]) for i in mb.samples])
        # Sensitivity: the same row without restarts (one long sequence) lets samples see each other.
        leaky = model.model(input_ids=mb.input_ids[None], use_cache=False).last_hidden_state[0, mb.positions]
    assert packed.shape == (sum(len(s.response_ids) for s in samples), model.config.hidden_size)
    torch.testing.assert_close(packed, expected, atol=atol, rtol=0)
    assert (leaky - expected).abs().max() > 1e-2


def test_the_mask_each_attention_gets_for_a_packed_row(tiny_model_dir, eager_flex):
    """What transformers builds from position_ids restarts (no attention mask): sdpa a dense [1, 1, T, T] boolean
    mask (block-diagonal causal) for several samples and none for one; flex a block mask; flash-attn none (its
    varlen kernel takes the boundaries from position_ids)."""
    from torch.nn.attention.flex_attention import BlockMask
    from transformers.masking_utils import create_causal_mask

    model = Qwen3ForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    two = torch.cat([torch.arange(5), torch.arange(3)])[None]
    embeds = torch.zeros(1, 8, model.config.hidden_size)

    def mask(impl, position_ids):
        model.config._attn_implementation = impl
        return create_causal_mask(config=model.config, inputs_embeds=embeds, attention_mask=None,
                                  past_key_values=None, position_ids=position_ids)

    dense = mask("sdpa", two)
    assert dense.shape == (1, 1, 8, 8) and dense.dtype == torch.bool
    expected = torch.block_diag(torch.ones(5, 5), torch.ones(3, 3)).tril().bool()
    assert torch.equal(dense[0, 0], expected)
    assert mask("sdpa", torch.arange(8)[None]) is None  # one sample: is_causal, no mask
    assert isinstance(mask("flex_attention", two), BlockMask)
    assert mask("flash_attention_2", two) is None


@pytest.fixture
def eager_flex(monkeypatch):
    """FlexAttention and its block mask without the torch.compile that transformers applies to both: compiling them
    takes about 20 s per shape on this CPU, and the CPU's compiled kernel is not the GPU's Triton one anyway; torch's
    eager FlexAttention computes the same attention under the same block mask (the device check runs the compiled
    one). Only the compile step is replaced."""
    from torch.nn.attention import flex_attention as torch_flex
    from transformers import masking_utils
    from transformers.integrations import flex_attention as hf_flex

    def eager_attention(query, key, value, training=False, **kwargs):
        return torch_flex.flex_attention(query, key, value, **kwargs)

    def eager_block_mask(*args, _compile=False, **kwargs):
        return torch_flex.create_block_mask(*args, _compile=False, **kwargs)

    monkeypatch.setattr(hf_flex, "compile_friendly_flex_attention", eager_attention)
    monkeypatch.setattr(masking_utils, "create_block_mask", eager_block_mask)


@pytest.mark.parametrize("attention", ["sdpa", "flex_attention"])
def test_teacher_logprobs_packed_equal_unpacked(tiny_model_dir, gen, eager_flex, attention):
    """The teacher's scores of samples packed into one row equal those of each sample in a row of its own (one-sample
    rows: plain causal attention, no mask), through ``parallel.attention`` (FlexAttention: forward only on the CPU)."""
    from actfirst.train.teacher import TeacherScorer

    model = Qwen3ForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    samples = random_samples(gen, 4, model.config.vocab_size, max_context=30, max_response=12, scored=False)
    alone = [dataclasses.replace(s) for s in samples]
    packed_scorer = TeacherScorer(model, micro_batch_tokens=10_000, device="cpu", attention=attention)
    assert model.config._attn_implementation == attention
    packed_scorer.score(samples)
    TeacherScorer(model, micro_batch_tokens=1, device="cpu", attention="sdpa").score(alone)
    for s, a in zip(samples, alone, strict=True):
        torch.testing.assert_close(torch.tensor(s.teacher_logprobs), torch.tensor(a.teacher_logprobs),
                                   atol=2e-5, rtol=0)


def test_attention_choice_and_refusals(tmp_path):
    from actfirst.core.config import TrainConfig
    from actfirst.core.schema import load_config, paths_unchecked
    from actfirst.core.user_input import ConfigError
    from actfirst.train.packing import attention_implementation

    bf16, f32 = torch.bfloat16, torch.float32
    gpu = torch.device("cuda", 0)
    assert attention_implementation("auto", "cpu", bf16, backward=True) == "sdpa"
    flash = importlib.util.find_spec("flash_attn") is not None
    assert attention_implementation("auto", gpu, bf16, backward=True) == ("flash_attention_2" if flash else
                                                                          "flex_attention")
    assert attention_implementation("auto", gpu, f32, backward=True) == "flex_attention"  # flash-attn: 16-bit only
    assert attention_implementation("flex_attention", "cpu", f32, backward=False) == "flex_attention"  # the teacher
    with pytest.raises(ConfigError, match=r"^parallel.attention='flex_attention': .*no FlexAttention backward"):
        attention_implementation("flex_attention", "cpu", f32, backward=True)
    with pytest.raises(ConfigError, match=r"^parallel.attention='flash_attention_2': "):
        attention_implementation("flash_attention_2", "cpu", bf16, backward=False)
    with pytest.raises(ConfigError, match=r"^parallel.attention='flash_attention_2': "):
        attention_implementation("flash_attention_2", gpu, f32, backward=False)
    demo = Path(__file__).parents[2] / "configs" / "demo" / "scienceworld_lifespan.yaml"
    with paths_unchecked():
        assert load_config(TrainConfig, demo).parallel.attention == "auto"
        with pytest.raises(ConfigError, match=r"^parallel.attention='dense': must be one of \['auto', "):
            load_config(TrainConfig, demo, ["parallel.attention=dense"])


@pytest.fixture
def flash_varlen_test_double(monkeypatch):
    """flash-attn's varlen function, in torch (each sample's causal SDPA, KV heads repeated), put where transformers
    imports flash-attn from (there is no flash-attn on the CPU), recording what it is called with; and transformers'
    own derivation of the boundaries from position_ids, counted. Everything between (transformers' attention
    integration and ``_flash_attention_forward``) is the real code. Returns (calls, derivations)."""
    from transformers import modeling_flash_attention_utils as fa

    calls: list[dict] = []
    derivations = {"_is_packed_sequence": 0, "prepare_fa_kwargs_from_position_ids": 0}

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False):
        calls.append({"max_seqlen_q": max_seqlen_q, "cu_seqlens_q": cu_seqlens_q.clone()})
        assert torch.equal(cu_seqlens_q, cu_seqlens_k) and causal and dropout_p == 0.0
        rep = q.shape[1] // k.shape[1]
        out = torch.empty_like(q)
        bounds = cu_seqlens_q.tolist()
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            qs, ks, vs = (x[a:b].transpose(0, 1) for x in (q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)))
            out[a:b] = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True,
                                                                        scale=softmax_scale).transpose(0, 1)
        return out

    def not_expected(*args, **kwargs):
        raise AssertionError("a packed row must take flash-attn's varlen path")

    def counted(name):
        original = getattr(fa, name)

        def wrapper(*args, **kwargs):
            derivations[name] += 1
            return original(*args, **kwargs)
        return wrapper

    functions = (not_expected, flash_attn_varlen_func, None, not_expected, not_expected)
    processing = (fa._lazy_define_process_function(flash_attn_varlen_func), dict)
    monkeypatch.setattr(fa, "lazy_import_flash_attention", lambda *args, **kwargs: (functions, processing))
    for name in derivations:
        monkeypatch.setattr(fa, name, counted(name))
    return calls, derivations


def test_varlen_lengths_come_from_pack_and_no_layer_derives_them(tiny_model_dir, gen, flash_varlen_test_double):
    """flash_attention_2 on a packed row: ``pack``'s ``cu_seq_lens`` and ``max_length`` are what transformers derives
    from position_ids; passed through ``final_hidden`` they give the same hidden states as transformers' own
    derivation (today's path: per layer, with host syncs), no layer derives them again, and the kernel gets the
    longest sample as a Python int. Both equal separate per-sample forwards."""
    from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

    calls, derivations = flash_varlen_test_double
    model = Qwen3ForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64, attn_implementation="sdpa").eval()
    samples = random_samples(gen, 6, model.config.vocab_size, max_context=30, max_response=12)
    (mb,) = pack(samples, max_tokens=10_000)
    (cu_q, _), (longest, _) = prepare_fa_kwargs_from_position_ids(mb.position_ids[None])
    assert torch.equal(mb.cu_seq_lens, cu_q) and mb.cu_seq_lens.dtype == torch.int32
    assert mb.max_length == int(longest) and type(mb.max_length) is int
    derivations.update(dict.fromkeys(derivations, 0))  # the one above
    layers = model.config.num_hidden_layers
    with torch.no_grad():
        expected = torch.cat([separate_hidden(model, samples[i]) for i in mb.samples])
        model.config._attn_implementation = "flash_attention_2"
        derived = model.model(input_ids=mb.input_ids[None], position_ids=mb.position_ids[None],
                              use_cache=False).last_hidden_state[0, mb.positions]
        assert derivations == {"_is_packed_sequence": layers, "prepare_fa_kwargs_from_position_ids": layers}
        assert len(calls) == layers and all(isinstance(c["max_seqlen_q"], torch.Tensor) for c in calls)
        calls.clear()
        ours = final_hidden(model, mb)
    assert derivations == {"_is_packed_sequence": layers, "prepare_fa_kwargs_from_position_ids": layers}  # no more
    assert len(calls) == layers and all(type(c["max_seqlen_q"]) is int for c in calls)
    assert all(torch.equal(c["cu_seqlens_q"], mb.cu_seq_lens) for c in calls)
    assert torch.equal(ours, derived)
    torch.testing.assert_close(ours, expected, atol=1e-10, rtol=0)

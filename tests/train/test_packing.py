"""Packing: layout, alignment, and a packed forward equal to separate per-sample forwards."""

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

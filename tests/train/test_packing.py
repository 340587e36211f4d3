"""Packing: both layouts, alignment, a packed or padded forward equal to separate per-sample forwards, the mask each
attention implementation gets, the layout it gets, the padded layout equal to the packed one in float64 on the demo's
models and samples (teacher log-probs, the student's loss and gradients), and ``parallel.attention``."""

import dataclasses
import importlib.util
import itertools
from pathlib import Path

import pytest
import torch
from train_helpers import random_samples
from transformers import Qwen3ForCausalLM

from actfirst.train.head import LMHeadModel
from actfirst.train.packing import final_hidden, layout_for, pack


def test_layout_alignment_and_budget(gen):
    samples = random_samples(gen, 9, 500, max_context=20, max_response=10)
    samples[4].context_ids = list(range(60))  # longer than the budget: its own row
    mbs = pack(samples, max_tokens=40, layout="packed")
    seen = []
    for mb in mbs:
        assert mb.layout == "packed" and mb.input_ids.shape == mb.position_ids.shape == (1, mb.num_tokens)
        assert mb.num_tokens <= 40 or mb.samples == [4]
        assert mb.samples == sorted(mb.samples)
        offset = 0
        for i in mb.samples:
            s = samples[i]
            row = mb.input_ids[0, offset:offset + s.num_tokens].tolist()
            assert row == s.context_ids + s.response_ids
            assert mb.position_ids[0, offset:offset + s.num_tokens].tolist() == list(range(s.num_tokens))
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
        assert torch.equal(mb.targets, mb.input_ids[0, mb.positions + 1])
        assert mb.cu_seq_lens.tolist() == [0, *itertools.accumulate(samples[i].num_tokens for i in mb.samples)]
    assert sorted(seen) == list(range(9))
    # First fit: no two rows could have been one.
    loads = [mb.num_tokens for mb in mbs]
    assert all(a + b > 40 for k, a in enumerate(loads) for b in loads[k + 1:])


def test_padded_layout_alignment_and_budget(gen):
    """One row per sample, right-padded with token 0 to the micro-batch's longest, positions 0..T-1 in every row;
    samples grouped by decreasing length while (samples) x (longest) fits the budget."""
    samples = random_samples(gen, 11, 500, max_context=20, max_response=10)
    samples[4].context_ids = list(range(60))  # longer than the budget: its own micro-batch
    mbs = pack(samples, max_tokens=60, layout="padded")
    seen = []
    for mb in mbs:
        rows, width = mb.input_ids.shape
        assert mb.layout == "padded" and rows == len(mb.samples) and mb.cu_seq_lens is None
        assert width == mb.max_length == max(samples[i].num_tokens for i in mb.samples)
        assert rows * width <= 60 or mb.samples == [4]
        assert torch.equal(mb.position_ids, torch.arange(width).expand(rows, width))
        assert mb.num_tokens == sum(samples[i].num_tokens for i in mb.samples) and mb.samples == sorted(mb.samples)
        for r, i in enumerate(mb.samples):
            s = samples[i]
            assert mb.input_ids[r].tolist() == s.context_ids + s.response_ids + [0] * (width - s.num_tokens)
            sel = mb.sample_idx == i
            start = r * width + len(s.context_ids) - 1
            assert mb.positions[sel].tolist() == list(range(start, start + len(s.response_ids)))
            assert mb.targets[sel].tolist() == s.response_ids
            assert mb.mask[sel].tolist() == [float(m) for m in s.loss_mask]
            torch.testing.assert_close(mb.logp_old[sel], torch.tensor(s.logprobs, dtype=torch.float32))
            torch.testing.assert_close(mb.logp_teacher[sel], torch.tensor(s.teacher_logprobs, dtype=torch.float32))
            seen.append(i)
        assert torch.equal(mb.targets, mb.input_ids.flatten()[mb.positions + 1])
    assert sorted(seen) == list(range(11))
    # By decreasing length: every micro-batch's samples are no longer than the previous one's shortest, and the
    # next sample would not have fitted.
    for a, b in itertools.pairwise(mbs):
        shortest = min(samples[i].num_tokens for i in a.samples)
        assert b.max_length <= shortest and (len(a.samples) + 1) * a.max_length > 60


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_teacher_logprobs_all_or_none(gen, layout):
    samples = random_samples(gen, 3, 100)
    samples[1].teacher_logprobs = None
    with pytest.raises(ValueError, match="teacher_logprobs=None for sample 1"):
        pack(samples, 64, layout)
    for s in samples:
        s.teacher_logprobs = None
    assert all(mb.logp_teacher is None for mb in pack(samples, 64, layout))
    with pytest.raises(ValueError, match="max_tokens=0"):
        pack(samples, 0, layout)
    with pytest.raises(ValueError, match=r"layout='dense': must be one of \['packed', 'padded'\]"):
        pack(samples, 64, "dense")


def test_the_layout_each_attention_gets():
    """Packed rows where attention skips the work across samples; padded rows (plain is_causal) everywhere else."""
    assert [layout_for(a) for a in ("flash_attention_2", "flash_attention_3", "flex_attention")] == ["packed"] * 3
    assert [layout_for(a) for a in ("sdpa", "eager", "paged|sdpa")] == ["padded"] * 3


def separate_hidden(model, sample):
    ids = torch.tensor([sample.context_ids + sample.response_ids])
    h = model.model(input_ids=ids, use_cache=False).last_hidden_state[0]
    c = len(sample.context_ids)
    return h[c - 1:c - 1 + len(sample.response_ids)]


# Eager attention takes its softmax in float32 whatever the dtype (transformers), hence its looser float64 bound.
@pytest.mark.parametrize("layout", ["packed", "padded"])
@pytest.mark.parametrize("attn,dtype,atol", [("sdpa", torch.float64, 1e-10), ("eager", torch.float64, 2e-6),
                                             ("sdpa", torch.float32, 2e-5), ("eager", torch.float32, 2e-5)])
def test_packed_forward_equals_separate_forwards(tiny_model_dir, gen, attn, dtype, atol, layout):
    model = Qwen3ForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype, attn_implementation=attn).eval()
    samples = random_samples(gen, 6, model.config.vocab_size, max_context=30, max_response=12)
    (mb,) = pack(samples, max_tokens=10_000, layout=layout)
    assert len(mb.samples) == 6
    with torch.no_grad():
        packed = final_hidden(model, mb)
        expected = torch.cat([separate_hidden(model, samples[i]) for i in mb.samples])
        leaky = leaky_hidden(model, mb, samples)
    assert packed.shape == (sum(len(s.response_ids) for s in samples), model.config.hidden_size)
    torch.testing.assert_close(packed, expected, atol=atol, rtol=0)
    assert (leaky - expected).abs().max() > 1e-2


def leaky_hidden(model, mb, samples):
    """Sensitivity: the same rows laid out wrongly. Packed: without position_ids (one long sequence: samples see each
    other). Padded: padded on the left instead (no mask: samples see their padding)."""
    if mb.layout == "packed":
        return model.model(input_ids=mb.input_ids, use_cache=False).last_hidden_state[0, mb.positions]
    width = mb.input_ids.shape[1]
    pad = torch.tensor([width - samples[i].num_tokens for i in mb.samples])
    ids = torch.stack([row.roll(int(p)) for row, p in zip(mb.input_ids, pad, strict=True)])
    positions = mb.positions + pad[mb.positions // width]
    return model.model(input_ids=ids, use_cache=False).last_hidden_state.flatten(0, 1)[positions]


def test_padding_is_never_read(tiny_model_dir, gen):
    """What the padding holds changes no scored state (float64, SDPA's is_causal)."""
    model = Qwen3ForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64, attn_implementation="sdpa").eval()
    samples = random_samples(gen, 5, model.config.vocab_size, max_context=30, max_response=12)
    samples[0].context_ids = samples[0].context_ids + [1] * (60 - samples[0].num_tokens)  # padding in every other row
    (mb,) = pack(samples, max_tokens=10_000, layout="padded")
    filler = mb.input_ids.clone()
    for r, i in enumerate(mb.samples):
        filler[r, samples[i].num_tokens:] = torch.randint(1, model.config.vocab_size, (60 - samples[i].num_tokens,),
                                                          generator=gen)
    assert int((filler != mb.input_ids).sum()) > 0
    with torch.no_grad():
        ours = final_hidden(model, mb)
        other = final_hidden(model, dataclasses.replace(mb, input_ids=filler))
    torch.testing.assert_close(other, ours, atol=1e-12, rtol=0)


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


@pytest.mark.parametrize("attention,layout", [("sdpa", "packed"), ("sdpa", None), ("flex_attention", None)])
def test_teacher_logprobs_packed_equal_unpacked(tiny_model_dir, gen, eager_flex, attention, layout):
    """The teacher's scores of samples sharing one micro-batch (packed into one row, or padded rows: SDPA's own) equal
    those of each sample in a row of its own (one-sample rows: plain causal attention, no mask), through
    ``parallel.attention`` (FlexAttention: forward only on the CPU)."""
    from actfirst.train.teacher import TeacherScorer

    model = Qwen3ForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    samples = random_samples(gen, 4, model.config.vocab_size, max_context=30, max_response=12, scored=False)
    alone = [dataclasses.replace(s) for s in samples]
    packed_scorer = TeacherScorer(model, micro_batch_tokens=10_000, device="cpu", attention=attention, layout=layout)
    assert model.config._attn_implementation == attention
    assert packed_scorer.head.layout == (layout or {"sdpa": "padded", "flex_attention": "packed"}[attention])
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


def test_micro_batch_tokens_below_one_sample_loads():
    """A micro-batch never splits a sample (a longer one rides alone), so any budget >= 1 is a valid config: 1 gives
    every sample its own forward."""
    from actfirst.core.config import TrainConfig
    from actfirst.core.schema import load_config
    from actfirst.core.user_input import ConfigError

    assert load_config(TrainConfig, DEMO_CONFIG, ["micro_batch_tokens=1"]).micro_batch_tokens == 1
    with pytest.raises(ConfigError, match=r"^micro_batch_tokens=0: must be >= 1"):
        load_config(TrainConfig, DEMO_CONFIG, ["micro_batch_tokens=0"])


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
    (mb,) = pack(samples, max_tokens=10_000, layout=layout_for("flash_attention_2"))
    (cu_q, _), (longest, _) = prepare_fa_kwargs_from_position_ids(mb.position_ids)
    assert torch.equal(mb.cu_seq_lens, cu_q) and mb.cu_seq_lens.dtype == torch.int32
    assert mb.max_length == int(longest) and type(mb.max_length) is int
    derivations.update(dict.fromkeys(derivations, 0))  # the one above
    layers = model.config.num_hidden_layers
    with torch.no_grad():
        expected = torch.cat([separate_hidden(model, samples[i]) for i in mb.samples])
        model.config._attn_implementation = "flash_attention_2"
        derived = model.model(input_ids=mb.input_ids, position_ids=mb.position_ids,
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


@pytest.fixture(scope="module")
def demo_samples():
    """Full responses shaped as the generation-bound demo's, on the demo's real prompts, through its shipped
    tokenizer: every step of the shipped reference cache's first two references, the prompt a rollout sends there
    (B.1/B.2, rendered from the cached transitions, whose object lists the cache slims away) and the ``surveyed``
    thought with the step's action as the response (about 600 tokens a sample)."""
    from transformers import AutoTokenizer

    from actfirst.core.config import TrainConfig
    from actfirst.core.schema import load_config
    from actfirst.envs.benchmarks import get_benchmark
    from actfirst.preparation.reference_cache import load_references
    from actfirst.rollout.prompts import Mode, Step
    from actfirst.train.sft import THOUGHTS, ExpertStep, examples

    cfg = load_config(TrainConfig, DEMO_CONFIG)
    benchmark = get_benchmark(cfg.benchmark, cfg.env)
    steps = []
    for ref in list(load_references(cfg.references, benchmark=benchmark).values())[:2]:
        history = []
        for t, action in enumerate(ref.actions):
            steps.append(ExpertStep(ref.task, tuple(history), ref.transitions[t], action,
                                    ref.transitions[t + 1].observation))
            history.append(Step(ref.transitions[t].observation, action))
    return cfg, examples(AutoTokenizer.from_pretrained(cfg.student.model), benchmark, steps,
                         modes=[Mode.FULL_RESPONSE], max_prompt_tokens=cfg.rollout.max_prompt_tokens,
                         thought=THOUGHTS["surveyed"])


DEMO_CONFIG = Path(__file__).parents[2] / "configs" / "demo" / "scienceworld_lifespan.yaml"


def logp64(hidden, weight, targets):
    """log pi at ``targets`` from the final hidden states, in their dtype (the fused ops compute in float32)."""
    return torch.log_softmax(hidden @ weight.T, -1).gather(-1, targets[:, None])[:, 0]


def surrogate64(logp, mb, num_samples):
    """Eq. 29-32 (delta 0.2, kappa 3, seq-mean-token-mean over ``num_samples``) of one micro-batch, in logp's dtype."""
    old, adv = mb.logp_old.double(), (mb.logp_teacher - mb.logp_old).double()
    rho = torch.exp(torch.clamp(logp - old, -20, 20))
    l_clip = -torch.minimum(rho * adv, torch.clamp(rho, 0.8, 1.2) * adv)
    l_dc = torch.where(adv < 0, torch.minimum(l_clip, -3.0 * adv), l_clip) * mb.mask.double()
    per_sample = torch.zeros(num_samples, dtype=logp.dtype).index_add(0, mb.sample_idx, l_dc)
    tokens = torch.zeros(num_samples, dtype=logp.dtype).index_add(0, mb.sample_idx, mb.mask.double())
    return (per_sample / (tokens + 1e-8)).sum() / num_samples


def teacher_scores(teacher, samples, layout, micro_batch_tokens):
    """The teacher's log-probs of every response token, in sample order, in float64, with ``layout``."""
    head = LMHeadModel(teacher, layout)
    scores = torch.zeros(sum(len(s.response_ids) for s in samples), dtype=torch.float64)
    starts = list(itertools.accumulate((len(s.response_ids) for s in samples), initial=0))
    mbs = pack(samples, micro_batch_tokens, layout)
    for mb in mbs:
        with torch.no_grad():
            logp = head(mb, lambda hidden, weight, mb=mb: logp64(hidden, weight, mb.targets))
        scores[torch.cat([torch.arange(starts[i], starts[i + 1]) for i in mb.samples])] = logp
    return mbs, scores


def student_gradients(student, samples, layout, micro_batch_tokens):
    """The student's Eq. 29-32 loss and gradients over ``samples``, in float64, with ``layout``."""
    policy = LMHeadModel(student, layout)
    student.zero_grad(set_to_none=True)
    loss = 0.0
    for mb in pack(samples, micro_batch_tokens, layout):
        part = policy(mb, lambda hidden, weight, mb=mb: surrogate64(logp64(hidden, weight, mb.targets), mb,
                                                                    len(samples)))
        part.backward()
        loss += float(part.detach())
    return loss, [p.grad.clone() for p in student.parameters()]


def test_padded_equals_packed_on_the_demo_in_float64(demo_samples):
    """The demo's shipped teacher and student in float64 on real demo samples at its micro_batch_tokens: the padded
    layout (what SDPA gets) gives today's packed rows' teacher log-probs and the student's Eq. 29-32 loss and
    gradients, computed in float64 from each layout's forward (a float64 log-softmax for the fused ops, which compute
    in float32), to 1e-10; through TeacherScorer and StudentUpdater themselves, to float32 rounding."""
    from actfirst.core.config import LossConfig, OptimConfig
    from actfirst.train.student import StudentUpdater
    from actfirst.train.teacher import TeacherScorer

    cfg, samples = demo_samples
    tokens = cfg.micro_batch_tokens
    teacher = Qwen3ForCausalLM.from_pretrained(cfg.teacher, dtype=torch.float64).eval()
    student = Qwen3ForCausalLM.from_pretrained(cfg.student.model, dtype=torch.float64).eval()
    assert LMHeadModel(teacher).layout == LMHeadModel(student).layout == "padded"  # sdpa's
    _, packed_scores = teacher_scores(teacher, samples, "packed", tokens)
    padded_mbs, padded_scores = teacher_scores(teacher, samples, "padded", tokens)
    padding = [mb.input_ids.numel() - mb.num_tokens for mb in padded_mbs]
    assert len(padded_mbs) < len(samples) and min(padding) < max(padding) and max(padding) > 0
    gen = torch.Generator().manual_seed(0)
    for s, logp in zip(samples, packed_scores.split([len(s.response_ids) for s in samples]), strict=True):
        s.teacher_logprobs = logp.tolist()  # log pi_old: the teacher's, moved (clipped and dual-clipped tokens)
        s.logprobs = (logp + 0.5 * torch.randn(len(logp), generator=gen, dtype=torch.float64)).tolist()
    packed_loss, packed_grads = student_gradients(student, samples, "packed", tokens)
    padded_loss, padded_grads = student_gradients(student, samples, "padded", tokens)
    worst = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(padded_grads, packed_grads, strict=True))
    print(f"{len(samples)} samples in {len(padded_mbs)} padded micro-batches (padding {padding}): padded - packed "
          f"teacher log-probs {float((padded_scores - packed_scores).abs().max()):.1e}, loss "
          f"{padded_loss - packed_loss:.1e}, gradients relative to each tensor's largest entry {worst:.1e}")
    torch.testing.assert_close(padded_scores, packed_scores, atol=1e-10, rtol=0)
    assert padded_loss == pytest.approx(packed_loss, rel=1e-10)
    for a, b in zip(padded_grads, packed_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10 * float(b.abs().max()), rtol=0)
    # The real classes (their fused ops in float32), with the automatic layout.
    copies = [dataclasses.replace(s, teacher_logprobs=None) for s in samples]
    TeacherScorer(teacher, micro_batch_tokens=tokens, device="cpu").score(copies)
    scored = torch.tensor([x for s in copies for x in s.teacher_logprobs], dtype=torch.float64)
    torch.testing.assert_close(scored, packed_scores, atol=1e-5, rtol=0)
    real = {}
    for layout in ("packed", None):
        student.zero_grad(set_to_none=True)
        updater = StudentUpdater(LMHeadModel(student, layout), optim=OptimConfig(), loss=LossConfig(),
                                 temperature=1.0, num_updates=1, micro_batch_tokens=tokens)
        real[layout] = (updater.accumulate_gradients(samples, 0).loss, [p.grad.clone() for p in student.parameters()])
    assert real[None][0] == pytest.approx(real["packed"][0], rel=1e-6)
    for a, b in zip(real[None][1], real["packed"][1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5 * float(b.abs().max()), rtol=0)

"""Train-inference mismatch: the trainer's log pi_theta against the engine's log pi_old on real vLLM samples."""

import asyncio

import pytest
import torch
from transformers import AutoTokenizer, Qwen3ForCausalLM

from actfirst.core.config import LossConfig, OptimConfig, SchedulerConfig
from actfirst.engine.request import RequestKind, SamplingSpec
from actfirst.rollout.sample import Sample
from actfirst.train.head import LMHeadModel
from actfirst.train.student import StudentUpdater

pytestmark = pytest.mark.engine


def generate_samples(engine, tokenizer, temperature, gen, min_tokens=False):
    """Full responses of different lengths from chat-template prompts of different lengths (ignore_eos: the
    length is fixed without min_tokens, whose EOS suppression would change the sampled distribution)."""
    engine.reconfigure(SchedulerConfig(b_max=8))
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": "You are in the middle of a room. " * k}],
                                             tokenize=True, add_generation_prompt=True) for k in (1, 3, 6, 10)]
    prompts = [list(p["input_ids"]) if hasattr(p, "keys") else list(p) for p in prompts]
    lengths = [int(x) for x in torch.randint(8, 40, (len(prompts),), generator=gen)]
    seeds = [int(x) for x in torch.randint(0, 2**31, (len(prompts),), generator=gen)]

    async def run():
        return await asyncio.gather(*(engine.generate(
            p, RequestKind.FULL_RESPONSE, SamplingSpec(max_tokens=n, min_tokens=n if min_tokens else 0, ignore_eos=True,
                                                       temperature=temperature, seed=s))
            for p, n, s in zip(prompts, lengths, seeds, strict=True)))

    samples = []
    for i, (p, res) in enumerate(zip(prompts, asyncio.run(run()), strict=True)):
        assert len(res.token_ids) == lengths[i] == len(res.logprobs)
        teacher = (torch.tensor(res.logprobs) + 0.5 * torch.randn(len(res.logprobs), generator=gen)).tolist()
        samples.append(Sample(context_ids=list(p), response_ids=res.token_ids, loss_mask=[1] * len(res.token_ids),
                              logprobs=res.logprobs, weight_version=res.weight_version, task=f"t{i}", turn=0,
                              strategy="actfirst", teacher_logprobs=teacher))
    return samples


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_mismatch_on_engine_samples_and_one_update_moves_the_weights(engine, tiny_model_dir, gen, temperature):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    samples = generate_samples(engine, tokenizer, temperature, gen)
    model = Qwen3ForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    before = [p.detach().clone() for p in model.parameters()]
    updater = StudentUpdater(LMHeadModel(model), optim=OptimConfig(lr=1e-4), loss=LossConfig(),
                             temperature=temperature, num_updates=1)
    m = updater.update(samples, current_version=engine.weight_version)
    print(f"T={temperature}: mismatch mean {m['mismatch_mean']:.3e} max {m['mismatch_max']:.3e} over "
          f"{int(m['num_supervised'])} tokens; loss {m['loss']:.4f} grad_norm {m['grad_norm']:.3f}")
    assert m["num_supervised"] == sum(len(s.response_ids) for s in samples)
    assert m["mismatch_mean"] < 1e-4 and m["mismatch_max"] < 1e-3
    assert m["skipped"] == 0
    assert any(not torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))


def test_min_tokens_suppression_is_the_whole_mismatch(engine, tiny_model_dir, gen):
    """With min_tokens, vLLM masks EOS before sampling and its processed log-probs are renormalized without it:
    log pi_old - log pi_theta = -log(1 - pi_theta(EOS)) at every token. The trainer cannot see that mask, so full
    responses must be sampled without min_tokens (or any other logits processor) for Eq. 30's ratio to be 1."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    samples = generate_samples(engine, tokenizer, 1.0, gen, min_tokens=True)
    model = Qwen3ForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).eval()
    eos = model.config.eos_token_id
    for s in samples:
        ids = torch.tensor([s.context_ids + s.response_ids])
        with torch.no_grad():
            logz = torch.log_softmax(model(ids).logits[0, len(s.context_ids) - 1:-1], -1)
        logp = logz.gather(-1, torch.tensor(s.response_ids)[:, None])[:, 0]
        gap = torch.tensor(s.logprobs, dtype=torch.float64) - logp
        torch.testing.assert_close(gap, -torch.log1p(-logz[:, eos].exp()), atol=2e-6, rtol=0)
        assert gap.min() > 5e-4

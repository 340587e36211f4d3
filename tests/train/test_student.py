"""StudentUpdater: Eq. 29-32 against a float64 autograd reference on the same tiny model, accumulation, skipping,
the learning-rate schedule and the train-inference mismatch metric (Appendix B.4)."""

import copy
import dataclasses
import io
import math

import pytest
import torch
from train_helpers import random_samples
from transformers import Qwen3ForCausalLM

from actfirst.core.config import LossConfig, OptimConfig
from actfirst.rollout.sample import Sample
from actfirst.train.head import LMHeadModel
from actfirst.train.student import StudentUpdater, learning_rate

DELTA, KAPPA, EPS = 0.2, 3.0, 1e-8
LN = math.log


@pytest.fixture
def model(tiny_model_dir):
    return Qwen3ForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def updater(model, temperature=1.0, **kw):
    optim = kw.pop("optim", OptimConfig(lr=1e-3, grad_clip=0.0))
    loss = kw.pop("loss", LossConfig())
    return StudentUpdater(LMHeadModel(model), optim=optim, loss=loss, temperature=temperature, num_updates=10, **kw)


def logprobs64(model64, sample, temperature):
    """log softmax(logits / T) of the response tokens from a plain float64 forward (differentiable)."""
    ids = torch.tensor([sample.context_ids + sample.response_ids])
    c = len(sample.context_ids)
    logits = model64(ids, use_cache=False).logits[0, c - 1:-1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(sample.response_ids)[:, None])[:, 0]


def f32(values):
    """What the updater sees: the stored log-probs as float32."""
    return torch.tensor(values, dtype=torch.float32).double()


def surrogate64(model64, samples, temperature):
    """Eq. 29-32 written out literally, in float64."""
    total = 0.0
    for s in samples:
        logp = logprobs64(model64, s, temperature)
        old, teacher = f32(s.logprobs), f32(s.teacher_logprobs)
        m = torch.tensor(s.loss_mask, dtype=torch.float64)
        adv = torch.where(m > 0, teacher - old, 0.0)  # Eq. 29: sg (constants here), 0 where masked
        rho = torch.exp(torch.clamp(logp - old, -20, 20))  # Eq. 30
        l_clip = -torch.minimum(rho * adv, torch.clamp(rho, 1 - DELTA, 1 + DELTA) * adv)  # Eq. 31
        l_dc = torch.where(adv < 0, torch.minimum(l_clip, -KAPPA * adv), l_clip)
        total = total + (m * l_dc).sum() / (m.sum() + EPS)  # Eq. 32
    return total / len(samples)


def designed(model, gen, specs, temperature, version=0):
    """Samples whose tokens sit in chosen branches: spec = (context length, [(log ratio r, advantage A, mask)]).
    log pi_old = log pi_theta - r and log pi_T = log pi_old + A, from a float64 forward of the model."""
    model64 = copy.deepcopy(model).double()
    out = []
    for i, (c, toks) in enumerate(specs):
        s = Sample(context_ids=torch.randint(0, model.config.vocab_size, (c,), generator=gen).tolist(),
                   response_ids=torch.randint(0, model.config.vocab_size, (len(toks),), generator=gen).tolist(),
                   loss_mask=[m for _, _, m in toks], logprobs=[0.0] * len(toks), weight_version=version,
                   task=f"t{i}", turn=i, strategy="actfirst")
        with torch.no_grad():
            logp = logprobs64(model64, s, temperature)
        s.logprobs = [float(lp) - r for lp, (r, _, _) in zip(logp, toks, strict=True)]
        s.teacher_logprobs = [old + a for old, (_, a, _) in zip(s.logprobs, toks, strict=True)]
        out.append(s)
    return out


def on_policy(model, samples, temperature, noise, gen):
    """Set log pi_old near the model's own log-probs (plus noise) and a teacher near it."""
    model64 = copy.deepcopy(model).double()
    for s in samples:
        with torch.no_grad():
            logp = logprobs64(model64, s, temperature)
        old = logp + noise * torch.randn(logp.shape, generator=gen, dtype=torch.float64)
        s.logprobs = old.tolist()
        s.teacher_logprobs = (old + 0.5 * torch.randn(logp.shape, generator=gen, dtype=torch.float64)).tolist()
    return samples


BRANCHES = [
    (7, [(0.1, 0.5, 1),  # A > 0, unclipped
         (LN(1.5), 0.5, 1),  # A > 0, clipped at 1 + delta (no gradient)
         (LN(1.5), -0.5, 1),  # A < 0, rho > 1 + delta: the unclipped branch is the larger loss
         (0.3, 2.0, 0)]),  # inserted token: in the context, not in the loss
    (3, [(LN(0.5), -0.5, 1),  # A < 0, clipped at 1 - delta
         (LN(5.0), -0.5, 1),  # A < 0, dual-clipped at -kappa A
         (25.0, -0.4, 1),  # log ratio clamped at +20, then dual-clipped
         (25.0, 0.6, 1),  # clamped at +20, clipped at 1 + delta
         (-25.0, 0.7, 1),  # clamped at -20: rho = e^-20, unclipped, no gradient through the clamp
         (0.0, 0.0, 1)]),  # A = 0
    (5, [(30.0, -5.0, 0), (-30.0, 5.0, 0), (0.2, 1.0, 0)]),  # an all-masked response: counts in |B| only
    (12, [(-0.1, 1.0, 1)]),  # a one-token response (per-sample normalization)
]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("micro_batch_tokens", [8192, 12])
def test_loss_and_gradient_every_branch_against_float64(model, gen, temperature, micro_batch_tokens):
    samples = designed(model, gen, BRANCHES, temperature)
    up = updater(model, temperature, micro_batch_tokens=micro_batch_tokens)
    model.zero_grad(set_to_none=True)
    stats = up.accumulate_gradients(samples, current_version=0)
    model64 = copy.deepcopy(model).double()
    ref = surrogate64(model64, samples, temperature)
    ref.backward()
    print(f"T={temperature} loss {stats.loss:.8f} reference {float(ref.detach()):.8f}")
    assert stats.loss == pytest.approx(float(ref.detach()), rel=1e-5, abs=1e-6)
    assert stats.num_clipped == 3 and stats.num_dual_clipped == 2  # of 10 supervised tokens
    worst = 0.0
    for (name, p), p64 in zip(model.named_parameters(), model64.parameters(), strict=True):
        scale = float(p64.grad.abs().max())
        worst = max(worst, float((p.grad.double() - p64.grad).abs().max()) / max(scale, 1e-12))
        torch.testing.assert_close(p.grad.double(), p64.grad, rtol=1e-4, atol=1e-5 * scale, msg=name)
    print(f"worst gradient error relative to the tensor's largest entry: {worst:.2e}")


def test_seq_mean_token_mean_normalization(model, gen):
    """At rho = 1 every supervised token's loss is -A: Eq. 32 is the mean over responses of the per-response mean
    over supervised tokens, with inserted tokens in neither sum."""
    specs = [(4, [(0.0, 1.0, 1), (0.0, 3.0, 1), (0.0, 9.0, 0)]), (9, [(0.0, -0.6, 1)]),
             (2, [(0.0, 2.0, 0), (0.0, 2.0, 0)]), (6, [(0.0, 0.3, 1)] * 5 + [(0.0, 0.9, 1)])]
    samples = designed(model, gen, specs, 1.0)
    stats = updater(model).accumulate_gradients(samples, current_version=0)
    expected = -((1.0 + 3.0) / 2 + (-0.6) + 0.0 + (5 * 0.3 + 0.9) / 6) / 4
    assert stats.loss == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("micro_batch_tokens", [8192, 12])
def test_token_mean_aggregation_by_hand(model, gen, micro_batch_tokens):
    """003 D.3's token-mean at rho = 1 (every supervised token's loss is -A): the sum over all supervised tokens of
    the batch over their number, whatever the rows; an SFT target's sampled tokens are tokens of that mean, each
    adding beta * NLL. Written out by hand beside Eq. 32 on the same samples."""
    specs = [(4, [(0.0, 1.0, 1), (0.0, 3.0, 1), (0.0, 9.0, 0)]), (9, [(0.0, -0.6, 1)]),
             (2, [(0.0, 2.0, 0), (0.0, 2.0, 0)]), (6, [(0.0, 0.3, 1)] * 5 + [(0.0, 0.9, 1)])]
    samples = designed(model, gen, specs, 1.0)
    token_mean = LossConfig(aggregation="token_mean")
    stats = updater(model, micro_batch_tokens=micro_batch_tokens, loss=token_mean).accumulate_gradients(samples, 0)
    tokens = [1.0, 3.0, -0.6] + [0.3] * 5 + [0.9]
    assert stats.loss == pytest.approx(-sum(tokens) / len(tokens), abs=1e-5)
    seq = updater(model, micro_batch_tokens=micro_batch_tokens).accumulate_gradients(samples, 0)
    assert seq.loss == pytest.approx(-((1.0 + 3.0) / 2 - 0.6 + 0.0 + (5 * 0.3 + 0.9) / 6) / 4, abs=1e-5)

    beta = 1.5
    sft = designed(model, gen, [(5, [(0.0, 0.0, 1), (0.0, 0.0, 0), (0.0, 0.0, 1), (0.0, 0.0, 1)])], 1.0)[0]
    sft.sft_weight = beta
    with torch.no_grad():
        nll = -logprobs64(copy.deepcopy(model).double(), sft, 1.0)[[0, 2, 3]]
    stats = updater(model, micro_batch_tokens=micro_batch_tokens, loss=token_mean).accumulate_gradients(
        samples + [sft], 0)
    n = len(tokens) + 3
    print(f"token-mean with an SFT target: loss {stats.loss:.6f}, sft {stats.sft_loss:.6f}, {n} tokens")
    assert stats.sft_loss == pytest.approx(float(beta * nll.sum() / n), rel=1e-5)
    assert stats.loss == pytest.approx(-sum(tokens) / n + float(beta * nll.sum() / n), rel=1e-5, abs=1e-6)


def test_micro_and_mini_batches_match_one_pass(model, gen):
    samples = random_samples(gen, 7, model.config.vocab_size, max_context=20, max_response=10)
    samples = on_policy(model, samples, 1.0, 0.1, gen)
    grads = {}
    passes = (("one", [samples], 8192), ("micro", [samples], 16), ("mini", [samples[:3], samples[3:]], 8192))
    for name, chunks, mbt in passes:
        up = updater(model, micro_batch_tokens=mbt)
        model.zero_grad(set_to_none=True)
        total = 0.0
        acc = [torch.zeros_like(p) for p in model.parameters()]
        for chunk in chunks:
            model.zero_grad(set_to_none=True)
            stats = up.accumulate_gradients(chunk, current_version=0)
            total += stats.loss * len(chunk) / len(samples)
            for a, p in zip(acc, model.parameters(), strict=True):
                a += p.grad * len(chunk) / len(samples)
        grads[name] = (total, acc)
    for name in ("micro", "mini"):
        assert grads[name][0] == pytest.approx(grads["one"][0], rel=1e-5, abs=1e-7)
        for a, b in zip(grads[name][1], grads["one"][1], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6 * float(b.abs().max()))


def test_minibatch_update_equals_sequential_updates(model, gen):
    samples = on_policy(model, random_samples(gen, 6, model.config.vocab_size), 1.0, 0.05, gen)
    split, seq = copy.deepcopy(model), copy.deepcopy(model)
    metrics = updater(split, num_minibatches=2).update(samples, current_version=0)
    up = updater(seq)
    m1, m2 = up.update(samples[:3], current_version=0), up.update(samples[3:], current_version=0)
    assert metrics["loss"] == pytest.approx((m1["loss"] + m2["loss"]) / 2, rel=1e-5)
    for a, b, _p0 in zip(split.parameters(), seq.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert any(not torch.equal(a, p0) for a, p0 in zip(split.parameters(), model.parameters(), strict=True))
    # The mismatch is measured before the first step, for the second mini-batch too.
    before = updater(copy.deepcopy(model)).update(samples, current_version=0)
    assert metrics["mismatch_max"] == pytest.approx(before["mismatch_max"], abs=1e-6)
    assert metrics["mismatch_mean"] == pytest.approx(before["mismatch_mean"], abs=1e-6)


def test_nan_teacher_logprob_skips_the_step(model, gen):
    samples = on_policy(model, random_samples(gen, 4, model.config.vocab_size), 1.0, 0.1, gen)
    j = samples[2].loss_mask.index(1) if 1 in samples[2].loss_mask else None
    if j is None:
        samples[2].loss_mask[0], j = 1, 0
    samples[2].teacher_logprobs[j] = float("nan")
    before = [p.detach().clone() for p in model.parameters()]
    up = updater(model, optim=OptimConfig(lr=1e-2, weight_decay=0.1, grad_clip=1.0))
    metrics = up.update(samples, current_version=0)
    assert metrics["skipped"] == 1 and math.isnan(metrics["loss"])
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before, strict=True))
    assert all(p.grad is None for p in model.parameters()) and not up.optimizer.state
    samples[2].teacher_logprobs[j] = samples[2].logprobs[j] + 0.3
    metrics = up.update(samples, current_version=0)
    assert metrics["skipped"] == 0 and math.isfinite(metrics["loss"])
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), before, strict=True))


def test_learning_rate_schedule():
    cos = OptimConfig(lr=1.0, warmup_updates=2, schedule="cosine", min_lr_ratio=0.1)
    got = [learning_rate(cos, u, 6) for u in range(7)]
    want = [0.5, 1.0, 1.0, 0.1 + 0.9 * 0.75, 0.1 + 0.9 * 0.25, 0.1, 0.1]
    assert got == pytest.approx(want)
    const = OptimConfig(lr=2e-6, warmup_updates=4)
    assert [learning_rate(const, u, 10) for u in (0, 3, 4, 9)] == pytest.approx([5e-7, 2e-6, 2e-6, 2e-6])
    assert learning_rate(OptimConfig(lr=3e-6), 0, 5) == 3e-6


def test_update_metrics_schedule_and_state_dict(model, gen):
    samples = on_policy(model, random_samples(gen, 4, model.config.vocab_size), 1.0, 0.0, gen)
    samples[3].weight_version = 4
    for s in samples[:3]:
        s.weight_version = 5
    optim = OptimConfig(lr=1e-3, warmup_updates=2, grad_clip=0.5)
    twin = copy.deepcopy(model)
    up = updater(model, optim=optim)
    m = up.update(samples, current_version=5)
    assert m["lr"] == pytest.approx(5e-4) and m["skipped"] == 0
    assert m["version_lag_mean"] == pytest.approx(0.25)
    assert m["num_tokens"] == sum(s.num_tokens for s in samples)
    assert m["num_supervised"] == sum(s.num_supervised for s in samples)
    sup = [(t - o) for s in samples for k, t, o in zip(s.loss_mask, s.teacher_logprobs, s.logprobs, strict=True) if k]
    assert m["teacher_minus_old"] == pytest.approx(sum(sup) / len(sup))
    assert m["mismatch_mean"] < 1e-5 and m["mismatch_max"] < 1e-4  # on-policy to fp32 rounding
    assert m["grad_norm"] > 0 and 0 <= m["clip_frac"] <= 1 and m["update_s"] > 0
    # Resuming from the state dict continues identically.
    twin.load_state_dict(model.state_dict())
    resumed = updater(twin, optim=optim)
    saved = io.BytesIO()
    torch.save({"updater": up.state_dict(), "optimizer": up.optimizer.state_dict()}, saved)  # like a checkpoint
    saved.seek(0)
    state = torch.load(saved)
    resumed.load_state_dict(state["updater"])
    resumed.optimizer.load_state_dict(state["optimizer"])
    a, b = up.update(samples, current_version=5), resumed.update(samples, current_version=5)
    assert a["lr"] == b["lr"] == pytest.approx(1e-3) and a["loss"] == b["loss"]
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters(), strict=True))


def test_mismatch_counts_only_the_current_version(model, gen):
    samples = on_policy(model, random_samples(gen, 4, model.config.vocab_size, version=3), 1.0, 0.0, gen)
    for s in samples[2:]:
        s.weight_version = 2
        s.logprobs = [x - 1.0 for x in s.logprobs]  # an older policy: far from the current one
    m = updater(copy.deepcopy(model), num_minibatches=2).update(samples, current_version=3)
    assert m["mismatch_max"] < 1e-4
    for s in samples:
        s.weight_version = 2
    m = updater(model).update(samples, current_version=3)
    assert math.isnan(m["mismatch_mean"]) and math.isnan(m["mismatch_max"])


def test_a_response_spanning_two_versions_uses_its_sampled_logprobs(model, gen):
    """``pipeline: inflight``: a response holds tokens of versions 1 and 2 (a weight load fell inside it). Each
    token's log pi_old is its stored sampled log-prob, whichever version produced it (Eq. 29-30): the loss and
    gradients equal Eq. 29-32 written out with those values, and the sample counts as of its oldest version."""
    samples = on_policy(model, random_samples(gen, 4, model.config.vocab_size, max_response=16, version=2), 1.0,
                        0.0, gen)
    unshifted = list(samples)
    for i, s in enumerate(samples[:2]):
        k = max(1, len(s.response_ids) // 2)
        # the first version's tokens were sampled by another policy than the current one
        samples[i] = dataclasses.replace(s, logprobs=[x - 0.1 * m
                                                      for x, m in zip(s.logprobs[:k], s.loss_mask, strict=False)]
                                         + s.logprobs[k:], weight_version=1,
                                         token_versions=[1] * k + [2] * (len(s.response_ids) - k))
    model.zero_grad(set_to_none=True)
    stats = updater(model).accumulate_gradients(samples, current_version=2)
    model64 = copy.deepcopy(model).double()
    ref = surrogate64(model64, samples, 1.0)
    ref.backward()
    assert stats.loss == pytest.approx(float(ref.detach()), rel=1e-5, abs=1e-6)
    for (name, p), p64 in zip(model.named_parameters(), model64.parameters(), strict=True):
        scale = float(p64.grad.abs().max())
        torch.testing.assert_close(p.grad.double(), p64.grad, rtol=1e-4, atol=1e-5 * scale, msg=name)
    # The shift is material: with the first version's log pi_old unshifted the loss would be another.
    assert abs(float(surrogate64(model64, unshifted, 1.0)) - stats.loss) > 1e-2
    m = updater(copy.deepcopy(model)).update(samples, current_version=2)
    assert m["version_lag_mean"] == pytest.approx(2 / len(samples))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sft_targets_add_their_weighted_nll_against_float64(model, gen, temperature):
    """UOPD (003 Sec. 4.2): an SFT target adds beta / |B| * its token-mean NLL at temperature 1 and no PPO term;
    |B| counts both kinds. The OPD samples' part is Eq. 29-32 as before."""
    opd = designed(model, gen, BRANCHES[:2], temperature)
    beta = 1.5
    sft = designed(model, gen, [(6, [(0.4, 3.0, 1), (0.2, -2.0, 1), (0.0, 5.0, 0), (-0.3, 1.0, 1)])], temperature)[0]
    sft.sft_weight = beta
    samples = [opd[0], sft, opd[1]]
    up = updater(model, temperature, micro_batch_tokens=20)
    model.zero_grad(set_to_none=True)
    stats = up.accumulate_gradients(samples, current_version=0)
    model64 = copy.deepcopy(model).double()
    m = torch.tensor(sft.loss_mask, dtype=torch.float64)
    nll = -(logprobs64(model64, sft, 1.0) * m).sum() / m.sum()
    ref = surrogate64(model64, opd, temperature) * len(opd) / len(samples) + beta * nll / len(samples)
    ref.backward()
    print(f"T={temperature} loss {stats.loss:.8f} reference {float(ref.detach()):.8f} sft {stats.sft_loss:.8f}")
    assert stats.loss == pytest.approx(float(ref.detach()), rel=1e-5, abs=1e-6)
    assert stats.sft_loss == pytest.approx(float(beta * nll.detach() / len(samples)), rel=1e-5)
    assert stats.num_clipped == 3 and stats.num_dual_clipped == 2  # the SFT target's tokens are in no PPO count
    for (name, p), p64 in zip(model.named_parameters(), model64.parameters(), strict=True):
        scale = float(p64.grad.abs().max())
        torch.testing.assert_close(p.grad.double(), p64.grad, rtol=1e-4, atol=1e-5 * scale, msg=name)

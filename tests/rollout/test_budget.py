"""B.3 budgeted full-response decoding: the decision functions exhaustively, every branch on the real engine with a
hand-set bigram model (tests/rollout/conftest.py), and B.4's masks against a float64 re-scoring."""

import asyncio
import itertools

import pytest
import torch
from transformers import Qwen3ForCausalLM

from actfirst.envs.response_format import EARLY_STOP_SENTENCE, early_stop_text
from actfirst.models.tokenizers import build_qwen3_tokenizer
from actfirst.rollout.actions import GenerationAborted
from actfirst.rollout.budget import FullResponse, generate_full_response, second_stage_max_tokens
from actfirst.rollout.sample import Sample

PROMPT_HEAD = [11, 12, 13, 14, 15]
START = 100  # the prompt's last token: where each chain starts
WITH_THINK = f"\n\n{EARLY_STOP_SENTENCE}\n</think>\n\n<action>"
WITHOUT_THINK = f"\n\n{EARLY_STOP_SENTENCE}\n\n<action>"


def test_early_stop_sentence_is_the_papers():
    assert EARLY_STOP_SENTENCE == ("Considering the limited time by the user, I have to give the action based on the "
                                   "thinking directly now.")


@pytest.mark.parametrize(("first_text", "inserted"), [
    ("", WITH_THINK),
    ("<think>\nI need the apple", WITH_THINK),
    ("I need the apple", WITH_THINK),  # the chat template may have opened <think> in the prompt
    ("<think>\nthe tag </thi", WITH_THINK),  # a partial tag is not the tag
    ("<think>\nI need the apple\n</think>\n\n", WITHOUT_THINK),
    ("<think>\nI need the apple\n</think>\n\nI will", WITHOUT_THINK),
    ("<think>\nI need the apple\n</think>\n\n<action>", ""),
    ("<think>\nI need the apple\n</think>\n\n<action>go to", ""),
    ("I need the apple\n\n<action>go to", ""),  # action generation started (no thinking block)
    ("<think>\nI need the apple\n\n<action>go to", WITH_THINK),  # a tag inside unfinished reasoning is an echo
])
def test_early_stop_text(first_text, inserted):
    assert early_stop_text(first_text) == inserted


def test_second_stage_max_tokens_exhaustive():
    for num_first, num_inserted, total, second in itertools.product(range(12), range(6), range(1, 20), range(1, 8)):
        got = second_stage_max_tokens(num_first=num_first, num_inserted=num_inserted, total=total,
                                      second_stage=second)
        # The most tokens n <= second_stage with sampled + inserted + n <= total (0: no second request).
        fits = [n for n in range(second + 1) if num_first + num_inserted + n <= total]
        assert got == (max(fits) if fits else 0), (num_first, num_inserted, total, second)


@pytest.fixture(scope="module")
def qwen():
    return build_qwen3_tokenizer()


@pytest.mark.parametrize("text", [WITH_THINK, WITHOUT_THINK])
def test_inserted_text_round_trips_both_tokenizers(text, tokenizer, qwen):
    """The inserted tokens decode back to the text, so the response text and the token count agree."""
    env = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(env, skip_special_tokens=True) == text and env[-1] == tokenizer.convert_tokens_to_ids(
        "<action>")
    q = qwen.encode(text, add_special_tokens=False)
    assert qwen.decode(q, skip_special_tokens=True) == text
    assert (151668 in q) == ("</think>" in text)  # Qwen3's </think>: one token
    assert len(qwen.encode("<action>", add_special_tokens=False)) > 1  # Qwen3's <action>: plain text


# -- the real engine, driven by a bigram chain -----------------------------------------------------------------------

def think_act_chain(tokenizer, ids) -> list[int]:
    """START -> <think> I the apple look </think> \\n\\n <action> go to kitchen </action> EOS: response positions
    0..12 (<think> at 0, </think> at 5, <action> at 7, </action> at 11, EOS at 12)."""
    return [START, *ids("<think>", "I", " the", " apple", "look", "</think>", "\n\n", "<action>", "go", " to",
                        " kitchen", "</action>"), tokenizer.eos_token_id]


def full(engine, tokenizer, *, first_stage, total=128, second_stage=16, seed=0, temperature=1.0,
         prompt=None) -> FullResponse:
    prompt = PROMPT_HEAD + [START] if prompt is None else prompt
    return asyncio.run(generate_full_response(engine, tokenizer, prompt, first_stage=first_stage, total=total,
                                              second_stage=second_stage, temperature=temperature, top_p=1.0,
                                              seed=seed))


@pytest.fixture
def chain(tokenizer, ids, load_chain):
    chain = think_act_chain(tokenizer, ids)
    load_chain(chain)
    return chain


def response(chain):
    return chain[1:]


def check_masks(res: FullResponse, *, first: int, inserted: list[int], chain: bool = True):
    """Sampled tokens carry mask 1 and a log-prob; inserted tokens mask 0 and log-prob 0.0 (B.4)."""
    n = len(res.token_ids)
    assert len(res.loss_mask) == len(res.logprobs) == n and res.num_inserted == len(inserted)
    assert res.token_ids[first:first + len(inserted)] == inserted
    assert res.loss_mask == [1] * first + [0] * len(inserted) + [1] * (n - first - len(inserted))
    assert all(res.logprobs[i] == 0.0 for i in range(first, first + len(inserted)))
    if chain:  # the bigram chain is near-certain
        assert all(-1e-3 < lp <= 0.0 for lp in res.logprobs)


def test_finished_within_first_stage(engine, tokenizer, chain):
    records = len(engine.records)
    res = full(engine, tokenizer, first_stage=16)
    assert res.num_requests == 1 and len(engine.records) == records + 1
    assert res.token_ids == response(chain)  # ends at EOS, not at </action>
    assert res.text == "<think>I the applelook</think>\n\n<action>go to kitchen</action>"
    assert res.action == "go to kitchen" and not res.truncated
    check_masks(res, first=len(res.token_ids), inserted=[])


def test_budget_hit_during_reasoning_inserts_with_think_close(engine, tokenizer, chain):
    inserted = tokenizer.encode(WITH_THINK, add_special_tokens=False)
    res = full(engine, tokenizer, first_stage=3, second_stage=16)
    assert res.num_requests == 2
    # <think> I the | early-stop text ending in <action> | the model continues from <action>.
    assert res.token_ids == response(chain)[:3] + inserted + response(chain)[8:]
    check_masks(res, first=3, inserted=inserted)
    assert res.text == f"<think>I the{WITH_THINK}go to kitchen</action>"
    assert res.action == "go to kitchen" and not res.truncated


def test_budget_hit_after_think_close_inserts_without_it(engine, tokenizer, chain):
    inserted = tokenizer.encode(WITHOUT_THINK, add_special_tokens=False)
    for first_stage in (6, 7):  # </think> generated, <action> not yet
        res = full(engine, tokenizer, first_stage=first_stage)
        assert res.num_requests == 2 and res.text.count("</think>") == 1
        assert res.token_ids == response(chain)[:first_stage] + inserted + response(chain)[8:]
        check_masks(res, first=first_stage, inserted=inserted)
        assert res.action == "go to kitchen" and not res.truncated


def test_budget_hit_after_action_began_continues_without_insertion(engine, tokenizer, chain):
    for first_stage in (8, 9, 10, 11):  # <action> generated, </action> not yet
        res = full(engine, tokenizer, first_stage=first_stage)
        assert res.num_requests == 2 and res.num_inserted == 0
        assert res.token_ids == response(chain)  # the second request picked up where the first stopped
        check_masks(res, first=first_stage, inserted=[])
        assert res.action == "go to kitchen" and not res.truncated


def test_action_closed_within_first_stage_is_finished(engine, tokenizer, chain):
    records = len(engine.records)
    res = full(engine, tokenizer, first_stage=12)  # the budget ends right after </action>, before EOS
    assert res.num_requests == 1 and len(engine.records) == records + 1
    assert res.token_ids == response(chain)[:12] and res.text.endswith("</action>")
    assert res.action == "go to kitchen" and not res.truncated  # B.3: not truncated solely by the length limit


def test_total_exhausted_means_no_second_request(engine, tokenizer, chain):
    n_with = len(tokenizer.encode(WITH_THINK, add_special_tokens=False))
    for first_stage, total in ((3, 3), (3, 3 + n_with), (9, 9)):  # nothing left after sampled (+ inserted) tokens
        records = len(engine.records)
        res = full(engine, tokenizer, first_stage=first_stage, total=total)
        assert res.num_requests == 1 and len(engine.records) == records + 1, (first_stage, total)
        assert res.token_ids == response(chain)[:first_stage] and res.num_inserted == 0
        assert res.truncated and res.action == ""
        check_masks(res, first=first_stage, inserted=[])


def test_second_stage_limits(engine, tokenizer, chain):
    inserted = tokenizer.encode(WITH_THINK, add_special_tokens=False)
    # second_stage binds: two tokens after the insertion, no </action>: truncated, empty action.
    res = full(engine, tokenizer, first_stage=3, second_stage=2)
    assert res.token_ids == response(chain)[:3] + inserted + response(chain)[8:10]
    assert res.num_requests == 2 and res.truncated and res.action == ""
    # The total binds, counting sampled and inserted tokens.
    res = full(engine, tokenizer, first_stage=3, total=3 + len(inserted) + 2, second_stage=128)
    assert len(res.token_ids) == 3 + len(inserted) + 2 and res.truncated
    # Room for exactly the action: the limit is hit right after </action>, which is not truncation.
    res = full(engine, tokenizer, first_stage=3, total=3 + len(inserted) + 4)
    assert res.text.endswith("go to kitchen</action>") and not res.truncated and res.action == "go to kitchen"


def test_multi_token_action_tag(engine, tokenizer, ids, load_chain):
    """Qwen3-style: "<action>" spelled with several tokens; the decision reads text, not tag ids."""
    chain = [START, *ids("<think>", "I", "</think>", "<", "act", "ion", ">", "go", "</action>"),
             tokenizer.eos_token_id]
    load_chain(chain)
    res = full(engine, tokenizer, first_stage=7)  # <think> I </think> < act ion > | go </action> EOS
    assert res.num_requests == 2 and res.num_inserted == 0 and res.token_ids == chain[1:]
    assert res.action == "go" and not res.truncated


def test_weight_update_between_requests_gives_the_oldest_version(engine, tokenizer, ids, load_chain):
    chain = think_act_chain(tokenizer, ids)
    v0 = load_chain(chain)

    async def run():
        records = len(engine.records)
        task = asyncio.ensure_future(generate_full_response(engine, tokenizer, PROMPT_HEAD + [START], first_stage=3,
                                                            total=128, second_stage=16, temperature=1.0, top_p=1.0,
                                                            seed=0))
        while len(engine.records) == records:  # until the first request finishes
            await asyncio.sleep(0)
        v1 = load_chain(chain)  # the same weights, a new version, before the second request can finish
        assert len(engine.records) == records + 1
        return v1, await task

    v1, res = asyncio.run(run())
    assert v1 == v0 + 1 and res.num_requests == 2 and res.weight_version == v0
    assert res.action == "go to kitchen"
    # The first request's tokens and the inserted ones (outside the loss) are v0's, the second request's v1's.
    old = 3 + res.num_inserted
    assert res.num_inserted > 0 and res.token_versions == [v0] * old + [v1] * (len(res.token_ids) - old)
    sample = res.to_sample(PROMPT_HEAD + [START], task="t", turn=0, strategy="actfirst")
    assert sample.token_versions == res.token_versions and sample.weight_version == v0


def test_second_request_continues_from_prompt_first_and_inserted(engine, tokenizer, tiny_model_dir):
    """On the random model: re-scoring prompt + response with a float64 forward reproduces every sampled token's
    log pi_old, including the second request's, so it was sampled after prompt + first stage + inserted tokens."""
    prompt = tokenizer.encode("Your task is to: put a clean apple in fridge.", add_special_tokens=False)
    records = len(engine.records)
    res = full(engine, tokenizer, first_stage=6, second_stage=5, temperature=0.7, seed=3, prompt=prompt)
    first_text = tokenizer.decode(res.token_ids[:6], skip_special_tokens=True)
    inserted = tokenizer.encode(early_stop_text(first_text), add_special_tokens=False)
    assert "<action>" not in first_text and len(inserted) > 0
    assert res.num_requests == 2 and [r.num_tokens for r in engine.records[records:]] == [6, 5]
    check_masks(res, first=6, inserted=inserted, chain=False)
    sampled = [i for i, m in enumerate(res.loss_mask) if m]
    ref = hf_logprobs(tiny_model_dir, prompt, res.token_ids, temperature=0.7)[sampled]
    torch.testing.assert_close(torch.tensor([res.logprobs[i] for i in sampled], dtype=torch.float64), ref,
                               atol=2e-3, rtol=0)
    # Without the inserted tokens in its context the second request's log-probs would be different ones.
    without = hf_logprobs(tiny_model_dir, prompt, res.token_ids[:6] + res.token_ids[6 + len(inserted):], 0.7)
    assert (torch.tensor(res.logprobs[6 + len(inserted):], dtype=torch.float64) - without[6:]).abs().max() > 0.05
    sample = res.to_sample(prompt, task="alfworld/pick_clean_then_place/0", turn=2, strategy="actfirst")
    assert isinstance(sample, Sample) and sample.context_ids == prompt and sample.response_ids == res.token_ids
    assert sample.loss_mask == res.loss_mask and sample.logprobs == res.logprobs
    assert sample.num_supervised == len(res.token_ids) - len(inserted) and sample.weight_version == res.weight_version
    assert (sample.task, sample.turn, sample.strategy) == ("alfworld/pick_clean_then_place/0", 2, "actfirst")


def hf_logprobs(model_dir, prompt, tokens, temperature):
    """log softmax(logits / temperature) of each response token, from a float64 transformers forward."""
    model = Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def test_abort_raises(engine, tokenizer):
    async def run():
        task = asyncio.ensure_future(generate_full_response(engine, tokenizer, PROMPT_HEAD, first_stage=400,
                                                            total=512, second_stage=16, temperature=1.0, top_p=1.0,
                                                            seed=0))
        start = engine.num_steps
        while engine.num_steps < start + 3:
            await asyncio.sleep(0)
        await engine.close()
        with pytest.raises(GenerationAborted, match="FULL_RESPONSE.*aborted"):
            await task

    asyncio.run(run())


def test_first_stage_above_total_is_refused(engine, tokenizer):
    with pytest.raises(ValueError, match="first_stage=9"):
        full(engine, tokenizer, first_stage=9, total=8)

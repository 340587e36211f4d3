"""Action extraction (Appendix B.3) and fast actions (action-only decoding, Appendix C.5) on the real engine."""

import asyncio
import os
import random

import pytest

from actfirst.engine.request import GenerationResult, RequestKind
from actfirst.envs.response_format import extract_action, has_action_field
from actfirst.rollout.actions import GenerationAborted, check_not_aborted, generate_fast_action


@pytest.mark.parametrize(("text", "action"), [
    ("<action>go to kitchen 1</action>", "go to kitchen 1"),
    ("<think>\nthe apple is in the fridge\n</think>\n\n<action> open fridge 1 \n</action>", "open fridge 1"),
    ("<action>\n\ttake apple 1\u3000\n</action>", "take apple 1"),  # unicode whitespace is stripped too
    ("no tag at all", ""),
    ("", ""),
    ("<action>go to kitchen 1", ""),  # unclosed
    ("</action>go to kitchen 1<action>", ""),  # tags in the wrong order
    ("go to kitchen 1</action>", ""),  # closing tag only
    ("<action>first</action> <action>second</action>", "first"),  # repeated: the first complete field
    ("<action>open<action>take apple 1</action>", "take apple 1"),  # re-opened: the field restarts
    ("<action>a</action><action>b", "a"),
    ("<action></action>", ""),
    ("<action>  \n </action>", ""),
    ("<action>search[red shoes </b> <i>]</action>", "search[red shoes </b> <i>]"),  # other markup is text
    ("<action>\x00\ufffd\u202eé ☃ 𝔘\n line2</action>", "\x00\ufffd\u202eé ☃ 𝔘\n line2"),  # junk passes through
    ("<ACTION>go</ACTION>", ""),  # tags are case-sensitive, as the prompts write them
    # The prompt's tags echoed inside the reasoning are not the action field.
    ("<think>present it within <action> </action> tags</think>\n<action>look</action>", "look"),
    ("<think>within <action>x</action> tags</think>\nno field", ""),
    ("<think>I will answer <action>go to desk 1</action> soon", ""),  # echoed inside unfinished reasoning
])
def test_extract_action_cases(text, action):
    assert extract_action(text, truncated=False) == action
    answer = text.rpartition("</think>")[2] if "</think>" in text else ("" if "<think>" in text else text)
    assert has_action_field(text) == ("<action>" in answer and "</action>" in answer.split("<action>", 1)[1])
    assert extract_action(text, truncated=True) == ""


def reference_extract(text: str) -> str:
    """The same rule by a different algorithm: after the last </think>, the first </action> and the nearest
    <action> before it."""
    think = text.rfind("</think>")
    if think >= 0:
        text = text[think + len("</think>"):]
    elif "<think>" in text:
        return ""  # reasoning unfinished: no answer yet
    close = text.find("</action>")
    while close >= 0:
        open_ = text.rfind("<action>", 0, close)
        if open_ >= 0:
            return text[open_ + len("<action>"):close].strip()
        close = text.find("</action>", close + 1)
    return ""


def test_extract_action_random_junk():
    seed = int(os.environ.get("ACTFIRST_TEST_SEED", random.SystemRandom().randrange(2**32)))
    print(f"ACTFIRST_TEST_SEED={seed}")
    rng = random.Random(seed)
    pieces = ["<action>", "</action>", "<think>", "</think>", "<", ">", "/", "action", "<act", "ion>", " ", "\n",
              "\t", "\u00a0", "\u3000", "go to", "kitchen", "é", "☃", "𝔘", "\x00", "\ufffd", "\u202e", "\ud800"]
    for case in range(2000):
        if rng.random() < 0.5:
            text = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 30)))
        else:
            text = "".join(chr(rng.randrange(0, 0x30000)) for _ in range(rng.randrange(0, 60)))
        got = extract_action(text, truncated=False)
        context = f"ACTFIRST_TEST_SEED={seed} case {case}: {text!r}"
        assert isinstance(got, str), context
        assert got == reference_extract(text), context
        assert got == got.strip() and got in text, context
        assert extract_action(text, truncated=True) == "", context
        # Any tag-free junk inside a field, before it and after it: the field's text comes back, stripped.
        clean = text
        while "<action>" in clean or "</action>" in clean:
            clean = clean.replace("<action>", "").replace("</action>", "")
        if "</think>" not in text and "<think>" not in clean:  # a later </think> would start the answer after it
            assert extract_action(f"{clean}<action>{clean}</action>{text}", truncated=False) == clean.strip(), context


def test_aborted_result_raises_a_clear_error():
    result = GenerationResult(request_id="r1", kind=RequestKind.FAST_ACTION, token_ids=[5, 6], text="ab",
                              logprobs=[-1.0, -1.0], finish_reason="abort", weight_version=0, token_versions=[0, 0],
                              queue_wait_s=0.0, latency_s=0.1, num_preemptions=0)
    with pytest.raises(GenerationAborted, match="r1.*aborted after 2 tokens"):
        check_not_aborted(result)
    for reason in ("stop", "length"):
        result.finish_reason = reason
        assert check_not_aborted(result) is result


PROMPT_HEAD = [11, 12, 13, 14, 15]
START = 100  # the prompt's last token: where each chain starts


def fast(engine, chain, max_tokens, seed=0):
    return asyncio.run(generate_fast_action(engine, PROMPT_HEAD + [chain[0]], max_tokens=max_tokens,
                                            temperature=1.0, top_p=1.0, seed=seed))


def test_fast_action_stops_at_single_token_tag(engine, tokenizer, ids, load_chain):
    chain = [START, *ids("<action>", "go", " to", " kitchen", "</action>", "\n\n", "look"),
             tokenizer.eos_token_id]
    version = load_chain(chain)
    res = fast(engine, chain, max_tokens=32)
    assert res.token_ids == chain[1:6]  # stopped at </action>, although the model would go on
    assert res.text == "<action>go to kitchen</action>" and res.action == "go to kitchen"
    assert not res.truncated and res.weight_version == version
    assert res.latency_s > 0.0 and res.queue_wait_s >= 0.0  # in-slot and waiting, apart


def test_fast_action_stops_at_multi_token_tags(engine, tokenizer, ids, load_chain):
    # As with Qwen3's tokenizer, a tag spelled with several plain-text tokens; first the closing tag ("</" is two).
    chain = [START, *ids("<action>", "look", " around"), *tokenizer.encode("</", add_special_tokens=False),
             *ids("action", ">", "\n\n", "go")]
    load_chain(chain)
    res = fast(engine, chain, max_tokens=32)
    assert res.text == "<action>look around</action>" and res.action == "look around"
    assert res.token_ids == chain[1:8] and not res.truncated
    # The opening tag in pieces.
    chain = [START, *ids("<", "act", "ion", ">", "look", " around", "</action>", "\n\n", "go")]
    load_chain(chain)
    res = fast(engine, chain, max_tokens=32)
    assert res.text == "<action>look around</action>" and res.action == "look around"
    assert res.token_ids == chain[1:8] and not res.truncated


def test_fast_action_truncated_at_max_tokens(engine, tokenizer, ids, load_chain):
    chain = [START, *ids("<action>", "go", " to", " kitchen", "</action>"), tokenizer.eos_token_id]
    load_chain(chain)
    res = fast(engine, chain, max_tokens=3)
    assert res.token_ids == chain[1:4] and res.text == "<action>go to"
    assert res.truncated and res.action == ""
    # Reaching max_tokens with the closing tag as the last token is not truncation.
    res = fast(engine, chain, max_tokens=5)
    assert res.text == "<action>go to kitchen</action>" and not res.truncated and res.action == "go to kitchen"


def test_fast_action_eos_without_field_is_an_empty_action(engine, tokenizer, ids, load_chain):
    chain = [START, *ids("<action>", "go"), tokenizer.eos_token_id]
    load_chain(chain)
    res = fast(engine, chain, max_tokens=16)
    assert res.token_ids == chain[1:] and res.text == "<action>go"
    assert not res.truncated and res.action == ""  # ended normally, but with an unclosed field: invalid action

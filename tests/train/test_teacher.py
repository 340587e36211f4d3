"""TeacherScorer: log pi_teacher against a float64 transformers forward; a different tokenizer is refused."""

import asyncio
import concurrent.futures
import shutil
import threading
import time

import pytest
import torch
from train_helpers import random_samples
from transformers import AutoTokenizer, Qwen3ForCausalLM

from actfirst.core.config import ModelConfig
from actfirst.models.build import build_model
from actfirst.rollout.budget import FullResponse
from actfirst.rollout.intervention import Intervention
from actfirst.rollout.strategies import UOPDConfig
from actfirst.train.teacher import TeacherScorer


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """A teacher of another size with the student's (env-bpe) tokenizer."""
    cfg = ModelConfig(tokenizer="env-bpe", hidden_size=96, num_hidden_layers=3, num_attention_heads=3,
                      num_key_value_heads=1, head_dim=32, intermediate_size=160, seed=7)
    return build_model(cfg, tmp_path_factory.mktemp("teacher") / "teacher")


def reference_logprobs(model_dir, sample):
    """log_softmax of the logits of a plain float64 forward over the sample alone, at the response tokens."""
    model = Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    ids = torch.tensor([sample.context_ids + sample.response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(sample.context_ids) - 1:-1]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(sample.response_ids)[:, None])[:, 0]


@pytest.mark.parametrize("dtype,atol", [("float32", 1e-5), ("float64", 1e-5)])
def test_scores_match_a_float64_forward(teacher_dir, tiny_model_dir, vocab_size, gen, dtype, atol):
    scorer = TeacherScorer.load(teacher_dir, student_tokenizer=tiny_model_dir, dtype=dtype, micro_batch_tokens=48)
    samples = random_samples(gen, 5, vocab_size, max_context=30, max_response=14, scored=False)
    scorer.score(samples)
    worst = 0.0
    for s in samples:
        got = torch.tensor(s.teacher_logprobs, dtype=torch.float64)
        assert got.shape == (len(s.response_ids),)  # every response token, inserted ones too
        ref = reference_logprobs(teacher_dir, s)
        worst = max(worst, float((got - ref).abs().max()))
        torch.testing.assert_close(got, ref, atol=atol, rtol=0)
    print(f"teacher {dtype}: max |logp - float64 reference| = {worst:.2e}")
    assert all(p.grad is None and not p.requires_grad for p in scorer.head.parameters())
    assert not scorer.head.model.training


def test_refuses_another_vocabulary(tiny_model_dir, tmp_path):
    other = build_model(ModelConfig(tokenizer="env-bpe", env_bpe_vocab_size=400, hidden_size=32,
                                    num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1, head_dim=32,
                                    intermediate_size=64), tmp_path / "other")
    with pytest.raises(ValueError) as err:
        TeacherScorer.load(other, student_tokenizer=tiny_model_dir)
    msg = str(err.value)
    assert str(other) in msg and str(tiny_model_dir) in msg and "vocab" in msg


def test_refuses_an_extra_added_token(tiny_model_dir, tmp_path):
    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_model_dir, teacher)
    tok = AutoTokenizer.from_pretrained(teacher)
    tok.add_tokens(["<extra_tool>"])
    tok.save_pretrained(teacher)
    with pytest.raises(ValueError, match=r"added tokens.*<extra_tool>"):
        TeacherScorer.load(teacher, student_tokenizer=tiny_model_dir)


def test_refuses_a_chat_template_that_renders_other_ids(tiny_model_dir, tmp_path):
    """The check compares the ids a template renders, not its text: a re-saved template with the same rendering
    passes (tests/models/test_tokenizer_match.py), one that renders other ids is refused."""
    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_model_dir, teacher)
    tok = AutoTokenizer.from_pretrained(teacher)
    tok.chat_template = "Teacher. " + tok.chat_template
    tok.save_pretrained(teacher)
    with pytest.raises(ValueError, match="chat template") as err:
        TeacherScorer.load(teacher, student_tokenizer=AutoTokenizer.from_pretrained(tiny_model_dir))
    assert "vocab" not in str(err.value)


def test_refuses_ids_outside_the_teacher_vocabulary(tiny_model_dir, vocab_size, gen):
    scorer = TeacherScorer.load(tiny_model_dir, student_tokenizer=tiny_model_dir)
    samples = random_samples(gen, 2, vocab_size, scored=False)
    samples[1].response_ids[0] = 10**6
    with pytest.raises(ValueError, match="token id 1000000 of sample 1"):
        scorer.score(samples)


def test_a_sample_already_scored_keeps_its_scores(tiny_model_dir, vocab_size, gen):
    """The teacher is frozen: what it scored once (UOPD's proposals, during the rollout) is not scored again, and
    scoring the rest alone gives what scoring all of them gives."""
    scorer = TeacherScorer.load(tiny_model_dir, student_tokenizer=tiny_model_dir)
    samples = random_samples(gen, 4, vocab_size, scored=False)
    scorer.score(samples)
    reference = [list(s.teacher_logprobs) for s in samples]
    marker = [0.5] * len(samples[1].response_ids)
    samples[1].teacher_logprobs = marker
    for s in (samples[0], samples[2], samples[3]):
        s.teacher_logprobs = None
    scorer.score(samples)
    assert samples[1].teacher_logprobs is marker
    for i in (0, 2, 3):
        assert samples[i].teacher_logprobs == pytest.approx(reference[i], abs=1e-5)


def test_concurrent_callers_never_overlap_in_the_forward(tiny_model_dir, vocab_size, gen):
    """UOPD scores proposals during the rollout (``Intervention.score``, in a thread of its own) while the update
    scores its batch (the trainer calls ``TeacherScorer.score`` from the update's thread): the teacher runs one
    forward at a time whoever calls, or two micro-batches' activations would be alive at once, twice what
    ``micro_batch_tokens`` was sized for. Every forward of the real teacher is recorded as it enters and leaves
    (held for 20 ms inside, so that an overlap cannot slip between two forwards)."""
    scorer = TeacherScorer.load(tiny_model_dir, student_tokenizer=tiny_model_dir, micro_batch_tokens=48)
    inside, most, forwards = 0, 0, 0
    count = threading.Lock()

    def enter(module, args):
        nonlocal inside, most, forwards
        with count:
            inside, forwards = inside + 1, forwards + 1
            most = max(most, inside)
        time.sleep(0.02)

    def leave(module, args, output):
        nonlocal inside
        with count:
            inside -= 1

    scorer.head.register_forward_pre_hook(enter)
    scorer.head.register_forward_hook(leave)
    intervention = Intervention(UOPDConfig(), rollout=None, teacher_engine=None, scorer=scorer, tokenizer=None,
                                num_updates=1, seed=0)
    batch = random_samples(gen, 8, vocab_size, max_context=30, max_response=14, scored=False)
    proposals = random_samples(gen, 4, vocab_size, scored=False)
    start = threading.Barrier(2)

    def rollout() -> list:
        start.wait()
        return [asyncio.run(intervention.score(p.context_ids, FullResponse(
            token_ids=p.response_ids, loss_mask=[1] * len(p.response_ids), logprobs=p.logprobs, text="", action="",
            truncated=False, weight_version=0, token_versions=[0] * len(p.response_ids), num_requests=1,
            num_inserted=0, queue_wait_s=0.0, latency_s=0.0))) for p in proposals]

    def update() -> None:
        start.wait()
        scorer.score(batch)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        scored, updated = pool.submit(rollout), pool.submit(update)
        scores, _ = scored.result(timeout=120), updated.result(timeout=120)
    assert forwards >= len(proposals) + 2 and inside == 0
    assert most == 1, f"{most} teacher forwards ran at once"
    assert len(scores) == len(proposals) and all(s.teacher_logprobs is not None for s in batch)

"""UOPD's rule by hand (003 Sec. 4.2, 5.3): the quantile threshold, the rate schedules, the two uncertainty scores,
the curricula's W_n and P_n (Appendix D.3), the rule's state across a checkpoint, and the samples of a turn whose
proposal the teacher replaced. The rule inside real
episodes is tested in ``test_runner.py``."""

import asyncio
import math
import random

import pytest

from actfirst.core.config import ConfigError
from actfirst.envs.response_format import ACTION_TAGS
from actfirst.envs.search.text import SEARCH_RESPONSES
from actfirst.rollout.budget import FullResponse
from actfirst.rollout.intervention import (
    Intervention,
    quantile_threshold,
    scheduled_rate,
    teacher_action,
    uncertainty_score,
)
from actfirst.rollout.runner import EpisodeResult, episode_samples
from actfirst.rollout.strategies import BackwardToForward, TCODConfig, UOPDConfig, make_strategy


def test_threshold_is_the_one_minus_rate_quantile():
    scores = [0.1, 0.5, 0.2, 0.9, 0.3]  # sorted: 0.1 0.2 0.3 0.5 0.9
    assert quantile_threshold(scores, 0.25) == pytest.approx(0.5)  # position 0.75 * 4 = 3
    assert quantile_threshold(scores, 0.30) == pytest.approx(0.3 + 0.8 * (0.5 - 0.3))  # position 2.8
    assert quantile_threshold(scores, 0.0) == pytest.approx(0.9)  # nothing above the maximum: no intervention
    assert quantile_threshold(scores, 1.0) == pytest.approx(0.1)


@pytest.mark.parametrize("rate,values", [
    ((0.30, 0.05), {0: 0.30, 5: 0.175, 10: 0.05, 14: 0.05}),
    ((0.50, 0.30), {0: 0.50, 2: 0.46, 10: 0.30}),
    ((0.15, 0.15), {0: 0.15, 7: 0.15}),
])
def test_schedules_at_given_updates(rate, values):
    for update, expected in values.items():
        assert scheduled_rate(rate, update, num_updates=11) == pytest.approx(expected)


def test_uncertainty_scores_over_sampled_tokens():
    teacher, student, mask = [-0.5, -1.5, -9.0, -1.0], [-0.2, -0.4, -0.1, -0.3], [1, 1, 0, 1]
    assert uncertainty_score("teacher_confidence", teacher, student, mask) == pytest.approx(1 - math.exp(-1.0))
    assert uncertainty_score("logprob_gap", teacher, student, mask) == pytest.approx((0.3 + 1.1 + 0.7) / 3)
    with pytest.raises(ValueError, match="uopd.score"):
        uncertainty_score("entropy", teacher, student, mask)


def test_the_rule_refuses_bad_settings_by_name():
    with pytest.raises(ConfigError, match=r"rate=\(0.3, 1.5\)"):
        UOPDConfig(rate=(0.3, 1.5))
    with pytest.raises(ConfigError, match="min_scores=600"):
        UOPDConfig(buffer_size=512, min_scores=600)
    with pytest.raises(ConfigError, match="eta=0"):
        TCODConfig(eta=0)


def test_threshold_waits_for_min_scores_and_the_state_survives_a_checkpoint():
    rule = Intervention(UOPDConfig(rate=(0.5, 0.5), buffer_size=4, min_scores=3), rollout=None, teacher_engine=None,
                        scorer=None, tokenizer=None, num_updates=10, seed=3)
    rule.scores.extend([0.4, 0.2])
    assert rule.episode_rule() == (0.5, None)  # random at r_n until min_scores
    rule.scores.extend([0.8, 0.6, 0.1])  # the buffer keeps the 4 most recent
    assert list(rule.scores) == [0.2, 0.8, 0.6, 0.1]
    assert rule.episode_rule() == pytest.approx((0.5, 0.4))
    rule.update = 9  # the schedule is constant here; the rate comes from the update the batch is collected for
    assert rule.episode_rule()[0] == 0.5
    rule.rng.random()
    copy = Intervention(rule.cfg, rollout=None, teacher_engine=None, scorer=None, tokenizer=None, num_updates=10,
                        seed=99)
    copy.load_state_dict(rule.state_dict())
    assert list(copy.scores) == list(rule.scores) and copy.rng.random() == rule.rng.random()


@pytest.mark.parametrize("n,w", [(0, 1), (5, 1), (6, 2), (17, 3), (1000, 50)])
def test_f2b_horizon(n, w):
    f2b = make_strategy("f2b")  # eta 6 (ALFWorld, D.3)
    assert f2b.horizon(n, max_turns=50) == w
    capped = make_strategy("f2b", TCODConfig(eta=6, max_turns=2))
    assert capped.horizon(n, max_turns=50) == min(w, 2)


@pytest.mark.parametrize("length,n,prefix", [(7, 0, 6), (7, 4, 6), (7, 5, 5), (7, 29, 1), (7, 30, 0), (7, 900, 0),
                                             (1, 0, 0), (2, 0, 1)])
def test_b2f_prefix(length, n, prefix):
    b2f = make_strategy("b2f")  # eta 5 (ALFWorld, D.3)
    assert isinstance(b2f, BackwardToForward) and b2f.prefix_length(length, n) == prefix


@pytest.mark.parametrize("rate", [0.3, 0.0, 1.0])
def test_random_selection_intervenes_at_the_rate(rate):
    seed = random.randrange(1 << 30)
    rule = Intervention(UOPDConfig(selection="random", rate=(rate, rate)), rollout=None, teacher_engine=None,
                        scorer=None, tokenizer=None, num_updates=10, seed=seed)

    async def decide_many():
        return [(await rule.decide([1], None, *rule.episode_rule()))[0] for _ in range(4000)]

    records = asyncio.run(decide_many())
    share = sum(r.intervened for r in records) / len(records)
    print(f"seed {seed}: share {share:.3f}")
    assert abs(share - rate) < 0.04 and all(r.score is None and r.rate == rate for r in records)
    if rate in (0.0, 1.0):  # never and always
        assert share == rate


def full_response(tokens: list[int], action: str = "look") -> FullResponse:
    return FullResponse(token_ids=tokens, loss_mask=[1] * len(tokens), logprobs=[-1.0] * len(tokens), text="",
                        action=action, truncated=not action, weight_version=3, token_versions=[3] * len(tokens),
                        num_requests=1, num_inserted=0, queue_wait_s=0.0, latency_s=0.0)


def test_a_replaced_proposal_carries_no_loss_even_when_the_step_failed():
    """The environment failed before executing the teacher's action at turn 1 (no TurnRecord for it): the proposal
    the rule replaced still yields no OPD sample, and the teacher's response is the turn's SFT target."""
    proposals, teacher = [full_response([1, 2]), full_response([3, 4])], full_response([5, 6, 7])
    episode = EpisodeResult(task="t", task_type="x", turns=[], score=0.0, won=False, done=False, guided=False,
                            fallback_turn=None, aligned_turns=0, fully_aligned=False, contexts=[[9], [9, 8]],
                            full_responses=proposals, full_response_done=[0.0, 0.0], failure="EnvError: boom",
                            teacher_responses=[None, teacher], replaced=[False, True])
    samples = episode_samples(episode, "uopd", sft_weight=2.0)
    assert [(s.turn, s.response_ids, s.sft_weight) for s in samples] == [(0, [1, 2], 0.0), (1, [5, 6, 7], 2.0)]
    assert samples[1].weight_version == 3 and samples[1].context_ids == [9, 8]


@pytest.mark.parametrize("response_format, text, want", [
    (SEARCH_RESPONSES, "<think>who</think> <search> eiffel designer </search>",
     "<think>who</think> <search> eiffel designer </search>"),
    (SEARCH_RESPONSES, "<think>so</think> <answer> Dijon </answer>", "<think>so</think> <answer> Dijon </answer>"),
    (SEARCH_RESPONSES, "<think>no field</think> just text", None),
    (SEARCH_RESPONSES, "<think>cut</think> <search> never closed", None),
    (ACTION_TAGS, "<think>go</think><action>go to desk 1</action>", "go to desk 1"),
    (ACTION_TAGS, "<think>go</think>go to desk 1", None),
])
def test_the_teacher_path_acts_only_on_a_complete_action(response_format, text, want):
    """003's teacher path: a teacher output with no complete action field (Search: no closed <search> or <answer>)
    is neither executed nor imitated (counted as uopd/teacher_no_action), whatever the environment would make of it."""
    truncated = not response_format.has_action(text)
    response = full_response([1, 2], action=response_format.extract_action(text, truncated=truncated))
    response.text = text
    print(f"{text!r}: extract_action {response.action!r}")
    assert teacher_action(response, response_format) == want

"""UOPD's intervention rule (UOPD paper, 003: Sec. 4.2, Sec. 5.3, Appendix D.4).

At turn t the student's full response y_t^S (think, then act) is its proposal. Its uncertainty score delta_t is
compared with the episode's threshold tau_n = Quantile_{1 - r_n}(D_n), the (1 - r_n) quantile of a buffer D_n of
recent scores, recomputed at the start of each episode and held fixed within it (Sec. 4.2). If delta_t > tau_n the
teacher samples its own full response y_t^T from the same context, and its action is executed in place of the
student's (``uopd.teacher_execution``); the teacher's response becomes an SFT target of weight beta
(``uopd.sft_weight``) and the student's proposal carries no loss (it was not executed). Otherwise the student's
action is executed and its response is an OPD sample, as in Vanilla OPD.

The scores. Our copy of the paper lost Appendix D.4's formulas ("Intervention signals" keeps its heading only), so
the two signals are defined here from what Sec. 4.2 and 5.3 say of them, over the sampled tokens j of the student's
response (B.4's mask: inserted tokens are not the student's):

- ``teacher_confidence`` (the default, as on ALFWorld and WebShop): the teacher's length-normalized confidence in
  the proposal, C_t = exp(1/|y| sum_j log pi_T(y_j | h_t, y_<j)), its geometric-mean token probability; the
  uncertainty is delta_t = 1 - C_t.
- ``logprob_gap``: the length-normalized student-teacher log-prob gap, delta_t = 1/|y| sum_j (log pi_theta(y_j) -
  log pi_T(y_j)): large where the student is sure of tokens the teacher does not support. log pi_theta is the
  engine's sampling log-prob (at the rollout temperature; pi_theta itself at temperature 1).

The threshold only depends on the scores' order, so any increasing function of these ranks turns alike.

Before the buffer holds ``uopd.min_scores`` scores there is no quantile to take; those turns are intervened at
random with probability r_n, so that the first rollout batches, where the schedule's rate is highest and the
student weakest, still get their share of corrections (the alternative, no intervention until the buffer fills,
would skip the first rollout batch entirely: all of its episodes start with an empty buffer). Every score still
enters the buffer. ``uopd.selection: random`` is Sec. 5.3's ablation: every turn is intervened with probability
r_n, and no score is computed.

The rate r_n falls linearly from ``uopd.rate[0]`` at the first update to ``uopd.rate[1]`` at the last; a rollout
batch takes the rate of the update it is collected for (in the paper one rollout batch is one training step; unless
``pipeline: serial``, the batches collected during update u are for update u + 1), and an episode holds r_n with
tau_n.

A teacher response without an action (truncated, B.3, or ended without a complete action: Search's output with no
closed ``<search>`` or ``<answer>``, which the environment would answer with its invalid-action reply) is neither
executed nor imitated: the student's action runs and keeps its OPD sample (counted: ``uopd/teacher_no_action``;
:func:`teacher_action`).

The teacher generates on its own in-process vLLM engine, beside the student's (a second ``ActFirstEngine`` in this
process, with B.3's budget as the student's full responses): its requests batch, and the student's engine and
scheduler are not shared with a model whose weights never change. The teacher's scores for delta_t come from the
trainer's frozen teacher (the same model that scores the update's tokens).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import math
import os
import random
import time
from typing import Any

import numpy as np
import torch

from actfirst.core.config import RolloutConfig
from actfirst.engine.core import ActFirstEngine
from actfirst.envs.response_format import ResponseFormat
from actfirst.rollout.budget import FullResponse, generate_full_response
from actfirst.rollout.sample import SampleScorer
from actfirst.rollout.strategies import UOPDConfig


@dataclasses.dataclass(slots=True)
class InterventionRecord:
    """UOPD's decision at one student turn."""

    score: float | None
    """delta_t (None with random selection)."""
    threshold: float | None
    """The episode's tau_n (None: random selection, or the buffer still short of ``min_scores``)."""
    rate: float
    """r_n of the episode's rollout batch."""
    intervened: bool
    """The rule chose the teacher (its response is then used unless ``teacher_no_action``)."""
    teacher_no_action: bool = False
    """The teacher's response held no action (truncated, B.3, or ended without one): neither executed nor
    imitated."""
    score_s: float = 0.0
    """Seconds spent scoring the proposal with the teacher."""
    teacher_s: float = 0.0
    """Seconds the teacher's full response took (0 when not intervened)."""


def scheduled_rate(rate: tuple[float, float], update: int, num_updates: int) -> float:
    """r_n for a rollout batch collected for update ``update`` (0-based): linear from ``rate[0]`` at the first
    update to ``rate[1]`` at the last (Sec. 5.3's schedules)."""
    progress = min(1.0, max(0.0, update / max(1, num_updates - 1)))
    return rate[0] + (rate[1] - rate[0]) * progress


def quantile_threshold(scores: list[float], rate: float) -> float:
    """tau_n = Quantile_{1 - r_n}(D_n), numpy's linear interpolation between order statistics."""
    return float(np.quantile(np.asarray(scores, dtype=np.float64), 1.0 - rate))


def uncertainty_score(kind: str, teacher_logprobs: list[float], student_logprobs: list[float],
                      loss_mask: list[int]) -> float:
    """delta_t of a proposal (see the module docstring), over its sampled tokens."""
    pairs = [(t, s) for t, s, m in zip(teacher_logprobs, student_logprobs, loss_mask, strict=True) if m]
    if not pairs:
        raise ValueError("a proposal without sampled tokens has no uncertainty score")
    if kind == "teacher_confidence":
        return 1.0 - math.exp(sum(t for t, _ in pairs) / len(pairs))
    if kind == "logprob_gap":
        return sum(s - t for t, s in pairs) / len(pairs)
    raise ValueError(f"uopd.score={kind!r}: not 'teacher_confidence' or 'logprob_gap'")


class Intervention:
    """One rank's UOPD state: the score buffer D_n, the schedule, the teacher's engine and scorer."""

    def __init__(self, cfg: UOPDConfig, *, rollout: RolloutConfig, teacher_engine: ActFirstEngine,
                 scorer: SampleScorer, tokenizer: Any, num_updates: int, seed: int,
                 scoring_cores: tuple[int, ...] | None = None) -> None:
        self.cfg, self.rollout = cfg, rollout
        self.teacher_engine, self.scorer, self.tokenizer = teacher_engine, scorer, tokenizer
        self.executor = None if scoring_cores is None else concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="uopd-score", initializer=os.sched_setaffinity, initargs=(0, scoring_cores))
        """Where a proposal's teacher forward runs: a thread on ``scoring_cores`` (the trainer's, with
        ``parallel.cpu_pin_cores``), else the loop's default executor."""
        self.num_updates = num_updates
        self.scores: collections.deque[float] = collections.deque(maxlen=cfg.buffer_size)
        self.rng = random.Random(seed)
        self.update = 0
        """The 0-based update the rollout batch now starting is collected for (set by the trainer)."""

    def episode_rule(self) -> tuple[float, float | None]:
        """(r_n, tau_n) for an episode starting now, held for the episode (tau_n None: random selection, or too few
        scores yet)."""
        rate = scheduled_rate(self.cfg.rate, self.update, self.num_updates)
        if self.cfg.selection == "random" or len(self.scores) < self.cfg.min_scores:
            return rate, None
        return rate, quantile_threshold(list(self.scores), rate)

    async def decide(self, context_ids: list[int], proposal: FullResponse, rate: float, threshold: float | None
                     ) -> tuple[InterventionRecord, list[float] | None]:
        """Whether the teacher replaces ``proposal`` at this turn (the episode's ``rate`` and ``threshold``), and the
        teacher's log-probs of the proposal's tokens (None with random selection: nothing was scored; the update
        scores its sample then). The proposal's score joins the buffer."""
        if self.cfg.selection == "random":
            return InterventionRecord(None, None, rate, self.rng.random() < rate), None
        t0 = time.perf_counter()
        score, teacher_logprobs = await self.score(context_ids, proposal)
        self.scores.append(score)
        intervened = self.rng.random() < rate if threshold is None else score > threshold
        record = InterventionRecord(score, threshold, rate, intervened, score_s=time.perf_counter() - t0)
        return record, teacher_logprobs

    async def score(self, context_ids: list[int], proposal: FullResponse) -> tuple[float, list[float]]:
        """delta_t of ``proposal`` at ``context_ids`` and the teacher's log-probs it came from (the teacher's forward
        in a thread: the loop keeps serving)."""
        sample = proposal.to_sample(context_ids, task="uopd", turn=0, strategy="uopd")

        def work() -> None:
            if self.scorer.device.type == "cuda":  # the current CUDA device is per thread
                torch.cuda.set_device(self.scorer.device)
            self.scorer.score([sample])  # the scorer's own lock: one teacher forward at a time, the update's too

        await asyncio.get_running_loop().run_in_executor(self.executor, work)
        delta = uncertainty_score(self.cfg.score, sample.teacher_logprobs, sample.logprobs, sample.loss_mask)
        return delta, sample.teacher_logprobs

    async def teacher_response(self, context_ids: list[int], seed: int, response_format: ResponseFormat
                               ) -> FullResponse:
        """a_t^T ~ pi_T(. | h_t): the teacher's full response at the rollout temperature, with B.3's budget, in the
        benchmark's ``response_format``."""
        budget = self.rollout.budget
        return await generate_full_response(
            self.teacher_engine, self.tokenizer, context_ids, first_stage=budget.first_stage, total=budget.total,
            second_stage=budget.second_stage, temperature=self.rollout.temperature, top_p=self.rollout.top_p,
            seed=seed, response_format=response_format)

    def state_dict(self) -> dict[str, Any]:
        """The score buffer and the random stream (the schedule follows the update count)."""
        return {"scores": list(self.scores), "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`."""
        self.scores.clear()
        self.scores.extend(float(x) for x in state["scores"])
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


def teacher_action(response: FullResponse, response_format: ResponseFormat) -> str | None:
    """What the teacher path executes and imitates of the teacher's ``response``: its action, or None when the
    response holds no complete action in the benchmark's ``response_format`` (whatever the environment would make
    of the text, e.g. Search's invalid-action reply)."""
    if response.action and response_format.has_action(response.text):
        return response.action
    return None


def intervention_metrics(records: list[InterventionRecord]) -> dict[str, float]:
    """An update's UOPD figures over its student turns: realized and target intervention rates, the thresholds the
    episodes held, the scores' distribution, and the teacher's cost per intervened turn."""
    nan = float("nan")
    scores = [r.score for r in records if r.score is not None]
    thresholds = [r.threshold for r in records if r.threshold is not None]
    intervened = [r for r in records if r.intervened]

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else nan

    return {
        "uopd/turns": float(len(records)),
        "uopd/intervention_rate": len(intervened) / len(records) if records else nan,
        "uopd/teacher_no_action": float(sum(r.teacher_no_action for r in records)),
        "uopd/target_rate": mean([r.rate for r in records]),
        "uopd/threshold_mean": mean(thresholds),
        "uopd/random_turns": float(sum(r.threshold is None for r in records)),
        "uopd/score_mean": mean(scores),
        "uopd/score_p50": float(np.quantile(scores, 0.5)) if scores else nan,
        "uopd/score_p90": float(np.quantile(scores, 0.9)) if scores else nan,
        "uopd/score_s_per_turn": mean([r.score_s for r in records if r.score is not None]),
        "uopd/teacher_s_per_intervention": mean([r.teacher_s for r in intervened]),
    }

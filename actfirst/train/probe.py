"""The per-update diagnostic (not the method's): the teacher-minus-student log-prob gap at fixed contexts, and with
several ranks the engines' agreement after a weight sync. Both run on a quiet engine and their time is left out of
the training time (``probe_s``)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from actfirst.core.config import TrainConfig
from actfirst.engine.core import ActFirstEngine
from actfirst.engine.request import RequestKind, SamplingSpec
from actfirst.parallel.context import ParallelContext, all_gather_objects, reduce_sum
from actfirst.rollout.runner import RolloutBatch, RolloutRunner
from actfirst.rollout.sample import SampleScorer
from actfirst.train.pipeline import share

ENGINE_PROBE = "The same weights give the same log-probs on every rank."
"""The prompt each rank's engine answers after a weight sync (with several ranks): the engines must agree."""


class Probe:
    """This rank's probe contexts (taken from the first rollout batch) and the run's gaps so far."""

    def __init__(self, cfg: TrainConfig, ctx: ParallelContext) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.wanted = share(cfg.probe_contexts, ctx.rank, ctx.world_size)
        """This rank's share of ``probe_contexts``."""
        self.contexts: list[list[int]] = []
        self.gaps: list[float] = []

    def offer(self, batch: RolloutBatch) -> None:
        """Take this rank's contexts from the first rollout batch that gives any, spread over its episodes and
        turns."""
        if not self.contexts and self.wanted:
            step = max(1, len(batch.samples) // self.wanted)
            self.contexts = [s.context_ids for s in batch.samples[::step][:self.wanted]]

    def due(self, update: int) -> bool:
        """Every ``probe_every`` updates and after the last (never with ``probe_contexts: 0``)."""
        cfg = self.cfg
        return bool(cfg.probe_contexts) and (update % cfg.probe_every == 0 or update == cfg.num_updates)

    async def gap(self, runner: RolloutRunner, teacher: SampleScorer) -> dict[str, float]:
        """Teacher-minus-student log-prob gap of fresh full responses at the probe contexts, over every rank's: an
        estimate of -KL(student || teacher) there (Eq. 4-5)."""
        responses = await asyncio.gather(*(runner.full_response(c, seed=10_007 + 97 * self.ctx.rank + i)
                                           for i, c in enumerate(self.contexts)))
        samples = [r.to_sample(c, task="probe", turn=0, strategy="probe")
                   for c, (r, _) in zip(self.contexts, responses, strict=True)]
        teacher.score(samples)
        diffs = [t - s for x in samples
                 for t, s, m in zip(x.teacher_logprobs, x.logprobs, x.loss_mask, strict=True) if m]
        total, count = reduce_sum([sum(diffs), len(diffs)])
        gap = total / count if count else math.nan
        self.gaps.append(gap)
        return {"probe/gap": gap}

    async def check_engines(self, engine: ActFirstEngine, tokenizer: Any) -> dict[str, float]:
        """With several ranks: every engine answers a fixed prompt with a fixed seed; engines that hold the same
        weights sample the same tokens with the same log-probs. Returns whether every rank's tokens equal rank 0's
        (``sync/engine_tokens_agree``) and the largest log-prob difference from rank 0's over the tokens up to the
        first that differs (``sync/engine_logprob_spread``)."""
        prompt = tokenizer.encode(ENGINE_PROBE, add_special_tokens=False)
        result = await engine.generate(prompt, RequestKind.FULL_RESPONSE,
                                       SamplingSpec(max_tokens=8, temperature=1.0, seed=12_345, ignore_eos=True))
        answers = all_gather_objects((result.token_ids, result.logprobs))
        tokens, logps = answers[0]
        spread = 0.0
        for other_tokens, other_logps in answers[1:]:
            for t, u, a, b in zip(tokens, other_tokens, logps, other_logps, strict=False):
                spread = max(spread, abs(a - b))
                if t != u:
                    break
        return {"sync/engine_tokens_agree": float(all(t == tokens for t, _ in answers)),
                "sync/engine_logprob_spread": spread}

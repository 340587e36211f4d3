"""Budgeted decoding of full think-then-act responses y_t = (z_t, a_t) (Appendix B.3), with B.4's masks.

At most two ``FULL_RESPONSE`` requests, following Qwen3's thinking-budget recipe:

1. the first request generates at most ``first_stage`` tokens. If it finishes normally (EOS) it is the response;
   so is a response that already holds a closed action field (B.3: reaching the limit after ``</action>`` does
   not make it truncated);
2. otherwise it reached its budget. If action generation had not started (no ``<action>``), the early-stop text
   of :func:`early_stop_text` is inserted; then a second request continues from the prompt, the first-stage
   tokens and the inserted tokens, with at most ``min(second_stage, total - sampled - inserted)`` tokens. When
   nothing remains there is no second request, and nothing is inserted (the inserted text only exists to prompt
   the second request).

The response is truncated when it ends at a length limit without a closed action field. Full responses have no
stop string: they end at EOS, also after ``</action>``. Decisions read the decoded text, never tag token ids, so
they hold whether a tag is one token (``env-bpe``) or several (Qwen3's tokenizer).
"""

from __future__ import annotations

import dataclasses

from transformers import PreTrainedTokenizerBase

from actfirst.engine.core import ActFirstEngine
from actfirst.engine.request import GenerationResult, RequestKind, SamplingSpec
from actfirst.envs.response_format import ACTION_TAGS, ResponseFormat
from actfirst.rollout.actions import check_not_aborted
from actfirst.rollout.sample import Sample


def second_stage_max_tokens(*, num_first: int, num_inserted: int, total: int, second_stage: int) -> int:
    """Tokens the second request may generate (B.3): at most ``second_stage``, within the total budget after
    counting both sampled and inserted tokens; 0 means no second request."""
    return max(0, min(second_stage, total - num_first - num_inserted))


@dataclasses.dataclass(kw_only=True, slots=True)
class FullResponse:
    """A budgeted full response y_t: sampled and inserted tokens in order, with B.4's mask and log pi_old."""

    token_ids: list[int]
    loss_mask: list[int]
    """1 for a sampled token, 0 for an inserted one (B.4: in the context, outside the loss and its normalization)."""
    logprobs: list[float]
    """The engine's log pi_old of each sampled token; 0.0 at inserted positions."""
    text: str
    """All tokens decoded together, tags included (special tokens such as EOS skipped, as the engine does)."""
    action: str
    """:func:`~actfirst.rollout.actions.extract_action` of ``text`` (``""`` when truncated)."""
    truncated: bool
    """Ended at a length limit without a closed action field (B.3)."""
    weight_version: int
    """The oldest weight version of its tokens (a weight update can fall between or inside its requests)."""
    token_versions: list[int]
    """The weight version that generated each token; an inserted token has that of the token before it."""
    num_requests: int
    num_inserted: int
    queue_wait_s: float
    """Summed over its requests."""
    latency_s: float
    """Summed over its requests."""

    def to_sample(self, context_ids: list[int], *, task: str, turn: int, strategy: str) -> Sample:
        """The turn-level training sample of this response at context ``context_ids`` (its prompt, B.4)."""
        return Sample(context_ids=list(context_ids), response_ids=list(self.token_ids), loss_mask=list(self.loss_mask),
                      logprobs=list(self.logprobs), weight_version=self.weight_version,
                      token_versions=list(self.token_versions), task=task, turn=turn, strategy=strategy)


async def generate_full_response(engine: ActFirstEngine, tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int],
                                 *, first_stage: int, total: int, second_stage: int, temperature: float,
                                 top_p: float, seed: int | None,
                                 response_format: ResponseFormat = ACTION_TAGS) -> FullResponse:
    """Generate one full response with B.3's budgeted decoding (see the module docstring).

    ``response_format`` (the benchmark's) gives the stop strings, when a response holds its action, the action and
    the inserted tokens: ``tokenizer.encode(response_format.early_stop_text(...), add_special_tokens=False)``. The
    second request's seed is ``seed`` plus the response tokens before it, the engine's convention for a resumed
    request, so no two stretches of a response share a sampling seed. Raises
    :class:`~actfirst.rollout.actions.GenerationAborted` if the engine aborts a request.
    """
    if not 1 <= first_stage <= total:
        raise ValueError(f"first_stage={first_stage}: must be in [1, total={total}]")

    async def request(prompt: list[int], max_tokens: int, offset: int) -> GenerationResult:
        spec = SamplingSpec(max_tokens=max_tokens, stop=response_format.stop, temperature=temperature, top_p=top_p,
                            seed=None if seed is None else seed + offset)
        return check_not_aborted(await engine.generate(prompt, RequestKind.FULL_RESPONSE, spec))

    first = await request(prompt_ids, first_stage, 0)
    results = [first]
    token_ids, loss_mask, logprobs = list(first.token_ids), [1] * len(first.token_ids), list(first.logprobs)
    versions = list(first.token_versions)
    num_inserted = 0
    if first.finish_reason == "length" and not response_format.has_action(first.text):
        inserted = tokenizer.encode(response_format.early_stop_text(first.text), add_special_tokens=False)
        budget = second_stage_max_tokens(num_first=len(first.token_ids), num_inserted=len(inserted), total=total,
                                         second_stage=second_stage)
        if budget > 0:
            num_inserted = len(inserted)
            token_ids += inserted
            loss_mask += [0] * num_inserted
            logprobs += [0.0] * num_inserted
            versions += [versions[-1] if versions else first.weight_version] * num_inserted
            second = await request(list(prompt_ids) + token_ids, budget, len(token_ids))
            results.append(second)
            token_ids += second.token_ids
            loss_mask += [1] * len(second.token_ids)
            logprobs += second.logprobs
            versions += second.token_versions
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    truncated = results[-1].finish_reason == "length" and not response_format.has_action(text)
    return FullResponse(token_ids=token_ids, loss_mask=loss_mask, logprobs=logprobs, text=text,
                        action=response_format.extract_action(text, truncated=truncated), truncated=truncated,
                        weight_version=min(versions, default=first.weight_version), token_versions=versions,
                        num_requests=len(results),
                        num_inserted=num_inserted, queue_wait_s=sum(r.queue_wait_s for r in results),
                        latency_s=sum(r.latency_s for r in results))

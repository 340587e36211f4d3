"""Fast actions, the action-only decoding path (Sec. 4, Appendix C.5).

Everything here works on text, never on token ids of the tags: ``<action>`` is one added token in our small
``env-bpe`` tokenizer but several plain-text tokens in Qwen3's, and the engine finds the ``</action>`` stop string
in the decoded text either way.
"""

from __future__ import annotations

import dataclasses

from actfirst.engine.core import ActFirstEngine
from actfirst.engine.request import GenerationResult, RequestKind, SamplingSpec
from actfirst.envs.response_format import ACTION_CLOSE, extract_action, has_action_field


class GenerationAborted(RuntimeError):
    """The engine aborted a request (it is closing); the rollout cannot use a partial response."""


def check_not_aborted(result: GenerationResult) -> GenerationResult:
    """Raise :class:`GenerationAborted` for ``finish_reason == "abort"``; return ``result`` otherwise."""
    if result.finish_reason == "abort":
        raise GenerationAborted(f"request {result.request_id} ({result.kind.name}) was aborted after "
                                f"{len(result.token_ids)} tokens: the engine is closing")
    return result


@dataclasses.dataclass(kw_only=True, slots=True)
class FastAction:
    """One action-only generation: the fast action ã_t that advances the environment (Sec. 4)."""

    token_ids: list[int]
    text: str
    """Decoded output, up to and including ``</action>`` when the stop string was reached."""
    action: str
    """:func:`extract_action` of ``text`` (``""`` when truncated)."""
    truncated: bool
    """Stopped at ``max_tokens`` without a closed action field."""
    weight_version: int
    queue_wait_s: float
    latency_s: float
    seed: int | None
    """The request's sampling seed."""


async def generate_fast_action(engine: ActFirstEngine, prompt_ids: list[int], *, max_tokens: int,
                               temperature: float, top_p: float, seed: int | None) -> FastAction:
    """Generate a fast action: a ``FAST_ACTION`` request that stops at ``</action>`` or ``max_tokens`` (C.5).

    A response that reaches ``max_tokens`` without closing its action field is truncated and its action is empty
    (B.3). Raises :class:`GenerationAborted` if the engine aborts the request.
    """
    spec = SamplingSpec(max_tokens=max_tokens, stop=(ACTION_CLOSE,), temperature=temperature, top_p=top_p,
                        seed=seed)
    result = check_not_aborted(await engine.generate(prompt_ids, RequestKind.FAST_ACTION, spec))
    truncated = result.finish_reason == "length" and not has_action_field(result.text)
    return FastAction(token_ids=result.token_ids, text=result.text, action=extract_action(result.text,
                      truncated=truncated), truncated=truncated, weight_version=result.weight_version,
                      queue_wait_s=result.queue_wait_s, latency_s=result.latency_s, seed=seed)

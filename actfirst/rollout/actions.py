"""Action extraction (Appendix B.3) and fast actions, the action-only decoding path (Sec. 4, Appendix C.5).

Everything here works on text, never on token ids of the tags: ``<action>`` is one added token in our small
``env-bpe`` tokenizer but several plain-text tokens in Qwen3's, and the engine finds the ``</action>`` stop string
in the decoded text either way.
"""

from __future__ import annotations

import dataclasses
import re

from actfirst.engine.core import ActFirstEngine
from actfirst.engine.request import GenerationResult, RequestKind, SamplingSpec

ACTION_OPEN = "<action>"
ACTION_CLOSE = "</action>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

# A complete field: an opening tag, then text without another opening tag, then the first closing tag.
_FIELD = re.compile(f"{re.escape(ACTION_OPEN)}((?:(?!{re.escape(ACTION_OPEN)}).)*?){re.escape(ACTION_CLOSE)}",
                    re.DOTALL)


class GenerationAborted(RuntimeError):
    """The engine aborted a request (it is closing); the rollout cannot use a partial response."""


def check_not_aborted(result: GenerationResult) -> GenerationResult:
    """Raise :class:`GenerationAborted` for ``finish_reason == "abort"``; return ``result`` otherwise."""
    if result.finish_reason == "abort":
        raise GenerationAborted(f"request {result.request_id} ({result.kind.name}) was aborted after "
                                f"{len(result.token_ids)} tokens: the engine is closing")
    return result


def answer_text(text: str) -> str:
    """Where a response's action field may be: the text after the last ``</think>``; nothing while reasoning is
    unfinished (a ``<think>`` not closed yet: tags the reasoning echoes from the prompt are not the answer); the
    whole text of a response without a thinking block (fast actions)."""
    _, closed, after = text.rpartition(THINK_CLOSE)
    if closed:
        return after
    return "" if THINK_OPEN in text else text


def has_action_field(text: str) -> bool:
    """Whether ``text`` holds a complete ``<action>...</action>`` field (B.3's closed action field)."""
    return _FIELD.search(answer_text(text)) is not None


def extract_action(text: str, *, truncated: bool) -> str:
    """The action of a response: the text of its ``<action>`` field, stripped of surrounding whitespace (B.3).

    Whatever the model emitted yields a string, never an error; ``""`` is the paper's empty action, and anything
    else is passed on for the environment to judge (C.5: valid iff it exactly matches an admissible action):

    - ``truncated`` (B.3: "responses marked as truncated are treated as empty actions"), no ``<action>`` tag, or
      an opening tag that is never closed: ``""``;
    - several fields: the first complete one, i.e. the first ``</action>`` with the nearest ``<action>`` before
      it (an ``<action>`` repeated before any ``</action>`` restarts the field);
    - any other characters (unicode junk, nested markup, newlines) are kept as text;
    - only :func:`answer_text` counts: the prompt's "<action> </action>" echoed inside the reasoning is not the
      response's action field.
    """
    if truncated:
        return ""
    match = _FIELD.search(answer_text(text))
    return match.group(1).strip() if match else ""


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
                      queue_wait_s=result.queue_wait_s, latency_s=result.latency_s)

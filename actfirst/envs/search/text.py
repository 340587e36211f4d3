"""What the Search model reads and writes (UOPD, Appendix E.3), and how its answer is scored (D.1).

The prompt is Search-R1's, verbatim (E.3); the episode so far follows it directly: each earlier model output cut
after its first complete ``<search>…</search>`` or ``<answer>…</answer>``, then the environment's reply. Where E.3
leaves the layout open we follow Search-R1's ``scripts/data_process/nq_search.py`` (the prompt ends with a newline)
and ``search_r1/llm_agent/generation.py`` (``execute_predictions``: the information block between blank lines, the
invalid-action reply on its own line; ``_passages2string``: one passage per line, its first line the title).
"""

from __future__ import annotations

import dataclasses
import re
import string
from collections.abc import Sequence

from actfirst.envs.response_format import ResponseFormat

SEARCH_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get new "
    "information. After reasoning, if you find you lack some knowledge, you can call a search engine by <search> "
    "query </search> and it will return the top searched results between <information> and </information>. You can "
    "search as many times as your want. If you find no further external knowledge needed, you can directly provide "
    "the answer inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing "
    "</answer>. Question: {question}\n")
"""E.3's prompt, verbatim (Search-R1's ``make_prefix``, which ends with a newline)."""

INVALID_ACTION = ("Invalid action. After your reasoning, choose exactly one action: <search> your query </search> or "
                  "<answer> your final answer </answer>.")
"""E.3's reply to an output with neither a complete search nor a complete answer."""

FORCED_ANSWER = ("You can no longer search. Based on the information above you MUST now give your final answer inside "
                 "<answer> and </answer>. For example, <answer> Beijing </answer>.")
"""E.3's forced-answer instruction (evaluation only, D.5)."""

SEARCH, ANSWER = "search", "answer"
STOP = ("</search>", "</answer>")
"""E.3: generation stops at either closing tag."""

_OPEN = {SEARCH: "<search>", ANSWER: "<answer>"}
_CLOSE = re.compile(r"</(search|answer)>")


@dataclasses.dataclass(frozen=True, slots=True)
class ModelOutput:
    """One model output as the episode keeps it."""

    text: str
    """The output cut after its first complete field (all of it when it has none)."""
    kind: str | None
    """``"search"``, ``"answer"``, or None (neither: an invalid action)."""
    content: str
    """The field's text, stripped ("" when ``kind`` is None)."""


def parse_output(text: str) -> ModelOutput:
    """The first complete ``<search>…</search>`` or ``<answer>…</answer>`` of ``text``: the field whose closing tag
    comes first, opened by the nearest opening tag of its kind before it (where generation stops, E.3); the text is
    cut right after it. Neither: the whole text, ``kind`` None."""
    for close in _CLOSE.finditer(text):
        kind = close.group(1)
        start = text.rfind(_OPEN[kind], 0, close.start())
        if start >= 0:
            content = text[start + len(_OPEN[kind]):close.start()]
            return ModelOutput(text[:close.end()], kind, content.strip())
    return ModelOutput(text, None, "")


def format_passage(contents: str) -> str:
    """One retrieved passage: Search-R1's corpus ``contents`` hold the title on the first line and the text after
    it; shown as Search-R1's ``_passages2string`` shows them, ``(Title: <title>) <text>``."""
    title, _, body = contents.partition("\n")
    return f"(Title: {title}) {body}"


def information_reply(passages: Sequence[str]) -> str:
    """The reply to a search (E.3: ``<information>Doc 1: {passage} Doc 2: ... </information>``, on its own line):
    one ``Doc k: `` line per passage (``contents`` as the retrieval server returns them), between blank lines as
    Search-R1's ``execute_predictions`` writes it."""
    docs = "\n".join(f"Doc {k}: {format_passage(p)}" for k, p in enumerate(passages, 1))
    return f"\n\n<information>{docs.strip()}</information>\n\n"


INVALID_REPLY = f"\n{INVALID_ACTION}\n"
"""The invalid-action reply on its own line (Search-R1's ``execute_predictions`` layout)."""


def episode_prompt(question: str, turns: Sequence[tuple[str, str]]) -> str:
    """E.3's prompt for ``question`` followed directly by the episode so far: each (cut output, reply) pair."""
    return SEARCH_PROMPT.format(question=question) + "".join(output + reply for output, reply in turns)


def forced_answer_prompt(prompt: str) -> str:
    """E.3's last evaluation turn: the episode's prompt followed on a new line by the forced-answer instruction
    (every reply ends with a newline, so the instruction starts a line), itself ending a line like the prompt."""
    return f"{prompt}{FORCED_ANSWER}\n"


# -- scoring (D.1: exact match after normalisation against any gold answer, the last <answer> of the episode) -------

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def normalize_answer(text: str) -> str:
    """Search-R1's ``normalize_answer`` (``verl/utils/reward_score/qa_em.py``): lowercase, drop punctuation, drop
    the articles a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, golden_answers: Sequence[str]) -> bool:
    """Whether ``prediction`` equals any gold answer after :func:`normalize_answer` (Search-R1's ``em_check``)."""
    predicted = normalize_answer(prediction)
    return any(normalize_answer(gold) == predicted for gold in golden_answers)


def last_answer(outputs: Sequence[str]) -> str | None:
    """The text of the last ``<answer>…</answer>`` in the episode's (cut) model outputs, stripped; None if none."""
    answers = _ANSWER.findall("".join(outputs))
    return answers[-1].strip() if answers else None


class SearchResponses(ResponseFormat):
    """E.3's responses: generation stops at ``</search>`` or ``</answer>``; the action is the output cut after its
    first complete field, handed to the environment whole (its reasoning is part of the episode); there is no
    ``<action>`` field and no B.3 early-stop text (nothing is inserted: Search's response is one request of at most
    512 tokens, D.5)."""

    stop = STOP

    def has_action(self, text: str) -> bool:
        return parse_output(text).kind is not None

    def extract_action(self, text: str, *, truncated: bool) -> str:
        """A truncated output too is kept in the episode (followed by the invalid-action reply)."""
        return parse_output(text).text

    def early_stop_text(self, first_text: str) -> str:
        return ""


SEARCH_RESPONSES = SearchResponses()

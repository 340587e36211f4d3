"""How a benchmark's full responses end and where their action is (a property of the benchmark object).

``ACTION_TAGS`` is the ActFirst format of the B.1 benchmarks (ALFWorld, ScienceWorld, WebShop): think-then-act
responses with an ``<action>`` field, no stop string, and B.3's early-stop text when the thinking budget runs out.
Search (UOPD, Appendix E.3) has its own format in ``actfirst.envs.search.text``. Everything here works on text, never
on token ids of the tags: ``<action>`` is one added token in our small ``env-bpe`` tokenizer but several plain-text
tokens in Qwen3's.
"""

from __future__ import annotations

import abc
import re

ACTION_OPEN = "<action>"
ACTION_CLOSE = "</action>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

# A complete field: an opening tag, then text without another opening tag, then the first closing tag.
_FIELD = re.compile(f"{re.escape(ACTION_OPEN)}((?:(?!{re.escape(ACTION_OPEN)}).)*?){re.escape(ACTION_CLOSE)}",
                    re.DOTALL)

EARLY_STOP_SENTENCE = ("Considering the limited time by the user, I have to give the action based on the thinking "
                       "directly now.")
"""B.3's early-stop instruction (Qwen3's, with "solution" adapted to "action")."""


class ResponseFormat(abc.ABC):
    """A benchmark's full responses: their stop strings, when one holds its action, the action, and what B.3's
    budgeted decoding inserts when the first request reached its budget."""

    stop: tuple[str, ...] = ()
    """Stop strings of a full-response request (kept in the output)."""

    @abc.abstractmethod
    def has_action(self, text: str) -> bool:
        """Whether ``text`` already holds a complete action (reaching a length limit after it is no truncation)."""

    @abc.abstractmethod
    def extract_action(self, text: str, *, truncated: bool) -> str:
        """What the environment executes for the response ``text``."""

    @abc.abstractmethod
    def early_stop_text(self, first_text: str) -> str:
        """The text inserted after a first request that reached its budget ("": nothing)."""


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


def early_stop_text(first_text: str) -> str:
    """The text B.3 inserts after a first request that reached its budget (``first_text``: its decoded output).

    The three lines of B.3 laid out as in Qwen3's thinking-budget recipe (``"\\n\\n" + sentence + "\\n</think>"``,
    then the blank line Qwen3's chat template puts after ``</think>``), ending with the opening tag so that the
    second request starts inside the action field::

        "\\n\\n" + EARLY_STOP_SENTENCE + "\\n</think>\\n\\n<action>"   reasoning unfinished
        "\\n\\n" + EARLY_STOP_SENTENCE + "\\n\\n<action>"             "</think>" already generated: its line is omitted
        ""                                                          "<action>" already generated: nothing is inserted

    (Qwen's recipe writes ``"</think>.\\n\\n"``; B.3's text has no period after ``</think>``, so neither do we.)
    """
    if ACTION_OPEN in answer_text(first_text):  # action generation started (not an echo inside the reasoning)
        return ""
    think_close = "" if THINK_CLOSE in first_text else f"\n{THINK_CLOSE}"
    return f"\n\n{EARLY_STOP_SENTENCE}{think_close}\n\n{ACTION_OPEN}"


class ActionTags(ResponseFormat):
    """B.1/B.3: think, then an ``<action>`` field; full responses end at EOS (no stop string)."""

    def has_action(self, text: str) -> bool:
        return has_action_field(text)

    def extract_action(self, text: str, *, truncated: bool) -> str:
        return extract_action(text, truncated=truncated)

    def early_stop_text(self, first_text: str) -> str:
        return early_stop_text(first_text)


ACTION_TAGS = ActionTags()

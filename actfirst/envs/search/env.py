"""Search (UOPD, Appendix D.1, D.5, E.3): open-domain QA with a retrieval tool, in the Search-R1 setting.

An episode's observation is its whole prompt: E.3's prompt for the question followed by the episode so far
(``actfirst.envs.search.text``). ``step`` takes a model output: a complete search is answered with the top
``topk`` passages of the retrieval server and continues the episode; a complete answer ends it, scored by exact
match (score 100 and ``won``, else 0); neither gets the invalid-action reply. After ``max_turns`` outputs without an
answer the episode is truncated with score 0 (training). At evaluation only, ``force_answer`` then gives one more turn
whose prompt ends with E.3's forced-answer instruction (D.5: such an episode counts ``max_turns + 1`` turns); that
turn's search is not executed, and the episode ends after it whatever it holds.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from actfirst.core.user_input import ConfigError
from actfirst.envs.base import TextEnv, Transition
from actfirst.envs.search.config import SearchConfig
from actfirst.envs.search.retrieval import retrieve
from actfirst.envs.search.text import (
    ANSWER,
    INVALID_REPLY,
    SEARCH,
    episode_prompt,
    exact_match,
    forced_answer_prompt,
    information_reply,
    last_answer,
    parse_output,
)


@dataclasses.dataclass(frozen=True, slots=True)
class SearchTask:
    """One question of Search-R1's data (``question``, ``golden_answers``, ``data_source``)."""

    key: str
    """``<data_source>/<n>``: the n-th question of that source in the split's files (0-based)."""
    question: str
    golden_answers: tuple[str, ...]
    data_source: str


def load_questions(paths: list[str], key: str) -> list[SearchTask]:
    """The questions of JSONL files (one ``{"question", "golden_answers", "data_source"}`` per line, Search-R1's
    fields). Questions are stripped and end with "?" as Search-R1's data scripts make them. A missing file or a
    malformed line is a ``ConfigError`` naming ``key``, the file and the line."""
    tasks, seen = [], {}
    for path in paths:
        if not Path(path).is_file():
            raise ConfigError(f"{key}={path!r}: no such file (Search-R1's data: see docs/search.md)")
        for number, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                question, source = row["question"].strip(), str(row["data_source"])
                gold = row["golden_answers"]
                gold = (gold,) if isinstance(gold, str) else tuple(str(g) for g in gold)
                if not question or not gold:
                    raise ValueError("empty question or golden_answers")
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise ConfigError(f"{key}={path!r}: line {number} is not a question ({type(e).__name__}: {e}; "
                                  f'{{"question", "golden_answers", "data_source"}} expected)') from None
            question = question if question.endswith("?") else question + "?"
            n = seen[source] = seen.get(source, -1) + 1
            tasks.append(SearchTask(f"{source}/{n}", question, gold, source))
    return tasks


class SearchTextEnv(TextEnv):
    """One Search episode at a time against the configured retrieval server."""

    benchmark = "search"

    def __init__(self, config: SearchConfig):
        self.config = config
        self.max_turns = config.max_turns

    def reset(self, task: SearchTask, admissible: bool = True) -> Transition:
        self.task = task
        self.turns: list[tuple[str, str]] = []
        self.forced = False
        return self._transition(done=False, won=False)

    def step(self, action: str) -> Transition:
        """Execute one model output (``action``: the output, cut or not; it is cut here)."""
        output = parse_output(action)
        if output.kind == ANSWER:
            self.turns.append((output.text, ""))
            won = exact_match(last_answer([text for text, _ in self.turns]), self.task.golden_answers)
            return self._transition(done=True, won=won)
        if output.kind == SEARCH and not self.forced:
            passages = retrieve(self.config.retrieval_url, [output.content], self.config.topk,
                                self.config.timeout_s)[0]
            self.turns.append((output.text, information_reply(passages)))
        else:
            self.turns.append((output.text, INVALID_REPLY))
        return self._transition(done=False, won=False, valid=output.kind is not None,
                                truncated=self.forced or len(self.turns) >= self.max_turns)

    def force_answer(self) -> Transition:
        """The evaluation's extra turn after the limit (D.5, E.3): the prompt with the forced-answer instruction."""
        if self.forced or len(self.turns) < self.max_turns:
            raise RuntimeError(f"force_answer after {len(self.turns)} of max_turns={self.max_turns} turns: only once, "
                               f"at the limit")
        self.forced = True
        return dataclasses.replace(self._transition(done=False, won=False),
                                   observation=forced_answer_prompt(self._prompt()))

    def close(self) -> None:
        pass

    def _prompt(self) -> str:
        return episode_prompt(self.task.question, self.turns)

    def _transition(self, *, done: bool, won: bool, valid: bool = True, truncated: bool = False) -> Transition:
        return Transition(observation=self._prompt(), admissible=(), score=100.0 if won else 0.0, done=done, won=won,
                          valid=valid, turn=len(self.turns), truncated=truncated and not done,
                          task_description=self.task.question)

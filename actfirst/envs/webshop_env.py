"""WebShop behind ``TextEnv`` (Appendix C.1), for machines where WebShop is installed.

WebShop's code and data are not on PyPI (the PyPI package is an empty stub), so this adapter imports
``web_agent_site`` lazily and says how to install it when it is missing. It drives WebShop's text environment
(``WebAgentTextEnv``, observation mode "text": page elements joined by " [SEP] ") with ``search[...]`` and
``click[...]`` actions, the available-actions dictionary (``has_search_bar``, ``clickables``) and the score page. The
paper's split: goal ids 0-4095 train, 4096-4195 evaluation, WebShop's goal shuffle seed 233 (fixed in WebShop's
own ``SimServer``); a 15-turn limit; score = the purchase reward x 100 (0 without a purchase); success = score >=
99.999.
"""

from __future__ import annotations

import dataclasses

from actfirst.envs.base import TextEnv, Transition
from actfirst.envs.checks import webshop_action_valid

TRAIN_GOALS = range(0, 4096)
EVAL_GOALS = range(4096, 4196)
SUCCESS_SCORE = 99.999
_SEP = " [SEP] "
_INSTRUCTION = "Instruction:"

INSTALL_HINT = (
    "WebShop is not installed (the 'web_agent_site' package is missing; PyPI has no usable WebShop). Install it "
    "from source: git clone https://github.com/princeton-nlp/WebShop && cd WebShop && ./setup.sh -d all "
    "(downloads the product catalog and builds the search index), then pip install -e . in this environment.")


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class WebShopTask:
    """One WebShop goal (instruction), by its index in WebShop's shuffled goal list."""

    goal_idx: int


def webshop_split(split: str) -> list[WebShopTask]:
    """The paper's custom split: "train" goals 0-4095, "eval" goals 4096-4195."""
    goals = {"train": TRAIN_GOALS, "eval": EVAL_GOALS}
    if split not in goals:
        raise ValueError(f"split={split!r}: not one of {sorted(goals)}")
    return [WebShopTask(i) for i in goals[split]]


def instruction_of(observation: str) -> str:
    """The instruction text of a WebShop text-mode page ("WebShop [SEP] Instruction: [SEP] <text> [SEP] ...")."""
    parts = observation.split(_SEP)
    for i, part in enumerate(parts[:-1]):
        if part.strip() == _INSTRUCTION:
            return parts[i + 1].strip()
    return ""


def strip_instruction(observation: str) -> str:
    """The page without its repeated instruction block, as the inverse-dynamics prompt shows a reference next
    observation (B.5: the block is kept everywhere else, including the checks)."""
    parts = observation.split(_SEP)
    for i, part in enumerate(parts[:-1]):
        if part.strip() == _INSTRUCTION:
            start = i - 1 if i > 0 and parts[i - 1].strip() == "WebShop" else i
            return _SEP.join(parts[:start] + parts[i + 2:])
    return observation


def parse_score(observation: str) -> float | None:
    """The reward on WebShop's score page ("Your score (min 0.0, max 1.0) [SEP] 0.75"), x 100; None elsewhere."""
    parts = [p.strip() for p in observation.split(_SEP)]
    for i, part in enumerate(parts[:-1]):
        if part.lower().startswith("your score (min 0.0, max 1.0)"):
            try:
                return 100.0 * float(parts[i + 1])
            except ValueError:
                return None
    return None


class WebShopTextEnv(TextEnv):
    """WebShop's text environment (one search engine and product catalog per worker)."""

    benchmark = "webshop"

    def __init__(self, max_turns: int = 15, num_products: int | None = None, human_goals: bool = True):
        try:
            from web_agent_site.envs import WebAgentTextEnv
        except ImportError as e:
            raise ImportError(INSTALL_HINT) from e
        self.max_turns = max_turns
        self.num_products = num_products
        self._env = WebAgentTextEnv(observation_mode="text", num_products=num_products, human_goals=human_goals)
        self._available = {"has_search_bar": False, "clickables": []}
        self._turn = 0
        self._score = 0.0
        self._instruction = ""

    def reset(self, task: WebShopTask) -> Transition:
        observation, _ = self._env.reset(session=task.goal_idx)
        self._turn, self._score = 0, 0.0
        self._instruction = instruction_of(observation)
        return self._transition(observation, done=False, valid=True)

    def step(self, action: str) -> Transition:
        valid = webshop_action_valid(action, has_search_bar=self._available["has_search_bar"],
                                     clickables=self._available["clickables"])
        observation, reward, done, _ = self._env.step(action)
        self._turn += 1
        if done:
            page_score = parse_score(observation)
            self._score = page_score if page_score is not None else 100.0 * reward
        return self._transition(observation, done=bool(done), valid=valid)

    def _transition(self, observation: str, *, done: bool, valid: bool) -> Transition:
        self._available = self._env.get_available_actions()
        return Transition(observation=observation, admissible=tuple(c.lower() for c in self._available["clickables"]),
                          score=self._score, done=done, won=self._score >= SUCCESS_SCORE, valid=valid,
                          turn=self._turn, truncated=self._truncated(self._turn, done),
                          task_description=self._instruction, has_search_bar=bool(self._available["has_search_bar"]))

    def close(self) -> None:
        self._env.close()

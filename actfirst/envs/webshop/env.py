"""WebShop behind ``TextEnv`` (Appendix C.1), for machines where WebShop is installed (``scripts/setup_webshop.sh``).

Each environment is a connection to the node's WebShop server (``actfirst.envs.webshop.server``), which runs the
official simulator with the catalog, search engine and goals loaded once: WebShop's text environment
(``WebAgentTextEnv``, observation mode "text": page elements joined by " [SEP] ") driven with ``search[...]`` and
``click[...]`` actions, its available-actions dictionary (``has_search_bar``, ``clickables``) and the score page. The
paper's setting (C.1): the full product catalog (``WebShopConfig.product_file``), goal ids 0-4095 train and
4096-4195 evaluation (or the pools of ``train_goals`` / ``eval_goals``: ``actfirst.envs.webshop.goals``),
goal-construction seed 233; a 15-turn limit; score = the purchase reward x 100 (0 without a
purchase); success = score >= 99.999.

C.2's oracle solutions are built from a goal by plain functions (``oracle_query``, ``oracle_actions``) on a
:class:`WebShopGoal`, which ``WebShopTextEnv.goal`` reads from WebShop's goal list.
"""

from __future__ import annotations

import dataclasses
import re

from actfirst.core.user_input import ConfigError
from actfirst.envs.base import TextEnv, Transition
from actfirst.envs.webshop.checks import webshop_action_valid
from actfirst.envs.webshop.client import ServerConnection
from actfirst.envs.webshop.config import WebShopConfig
from actfirst.envs.webshop.goals import goal_pool
from actfirst.envs.webshop.install import require_install
from actfirst.envs.webshop.transition import WebShopTransition

SUCCESS_SCORE = 99.999
RESULT_PAGES = 5
"""Search-results pages WebShop shows for a query (its 50 results, 10 a page)."""
NEXT_PAGE = "click[next >]"
BUY = "click[buy now]"
_SEP = " [SEP] "
_INSTRUCTION = "Instruction:"

@dataclasses.dataclass(frozen=True, slots=True, order=True)
class WebShopTask:
    """One WebShop goal (instruction), by its index in WebShop's shuffled goal list."""

    goal_idx: int


@dataclasses.dataclass(frozen=True, slots=True)
class WebShopGoal:
    """What an oracle solution is built from (C.2): one goal of WebShop's list and its product's options."""

    instruction: str
    asin: str
    """The product the goal was made from."""
    options: tuple[str, ...]
    """The goal's option values, as WebShop's goal lists them."""
    price_upper: float
    """The goal's price cap (WebShop draws it at random: see ``server.GOAL_SEED``)."""
    product_options: dict[str, tuple[str, ...]]
    """The product's options: name -> values, as its page offers them (lowercased, "/" written " | ")."""


def webshop_split(split: str, config: WebShopConfig | None = None) -> list[WebShopTask]:
    """The goals of ``split``: ``config``'s pool files (``train_goals``, ``eval_goals``), or C.1's custom split
    ("train" goals 0-4095, "eval" goals 4096-4195)."""
    config = WebShopConfig() if config is None else config
    file, key = (config.train_goals, "train_goals") if split == "train" else (config.eval_goals, "eval_goals")
    return [WebShopTask(i) for i in goal_pool(split, file, key)]


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


_PRICE_CLAUSE = re.compile(r",?\s*and price lower than [\d.]+ dollars\s*$", re.IGNORECASE)


def oracle_query(instruction: str) -> str:
    """The search query of an oracle solution: the instruction without its price clause (", and price lower than
    40.00 dollars", which WebShop appends and its text search cannot use), lowercased, brackets removed."""
    return " ".join(_PRICE_CLAUSE.sub("", instruction).replace("[", " ").replace("]", " ").lower().split())


def product_option_value(option: str) -> str:
    """An option value as a product page offers it (WebShop's ``load_products``: stripped, "/" -> " | ",
    lowercased)."""
    return option.strip().replace("/", " | ").lower()


def oracle_option_clicks(goal: WebShopGoal) -> list[str]:
    """A click on each goal option the product offers, in the goal's order; at most one value per option name
    (choosing another value of the same name replaces the first). Goal options the product does not offer are
    left out (they cost their share of the reward; C.2 ranks candidates by score)."""
    clicks, chosen = [], set()
    for option in goal.options:
        value = product_option_value(option)
        name = next((n for n, values in goal.product_options.items() if value in values and n not in chosen), None)
        if name is not None:
            chosen.add(name)
            clicks.append(f"click[{value}]")
    return clicks


def oracle_actions(goal: WebShopGoal, *, result_page: int = 1) -> list[str]:
    """C.2's oracle solution of ``goal``: search with ``oracle_query``, go to results page ``result_page`` (where the
    goal product is listed), click the goal product, choose the goal options, buy."""
    if not 1 <= result_page <= RESULT_PAGES:
        raise ValueError(f"result_page={result_page}: must be in [1, {RESULT_PAGES}]")
    return ([f"search[{oracle_query(goal.instruction)}]"] + [NEXT_PAGE] * (result_page - 1)
            + [f"click[{goal.asin.lower()}]"] + oracle_option_clicks(goal) + [BUY])


class WebShopTextEnv(TextEnv):
    """WebShop's text environment: one connection to the node's WebShop server, one episode at a time."""

    benchmark = "webshop"

    def __init__(self, config: WebShopConfig | None = None):
        config = WebShopConfig() if config is None else config
        self.max_turns = config.max_turns
        self.product_file = config.product_file
        require_install()  # the install hint at the worker's start, not at its first episode
        self._server = ServerConnection(config)  # connects at the first call (starting the server if none runs)
        self._goals: int | None = None
        self._available = {"has_search_bar": False, "clickables": []}
        self._turn = 0
        self._score = 0.0
        self._instruction = ""

    def reset(self, task: WebShopTask, admissible: bool = True) -> Transition:
        if self._goals is None:
            self._goals = self._server.call("info")["goals"]
        if not 0 <= task.goal_idx < self._goals:
            raise ConfigError(f"goal {task.goal_idx} (env.train_goals / env.eval_goals) is outside the "
                              f"{self._goals} goals WebShop built from product_file={self.product_file!r}")
        reply = self._server.call("reset", goal=task.goal_idx)
        self._turn, self._score = 0, 0.0
        self._instruction = instruction_of(reply["observation"])
        return self._transition(reply, done=False, valid=True)

    def step(self, action: str) -> Transition:
        valid = webshop_action_valid(action, has_search_bar=self._available["has_search_bar"],
                                     clickables=self._available["clickables"])
        reply = self._server.call("step", action=action)
        self._turn += 1
        if reply["done"]:
            page_score = parse_score(reply["observation"])
            self._score = page_score if page_score is not None else 100.0 * reply["reward"]
        return self._transition(reply, done=reply["done"], valid=valid)

    def goal(self, task: WebShopTask) -> WebShopGoal:
        """The goal of ``task`` and its product's options, as WebShop built them."""
        goal = self._server.call("goal", goal=task.goal_idx)
        return WebShopGoal(instruction=goal["instruction"], asin=goal["asin"], options=tuple(goal["options"]),
                           price_upper=goal["price_upper"],
                           product_options={k: tuple(v) for k, v in goal["product_options"].items()})

    def _transition(self, reply: dict, *, done: bool, valid: bool) -> WebShopTransition:
        self._available = reply["available"]
        return WebShopTransition(observation=reply["observation"],
                                 admissible=tuple(c.lower() for c in self._available["clickables"]),
                                 score=self._score, done=done, won=self._score >= SUCCESS_SCORE, valid=valid,
                                 turn=self._turn, truncated=self._truncated(self._turn, done),
                                 task_description=self._instruction,
                                 has_search_bar=bool(self._available["has_search_bar"]))

    def close(self) -> None:
        self._server.close()

"""WebShop (Appendix C.1) as one benchmark: its config, environment (a client of the node's WebShop server, which runs
the official simulator: ``server.py``), transition check and prompt templates, registered as ``webshop``."""

from __future__ import annotations

from actfirst.envs.base import Outcome, Reference, TextEnv
from actfirst.envs.benchmarks import Benchmark, register_benchmark
from actfirst.envs.webshop.checks import (
    SEARCH_MISMATCH_ALLOWED,
    webshop_action_valid,
    webshop_check,
    webshop_reference_product,
)
from actfirst.envs.webshop.config import WebShopConfig
from actfirst.envs.webshop.data import WebShopData
from actfirst.envs.webshop.prompts import TEMPLATES, UOPD_PROMPTS, available_actions
from actfirst.envs.webshop.transition import WebShopTransition


@register_benchmark
class WebShopBenchmark(Benchmark):
    """WebShop (C.1): text interface, goals 0-4095 train and 4096-4195 evaluation (or the config's goal pools)."""

    name = "webshop"
    config_class = WebShopConfig
    transition_class = WebShopTransition
    data = WebShopData()
    templates = TEMPLATES
    uopd_prompts = UOPD_PROMPTS
    fast_actions = True
    partial_score = True

    def make_env(self) -> TextEnv:
        from actfirst.envs.webshop.env import WebShopTextEnv

        return WebShopTextEnv(self.config)

    def prompt_fields(self, current: WebShopTransition) -> dict[str, str]:
        return available_actions(current)

    def reference_observation(self, observation: str) -> str:
        """The page without its repeated instruction block (B.5: removed only in the inverse-dynamics prompt)."""
        from actfirst.envs.webshop.env import strip_instruction

        return strip_instruction(observation)

    def valid_action(self, action: str, current: WebShopTransition) -> bool:
        return webshop_action_valid(action, has_search_bar=current.has_search_bar, clickables=current.admissible)

    def _check(self, reference, t, *, action, current, next, previous):
        """B.5 with the search-results exception: after a turn that passed through it, this turn checks the product
        of that turn's search (``t - 1``), else the product of a search at ``t``."""
        ref = reference.transitions[t + 1]
        after = previous is not None and previous.reason == SEARCH_MISMATCH_ALLOWED
        return webshop_check(
            action=action, has_search_bar=current.has_search_bar, clickables=current.admissible, done=next.done,
            ref_done=ref.done, next_observation=next.observation, ref_next_observation=ref.observation,
            next_clickables=next.admissible, ref_next_clickables=ref.admissible,
            next_has_search_bar=next.has_search_bar, ref_next_has_search_bar=ref.has_search_bar,
            ref_action=reference.actions[t],
            ref_product=webshop_reference_product(reference.actions, t - 1 if after else t),
            after_search_mismatch=after)

    def task_key(self, task) -> str:
        return str(task.goal_idx)

    def task_type(self, task) -> str:
        return "all"

    def _tasks(self, split: str) -> list:
        from actfirst.envs.webshop.env import webshop_split

        return webshop_split(split, self.config)

    def accepts_reference(self, final: Outcome) -> bool:
        """Any purchase with a positive score: C.2 ranks WebShop candidates by score, so a partial score may be
        the best a task has."""
        return final.done and final.score > 0

    async def candidates(self, worker, task) -> list[tuple[str, list[str]]]:
        """C.2's oracle solution built from the task's goal (``oracle_actions``), on the results page that lists
        the goal product after the oracle's search (found by replaying the search and its next pages); none when
        the search does not return the product."""
        from actfirst.envs.webshop.env import NEXT_PAGE, RESULT_PAGES, oracle_actions

        goal = await worker.acall("goal", task)
        product = goal.asin.lower()
        await worker.areset(task)
        page = await worker.astep(oracle_actions(goal)[0])
        for number in range(1, RESULT_PAGES + 1):
            if product in page.admissible:
                return [("oracle", oracle_actions(goal, result_page=number))]
            if number == RESULT_PAGES or "next >" not in page.admissible:
                break
            page = await worker.astep(NEXT_PAGE)
        return []

    def rank(self, reference: Reference) -> tuple:
        """C.2: the highest score first, then the fewest actions."""
        return (-reference.score, len(reference.actions))

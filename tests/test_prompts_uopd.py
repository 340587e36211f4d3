"""The UOPD paper's prompt set (``rollout.prompts: uopd``, 003 Appendix E.1/E.2) against the paper's own text: its
four templates word for word, and rendered prompts (first step, second step, a later step with the two-step history)
against the paper's templates filled in by hand; the config refuses the set where it has no meaning."""

import re
from pathlib import Path

import pytest

from actfirst.core.config import TrainConfig
from actfirst.core.schema import load_config
from actfirst.core.user_input import ConfigError
from actfirst.envs.base import Transition
from actfirst.envs.benchmarks import BENCHMARKS, get_benchmark
from actfirst.envs.webshop.transition import WebShopTransition
from actfirst.models.tokenizers import build_qwen3_tokenizer
from actfirst.rollout.prompts import Mode, PromptTooLong, Step, build_prompt

pytestmark = pytest.mark.usefixtures("alfworld_data")  # configs with games: real load

PAPERS = Path(__file__).parents[2] / "shared" / "papers"
CONFIGS = Path(__file__).parents[1] / "configs" / "train"

# 003 Appendix E.1 and E.2 as printed (the paper's text lost its line breaks): first and second template each.
PAPER = {
    "alfworld": [
        "You are an expert agent operating in the ALFRED Embodied Environment. Your current observation is: "
        "{current_observation} Your admissible actions of the current situation are: [{admissible_actions}]. Now "
        "it's your turn to take an action. You should first reason step-by-step about the current situation. This "
        "reasoning process MUST be enclosed within <think> </think> tags. Once you've finished your reasoning, you "
        "should choose an admissible action for current step and present it within <action> </action> tags.",
        "You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: {task_description} "
        "Prior to this step, you have already taken {step_count} step(s). Below are the most recent "
        "{history_length} observations and the corresponding actions you took: {action_history} You are now at "
        "step {current_step} and your current observation is: {current_observation} Your admissible actions of the "
        "current situation are: [{admissible_actions}]. Now it's your turn to take an action. You should first "
        "reason step-by-step about the current situation. This reasoning process MUST be enclosed within <think> "
        "</think> tags. Once you've finished your reasoning, you should choose an admissible action for current "
        "step and present it within <action> </action> tags.",
    ],
    "webshop": [
        "You are an expert autonomous agent operating in the WebShop e-commerce environment. Your task is to: "
        "{task_description}. Your current observation is: {current_observation}. Your admissible actions of the "
        "current situation are: [ {available_actions} ]. Now it's your turn to take one action for the current "
        "step. You should first reason step-by-step about the current situation, then think carefully which "
        "admissible action best advances the shopping goal. This reasoning process MUST be enclosed within <think> "
        "</think> tags. Once you've finished your reasoning, you should choose an admissible action for current "
        "step and present it within <action> </action> tags.",
        "You are an expert autonomous agent operating in the WebShop e-commerce environment. Your task is to: "
        "{task_description}. Prior to this step, you have already taken {step_count} step(s). Below are the most "
        "recent {history_length} observations and the corresponding actions you took: {action_history} You are now "
        "at step {current_step} and your current observation is: {current_observation}. Your admissible actions of "
        "the current situation are: [ {available_actions} ]. Now it's your turn to take one action for the current "
        "step. You should first reason step-by-step about the current situation, then think carefully which "
        "admissible action best advances the shopping goal. This reasoning process MUST be enclosed within <think> "
        "</think> tags. Once you've finished your reasoning, you should choose an admissible action for current "
        "step and present it within <action> </action> tags.",
    ],
}


def flat(text):
    return re.sub(r"\s+", " ", text).strip()


@pytest.mark.skipif(not PAPERS.is_dir(), reason="the paper is not next to this checkout")
def test_the_templates_here_are_the_papers_text():
    paper = next(PAPERS.glob("003_*.txt")).read_text()
    for first, later in PAPER.values():
        assert f"⬇ {first}\n" in paper and f"⬇ {later}\n" in paper


@pytest.mark.parametrize("benchmark", sorted(PAPER))
def test_templates_are_the_papers_word_for_word(benchmark):
    prompts = BENCHMARKS[benchmark].uopd_prompts
    assert [flat(prompts.first), flat(prompts.later)] == PAPER[benchmark]


def test_only_alfworld_and_webshop_have_them():
    """003 gives E.1 (ALFWorld) and E.2 (WebShop); Search's one prompt is E.3's observation; ScienceWorld has none."""
    builtin = {n for n, c in BENCHMARKS.items() if c.__module__.startswith("actfirst.envs.")}
    assert sorted(n for n in builtin if BENCHMARKS[n].uopd_prompts is not None) == ["alfworld", "webshop"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_qwen3_tokenizer()


def prompt(tokenizer, benchmark, history, current, **kwargs):
    """The full-response request of the uopd set after ``history``; its token ids are the chat-templated text."""
    kwargs = {"budget_tokens": 10_000, **kwargs}
    result = build_prompt(tokenizer, get_benchmark(benchmark), Mode.FULL_RESPONSE, prompts="uopd",
                          task_description=current.task_description, history=history, current=current, **kwargs)
    assert result.token_ids == tokenizer.apply_chat_template([{"role": "user", "content": result.text}],
                                                             add_generation_prompt=True, tokenize=True,
                                                             return_dict=False)
    return result


ALFWORLD_O1 = ("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, "
               "you see a cabinet 1, a countertop 1, and a fridge 1.\n\nYour task is to: put a cool mug in cabinet.")
ALFWORLD_TASK = "put a cool mug in cabinet."


def alfworld_at(observation, admissible):
    return Transition(observation=observation, admissible=admissible, score=0, done=False, won=False,
                      task_description=ALFWORLD_TASK)


def test_alfworld_first_step_is_e1s_first_template_without_the_task(tokenizer):
    current = alfworld_at(ALFWORLD_O1, ("go to cabinet 1", "go to countertop 1", "go to fridge 1", "inventory", "look"))
    result = prompt(tokenizer, "alfworld", [], current)
    assert result.text == (
        "You are an expert agent operating in the ALFRED Embodied Environment.\n"
        "Your current observation is: -= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. "
        "Looking quickly around you, you see a cabinet 1, a countertop 1, and a fridge 1.\n\nYour task is to: put a "
        "cool mug in cabinet.\n"
        "Your admissible actions of the current situation are: ['go to cabinet 1'\n 'go to countertop 1'\n "
        "'go to fridge 1'\n 'inventory'\n 'look'].\n"
        "\n"
        "Now it's your turn to take an action.\n"
        "You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed "
        "within <think> </think> tags.\n"
        "Once you've finished your reasoning, you should choose an admissible action for current step and present it "
        "within <action> </action> tags.")
    assert result.history_kept == 0 and not result.over_budget


def test_alfworld_second_step_shows_the_one_step_taken(tokenizer):
    current = alfworld_at("You arrive at countertop 1. On the countertop 1, you see a mug 1.",
                          ("go to cabinet 1", "take mug 1 from countertop 1"))
    result = prompt(tokenizer, "alfworld", [Step(ALFWORLD_O1, "go to countertop 1")], current)
    assert result.text == (
        "You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: put a cool mug in "
        "cabinet.\n"
        "Prior to this step, you have already taken 1 step(s). Below are the most recent 1 observations and the "
        "corresponding actions you took: [Observation 1: '-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the "
        "middle of a room. Looking quickly around you, you see a cabinet 1, a countertop 1, and a fridge 1.\n\nYour "
        "task is to: put a cool mug in cabinet.', Action 1: 'go to countertop 1']\n"
        "You are now at step 2 and your current observation is: You arrive at countertop 1. On the countertop 1, you "
        "see a mug 1.\n"
        "Your admissible actions of the current situation are: ['go to cabinet 1'\n 'take mug 1 from countertop 1'].\n"
        "\n"
        "Now it's your turn to take an action.\n"
        "You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed "
        "within <think> </think> tags.\n"
        "Once you've finished your reasoning, you should choose an admissible action for current step and present it "
        "within <action> </action> tags.")
    assert result.history_kept == 1


ALFWORLD_HISTORY = [Step(ALFWORLD_O1, "go to countertop 1"),
                    Step("You arrive at countertop 1. On the countertop 1, you see a mug 1.",
                         "take mug 1 from countertop 1"),
                    Step("You pick up the mug 1 from the countertop 1.", "go to fridge 1"),
                    Step("You arrive at fridge 1. The fridge 1 is closed.", "cool mug 1 with fridge 1")]


def test_alfworld_later_step_shows_the_two_most_recent_steps(tokenizer):
    current = alfworld_at("You cool the mug 1 using the fridge 1.", ("go to cabinet 1", "inventory"))
    result = prompt(tokenizer, "alfworld", ALFWORLD_HISTORY, current)
    assert result.text == (
        "You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: put a cool mug in "
        "cabinet.\n"
        "Prior to this step, you have already taken 4 step(s). Below are the most recent 2 observations and the "
        "corresponding actions you took: [Observation 3: 'You pick up the mug 1 from the countertop 1.', Action 3: "
        "'go to fridge 1']\n"
        "[Observation 4: 'You arrive at fridge 1. The fridge 1 is closed.', Action 4: 'cool mug 1 with fridge 1']\n"
        "You are now at step 5 and your current observation is: You cool the mug 1 using the fridge 1.\n"
        "Your admissible actions of the current situation are: ['go to cabinet 1'\n 'inventory'].\n"
        "\n"
        "Now it's your turn to take an action.\n"
        "You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed "
        "within <think> </think> tags.\n"
        "Once you've finished your reasoning, you should choose an admissible action for current step and present it "
        "within <action> </action> tags.")
    assert result.history_kept == 2


# WebShop's text pages join elements by " [SEP] "; a product's text may hold line breaks, which E.2 flattens.
SEARCH_PAGE = "WebShop [SEP] Instruction: [SEP] i need a red cotton shirt, under 30 dollars [SEP] Search"
RESULTS_PAGE = ("Instruction: [SEP] i need a red cotton shirt, under 30 dollars [SEP] Back to Search [SEP] Page 1 "
                "(Total results: 50) [SEP] Next > [SEP] B09ABC1234 [SEP] Red Cotton Shirt\nfor Men [SEP] $19.99")
ITEM_PAGE = ("Instruction: [SEP] i need a red cotton shirt, under 30 dollars [SEP] Back to Search [SEP] < Prev "
             "[SEP] size [SEP] small [SEP] large [SEP] Red Cotton Shirt\n  for Men [SEP] Price: $19.99 [SEP] Buy Now")
WEBSHOP_TASK = "i need a red cotton shirt, under 30 dollars"
WEBSHOP_ASK = (
    "\n"
    "Now it's your turn to take one action for the current step.\n"
    "You should first reason step-by-step about the current situation, then think carefully which admissible action "
    "best advances the shopping goal. This reasoning process MUST be enclosed within <think> </think> tags.\n"
    "Once you've finished your reasoning, you should choose an admissible action for current step and present it "
    "within <action> </action> tags.")


def webshop_at(observation, clickables, search_bar=False):
    return WebShopTransition(observation=observation, admissible=clickables, score=0, done=False, won=False,
                             task_description=WEBSHOP_TASK, has_search_bar=search_bar)


def test_webshop_first_step_is_e2s_first_template(tokenizer):
    result = prompt(tokenizer, "webshop", [], webshop_at(SEARCH_PAGE, (), search_bar=True))
    assert result.text == (
        "You are an expert autonomous agent operating in the WebShop e-commerce environment.\n"
        "Your task is to: i need a red cotton shirt, under 30 dollars.\n"
        "Your current observation is: WebShop [SEP] Instruction: [SEP] i need a red cotton shirt, under 30 dollars "
        "[SEP] Search.\n"
        "Your admissible actions of the current situation are:\n[\n'search[<your query>]'\n].\n" + WEBSHOP_ASK)
    assert result.history_kept == 0


def test_webshop_second_step_is_still_the_first_template_on_one_line(tokenizer):
    """E.2: the first template serves the first two steps, so step 2 shows no history; its page is flattened."""
    current = webshop_at(RESULTS_PAGE, ("back to search", "next >", "b09abc1234"))
    result = prompt(tokenizer, "webshop", [Step(SEARCH_PAGE, "search[red cotton shirt]")], current)
    assert result.text == (
        "You are an expert autonomous agent operating in the WebShop e-commerce environment.\n"
        "Your task is to: i need a red cotton shirt, under 30 dollars.\n"
        "Your current observation is: Instruction: [SEP] i need a red cotton shirt, under 30 dollars [SEP] Back to "
        "Search [SEP] Page 1 (Total results: 50) [SEP] Next > [SEP] B09ABC1234 [SEP] Red Cotton Shirt for Men [SEP] "
        "$19.99.\n"
        "Your admissible actions of the current situation are:\n[\n'click[back to search]',\n'click[next >]',\n"
        "'click[b09abc1234]'\n].\n" + WEBSHOP_ASK)
    assert result.history_kept == 0


def test_webshop_later_step_shows_the_two_most_recent_steps_on_one_line(tokenizer):
    history = [Step(SEARCH_PAGE, "search[red cotton shirt]"), Step(RESULTS_PAGE, "click[b09abc1234]"),
               Step(ITEM_PAGE, "click[large]")]
    current = webshop_at(ITEM_PAGE, ("back to search", "< prev", "small", "large", "buy now"))
    result = prompt(tokenizer, "webshop", history, current)
    assert result.text == (
        "You are an expert autonomous agent operating in the WebShop e-commerce environment.\n"
        "Your task is to: i need a red cotton shirt, under 30 dollars.\n"
        "Prior to this step, you have already taken 3 step(s). Below are the most recent 2 observations and the "
        "corresponding actions you took: [Observation 2: 'Instruction: [SEP] i need a red cotton shirt, under 30 "
        "dollars [SEP] Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next > [SEP] B09ABC1234 [SEP] Red Cotton "
        "Shirt for Men [SEP] $19.99', Action 2: 'click[b09abc1234]']\n"
        "[Observation 3: 'Instruction: [SEP] i need a red cotton shirt, under 30 dollars [SEP] Back to Search [SEP] < "
        "Prev [SEP] size [SEP] small [SEP] large [SEP] Red Cotton Shirt for Men [SEP] Price: $19.99 [SEP] Buy Now', "
        "Action 3: 'click[large]']\n"
        "You are now at step 4 and your current observation is: Instruction: [SEP] i need a red cotton shirt, under "
        "30 dollars [SEP] Back to Search [SEP] < Prev [SEP] size [SEP] small [SEP] large [SEP] Red Cotton Shirt for "
        "Men [SEP] Price: $19.99 [SEP] Buy Now.\n"
        "Your admissible actions of the current situation are:\n[\n'click[back to search]',\n'click[< prev]',\n"
        "'click[small]',\n'click[large]',\n'click[buy now]'\n].\n" + WEBSHOP_ASK)
    assert result.history_kept == 2


def test_the_window_is_never_fitted_to_the_budget(tokenizer):
    """E.1's history is its two-step window whatever the budget: over it the prompt goes ahead, counted; only what
    the model cannot take is refused."""
    current = alfworld_at("You cool the mug 1 using the fridge 1.", ("go to cabinet 1",))
    full = prompt(tokenizer, "alfworld", ALFWORLD_HISTORY, current)
    over = prompt(tokenizer, "alfworld", ALFWORLD_HISTORY, current, budget_tokens=len(full.token_ids) - 1)
    assert over.over_budget and over.history_kept == 2 and over.token_ids == full.token_ids
    with pytest.raises(PromptTooLong, match=f"needs {len(full.token_ids)} tokens"):
        prompt(tokenizer, "alfworld", ALFWORLD_HISTORY, current, limit_tokens=len(full.token_ids) - 1)


@pytest.mark.parametrize("mode", [Mode.NEXT_ACTION, Mode.INVERSE_DYNAMICS])
def test_no_action_only_prompt_in_the_uopd_set(tokenizer, mode):
    reference = "You arrive at cabinet 1." if mode is Mode.INVERSE_DYNAMICS else None
    with pytest.raises(ValueError, match=f"mode={mode.value}: rollout.prompts='uopd' has only think-then-act"):
        build_prompt(tokenizer, get_benchmark("alfworld"), mode, prompts="uopd", task_description=ALFWORLD_TASK,
                     history=[], current=alfworld_at(ALFWORLD_O1, ("look",)), budget_tokens=10_000,
                     reference_next_observation=reference)


@pytest.mark.parametrize(("overrides", "message"), [
    (["rollout.strategy=actfirst"], "rollout.prompts='uopd'.*rollout.strategy='actfirst' executes fast actions"),
    (["rollout.strategy=no_id"], "rollout.prompts='uopd'.*rollout.strategy='no_id' executes fast actions"),
    (["rollout.prompts=b1"], "rollout.prompts"),
])
def test_the_config_refuses_uopd_prompts_with_fast_actions(paths, overrides, message):
    """003's prompts are think-then-act only: a strategy that executes fast actions cannot use them."""
    with pytest.raises(ConfigError, match=message):
        load_config(TrainConfig, CONFIGS / "alfworld" / "uopd-qwen2.5-3b.yaml", paths + overrides)


def test_the_config_refuses_uopd_prompts_on_a_benchmark_without_them(paths):
    with pytest.raises(ConfigError, match="rollout.prompts='uopd'.*benchmark 'scienceworld' has no UOPD-paper"):
        load_config(TrainConfig, CONFIGS / "scienceworld" / "qwen3-1.7b.yaml",
                    paths + ["rollout.strategy=vanilla", "rollout.prompts=uopd"])


@pytest.mark.parametrize("strategy", ["vanilla", "f2b", "b2f", "uopd"])
def test_the_config_takes_uopd_prompts_with_think_then_act(paths, strategy):
    cfg = load_config(TrainConfig, CONFIGS / "alfworld" / "uopd-qwen2.5-3b.yaml",
                      paths + [f"rollout.strategy={strategy}"])
    assert cfg.rollout.prompts == "uopd"

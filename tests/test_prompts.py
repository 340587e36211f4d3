"""Prompts (Appendix B.1) against the paper's own text, and history management (Appendix B.2)."""

import re
from pathlib import Path

import pytest

from actfirst.envs.base import Transition
from actfirst.envs.benchmarks import BENCHMARKS, get_benchmark
from actfirst.envs.scienceworld.transition import ScienceWorldTransition
from actfirst.envs.webshop.transition import WebShopTransition
from actfirst.models.tokenizers import build_qwen3_tokenizer
from actfirst.rollout.prompts import Mode, PromptTooLong, Step, build_prompt, render

pytestmark = pytest.mark.usefixtures("alfworld_data")  # configs with games: real load

# The B.1 section of the paper, kept with the tests (a clean clone has no ../shared); checked against the paper
# itself where the paper is present.
EXCERPT = Path(__file__).parent / "data" / "paper_b1_templates.txt"
PAPERS = Path(__file__).parents[2] / "shared" / "papers"
SECTIONS = {"alfworld": "#### ALFWorld.", "webshop": "#### WebShop.", "scienceworld": "#### ScienceWorld."}
FIRST_LINE = {"alfworld": "You are an expert agent", "webshop": "You are an expert autonomous agent",
              "scienceworld": "Your ScienceWorld task is"}
MODES = (Mode.FULL_RESPONSE, Mode.NEXT_ACTION, Mode.INVERSE_DYNAMICS)
B1 = sorted(SECTIONS)
"""The benchmarks with B.1 templates in the paper."""


def paper_templates(benchmark):
    """The three B.1 templates of ``benchmark`` as printed in the paper (which lost its whitespace)."""
    lines = EXCERPT.read_text().splitlines()
    start = lines.index(SECTIONS[benchmark]) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("#")), len(lines))
    templates = []
    for line in lines[start:end]:
        if line.startswith(FIRST_LINE[benchmark]):
            templates.append([])
        if line.strip():
            templates[-1].append(line)
    assert len(templates) == 3
    return ["".join(t) for t in templates]


def squeeze(text):
    return re.sub(r"\s+", "", text)


@pytest.mark.skipif(not PAPERS.is_dir(), reason="the paper is not next to this checkout")
def test_excerpt_is_the_papers_text():
    paper = next(PAPERS.glob("000_*.txt")).read_text()
    assert "\n".join(EXCERPT.read_text().splitlines()[1:]) in paper


@pytest.mark.parametrize("benchmark", B1)
def test_templates_are_the_papers_word_for_word(benchmark):
    for mode, paper in zip(MODES, paper_templates(benchmark), strict=True):
        head, with_history, _, tail = BENCHMARKS[benchmark].templates[mode]
        ours = (head + with_history + tail).replace("{{", "{").replace("}}", "}")
        assert squeeze(ours) == squeeze(paper), (benchmark, mode)


@pytest.fixture(scope="module")
def tokenizer():
    return build_qwen3_tokenizer()


CURRENT = {
    "alfworld": Transition(observation="You arrive at countertop 1. On the countertop 1, you see a mug 1.",
                           admissible=("go to fridge 1", "take mug 1 from countertop 1"), score=0, done=False,
                           won=False, task_description="put a clean mug in countertop."),
    "scienceworld": ScienceWorldTransition(observation="This room is called the kitchen.",
                                           admissible=("look around",), score=0, done=False, won=False,
                                           task_description="Your task is to boil water.",
                                           templates=("look around", "go to LOC"), objects=("kitchen", "pot")),
    "webshop": WebShopTransition(observation="WebShop [SEP] Instruction: [SEP] red shirt [SEP] Search",
                                 admissible=("back to search", "b09abc1234"), score=0, done=False, won=False,
                                 task_description="red shirt", has_search_bar=True),
}
# How each benchmark's admissible-action fields (Benchmark.prompt_fields) appear in the prompt.
ACTION_FIELDS = {
    "alfworld": ["situation are: ['go to fridge 1', 'take mug 1 from countertop 1'].\n"],
    "scienceworld": ["Available action commands: [look around, go to LOC]\n",
                     "Available objects you can interact with: [kitchen, pot]\n"],
    "webshop": ["[\n'search[<your query>]',\n'click[back to search]',\n'click[b09abc1234]'\n]"],
}


def test_every_benchmark_has_templates():
    """A benchmark with fast actions has all three B.1 templates; one without (Search: E.3's prompt) has none but
    where its observation is not the whole prompt (a full-response template then)."""
    builtin = {name: cls for name, cls in BENCHMARKS.items() if cls.__module__.startswith("actfirst.envs.")}
    assert sorted(name for name, cls in builtin.items() if cls.fast_actions) == B1 == sorted(ACTION_FIELDS)
    for name, cls in BENCHMARKS.items():
        if cls.fast_actions:
            assert set(cls.templates) == set(MODES), name
        else:
            assert set(cls.templates) == (set() if cls.prompt_is_observation else {Mode.FULL_RESPONSE}), name


@pytest.mark.parametrize("benchmark", B1)
@pytest.mark.parametrize("mode", MODES)
def test_render_fills_every_field(benchmark, mode):
    current = CURRENT[benchmark]
    history = [Step("obs one", "act one"), Step("obs two", "act two")]
    ref = "REFERENCE NEXT" if mode is Mode.INVERSE_DYNAMICS else None
    text = render(get_benchmark(benchmark), mode, task_description=current.task_description, history=history,
                  step_count=5, current=current, reference_next_observation=ref)
    assert "{" not in text.replace("{'", "") and "}" not in text
    assert current.observation in text and current.task_description in text
    assert "already taken 5 step(s)" in text and "step 6" in text and "recent 2 observations" in text
    # Steps are numbered from the start of the episode: the kept pairs are steps 4 and 5.
    assert "[Observation 4: 'obs one', Action 4: 'act one']" in text
    assert ("<think>" in text) == (mode is Mode.FULL_RESPONSE)
    assert ("REFERENCE NEXT" in text) == (mode is Mode.INVERSE_DYNAMICS)
    assert all(field in text for field in ACTION_FIELDS[benchmark]), text
    no_history = render(get_benchmark(benchmark), mode, task_description="t", history=[], step_count=0,
                        current=current, reference_next_observation=ref)
    assert "Prior to this step" not in no_history and current.observation in no_history


def test_reference_only_for_inverse_dynamics():
    alfworld = get_benchmark("alfworld")
    with pytest.raises(ValueError, match="reference_next_observation"):
        render(alfworld, Mode.NEXT_ACTION, task_description="t", history=[], step_count=0,
               current=CURRENT["alfworld"], reference_next_observation="x")
    with pytest.raises(ValueError, match="reference_next_observation"):
        render(alfworld, Mode.INVERSE_DYNAMICS, task_description="t", history=[], step_count=0,
               current=CURRENT["alfworld"])


def test_webshop_reference_is_shown_without_its_instruction_block():
    webshop = get_benchmark("webshop")
    page = "WebShop [SEP] Instruction: [SEP] red shirt [SEP] Back to Search [SEP] Page 1 (Total results: 50)"
    text = render(webshop, Mode.INVERSE_DYNAMICS, task_description="red shirt", history=[], step_count=0,
                  current=CURRENT["webshop"], reference_next_observation=webshop.reference_observation(page))
    assert "Reference next observation:\nBack to Search [SEP] Page 1 (Total results: 50)\n" in text


def test_history_drops_oldest_pairs_until_the_prompt_fits(tokenizer):
    current = CURRENT["alfworld"]
    history = [Step(f"observation number {i} " + "word " * 20, f"go to cabinet {i}") for i in range(1, 9)]
    stored = list(history)
    alfworld = get_benchmark("alfworld")
    full = build_prompt(tokenizer, alfworld, Mode.NEXT_ACTION, task_description="put a mug in fridge.",
                        history=history, current=current, budget_tokens=10_000)
    assert full.history_kept == 8
    budget = len(full.token_ids) - 40  # room for about 5 of the 8 pairs
    fitted = build_prompt(tokenizer, alfworld, Mode.NEXT_ACTION, task_description="put a mug in fridge.",
                          history=history, current=current, budget_tokens=budget)
    assert 0 < fitted.history_kept < 8 and len(fitted.token_ids) <= budget
    kept = history[8 - fitted.history_kept:]
    assert all(s.action in fitted.text for s in kept)  # the most recent pairs are kept ...
    assert "go to cabinet 1'" not in fitted.text  # ... the oldest dropped
    one_more = render(alfworld, Mode.NEXT_ACTION, task_description="put a mug in fridge.",
                      history=history[8 - fitted.history_kept - 1:], step_count=8, current=current)
    n_one_more = len(tokenizer.apply_chat_template([{"role": "user", "content": one_more}],
                                                   add_generation_prompt=True, tokenize=True, return_dict=False))
    assert n_one_more > budget  # and it is the longest suffix that fits
    assert history == stored
    assert fitted.token_ids == tokenizer.apply_chat_template([{"role": "user", "content": fitted.text}],
                                                             add_generation_prompt=True, tokenize=True,
                                                             return_dict=False)


def test_no_history_template_and_never_shortening_the_rest(tokenizer):
    current, scienceworld = CURRENT["scienceworld"], get_benchmark("scienceworld")
    history = [Step("o " * 50, "look around")] * 3
    bare = build_prompt(tokenizer, scienceworld, Mode.INVERSE_DYNAMICS, task_description="boil water",
                        history=[], current=current, budget_tokens=10_000, reference_next_observation="R " * 30)
    fitted = build_prompt(tokenizer, scienceworld, Mode.INVERSE_DYNAMICS, task_description="boil water",
                          history=history, current=current, budget_tokens=len(bare.token_ids),
                          reference_next_observation="R " * 30)
    assert fitted.history_kept == 0 and fitted.text == bare.text
    assert "Your current observation is" in fitted.text and ("R " * 30).strip() in fitted.text
    assert not fitted.over_budget


def test_a_prompt_over_budget_without_history_goes_ahead_unless_the_model_cannot_take_it(tokenizer):
    """B.2: the oldest pairs go "until it fits or no history remains"; the no-history prompt is then used as it is.
    Only the model's own limit refuses it, since B.2 shortens nothing else."""
    current, scienceworld = CURRENT["scienceworld"], get_benchmark("scienceworld")
    history = [Step("o " * 50, "look around")] * 3
    kwargs = dict(task_description="boil water", history=history, current=current, reference_next_observation="R")
    bare = build_prompt(tokenizer, scienceworld, Mode.INVERSE_DYNAMICS, **{**kwargs, "history": []},
                        budget_tokens=10_000)
    over = build_prompt(tokenizer, scienceworld, Mode.INVERSE_DYNAMICS, **kwargs, budget_tokens=10,
                        limit_tokens=len(bare.token_ids))
    assert over.over_budget and over.history_kept == 0 and over.token_ids == bare.token_ids
    with pytest.raises(PromptTooLong, match=f"needs {len(bare.token_ids)} tokens, more than the model takes with "
                                            f"this request's response budget \\({len(bare.token_ids) - 1}\\)"):
        build_prompt(tokenizer, scienceworld, Mode.INVERSE_DYNAMICS, **kwargs, budget_tokens=10,
                     limit_tokens=len(bare.token_ids) - 1)


# Qwen3's own chat template ends the generation prompt with an empty thinking block when thinking is off.
QWEN3_STYLE_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}{%- endif -%}"
)


@pytest.mark.parametrize("mode", MODES)
def test_action_only_modes_render_with_thinking_off(mode):
    """Fast actions are actions without preceding reasoning (Eq. 6-7): with a Qwen3-style template the action-only
    prompts end in an empty thinking block; the full-response prompt leaves thinking on."""
    tokenizer = build_qwen3_tokenizer()
    tokenizer.chat_template = QWEN3_STYLE_TEMPLATE
    reference = "You arrive at fridge 1." if mode is Mode.INVERSE_DYNAMICS else None
    prompt = build_prompt(tokenizer, get_benchmark("alfworld"), mode, task_description="put a mug in fridge.",
                          history=[], current=CURRENT["alfworld"], budget_tokens=10_000,
                          reference_next_observation=reference)
    tail = tokenizer.decode(prompt.token_ids[-8:])
    assert tail.endswith("<think>\n\n</think>\n\n") == (mode is not Mode.FULL_RESPONSE), tail

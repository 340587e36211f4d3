"""The reasoning texts the built models learn (``actfirst.train.sft.THOUGHTS``): what each restates, checked by hand
on ScienceWorld and ALFWorld transitions, and the supervised examples built from them."""

import pytest

from actfirst.envs.base import Transition
from actfirst.envs.benchmarks import get_benchmark
from actfirst.envs.response_format import THINK_CLOSE, extract_action
from actfirst.envs.scienceworld.transition import ScienceWorldTransition
from actfirst.models.tokenizers import build_qwen3_tokenizer
from actfirst.rollout.prompts import Mode, Step
from actfirst.train.sft import (
    THOUGHTS,
    ExpertStep,
    decided_thought,
    enumerated_thought,
    examples,
    response_text,
    restated_thought,
    short_thought,
    surveyed_thought,
)

pytestmark = pytest.mark.usefixtures("alfworld_data")  # configs with games: real load

TASK = "Your task is to find the animal with the longest life span. The animals are in the 'outside' location."
SCIENCEWORLD = ScienceWorldTransition(observation="You move to the greenhouse.", admissible=("go to outside",),
                                      score=0, done=False, won=False, task_description=TASK,
                                      templates=("go OBJ", "focus on OBJ"), objects=("bee hive", "door to outside"))
ALFWORLD = Transition(observation="You arrive at countertop 1. On the countertop 1, you see a mug 1.",
                      admissible=("go to fridge 1", "take mug 1 from countertop 1"), score=0, done=False, won=False,
                      task_description="put a clean mug in countertop.")


def step(current: Transition, action: str, history: tuple[Step, ...] = ()) -> ExpertStep:
    return ExpertStep(task="t", history=history, current=current, action=action, next_observation="next")


def test_restated_thought_by_hand():
    history = (Step("This room is called the hallway.", "go to greenhouse"), Step("You see a door.", "open door"))
    text = restated_thought(get_benchmark("scienceworld"), step(SCIENCEWORLD, "go to outside", history))
    assert text == ("My task is to find the animal with the longest life span.\n"
                    f"The task says: {TASK}\n"
                    "Steps taken (2): go to greenhouse; open door.\n"
                    "What I see now: You move to the greenhouse.\n"
                    "Action templates: go OBJ, focus on OBJ.\n"
                    "Objects: bee hive, door to outside.\n"
                    "Now I choose the next step.")
    first = restated_thought(get_benchmark("alfworld"), step(ALFWORLD, "take mug 1 from countertop 1"))
    assert "Steps taken (0): none yet.\n" in first
    assert "Admissible actions: 'go to fridge 1', 'take mug 1 from countertop 1'.\n" in first  # ALFWorld's B.1 field
    assert first.endswith("'take mug 1 from countertop 1'.\n"
                          "Now I choose the next step.")  # the step: in the action only


def test_decided_thought_by_hand():
    history = (Step("This room is called the hallway.", "go to greenhouse"),)
    text = decided_thought(get_benchmark("scienceworld"), step(SCIENCEWORLD, "go to outside", history))
    assert text == ("My task is to find the animal with the longest life span. The next step is: go to outside.\n"
                    f"The task says: {TASK}\n"
                    "Steps taken (1): go to greenhouse.\n"
                    "What I see now: You move to the greenhouse.\n"
                    "Action templates: go OBJ, focus on OBJ.\n"
                    "Objects: bee hive, door to outside.\n"
                    "So I take that step.")
    first = decided_thought(get_benchmark("alfworld"), step(ALFWORLD, "take mug 1 from countertop 1"))
    assert first.startswith("My task is to put a clean mug in countertop. The next step is: take mug 1 from "
                            "countertop 1.\nThe task says: put a clean mug in countertop.\n"
                            "Steps taken (0): none yet.\n")


FIXED_BY_HAND = {
    "surveyed": (surveyed_thought, "The action commands: go OBJ, focus on OBJ.\n"),
    "enumerated": (enumerated_thought, "Command 1 of 2: go OBJ.\nCommand 2 of 2: focus on OBJ.\n"),
}
"""The thoughts fixed within a task but for the decision: each one's command lines on the fixture's 2 templates."""


@pytest.mark.parametrize("name", sorted(FIXED_BY_HAND))
def test_fixed_thought_by_hand(name):
    thought, commands = FIXED_BY_HAND[name]
    history = (Step("This room is called the hallway.", "go to greenhouse"),)
    text = thought(get_benchmark("scienceworld"), step(SCIENCEWORLD, "go to outside", history))
    assert text == (f"The task says: {TASK}\n{commands}"
                    "My task is to find the animal with the longest life span. The next step is: go to outside.")
    other = thought(get_benchmark("scienceworld"), step(SCIENCEWORLD, "focus on bee hive"))
    fixed = 1 + commands.count("\n")
    assert text.splitlines()[:fixed] == other.splitlines()[:fixed]  # fixed within the task: only the decision differs
    # ALFWorld's transitions have no templates to restate
    with pytest.raises(ValueError, match=r"prepare\.build_models\.thoughts restates.*'alfworld'.*task 't' has none"):
        thought(get_benchmark("alfworld"), step(ALFWORLD, "take mug 1 from countertop 1"))


@pytest.mark.parametrize("name", sorted(THOUGHTS))
def test_full_response_parses_to_the_step(name):
    benchmark = get_benchmark("scienceworld")
    expert = step(SCIENCEWORLD, "focus on bee hive")
    text = response_text(benchmark, Mode.FULL_RESPONSE, expert, THOUGHTS[name])
    assert extract_action(text, truncated=False) == "focus on bee hive"
    assert text.startswith(f"<think>\n{THOUGHTS[name](benchmark, expert)}\n{THINK_CLOSE}")
    for mode in (Mode.NEXT_ACTION, Mode.INVERSE_DYNAMICS):  # action only, whatever the reasoning style
        assert response_text(benchmark, mode, expert, THOUGHTS[name]) == "<action>focus on bee hive</action>"


def test_long_examples_are_longer_and_supervise_every_response_token():
    tokenizer = build_qwen3_tokenizer()
    benchmark = get_benchmark("scienceworld")
    steps = [step(SCIENCEWORLD, "go to outside"), step(SCIENCEWORLD, "focus on bee hive",
                                                       (Step("You move to the outside.", "go to outside"),))]
    built = {name: examples(tokenizer, benchmark, steps, modes=[Mode.FULL_RESPONSE, Mode.NEXT_ACTION],
                            max_prompt_tokens=2048, thought=THOUGHTS[name]) for name in THOUGHTS}
    for samples in built.values():
        assert all(s.loss_mask == [1] * len(s.response_ids) for s in samples)
        assert all(s.response_ids[-1] == tokenizer.eos_token_id for s in samples)
    short = built["short"]
    for name in ("restated", "decided", "surveyed", "enumerated"):
        long = built[name]
        assert [s.context_ids for s in short] == [s.context_ids for s in long]  # the same prompts
        full = [(a, b) for a, b in zip(short, long, strict=True) if a.strategy == "sft:full_response"]
        ratio = 1.5 if name in ("surveyed", "enumerated") else 2  # they restate the task and the fixture's 2 templates
        assert len(full) == 2 and all(len(b.response_ids) > ratio * len(a.response_ids) for a, b in full), name
        assert all(a.response_ids == b.response_ids for a, b in zip(short, long, strict=True)
                   if a.strategy == "sft:next_action")
    def first_full_response(name: str) -> str:
        return tokenizer.decode(next(s for s in built[name] if s.strategy == "sft:full_response").response_ids)

    assert short_thought(benchmark, steps[0]) in first_full_response("short")
    assert first_full_response("decided").startswith(f"<think>\n{short_thought(benchmark, steps[0])}\nThe task says:")
    assert first_full_response("surveyed").endswith(f"{short_thought(benchmark, steps[0])}\n</think>\n\n"
                                                    "<action>go to outside</action><|im_end|>")

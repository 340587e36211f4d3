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


@pytest.mark.parametrize("name", ["short", "enumerated"])
def test_stray_tokens_sit_inside_the_thought_and_are_not_supervised(name):
    """``stray_token_rate``: only full responses change, only inside their thought (``<think>``, ``</think>`` and the
    action are the clean example's), each changed token is another one and carries mask 0, every other token mask 1;
    the rate is met over many draws, and rate 0 leaves the examples as they were."""
    tokenizer = build_qwen3_tokenizer()
    benchmark = get_benchmark("scienceworld")
    steps = [step(SCIENCEWORLD, "go to outside"), step(SCIENCEWORLD, "focus on bee hive",
                                                       (Step("You move to the outside.", "go to outside"),))] * 20
    kwargs = dict(modes=[Mode.FULL_RESPONSE, Mode.NEXT_ACTION, Mode.INVERSE_DYNAMICS], max_prompt_tokens=2048,
                  thought=THOUGHTS[name])
    clean = examples(tokenizer, benchmark, steps, **kwargs)
    stray = examples(tokenizer, benchmark, steps, stray_token_rate=0.05, seed=3, **kwargs)
    assert examples(tokenizer, benchmark, steps, stray_token_rate=0.0, seed=3, **kwargs) == clean
    changed, thought_tokens = 0, 0
    special = set(tokenizer.all_special_ids)
    for a, b in zip(clean, stray, strict=True):
        assert a.context_ids == b.context_ids and len(a.response_ids) == len(b.response_ids)
        diff = [i for i, (x, y) in enumerate(zip(a.response_ids, b.response_ids, strict=True)) if x != y]
        assert b.loss_mask == [0 if i in diff else 1 for i in range(len(b.response_ids))]
        if a.strategy != "sft:full_response":
            assert not diff
            continue
        text = tokenizer.decode(a.response_ids)
        head = len(tokenizer.encode("<think>\n", add_special_tokens=False))
        tail = len(tokenizer.encode(text[text.index("\n</think>"):], add_special_tokens=False))
        assert all(head <= i < len(a.response_ids) - tail for i in diff)  # inside the thought
        assert not special & {b.response_ids[i] for i in diff}
        changed += len(diff)
        thought_tokens += len(a.response_ids) - head - tail
    assert 0.03 < changed / thought_tokens < 0.07, (changed, thought_tokens)
    with pytest.raises(ValueError, match=r"stray_token_rate=1\.0: must be in \[0, 1\)"):
        examples(tokenizer, benchmark, steps, stray_token_rate=1.0, **kwargs)


def test_sft_learns_nothing_from_a_masked_target(tiny_model_dir):
    """A target whose loss mask is 0 moves no weight: two SFT runs on data that differ only at a masked last target
    (no later token reads it) end with the same weights; unmasked, the same difference moves them."""
    import torch
    from transformers import AutoModelForCausalLM

    from actfirst.rollout.sample import Sample
    from actfirst.train.sft import sft

    def sample(response, mask):
        return Sample(context_ids=[5, 6, 7, 8], response_ids=response, loss_mask=mask, logprobs=[0.0] * len(response),
                      weight_version=0, task="t", turn=0, strategy="sft:full_response")

    def trained(data):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        sft(model, data, epochs=2, lr=1e-2, batch_tokens=64, micro_batch_tokens=32, log=None)
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    base = trained([sample([9, 10, 11, 12], [1, 1, 1, 0]), sample([13, 14, 15], [1, 1, 1])])
    masked = trained([sample([9, 10, 11, 40], [1, 1, 1, 0]), sample([13, 14, 15], [1, 1, 1])])
    unmasked = trained([sample([9, 10, 11, 40], [1, 1, 1, 1]), sample([13, 14, 15], [1, 1, 1])])
    assert torch.equal(base, masked)
    assert not torch.allclose(base, unmasked)

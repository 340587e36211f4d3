"""Transition checks (Appendix B.5, ``Benchmark.check``) on observations from the real ScienceWorld simulator, both
ways, and on ALFWorld's rules."""

import random

import pytest
from turn_checks import turn_check

from actfirst.envs.base import Reference
from actfirst.envs.benchmarks import get_benchmark
from actfirst.envs.checks import CheckResult, normalize_set, normalize_text
from actfirst.envs.scienceworld.checks import normalize_scienceworld_observation

pytestmark = pytest.mark.usefixtures("alfworld_data")  # ALFWorld's default config (games: real) loads

GOLD_STEPS = 6  # boil, easy, variation 0: 'go to kitchen', ..., 'open cupboard', 'pick up metal pot', 'look around'


def play(env, actions):
    """Replay ``actions``; returns one record per step with what the checks need."""
    obs, info = env.reset()
    steps = []
    for action in actions:
        valid = list(info["valid"])
        obs, _, done, info = env.step(action)
        steps.append({"action": action, "admissible": valid, "obs": obs, "done": done,
                      "templates": env.get_possible_actions()})
    return steps


@pytest.fixture(scope="module")
def boil():
    from scienceworld import ScienceWorldEnv

    envs = [ScienceWorldEnv("", envStepLimit=100) for _ in range(2)]
    try:
        for env in envs:
            env.load("boil", 0, "easy", generateGoldPath=True)
        # The easy preset's gold path holds no-op steps ("open door to kitchen" on an open door) that are not in
        # the admissible list; references drop them (Appendix C.2 shortens candidates while replay succeeds).
        gold = [a for a in envs[0].get_gold_action_sequence() if not a.startswith("open door")][:GOLD_STEPS]
        yield {"gold": gold, "reference": play(envs[0], gold), "student": play(envs[1], gold), "env": envs[1]}
    finally:
        for env in envs:
            env.close()


def sw_check(step, ref, **override):
    kwargs = dict(action=step["action"], admissible=step["admissible"], done=step["done"], ref_done=ref["done"],
                  next_observation=step["obs"], ref_next_observation=ref["obs"], next_templates=step["templates"],
                  ref_next_templates=ref["templates"])
    kwargs.update(override)
    return turn_check(get_benchmark("scienceworld"), **kwargs)


def alfworld_check(**kwargs):
    return turn_check(get_benchmark("alfworld"), **kwargs)


def test_normalize_text_rules():
    text = "ＡＢＣ  Fridge\r\n\r\n  You   See\tA  Cup \rend\n\n"
    # NFKC (full-width letters), case folding, \r\n and \r line endings, whitespace collapsed, empty lines dropped.
    assert normalize_text(text) == "abc fridge\nyou see a cup\nend"
    assert normalize_set(["Open Fridge 1", "open  fridge 1", "go to desk 1"]) == {"open fridge 1", "go to desk 1"}


def test_scienceworld_normalization_is_order_free_on_real_observations(boil):
    kitchen = boil["reference"][-1]["obs"]
    assert "(containing a red apple, a banana, an orange, a potato)" in kitchen and " is: " in kitchen
    lines = kitchen.split("\n")
    rng = random.Random(0)
    shuffled = lines[:]
    rng.shuffle(shuffled)
    reordered = "\n".join(shuffled)
    reordered = reordered.replace("a red apple, a banana, an orange, a potato",
                                  "a potato, a banana, a red apple, an orange")
    reordered = reordered.replace("a ceramic cup (containing nothing), a drawer, a tin cup (containing nothing).",
                                  "a tin cup (containing nothing), a ceramic cup (containing nothing), a drawer.")
    assert reordered != kitchen
    assert normalize_scienceworld_observation(reordered) == normalize_scienceworld_observation(kitchen)
    # Any change of content is still a mismatch.
    changed = kitchen.replace("a banana", "two bananas")
    assert normalize_scienceworld_observation(changed) != normalize_scienceworld_observation(kitchen)


def test_which_and_that_clauses_stay_with_their_item():
    a = "On the table is: a cup, which is red, a bowl, that is empty."
    b = "On the table is: a bowl, that is empty, a cup, which is red."
    c = "On the table is: a cup, that is empty, a bowl, which is red."
    assert normalize_scienceworld_observation(a) == normalize_scienceworld_observation(b)
    assert normalize_scienceworld_observation(a) != normalize_scienceworld_observation(c)
    # Only non-nested "(containing ...)" lists are sorted: the inner list here, not the outer one.
    nested = "a pot (containing ice, a cup (containing water, salt))"
    assert normalize_scienceworld_observation(nested) == "a pot (containing ice, a cup (containing salt, water))"


def test_scienceworld_replay_of_the_reference_passes(boil):
    for step, ref in zip(boil["student"], boil["reference"], strict=True):
        assert sw_check(step, ref).passed, step["action"]


def test_scienceworld_failures(boil):
    step, ref = boil["student"][-1], boil["reference"][-1]
    # The transition itself matches (it is the reference's own), so only the action decides: validity is checked
    # on the normalized text against the full admissible list, and an unknown action fails however the step went.
    assert sw_check(step, ref).passed and sw_check(step, ref, action=f"  {step['action'].upper()} ").passed
    assert sw_check(step, ref, action="fly to the moon") == CheckResult(False, "invalid action")
    assert sw_check(step, ref, done=True).reason == "termination mismatch"
    assert sw_check(step, ref, ref_next_templates=ref["templates"][1:]).reason == "action templates mismatch"
    # A different, valid action from the same state gives a different real observation.
    env = boil["env"]
    env.reset()
    for action in boil["gold"][:-1]:
        env.step(action)
    obs, _, done, _ = env.step("look at painting")
    assert "look at painting" in normalize_set(boil["student"][-1]["admissible"])
    result = sw_check(step, ref, action="look at painting", next_observation=obs, done=done)
    assert result.reason == "observation mismatch"


def test_alfworld_rules():
    obs = "You arrive at countertop 1. On the countertop 1, you see a apple 1, and a knife 2."
    adm = ["go to fridge 1", "take apple 1 from countertop 1", "help", "look"]
    base = dict(action="take apple 1 from countertop 1", admissible=["help", "take apple 1 from countertop 1"],
                done=False, ref_done=False, next_observation=obs, ref_next_observation=obs.upper(),
                next_admissible=adm, ref_next_admissible=list(reversed(adm)) + ["look"])
    assert alfworld_check(**base).passed
    assert alfworld_check(**{**base, "action": "help"}).reason == "invalid action"  # help is never valid
    assert alfworld_check(**{**base, "ref_done": True}).reason == "termination mismatch"
    assert alfworld_check(**{**base, "ref_next_observation": obs + " 2"}).reason == "observation mismatch"
    assert alfworld_check(**{**base, "ref_next_admissible": adm[1:]}).reason == "admissible actions mismatch"
    # Terminal transitions skip the admissible-action comparison.
    assert alfworld_check(**{**base, "done": True, "ref_done": True, "ref_next_admissible": []}).passed


def test_a_benchmark_without_reference_trajectories_has_nothing_to_check():
    search = get_benchmark("search")
    state = search.transition_class(observation="q", admissible=(), score=0.0, done=False, won=False)
    with pytest.raises(NotImplementedError, match="benchmark 'search' has no reference trajectories"):
        search.check(Reference("q", ["<search>x</search>"], [state, state], "test"), 0, action="<answer>y</answer>",
                     current=state, next=state)

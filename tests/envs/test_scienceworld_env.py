"""ScienceWorld behind the environment interface, on the real simulator (easy preset)."""

import pytest

from actfirst.envs.checks import normalize_text
from actfirst.envs.scienceworld.env import ScienceWorldTextEnv
from actfirst.envs.scienceworld.tasks import ScienceWorldTask

TASK = ScienceWorldTask("find-non-living-thing", 0)


@pytest.fixture(scope="module")
def env():
    env = ScienceWorldTextEnv(max_turns=30)
    yield env
    env.close()


def test_reset_gives_prompt_and_validation_information(env):
    first = env.reset(TASK)
    assert first.observation.startswith("This room is called the hallway.")
    assert first.task_description.startswith("Your task is to find a(n) non-living thing.")
    assert "look around" in first.admissible and len(first.admissible) > 50  # full list, for validation
    assert "go OBJ" in first.templates and "focus on OBJ" in first.templates  # templates, for the prompt
    assert "kitchen" in first.objects
    assert first.turn == 0 and not first.finished and first.valid


def test_gold_path_succeeds_with_score_and_validity(env):
    gold = env.gold_path(TASK)
    env.reset(TASK)
    steps = [env.step(a) for a in gold]
    # The easy preset's gold path starts with a no-op "open door" that is not admissible: invalid, still a turn.
    assert [s.valid for s in steps] == [not a.startswith("open door") for a in gold]
    assert [s.turn for s in steps] == list(range(1, len(gold) + 1))
    assert steps[-1].done and steps[-1].won and steps[-1].score == 100.0
    assert all(a.score <= b.score for a, b in zip(steps, steps[1:]))


def test_score_is_the_best_reached_and_never_negative(env):
    env.reset(ScienceWorldTask("find-living-thing", 0))
    reached = env.step("go to kitchen").score
    assert reached > 0
    wrong = env.step("focus on table")  # focusing on the wrong object ends the episode with -100 in ScienceWorld
    assert wrong.done and not wrong.won
    assert wrong.score == reached  # the highest score reached, clipped to [0, 100]


def test_turn_limit_truncates(tmp_path):
    env = ScienceWorldTextEnv(max_turns=2)
    try:
        env.reset(TASK)
        assert not env.step("look around").finished
        last = env.step("xyzzy")
        assert not last.valid and last.truncated and not last.done
        assert normalize_text(last.observation)  # the simulator answered an unknown command
    finally:
        env.close()


def test_state_is_the_look_around_and_inventory_stand_in(env):
    # No facts on ScienceWorld: C.5's state is the free look-around and inventory text, and the success flag.
    reset = env.reset(TASK)
    moves = env._env.get_num_moves()
    first = env.state()
    assert env._env.get_num_moves() == moves  # reading the state advances nothing
    assert first.content == (env._env.look(), env._env.inventory()) and not first.won
    assert first.content[0].startswith("This room is called the hallway.") and "inventory" in first.content[1]
    env.step("look around")
    assert env.state() == first  # looking changes nothing
    env.step(next(a for a in reset.admissible if a.startswith("go to ")))
    assert env.state().content[0] != first.content[0] and env.state().content[1] == first.content[1]

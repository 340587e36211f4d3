"""ScienceWorld behind the environment interface, on the real simulator (easy preset)."""

import itertools

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
    assert all(a.score <= b.score for a, b in itertools.pairwise(steps))


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


def library_moves(env, task, actions):
    """Each move of ``actions`` after a reset through ScienceWorldEnv's own reset and step (which build the full
    admissible list on every move): (observation, clipped best score, done, validity, admissible list, templates,
    objects, look-around and inventory)."""
    lib = env._env
    lib.load(task.task_type, task.variation, "easy")
    observation, info = lib.reset()
    moves, best, done, valid = [], 0.0, False, True
    for action in [None, *actions]:
        if action is not None:
            valid = normalize_text(action) in {normalize_text(a) for a in info["valid"]}
            observation, _, done, info = lib.step(action)
        best = max(best, min(100.0, max(0.0, float(info["score"]))))
        moves.append((observation, best, bool(done), valid, tuple(info["valid"]), tuple(lib.get_possible_actions()),
                      tuple(lib.get_possible_objects()), (info["look"], info["inv"])))
    return moves, info["taskDesc"].removeprefix("Task Description:").strip()


def test_lists_on_demand_keep_every_transition(env):
    # The same moves with every list built (the default) and with none: the same observations, scores, termination
    # flags, templates, objects and states as the library's own step gives; without lists no list and no validity.
    task = ScienceWorldTask("lifespan-longest-lived", 0)
    actions = ["xyzzy", *env.gold_path(task)]
    expected, description = library_moves(env, task, actions)
    for lists in (True, False):
        got = [env.reset(task, admissible=lists)]
        states = [env.state()]
        for action in actions:
            got.append(env.step(action))
            states.append(env.state())
        for move, (obs, best, done, valid, admissible, templates, objects, state), st in zip(
                got, expected, states, strict=True):
            assert (move.observation, move.score, move.done, move.templates, move.objects) == \
                (obs, best, done, templates, objects)
            assert move.task_description == description and st.content == state
            assert (move.admissible, move.valid) == ((admissible, valid) if lists else (None, valid if not move.turn
                                                                                       else None))
        assert got[-1].won
    assert [move[3] for move in expected[1:3]] == [False, False]  # "xyzzy" and the gold path's "open door": invalid


def test_a_list_asked_for_is_the_states_and_decides_the_next_validity(env):
    task = ScienceWorldTask("lifespan-longest-lived", 0)
    actions = env.gold_path(task)
    expected, _ = library_moves(env, task, actions)
    env.reset(task, admissible=False)
    for t, action in enumerate(actions):
        if t % 2 == 0:  # asked for on every other state, twice (built once)
            assert env.admissible() == env.admissible() == expected[t][4]
        move = env.step(action)
        assert move.admissible is None and move.valid == (expected[t + 1][3] if t % 2 == 0 else None)

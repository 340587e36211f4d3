"""ALFWorld on generated games: the generator, the environment, its splits, and the B.5 check on real text."""

import json
import shutil

import pytest
from turn_checks import turn_check

from actfirst.envs.alfworld.config import ALFWorldConfig
from actfirst.envs.alfworld.env import ALFWorldTask, ALFWorldTextEnv, alfworld_tasks, walkthrough
from actfirst.envs.alfworld.games import TASK_TYPES, generate_game, generated_split, unseen_floor_plan
from actfirst.envs.benchmarks import get_benchmark


@pytest.fixture(scope="module")
def env():
    env = ALFWorldTextEnv(max_turns=30)
    yield env
    env.close()


def play(env, task, actions):
    steps = [env.reset(task)]
    steps += [env.step(a) for a in actions]
    return steps


def test_six_task_types_each_solved_by_the_planner(alfworld_games, env):
    assert sorted(t.task_type for t in alfworld_games) == sorted(TASK_TYPES.values())
    for task in alfworld_games:
        plan = walkthrough(task)
        steps = play(env, task, plan)
        first = steps[0]
        assert first.observation.startswith("You are in the middle of a room.")
        assert "Welcome to TextWorld" not in first.observation and first.task_description
        assert all("help" != a for s in steps for a in s.admissible)
        # Every planner command is admissible where it is taken, and the plan wins exactly at its end.
        assert all(s.valid for s in steps[1:]), task
        assert [s.done for s in steps[1:]] == [False] * (len(plan) - 1) + [True]
        assert steps[-1].won and steps[-1].score == 100.0 and not steps[-2].won


def test_generation_is_deterministic_for_a_seed(tmp_path, alfworld_games):
    a = generate_game(7, "pick", tmp_path / "a")
    b = generate_game(7, "pick", tmp_path / "b")
    c = generate_game(8, "pick", tmp_path / "c")
    assert a.read_text() == b.read_text()
    assert json.loads(a.read_text())["pddl_problem"] != json.loads(c.read_text())["pddl_problem"]
    with pytest.raises(ValueError, match="task='fly'"):
        generate_game(0, "fly", tmp_path / "d")


def test_unseen_games_use_held_out_rooms(tmp_path):
    game = generate_game(0, "pick", tmp_path / "u", unseen=True)
    floor_plan = json.loads((game.parent / "traj_data.json").read_text())["scene"]["floor_plan"]
    assert unseen_floor_plan(int(floor_plan.removeprefix("FloorPlan")))


def test_invalid_actions_and_the_turn_limit(alfworld_games):
    env = ALFWorldTextEnv(max_turns=3)
    try:
        task = alfworld_games[0]
        env.reset(task)
        help_step = env.step("help")
        assert not help_step.valid and not help_step.finished  # help is excluded from the admissible actions
        assert not env.step("fly to the moon").valid
        last = env.step("look")
        assert last.valid and last.truncated and not last.done and last.turn == 3
    finally:
        env.close()


def test_alfworld_data_splits(tmp_path, alfworld_games):
    # A download-shaped tree: json_2.1.1/<split>/<task>/<trial>/{game.tw-pddl,traj_data.json}; movable and
    # sliced tasks are skipped as ALFWorld skips them, unsolvable games too.
    data = tmp_path / "data"
    for i, task in enumerate(alfworld_games[:3]):
        name = ["pick_and_place_simple-Mug-None-Shelf-1", "pick_heat_then_place_in_recep-Slice-Sliced-1",
                "pick_and_place_with_movable_recep-Mug-Bowl-1"][i]
        shutil.copytree(task.game_file.rsplit("/", 1)[0], data / "json_2.1.1" / "valid_seen" / name / "trial_1")
    unsolvable = data / "json_2.1.1" / "valid_seen" / "x-1" / "trial_1"
    shutil.copytree(alfworld_games[3].game_file.rsplit("/", 1)[0], unsolvable)
    game = json.loads((unsolvable / "game.tw-pddl").read_text())
    (unsolvable / "game.tw-pddl").write_text(json.dumps({**game, "solvable": False}))
    tasks = alfworld_tasks(data / "json_2.1.1" / "valid_seen")
    assert [t.game_file.split("/")[-3] for t in tasks] == ["pick_and_place_simple-Mug-None-Shelf-1"]
    with pytest.raises(ValueError, match="split='test'"):
        generated_split("test", tmp_path / "games")


def alfworld_check(**kwargs):
    return turn_check(get_benchmark("alfworld", ALFWorldConfig(games="generated")), **kwargs)


def test_alfworld_check_on_real_transitions(alfworld_games):
    task = next(t for t in alfworld_games if t.task_type == "pick_clean_then_place_in_recep")
    plan = walkthrough(task)
    envs = [ALFWorldTextEnv(), ALFWorldTextEnv()]
    try:
        ref, student = (play(e, task, plan) for e in envs)
        for t in range(1, len(plan) + 1):  # the same actions reproduce every reference transition
            assert alfworld_check(action=plan[t - 1], admissible=student[t - 1].admissible, done=student[t].done,
                                  ref_done=ref[t].done, next_observation=student[t].observation,
                                  ref_next_observation=ref[t].observation, next_admissible=student[t].admissible,
                                  ref_next_admissible=ref[t].admissible).passed
        # A different admissible action from the same state leads elsewhere: the check fails.
        envs[1].reset(task)
        other = next(a for a in student[0].admissible if a != plan[0] and a.startswith("go to"))
        moved = envs[1].step(other)
        kwargs = dict(admissible=student[0].admissible, ref_done=ref[1].done, ref_next_observation=ref[1].observation,
                      ref_next_admissible=ref[1].admissible)
        assert alfworld_check(action=other, done=moved.done, next_observation=moved.observation,
                              next_admissible=moved.admissible, **kwargs).reason == "observation mismatch"
        assert alfworld_check(action="help", done=ref[1].done, next_observation=ref[1].observation,
                              next_admissible=ref[1].admissible, **kwargs).reason == "invalid action"
        # Same observation text but other admissible actions (holding vs not holding): non-terminal fails ...
        assert alfworld_check(action=plan[0], done=False, next_observation=ref[1].observation,
                              next_admissible=student[3].admissible, **kwargs).reason == "admissible actions mismatch"
        # ... and a terminal transition skips the admissible comparison but not the termination flag.
        last = len(plan)
        assert alfworld_check(action=plan[-1], admissible=student[last - 1].admissible, done=True, ref_done=True,
                              next_observation=ref[last].observation, ref_next_observation=ref[last].observation,
                              next_admissible=[], ref_next_admissible=ref[last].admissible).passed
        assert alfworld_check(action=plan[-1], admissible=student[last - 1].admissible, done=False, ref_done=True,
                              next_observation=ref[last].observation, ref_next_observation=ref[last].observation,
                              next_admissible=[], ref_next_admissible=[]).reason == "termination mismatch"
    finally:
        for e in envs:
            e.close()


def test_alfworld_tasks_reads_real_layout(alfworld_games):
    root = alfworld_games[0].game_file.rsplit("/", 2)[0]
    assert alfworld_tasks(root) == sorted(alfworld_games)
    assert isinstance(alfworld_games[0], ALFWorldTask)


def test_state_is_the_positive_facts_and_the_won_flag(alfworld_games, env):
    # C.5's state: the game's facts as TextWorld reports them with EnvInfos(facts=True), negated effects left out.
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
    from textworld.envs import PddlEnv

    task = alfworld_games[0]
    plan = walkthrough(task)
    reference = AlfredDemangler(PddlEnv(textworld.EnvInfos(facts=True)), shuffle=False)
    reference.load(task.game_file)
    game_states = [reference.reset(), *(reference.step(a)[0] for a in plan)]
    reference.close()
    env.reset(task)
    states = [env.state()]
    for action in plan:
        env.step(action)
        states.append(env.state())
    assert len(states) == len(game_states)
    for state, game_state in zip(states, game_states, strict=True):
        names = sorted(f.name for f in game_state["facts"] if not f.is_negation)
        assert sorted(fact.split("(")[0] for fact in state.content) == names and len(state.content) > 10
        assert state.content == tuple(sorted(state.content))
    assert not any(fact.startswith("not_") for s in states for fact in s.content)
    assert [s.won for s in states] == [False] * len(plan) + [True]
    assert states[0] != states[1]  # the first planner action changes the facts (the agent moves)
    assert env.reset(task) and env.state() == states[0]  # the same state after a reset
    env.step("look")
    looked = env.state()  # a first look marks the place checked...
    added = set(looked.content) - set(states[0].content)
    assert added and all(f.startswith("checked(") for f in added) and set(states[0].content) <= set(looked.content)
    env.step("look")
    assert env.state() == looked  # ...and another changes no fact

"""Reference construction (Appendix C.2) on the real simulators: replay, selection, shortening, coverage, resume."""

import dataclasses
import json
import shutil

import pytest

from actfirst.core.config import ConfigError
from actfirst.envs.alfworld.config import ALFWorldConfig
from actfirst.envs.alfworld.env import alfworld_tasks, walkthrough
from actfirst.envs.benchmarks import get_benchmark
from actfirst.envs.checks import normalize_text
from actfirst.envs.scienceworld.checks import normalize_scienceworld_observation
from actfirst.envs.scienceworld.env import ScienceWorldTextEnv
from actfirst.envs.scienceworld.tasks import ScienceWorldTask
from actfirst.preparation.reference_cache import PartialCacheError, load_references, read_candidates
from actfirst.references import main

SW_ARGS = ["build", "--benchmark", "scienceworld", "--task-types", "find-non-living-thing", "lifespan-longest-lived",
           "--per-type", "2", "--workers", "2"]


@pytest.fixture(scope="module")
def sw_cache(tmp_path_factory):
    out = tmp_path_factory.mktemp("refs") / "scienceworld.jsonl"
    # A user candidate: the gold path of find-non-living-thing/0 padded with no-op looks, to be shortened away.
    env = ScienceWorldTextEnv()
    try:
        gold = env.gold_path(ScienceWorldTask("find-non-living-thing", 0))
    finally:
        env.close()
    padded = [a for g in gold for a in ("look around", g)]
    candidates = out.parent / "teacher.jsonl"
    candidates.write_text(json.dumps({"task": "find-non-living-thing/0", "actions": padded}) + "\n")
    assert main([*SW_ARGS, "--out", str(out), "--candidates", str(candidates)]) == 0
    return out


def test_scienceworld_cache_covers_every_task_and_replays(sw_cache):
    refs = load_references(sw_cache)
    meta = json.loads(sw_cache.with_name(sw_cache.name + ".meta.json").read_text())
    assert meta["coverage"] == 1.0 and meta["tasks"] == 4 and meta["missing"] == [] and meta["shortened"]
    config = dataclasses.asdict(get_benchmark("scienceworld").config)  # what was replayed, evaluation keys aside
    assert meta["config"] == {k: v for k, v in config.items() if not k.startswith("eval_")}
    assert load_references(sw_cache, benchmark=get_benchmark("scienceworld")) == refs
    assert sorted(refs) == ["find-non-living-thing/0", "find-non-living-thing/1", "lifespan-longest-lived/0",
                            "lifespan-longest-lived/1"]
    env = ScienceWorldTextEnv()
    try:
        for key, ref in refs.items():
            assert len(ref.transitions) == len(ref.actions) + 1  # o_1 ... o_{T+1}
            assert ref.transitions[-1].won and ref.transitions[-1].done
            assert all(t.valid for t in ref.transitions[1:])  # gold paths' "open door" no-ops are gone
            assert all(t.templates and not t.admissible for t in ref.transitions)  # what the checks compare
            task_type, variation = key.split("/")
            replayed = [env.reset(ScienceWorldTask(task_type, int(variation)))]
            replayed += [env.step(a) for a in ref.actions]
            assert [normalize_scienceworld_observation(t.observation) for t in replayed] == [
                normalize_scienceworld_observation(t.observation) for t in ref.transitions]
            # Shortened: removing any single action breaks the replay.
            for i in range(len(ref.actions)):
                env.reset(ScienceWorldTask(task_type, int(variation)))
                trial = [env.step(a) for a in ref.actions[:i] + ref.actions[i + 1:]]
                assert not (trial and trial[-1].won), (key, i)
    finally:
        env.close()


def test_a_cache_serves_another_turn_limit_only_where_every_reference_fits(sw_cache, tmp_path):
    """The turn limit may differ from the cache's (000 Sec. 5.1's 30 turns over a 12-turn cache) where each
    reference fits in the run's and was not cut by the cache's; any other key must be the cache's."""
    built = get_benchmark("scienceworld").config
    refs = load_references(sw_cache)
    longest = max(len(ref.actions) for ref in refs.values())
    for limit in (longest, built.max_turns + 20):
        other = get_benchmark("scienceworld", dataclasses.replace(built, max_turns=limit))
        assert load_references(sw_cache, benchmark=other) == refs
    short = get_benchmark("scienceworld", dataclasses.replace(built, max_turns=longest - 1))
    with pytest.raises(ConfigError, match=rf"built under max_turns={built.max_turns}; .* does not fit the run's "
                                          rf"max_turns={longest - 1}"):
        load_references(sw_cache, benchmark=short)
    cut = tmp_path / "cut.jsonl"  # a reference the cache's limit cut: its transitions are not another limit's
    lines = sw_cache.read_text().splitlines()
    row = json.loads(lines[0])
    row["transitions"][-1]["truncated"] = True
    cut.write_text("\n".join([json.dumps(row), *lines[1:]]) + "\n")
    shutil.copy(sw_cache.with_name(sw_cache.name + ".meta.json"), cut.with_name("cut.jsonl.meta.json"))
    longer = get_benchmark("scienceworld", dataclasses.replace(built, max_turns=built.max_turns + 20))
    with pytest.raises(ConfigError, match=rf"reference of task {row['task']!r} .* was cut by the cache's"):
        load_references(cut, benchmark=longer)
    assert load_references(cut, benchmark=get_benchmark("scienceworld", built))  # under the cache's own limit
    harder = get_benchmark("scienceworld", dataclasses.replace(built, simplification=""))
    with pytest.raises(ConfigError, match="built under another scienceworld config .* simplification"):
        load_references(sw_cache, benchmark=harder)


def test_replaying_a_reference_passes_every_check_and_a_detour_fails(sw_cache):
    refs = load_references(sw_cache)
    benchmark = get_benchmark("scienceworld")
    env = benchmark.make_env()
    try:
        for key, ref in refs.items():
            task_type, variation = key.split("/")
            current = env.reset(ScienceWorldTask(task_type, int(variation)))
            result = None
            for t, action in enumerate(ref.actions):
                nxt = env.step(action)
                result = benchmark.check(ref, t, action=action, current=current, next=nxt, previous=result)
                assert result.passed, (key, t, result)
                current = nxt
            assert benchmark.succeeded(current)
            assert benchmark.check(ref, len(ref.actions), action="look around", current=current,
                                   next=current).reason == "reference exhausted"
        ref = refs["lifespan-longest-lived/0"]
        current = env.reset(ScienceWorldTask("lifespan-longest-lived", 0))
        detour = env.step("look around")
        assert benchmark.check(ref, 0, action="look around", current=current,
                               next=detour).reason == "observation mismatch"
    finally:
        env.close()


def test_shortest_candidate_is_selected(sw_cache):
    ref = load_references(sw_cache)["find-non-living-thing/0"]
    assert "look around" not in ref.actions and len(ref.actions) <= 3


@pytest.fixture
def alf_games(alfworld_games, tmp_path):
    """A private copy of the generated games (tests below edit them)."""
    root = tmp_path / "games" / "train"
    for task in alfworld_games:
        shutil.copytree(task.game_file.rsplit("/", 1)[0], root / task.game_file.split("/")[-2])
    return tmp_path / "games"


def test_alfworld_refuses_partial_then_resumes_with_candidates(alf_games, tmp_path, capsys):
    # Take the planner's walkthrough away from one game: no candidate for it.
    game_file = alf_games / "train" / "look-0000" / "game.tw-pddl"
    game = json.loads(game_file.read_text())
    plan = game["walkthrough"]
    game_file.write_text(json.dumps({**game, "walkthrough": []}))
    out = tmp_path / "alfworld.jsonl"
    args = ["build", "--benchmark", "alfworld", "--set", "games=generated", f"generated_dir={alf_games}",
            "games_per_type=1", "--out", str(out), "--workers", "2"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "look-0000" in err and "not written" in err
    assert not out.exists() and out.with_name("alfworld.jsonl.partial").exists()
    # Resume: the five finished tasks are not replayed again; a user candidate (longer, with a detour) completes it.
    candidates = tmp_path / "rollouts.jsonl"
    candidates.write_text(json.dumps({"task": "look-0000", "actions": ["look", *plan]}) + "\n"
                          + json.dumps({"task": "look-0000", "actions": ["inventory", "look", *plan]}) + "\n")
    assert main([*args, "--candidates", str(candidates)]) == 0
    log = capsys.readouterr().out
    assert "resuming: 5 of 6" in log and log.count("actions (") == 1
    refs = load_references(out)
    assert len(refs) == 6 and refs["look-0000"].actions == ["look", *plan]
    assert refs["look-0000"].source == "candidates:rollouts.jsonl"
    assert all(r.source == "walkthrough" for k, r in refs.items() if k != "look-0000")
    benchmark = get_benchmark("alfworld", ALFWorldConfig(games="generated"))
    env = benchmark.make_env()
    try:  # the cached transitions are what a replay gives, admissible sets included
        ref = refs["pick-0000"]
        task = next(t for t in alfworld_tasks(alf_games) if t.game_file.endswith("pick-0000/game.tw-pddl"))
        assert ref.actions == walkthrough(task)
        replayed = [env.reset(task)] + [env.step(a) for a in ref.actions]
        assert [normalize_text(t.observation) for t in replayed] == [normalize_text(t.observation)
                                                                     for t in ref.transitions]
        assert [set(t.admissible) for t in replayed] == [set(t.admissible) for t in ref.transitions]
        for t, action in enumerate(ref.actions):
            assert benchmark.check(ref, t, action=action, current=replayed[t], next=replayed[t + 1]).passed
    finally:
        env.close()


def test_partial_cache_published_only_on_request(alf_games, tmp_path):
    game_file = alf_games / "train" / "pick-0000" / "game.tw-pddl"
    game_file.write_text(json.dumps({**json.loads(game_file.read_text()), "walkthrough": ["look"]}))
    out = tmp_path / "partial.jsonl"
    assert main(["build", "--benchmark", "alfworld", "--set", "games=generated", f"generated_dir={alf_games}",
                 "games_per_type=1", "--out", str(out), "--allow-partial"]) == 0
    with pytest.raises(PartialCacheError, match=r"coverage 83.3% \(5/6\), missing \['pick-0000'\]"):
        load_references(out)
    assert len(load_references(out, allow_partial=True)) == 5


def test_bad_candidate_lines_are_named(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"task": "a", "actions": ["x"]}) + "\n" + json.dumps({"task": "b", "actions": "x"}))
    with pytest.raises(ConfigError, match=r"--candidates='.*bad.jsonl': line 2 is not a candidate"):
        read_candidates([bad])
    bad.write_text(json.dumps({"task": "a", "actions": ["x"]}) + "\n{\"task\": \"b\", \"act")  # cut short
    with pytest.raises(ConfigError, match=r"bad.jsonl': line 2 is not JSON"):
        read_candidates([bad])

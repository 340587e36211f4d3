"""The benchmark objects: names and configs, splits and task types, prompt fields, checks, success."""

import asyncio
import importlib.util
import json
import pickle
import shutil
import subprocess
import sys

import pytest

from actfirst.core.schema import load_config
from actfirst.core.user_input import ConfigError
from actfirst.envs.alfworld.config import ALFWorldConfig
from actfirst.envs.base import Reference, Transition
from actfirst.envs.benchmarks import BENCHMARKS, EnvSpec, config_path, get_benchmark, load_benchmark, select_tasks
from actfirst.envs.checks import CheckResult
from actfirst.envs.scienceworld.config import ScienceWorldConfig
from actfirst.envs.scienceworld.tasks import SIMPLIFICATIONS, TASK_TYPES
from actfirst.envs.scienceworld.transition import ScienceWorldTransition
from actfirst.envs.webshop.checks import SEARCH_MISMATCH_ALLOWED
from actfirst.envs.webshop.config import WebShopConfig
from actfirst.envs.webshop.transition import WebShopTransition
from actfirst.envs.workers import EnvPool
from actfirst.preparation.reference_cache import build_references

pytestmark = pytest.mark.usefixtures("alfworld_data")  # configs with games: real load

WEBSHOP_INSTALLED = importlib.util.find_spec("web_agent_site") is not None


def test_unknown_names_and_wrong_configs_are_rejected():
    assert {"alfworld", "scienceworld", "search", "webshop"} <= set(BENCHMARKS)  # the built-in packages
    with pytest.raises(ValueError) as unknown:
        get_benchmark("webshp")
    assert str(unknown.value) == f"benchmark='webshp': not one of {sorted(BENCHMARKS)}"
    with pytest.raises(ValueError, match=r"benchmark 'webshop' needs a WebShopConfig, got a ALFWorldConfig"):
        get_benchmark("webshop", ALFWorldConfig(games="generated"))
    with pytest.raises(ValueError, match="benchmark='ALFWorld'"):
        EnvSpec("ALFWorld", ALFWorldConfig(games="generated"))
    with pytest.raises(ValueError, match="needs a ALFWorldConfig, got a WebShopConfig"):
        EnvSpec("alfworld", WebShopConfig())
    with pytest.raises(ValueError, match="split='test': not one of \\['train', 'eval'\\]"):
        get_benchmark("webshop").tasks("test")


@pytest.mark.parametrize("name,max_turns", [("alfworld", 30), ("scienceworld", 30), ("webshop", 15)])
def test_default_config_is_the_file_and_travels_to_workers(name, max_turns):
    benchmark = get_benchmark(name)
    assert benchmark.name == name and benchmark.max_turns == max_turns  # C.1's turn limits
    assert benchmark.config == load_config(BENCHMARKS[name].config_class, config_path(name))
    spec = pickle.loads(pickle.dumps(benchmark.env_spec()))  # what a spawned worker receives
    assert spec == EnvSpec(name, benchmark.config)
    changed = load_benchmark(name, overrides=["max_turns=7"])
    assert changed.max_turns == 7 and changed.env_spec().config.max_turns == 7


def test_scienceworld_simplifications_are_the_simulators():
    from scienceworld import ScienceWorldEnv

    env = ScienceWorldEnv("", envStepLimit=10)
    try:
        assert sorted(SIMPLIFICATIONS) == sorted(["easy"] + env.get_possible_simplifications())
    finally:
        env.close()
    assert ScienceWorldConfig(train_task_types=["boil"], simplification="openDoors,teleportAction")
    with pytest.raises(ConfigError, match=r"simplification='easy,hard': \['hard'\] not among"):
        ScienceWorldConfig(train_task_types=["boil"], simplification="easy,hard")


def test_the_evaluation_split_of_a_task():
    """ALFWorld's split is the folder that holds the game, downloaded (json_2.1.1/<split>/<task>/<trial>/) or
    generated (<generated_dir>/<split>/<task>-<i>/); the other benchmarks report their evaluation tasks together."""
    from actfirst.envs.alfworld.env import ALFWorldTask

    alfworld = get_benchmark("alfworld", ALFWorldConfig(games="generated"))
    for game, split in [("/d/json_2.1.1/valid_seen/look_at_obj_in_light-Box-None-DeskLamp-1/trial_T1/game.tw-pddl",
                         "valid_seen"), ("/g/valid_unseen/pick_two_obj_and_place-0003/game.tw-pddl", "valid_unseen"),
                        ("/g/train/pick_two_obj_and_place-0003/game.tw-pddl", None)]:
        assert alfworld.task_split(ALFWorldTask(game, "pick_two_obj_and_place")) == split
    webshop = get_benchmark("webshop")
    assert webshop.task_split(4096) is None


def test_alfworld_splits_pool_seen_and_unseen_and_name_task_types(alfworld_games, tmp_path, monkeypatch):
    # A download-shaped tree (json_2.1.1/<split>/<task>/<trial>/) holding the generated games.
    data = tmp_path / "data" / "json_2.1.1"
    for split, games in [("train", alfworld_games), ("valid_seen", alfworld_games[:2]),
                         ("valid_unseen", alfworld_games[2:3])]:
        for task in games:
            name = task.game_file.split("/")[-2]
            shutil.copytree(task.game_file.rsplit("/", 1)[0], data / split / name / f"trial_{split}_{name}")
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "data"))
    alfworld = get_benchmark("alfworld", ALFWorldConfig(games="real", generated_dir=str(tmp_path / "unused")))
    train, evaluation = alfworld.tasks("train"), alfworld.tasks("eval")
    assert len(train) == 6 and len(evaluation) == 3  # C.1: valid_seen and valid_unseen pooled
    assert {t.game_file.split("/")[-4] for t in evaluation} == {"valid_seen", "valid_unseen"}
    assert [alfworld.task_split(t) for t in evaluation] == ["valid_seen"] * 2 + ["valid_unseen"]  # reported apart
    assert {alfworld.task_split(t) for t in train} == {None}
    assert sorted(alfworld.task_type(t) for t in train) == sorted(["Pick", "Look", "Clean", "Heat", "Cool", "Pick2"])
    assert alfworld.task_key(train[0]) == train[0].game_file.split("/")[-2]
    assert not (tmp_path / "unused").exists()  # the download is used, nothing generated
    assert [alfworld.task_type(t) for t in select_tasks(alfworld, train, ["Heat", "Pick2"])] == ["Heat", "Pick2"]
    with pytest.raises(ValueError, match=r"--task-types=\['pick'\]: no alfworld tasks of these types"):
        select_tasks(alfworld, train, ["pick"])


def test_scienceworld_splits_and_keys():
    scienceworld = get_benchmark("scienceworld")
    train, evaluation = scienceworld.tasks("train"), scienceworld.tasks("eval")
    assert len(evaluation) == 150 and {scienceworld.task_type(t) for t in evaluation} == set(TASK_TYPES)
    assert {scienceworld.task_type(t) for t in train} == set(scienceworld.config.train_task_types)
    assert scienceworld.task_key(evaluation[0]) == f"{evaluation[0].task_type}/{evaluation[0].variation}"
    first_two = select_tasks(scienceworld, train, per_type=2)
    assert len(first_two) == 2 * 17 and {t.variation for t in first_two} == {0, 1}


def test_webshop_splits_keys_and_reference_observation():
    webshop = get_benchmark("webshop")
    train, evaluation = webshop.tasks("train"), webshop.tasks("eval")
    assert [t.goal_idx for t in evaluation] == list(range(4096, 4196)) and len(train) == 4096
    assert webshop.task_key(evaluation[0]) == "4096" and {webshop.task_type(t) for t in train} == {"all"}
    assert [t.goal_idx for t in select_tasks(webshop, train, per_type=3)] == [0, 1, 2]
    page = f"{INSTRUCTION} [SEP] Back to Search [SEP] Buy Now"
    assert webshop.reference_observation(page) == "Back to Search [SEP] Buy Now"  # B.5: prompt only
    for name in ("alfworld", "scienceworld"):
        assert get_benchmark(name).reference_observation(page) == page


def test_action_validity():
    shared = dict(observation="o", admissible=("go to desk 1", "help", "b09abc1234"), score=0, done=False, won=False)
    current, page = Transition(**shared), WebShopTransition(**shared, has_search_bar=True)
    alfworld, scienceworld, webshop = (get_benchmark(n) for n in ("alfworld", "scienceworld", "webshop"))
    assert alfworld.valid_action("Go to  desk 1", current) and not alfworld.valid_action("help", current)
    assert scienceworld.valid_action("help", current) and not scienceworld.valid_action("go to desk 2", current)
    assert webshop.valid_action("search[red shirt]", page) and webshop.valid_action("click[B09ABC1234]", page)
    assert not webshop.valid_action("go to desk 1", page) and not webshop.valid_action("click[b00]", page)
    assert not webshop.valid_action("search[red shirt]", WebShopTransition(**shared))  # no search bar


def test_prompt_fields():
    shared = dict(observation="o", admissible=("go to desk 1", "b09abc1234"), score=0, done=False, won=False)
    assert get_benchmark("alfworld").prompt_fields(Transition(**shared)) == {
        "admissible_actions": "'go to desk 1', 'b09abc1234'"}
    room = ScienceWorldTransition(**shared, templates=("look around", "go to LOC"), objects=("kitchen",))
    assert get_benchmark("scienceworld").prompt_fields(room) == {"action_templates": "look around, go to LOC",
                                                                 "objects": "kitchen"}
    assert get_benchmark("webshop").prompt_fields(WebShopTransition(**shared, has_search_bar=True)) == {
        "available_actions": "'search[<your query>]',\n'click[go to desk 1]',\n'click[b09abc1234]'"}
    assert get_benchmark("scienceworld").action_commands(room) == ("look around", "go to LOC")
    assert get_benchmark("alfworld").action_commands(Transition(**shared)) == ()  # none but ScienceWorld's


# -- WebShop's check over an episode (pages in WebShop's text format; WebShop itself is not installable here) ----

INSTRUCTION = "WebShop [SEP] Instruction: [SEP] i need a red cotton shirt"


def page(n, *asins):
    items = " [SEP] ".join(f"{a} [SEP] Shirt {a} [SEP] $12.99" for a in asins)
    return f"{INSTRUCTION} [SEP] Back to Search [SEP] Page {n} (Total results: 50) [SEP] Next > [SEP] {items}"


def state(observation, clickables=(), *, search=False, done=False, score=0.0):
    return WebShopTransition(observation=observation, admissible=tuple(clickables), score=score, done=done,
                             won=score >= 99.999, has_search_bar=search)


HOME = state(f"{INSTRUCTION} [SEP] Search", search=True)
PRODUCT = state(f"{INSTRUCTION} [SEP] Back to Search [SEP] < Prev [SEP] Red Cotton Shirt [SEP] Buy Now",
                ["back to search", "< prev", "buy now"])
SCORE = state("Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] 1.0", done=True,
              score=100.0)
REFERENCE = Reference("0", ["search[red cotton shirt]", "click[b09abc1234]", "click[buy now]"], [
    HOME, state(page(1, "B01", "B09ABC1234"), ["back to search", "next >", "b01", "b09abc1234"]), PRODUCT, SCORE],
    "test")


def test_webshop_check_carries_a_search_mismatch_to_the_next_turn_only():
    webshop = get_benchmark("webshop")
    results = state(page(1, "B02", "B09ABC1234"), ["back to search", "next >", "b02", "b09abc1234"])  # not the ref's
    first = webshop.check(REFERENCE, 0, action="search[red shirt]", current=HOME, next=results)
    assert first == CheckResult(True, SEARCH_MISMATCH_ALLOWED)
    # The next turn starts from the student's own results page: the reference product must remain clickable there,
    # and the click that follows meets the ordinary rules.
    product = webshop.check(REFERENCE, 1, action="click[b09abc1234]", current=results, next=PRODUCT, previous=first)
    assert product == CheckResult(True)
    lost = state(page(1, "B02"), ["back to search", "next >", "b02"])
    kwargs = dict(action="click[next >]", current=lost, next=state(page(2, "B09ABC1234"), ["b09abc1234"]))
    assert webshop.check(REFERENCE, 1, **kwargs, previous=first).reason == "reference product not clickable"
    assert webshop.check(REFERENCE, 1, **kwargs, previous=None).reason == "observation mismatch"
    # A reference that pages on after its search has no product in the click that follows it: no exception.
    paging = Reference("0", ["search[red cotton shirt]", "click[next >]", "click[b09abc1234]"],
                       REFERENCE.transitions, "test")
    assert webshop.check(paging, 0, action="search[red shirt]", current=HOME,
                         next=results).reason == "observation mismatch"
    bought = webshop.check(REFERENCE, 2, action="click[buy now]", current=PRODUCT, next=SCORE, previous=product)
    assert bought.passed and webshop.succeeded(SCORE) and webshop.accepts_reference(SCORE)
    assert webshop.check(REFERENCE, 3, action="click[back to search]", current=SCORE,
                         next=SCORE) == CheckResult(False, "reference exhausted")


def test_webshop_keeps_partial_scores_for_references_and_ranks_by_score():
    webshop = get_benchmark("webshop")
    partial = state(SCORE.observation.replace("1.0", "0.5"), done=True, score=50.0)
    assert not webshop.succeeded(partial) and webshop.accepts_reference(partial)  # C.1 vs C.2
    assert not webshop.accepts_reference(state("Thank you [SEP] Your score (min 0.0, max 1.0) [SEP] 0.0", done=True))
    short = Reference("0", ["click[buy now]"], [PRODUCT, partial], "short")
    assert webshop.rank(REFERENCE) < webshop.rank(short)  # the higher score wins over fewer actions
    alfworld = get_benchmark("alfworld")
    assert alfworld.rank(short) < alfworld.rank(REFERENCE)  # elsewhere the fewer actions


def test_webshop_ranks_by_score_then_length():
    def ref(score, length):
        end = state(SCORE.observation, done=True, score=score)
        return Reference("0", ["click[buy now]"] * length, [end] * (length + 1), f"{score}/{length}")

    candidates = [ref(50.0, 3), ref(100.0, 9), ref(75.0, 2), ref(100.0, 4), ref(75.0, 5)]
    ranked = sorted(candidates, key=get_benchmark("webshop").rank)
    assert [r.source for r in ranked] == ["100.0/4", "100.0/9", "75.0/2", "75.0/5", "50.0/3"]


@pytest.mark.skipif(WEBSHOP_INSTALLED, reason="WebShop is installed")
def test_webshop_environment_needs_webshop_installed():
    with pytest.raises(ImportError, match="bash scripts/setup_webshop.sh --catalog"):
        get_benchmark("webshop", WebShopConfig(max_turns=7, num_products=100)).make_env()


@pytest.mark.skipif(not WEBSHOP_INSTALLED, reason="WebShop is not installed (bash scripts/setup_webshop.sh)")
def test_webshop_config_reaches_the_environment():
    env = get_benchmark("webshop", WebShopConfig(max_turns=7, num_products=100)).make_env()
    try:  # the connection to the node's server opens at the first episode
        assert env.max_turns == 7 and env.product_file == "items_shuffle.json"
    finally:
        env.close()


def test_alfworld_config_reaches_the_environment(alfworld_games):
    env = get_benchmark("alfworld", ALFWorldConfig(games="generated", max_turns=1)).make_env()
    try:
        env.reset(alfworld_games[0])
        assert env.max_turns == 1 and env.step("look").truncated
    finally:
        env.close()


def test_references_are_built_only_by_the_configured_environment(tmp_path):
    # never started
    other = EnvPool(get_benchmark("alfworld", ALFWorldConfig(games="generated", max_turns=5)).env_spec(), 1)
    with pytest.raises(ValueError, match="pool: its workers run .*max_turns=5.*not the benchmark's configured"):
        asyncio.run(build_references(get_benchmark("alfworld"), [], other, out=tmp_path / "refs.jsonl"))


def test_reference_cache_lines_round_trip():
    line = REFERENCE.to_json()
    assert Reference.from_json(line, WebShopTransition) == REFERENCE and json.loads(line)["task"] == "0"
    assert json.loads(line)["transitions"][0]["has_search_bar"] is True
    # a transition crosses to a worker process and back whole, of its benchmark's class
    assert pickle.loads(pickle.dumps(REFERENCE.transitions)) == REFERENCE.transitions


# One transition of each benchmark as its cache line held it before each benchmark's data moved into its own
# Transition subclass: every benchmark's fields on every line.
OLD_LINES = {
    "alfworld": {"observation": "You arrive at desk 1.", "admissible": ["go to bed 1", "look"], "score": 0.0,
                 "done": False, "won": False, "valid": True, "turn": 1, "truncated": False,
                 "task_description": "put a pen on the bed.", "templates": [], "objects": [],
                 "has_search_bar": False},
    "scienceworld": {"observation": "This room is called the kitchen.", "admissible": [], "score": 8.0,
                     "done": False, "won": False, "valid": True, "turn": 2, "truncated": False,
                     "task_description": "Your task is to boil water.", "templates": ["look around", "go to LOC"],
                     "objects": [], "has_search_bar": False},
    "webshop": {"observation": "WebShop [SEP] Search", "admissible": [], "score": 0.0, "done": False, "won": False,
                "valid": True, "turn": 0, "truncated": False, "task_description": "i need a red shirt",
                "templates": [], "objects": [], "has_search_bar": True},
}


@pytest.mark.parametrize("name", sorted(OLD_LINES))
def test_a_cache_written_before_the_transition_subclasses_loads(name, tmp_path):
    from actfirst.preparation.reference_cache import load_references, transition_config

    benchmark = get_benchmark(name)
    cache = tmp_path / "refs.jsonl"
    cache.write_text(json.dumps({"task": "t", "actions": ["look"], "source": "old",
                                 "transitions": [OLD_LINES[name], {**OLD_LINES[name], "turn": 9}]}) + "\n")
    cache.with_name("refs.jsonl.meta.json").write_text(json.dumps({
        "benchmark": name, "config": transition_config(benchmark.config), "coverage": 1.0}))
    for given in (benchmark, None):  # None: the class of the benchmark the metadata names
        (first, last) = load_references(cache, benchmark=given)["t"].transitions
        assert type(first) is benchmark.transition_class and last.turn == 9
        assert {k: list(v) if isinstance(v, tuple) else v for k, v in first.to_dict().items()} == {
            k: v for k, v in OLD_LINES[name].items() if k in first.to_dict()}
    assert (getattr(first, "templates", ()), getattr(first, "has_search_bar", False)) == {
        "alfworld": ((), False), "scienceworld": (("look around", "go to LOC"), False),
        "webshop": ((), True)}[name]


def test_the_registry_loads_the_packages_without_their_simulators():
    """Reading the registry imports every built-in benchmark package, and none of them imports its simulator (those
    load when an environment is made)."""
    code = ("import sys; from actfirst.envs.benchmarks import BENCHMARKS; names = sorted(BENCHMARKS); "
            "loaded = sorted(m for m in ('scienceworld', 'textworld', 'alfworld', 'web_agent_site') "
            "if m in sys.modules); "
            "print(names, loaded)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['alfworld', 'scienceworld', 'search', 'webshop'] []"


def test_registration_refuses_what_is_not_a_benchmark():
    from actfirst.envs.benchmarks import register_benchmark

    with pytest.raises(TypeError, match="a subclass of actfirst.envs.benchmarks.Benchmark"):
        register_benchmark(ALFWorldConfig)
    impostor = type("Impostor", (BENCHMARKS["alfworld"],), {})  # another class under a taken name
    with pytest.raises(ValueError, match="benchmark 'alfworld': registered already, by actfirst.envs.alfworld."):
        register_benchmark(impostor)
    assert register_benchmark(BENCHMARKS["alfworld"]) is BENCHMARKS["alfworld"]  # the same class again: nothing
    nameless = type("Nameless", (BENCHMARKS["alfworld"],), {"name": "not a name"})
    with pytest.raises(TypeError, match=r"Nameless.name='not a name': must be an identifier"):
        register_benchmark(nameless)


def test_the_default_config_files_are_package_data():
    """Each built-in benchmark's default config is ``<name>.yaml`` in its package, and every non-Python file of the
    benchmark packages is in pyproject's package-data, so that a wheel carries it."""
    import fnmatch
    import tomllib
    from pathlib import Path

    root = Path(__file__).parents[2]
    envs = root / "actfirst" / "envs"
    for name in ("alfworld", "scienceworld", "search", "webshop"):
        assert config_path(name) == envs / name / f"{name}.yaml"
    package_data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    data = [p for p in envs.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")]
    assert {p.suffix for p in data} == {".yaml", ".txt"}
    for path in data:
        patterns = package_data.get(f"actfirst.envs.{path.parent.name}", [])
        assert any(fnmatch.fnmatch(path.name, p) for p in patterns), f"{path.relative_to(root)}: not package data"


def test_a_former_configs_envs_path_still_loads(caplog, tmp_path, monkeypatch):
    """Command lines and configs written when the default files were under ``configs/envs/`` keep working: the file is
    read where it is now, with a warning that names that place."""
    monkeypatch.chdir(tmp_path)  # whatever the working directory
    for name in ("alfworld", "scienceworld", "webshop"):
        with caplog.at_level("WARNING", logger="actfirst.envs.benchmarks"):
            assert load_benchmark(name, f"configs/envs/{name}.yaml", ["max_turns=7"]).config == \
                load_benchmark(name, overrides=["max_turns=7"]).config
        assert f"read from {config_path(name)}" in caplog.text
    old = WebShopConfig(num_products=1000, train_goals="configs/envs/webshop/003-train.txt",
                        eval_goals="/repo/configs/envs/webshop/003-test-128.txt")
    assert [len(get_benchmark("webshop", old).tasks(s)) for s in ("train", "eval")] == [6410, 128]  # 003's D.1
    with pytest.raises(ConfigError, match=r"train_goals='configs/envs/webshop/nothing.txt': no such file"):
        WebShopConfig(train_goals="configs/envs/webshop/nothing.txt")
    with pytest.raises(ConfigError, match=r"--config='configs/envs/nothing.yaml'"):
        load_benchmark("alfworld", "configs/envs/nothing.yaml")

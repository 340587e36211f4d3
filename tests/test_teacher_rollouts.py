"""Teacher rollouts as reference candidates (Appendix C.2) on the real engine and real ScienceWorld, with a hand-set
bigram "teacher" (tests/rollout/conftest.py's ``chain_weights``) that always answers RESPONSE.

ScienceWorld's lifespan-longest-lived variation 3 (easy preset) starts outside next to the parrot egg: focusing on
the parrot wins at once (score 100, done). Variation 0 starts in the hallway, where the same action matches
nothing, so every episode there runs to the turn limit and fails.

The action is "focus on parrot" (the simulator resolves it to the parrot egg), not the gold path's "focus on egg
parrot": a bigram machine needs distinct tokens, and the env-bpe vocabulary has no " egg"/" p..." token, so
"focus on egg parrot" needs the bare " " token twice.
"""

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file
from transformers import AutoTokenizer

from actfirst.core.config import RolloutConfig, SchedulerConfig, ThinkingBudgetConfig
from actfirst.core.journal import journal_path, journal_paths
from actfirst.envs.benchmarks import get_benchmark
from actfirst.envs.scienceworld.config import ScienceWorldConfig
from actfirst.envs.scienceworld.tasks import ScienceWorldTask
from actfirst.envs.workers import EnvPool
from actfirst.preparation.reference_cache import read_candidates, replay
from actfirst.preparation.teacher_candidates import (
    MAX_REPEATS,
    merge_candidates,
    play_share,
    rollout_seed,
    teacher_candidates,
    write_candidates,
)
from actfirst.rollout.runner import EpisodeResult, RolloutRunner

pytestmark = pytest.mark.engine

RESPONSE = "<think>egg</think><action>focus on parrot</action>"
ACTION = "focus on parrot"
WIN = ScienceWorldTask("lifespan-longest-lived", 3)
LOSE = ScienceWorldTask("lifespan-longest-lived", 0)
TASKS = [WIN, LOSE, ScienceWorldTask("lifespan-longest-lived", 1)]  # the shared preparation's task set
MAX_TURNS = 4
# The training budget (the teacher rollouts' own); RESPONSE is 15 tokens, so it ends in the first stage.
BUDGET = ThinkingBudgetConfig(first_stage=24, total=32, second_stage=8, eval_first_stage=40, eval_total=48)
ROLLOUT = RolloutConfig(strategy="actfirst", max_prompt_tokens=2000, budget=BUDGET)


def _chain_weights():
    """tests/rollout/conftest.py's ``chain_weights`` (that conftest is not visible from here)."""
    spec = importlib.util.spec_from_file_location("_rollout_conftest",
                                                  Path(__file__).parent / "rollout" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.chain_weights


@pytest.fixture(scope="module")
def teacher(engine, tiny_model_dir):
    """The engine serving the hand-set teacher: after the generation prompt's last token it emits RESPONSE, EOS
    (logit 40 against 0, so temperature 1 follows it). The random weights come back after the module."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True,
                                           tokenize=True, return_dict=False)
    chain = [prompt[-1], *tokenizer.encode(RESPONSE, add_special_tokens=False), tokenizer.eos_token_id]
    assert len(set(chain)) == len(chain), [tokenizer.decode([t]) for t in chain]
    original = load_file(f"{tiny_model_dir}/model.safetensors")
    engine.reconfigure(SchedulerConfig(b_max=8))
    engine.update_weights(_chain_weights()(original, chain).items())
    yield engine, tokenizer
    engine.update_weights(original.items())


@pytest.fixture(scope="module")
def benchmark():
    return get_benchmark("scienceworld", ScienceWorldConfig(train_task_types=["lifespan-longest-lived"],
                                                            max_turns=MAX_TURNS))


@pytest.fixture(scope="module")
def result(teacher, benchmark):
    """Two rollouts of [WIN, LOSE] with two episodes in flight (finished slots take the next episode); every
    episode the real runner played is recorded with its seed."""
    engine, tokenizer = teacher
    played = []
    run_episode = RolloutRunner.run_episode

    async def recording(self, task, worker, seed):
        episode = await run_episode(self, task, worker, seed)
        played.append((seed, episode))
        return episode

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RolloutRunner, "run_episode", recording)
        candidates = asyncio.run(teacher_candidates(engine, tokenizer, benchmark, [WIN, LOSE], per_task=2,
                                                    rollout=ROLLOUT, max_in_flight=2, seed=5, progress=None))
    return candidates, played


def test_only_the_successful_task_has_its_deduplicated_actions(result, benchmark):
    candidates, _ = result
    assert benchmark.task_key(WIN) == "lifespan-longest-lived/3"
    assert candidates == {"lifespan-longest-lived/3": [[ACTION]]}  # two identical wins, kept once; LOSE absent


def test_kept_episodes_are_those_the_benchmark_accepts_as_references():
    """What ``teacher_candidates`` keeps of a played episode: WebShop any purchase with a positive score (C.2 ranks
    its candidates by score, then length), elsewhere a success only."""
    def episode(score, *, done=True):
        return EpisodeResult(task="0", task_type="all", turns=[], score=score, won=score >= 99.999, done=done,
                             guided=False, fallback_turn=None, aligned_turns=0, fully_aligned=False, contexts=[],
                             full_responses=[], full_response_done=[], failure=None)

    webshop, scienceworld = get_benchmark("webshop"), get_benchmark("scienceworld")
    assert webshop.accepts_reference(episode(100.0)) and webshop.accepts_reference(episode(37.5))
    assert not webshop.accepts_reference(episode(0.0)) and not webshop.accepts_reference(episode(60.0, done=False))
    assert scienceworld.accepts_reference(episode(100.0)) and not scienceworld.accepts_reference(episode(75.0))


def test_episodes_are_think_then_act_with_the_teachers_text(result, benchmark):
    _, played = result
    assert len(played) == 4
    for _, episode in played:
        assert episode.failure is None
        assert [r.text for r in episode.full_responses] == [RESPONSE] * episode.num_turns
        assert all(not r.truncated and r.num_requests == 1 for r in episode.full_responses)
        assert [t.action for t in episode.turns] == [ACTION] * episode.num_turns
        assert all(t.source.value == "full_response" for t in episode.turns)
    wins = [e for _, e in played if e.task == benchmark.task_key(WIN)]
    losses = [e for _, e in played if e.task == benchmark.task_key(LOSE)]
    assert len(wins) == len(losses) == 2
    assert all(e.won and e.done and e.score == 100 and e.num_turns == 1 for e in wins)  # done after the focus
    assert all(not e.won and e.score < 100 and e.num_turns == MAX_TURNS for e in losses)
    assert all(not t.valid for e in losses for t in e.turns)  # "No known action matches that input."


def test_seeds_depend_on_seed_index_repeat_only(result, benchmark):
    _, played = result
    stride = 2 * MAX_TURNS + BUDGET.total + 2
    expected = {(benchmark.task_key(task), rollout_seed(5, index, repeat, stride))
                for index, task in enumerate([WIN, LOSE]) for repeat in range(2)}
    assert {(e.task, seed) for seed, e in played} == expected
    seeds = [rollout_seed(s, i, r, stride) for s in range(3) for i in range(4) for r in (0, 1, 2, MAX_REPEATS - 1)]
    assert len(set(seeds)) == len(seeds)
    assert min(abs(a - b) for a in seeds for b in seeds if a != b) >= stride  # no two episodes share a turn seed
    with pytest.raises(ValueError):
        rollout_seed(0, 0, MAX_REPEATS, stride)


def test_write_read_round_trip_and_the_candidates_replay(result, benchmark, tmp_path):
    candidates, _ = result
    path = write_candidates(tmp_path / "sub" / "teacher.jsonl", candidates)
    assert path == tmp_path / "sub" / "teacher.jsonl" and not (path.parent / "teacher.jsonl.tmp").exists()
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"task": "lifespan-longest-lived/3", "actions": [ACTION]}]
    assert read_candidates([path]) == {"lifespan-longest-lived/3": [("candidates:teacher.jsonl", [ACTION])]}
    more = {"a/1": [["x", "y"], ["z"]], "b/2": [[]]}
    assert read_candidates([write_candidates(path, more)]) == {
        "a/1": [("candidates:teacher.jsonl", ["x", "y"]), ("candidates:teacher.jsonl", ["z"])],
        "b/2": [("candidates:teacher.jsonl", [])]}
    assert write_candidates(path, {}).read_text() == ""

    async def go():  # what actfirst.references does with a candidate: replay it under the training config
        with EnvPool(benchmark.env_spec(), size=1) as pool:
            return await replay(pool.workers[0], WIN, candidates["lifespan-longest-lived/3"][0])

    executed, transitions = asyncio.run(go())
    assert executed == [ACTION] and transitions[-1].done and benchmark.accepts_reference(transitions[-1])


def test_bad_arguments(teacher, benchmark):
    engine, tokenizer = teacher
    for kwargs in ({"per_task": 0}, {"max_in_flight": 0}, {"seed": -1}):
        with pytest.raises(ValueError):
            asyncio.run(teacher_candidates(engine, tokenizer, benchmark, [WIN], rollout=ROLLOUT, **kwargs))
    with pytest.raises(ValueError, match="not unique"):
        asyncio.run(teacher_candidates(engine, tokenizer, benchmark, [WIN, WIN], rollout=ROLLOUT))
    with pytest.raises(ValueError, match="max_model_len"):
        asyncio.run(teacher_candidates(engine, tokenizer, benchmark, [WIN], rollout=RolloutConfig()))
    assert asyncio.run(teacher_candidates(engine, tokenizer, benchmark, [], rollout=ROLLOUT)) == {}


def test_cli_config_error(tiny_model_dir, tmp_path):
    """The CLI's config checks run before any engine or simulator starts."""
    cmd = [sys.executable, "-m", "actfirst.teacher_rollouts", "--teacher", str(tiny_model_dir), "--benchmark",
           "scienceworld", "--out", str(tmp_path / "c.jsonl"), "max_turns=2", "rollout.max_prompt_tokens=900",
           "rollout.budget.total=32", "rollout.budget.first_stage=24", "engine.max_model_len=512"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    bad = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120, env=env,
                         cwd=Path(__file__).parents[1])
    assert bad.returncode == 2 and "= 932 exceeds engine.max_model_len=512" in bad.stderr, bad.stderr[-2000:]
    assert not (tmp_path / "c.jsonl").exists()


class StopAfterFaultInjection(Exception):
    """Raised by :func:`stop_after_fault_injection`: a preparation killed after some tasks."""


def stop_after_fault_injection(tasks: int):
    """An ``after_task`` hook that stops the preparation once ``tasks`` tasks are in its journal."""
    finished = []

    def hook(key: str) -> None:
        finished.append(key)
        if len(finished) == tasks:
            raise StopAfterFaultInjection(f"stopped after {finished}")

    return hook


def _play_share(teacher, benchmark, out, rank=0, world=1, after_task=None):
    """``play_share`` of TASKS (one rollout each, two at once, seed 5); returns every (task, seed) the real runner
    played."""
    engine, tokenizer = teacher
    played = []
    run_episode = RolloutRunner.run_episode

    async def recording(self, task, worker, seed):
        episode = await run_episode(self, task, worker, seed)
        played.append((episode.task, seed))
        return episode

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RolloutRunner, "run_episode", recording)
        asyncio.run(play_share(engine, tokenizer, benchmark, TASKS, out=out, rank=rank, world=world, per_task=1,
                               rollout=ROLLOUT, max_in_flight=2, seed=5, after_task=after_task))
    return played


@pytest.fixture(scope="module")
def one_rank(teacher, benchmark, tmp_path_factory):
    """The candidates file of TASKS played by one rank, and what it played."""
    out = tmp_path_factory.mktemp("one_rank") / "refs.jsonl.teacher.jsonl"
    played = _play_share(teacher, benchmark, out)
    return merge_candidates(out, [benchmark.task_key(t) for t in TASKS]).read_text(), played


def test_one_rank_plays_every_task_once_and_keeps_the_win(one_rank, benchmark):
    text, played = one_rank
    stride = 2 * MAX_TURNS + BUDGET.total + 2
    assert sorted(played) == sorted((benchmark.task_key(t), rollout_seed(5, i, 0, stride)) for i, t in enumerate(TASKS))
    assert [json.loads(line) for line in text.splitlines()] == [
        {"task": "lifespan-longest-lived/3", "actions": [ACTION]}]


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_share_every_task_once_and_merge_to_the_one_rank_file(world, one_rank, teacher, benchmark, tmp_path):
    """Every rank plays its every world-th task (the seeds of one rank's run), and the merged file is one rank's."""
    out = tmp_path / "refs.jsonl.teacher.jsonl"
    keys = [benchmark.task_key(t) for t in TASKS]
    shares = [_play_share(teacher, benchmark, out, rank, world) for rank in range(world)]
    for rank, played in enumerate(shares):
        assert sorted(task for task, _ in played) == sorted(keys[rank::world])
    assert sorted(p for played in shares for p in played) == sorted(one_rank[1])
    assert len(journal_paths(out)) == min(world, len(TASKS))
    assert merge_candidates(out, keys).read_text() == one_rank[0]
    assert journal_paths(out) == [] and not journal_path(out, 1).exists()


def test_a_killed_preparation_resumes_with_the_missing_tasks_only(one_rank, teacher, benchmark, tmp_path):
    """Stopped after one finished task (and a line cut by the kill), the next call plays only the two others, on
    another number of ranks, and the merged file is that of an uninterrupted run."""
    out = tmp_path / "refs.jsonl.teacher.jsonl"
    keys = [benchmark.task_key(t) for t in TASKS]
    with pytest.raises(StopAfterFaultInjection):
        _play_share(teacher, benchmark, out, after_task=stop_after_fault_injection(1))
    lines = journal_path(out, 0).read_text().splitlines()
    assert len(lines) == 1
    first = json.loads(lines[0])["task"]
    with journal_path(out, 0).open("a") as f:
        f.write('{"task": "lifespan-longest-lived/1", "candi')  # a write cut by the kill
    with pytest.raises(RuntimeError, match="2 of 3 tasks have no teacher rollouts"):
        merge_candidates(out, keys)
    resumed = [p for rank in range(2) for p in _play_share(teacher, benchmark, out, rank, 2)]
    assert sorted(task for task, _ in resumed) == sorted(k for k in keys if k != first)
    assert sorted(set(one_rank[1]) - set(resumed)) == [p for p in one_rank[1] if p[0] == first]
    for path in journal_paths(out):  # the cut line was cut off before the next append
        assert all(json.loads(line)["task"] in keys for line in path.read_text().splitlines())
    assert merge_candidates(out, keys).read_text() == one_rank[0]


def test_cli_resumes_from_its_journal_and_writes_out_at_the_end(tiny_model_dir, tmp_path):
    """The command line journals each task: a journal left by a killed run (here one task's line, written by hand)
    is not played again, its candidates reach ``--out``, and the journal is gone once ``--out`` is written."""
    from actfirst.evaluation.evaluate import pick_tasks, serving_configs

    overrides = ["max_turns=2", "rollout.max_prompt_tokens=900", "rollout.budget.total=32",
                 "rollout.budget.first_stage=24", "engine.max_model_len=1024"]
    benchmark, *_ = serving_configs(str(tiny_model_dir), "scienceworld", None, overrides, max_in_flight=2,
                                    budget="total")
    first, second = (benchmark.task_key(t) for t in pick_tasks(benchmark, benchmark.tasks("train"), 2))
    out = tmp_path / "c.jsonl"
    journal_path(out, 0).write_text(json.dumps({"task": first, "candidates": [["look around"]]}) + "\n")
    cmd = [sys.executable, "-m", "actfirst.teacher_rollouts", "--teacher", str(tiny_model_dir), "--benchmark",
           "scienceworld", "--out", str(out), "--tasks", "2", "--per-task", "1", "--max-in-flight", "2", *overrides]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=Path(__file__).parents[1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 of 2 tasks to play (1 done before)" in proc.stdout, proc.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {"task": first, "actions": ["look around"]} in rows and {r["task"] for r in rows} <= {first, second}
    assert not journal_paths(out)

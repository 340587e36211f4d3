"""A benchmark defined only under tests/ (``toy_benchmark.py``: its config, environment, prompt templates and
``Benchmark``, whose transition check is the default one, plus its ``toy.yaml``), registered through the public
registry, through every stage with no file under ``actfirst/`` for it: an ActFirst-OPD rollout with a reference on the
real engine, one training update by ``python -m actfirst.run --config tests/toy/train.yaml`` (its
``benchmark_module`` registers the toy in the run's processes) on tiny models, and an evaluation. Its environment
workers are spawned processes that never read the registry: they receive the toy's class by reference."""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from toy_benchmark import ToyBenchmark, ToyConfig, ToyTask
from transformers import AutoTokenizer

from actfirst.core.config import ModelConfig, RolloutConfig, SchedulerConfig, ThinkingBudgetConfig, TrainConfig
from actfirst.core.schema import load_config, paths_unchecked
from actfirst.core.user_input import ConfigError
from actfirst.envs.benchmarks import BENCHMARKS, get_benchmark
from actfirst.envs.workers import EnvPool
from actfirst.evaluation.evaluate import evaluate
from actfirst.models.build import build_model
from actfirst.preparation.reference_cache import build_references, load_references, replay
from actfirst.rollout.runner import RolloutRunner
from actfirst.rollout.strategies import ActionSource, make_strategy

TRAIN_CONFIG = Path(__file__).parent / "train.yaml"
"""The toy's training config (``benchmark_module: toy_benchmark``; placeholders for the models, the cache, out_dir)."""
BUDGET = ThinkingBudgetConfig(first_stage=24, total=32, eval_first_stage=24, eval_total=32, second_stage=8,
                              fast_action_tokens=6)
ROLLOUT = RolloutConfig(strategy="actfirst", batch_tasks=2, max_prompt_tokens=1500, budget=BUDGET)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy under its default config file, its training tasks and their reference cache, built by
    ``actfirst.preparation.reference_cache`` from the toy's own candidates in worker processes."""
    benchmark = get_benchmark("toy")
    tasks = benchmark.tasks("train")
    out = tmp_path_factory.mktemp("toy") / "refs.jsonl"
    with EnvPool(benchmark.env_spec(), size=2) as pool:
        asyncio.run(build_references(benchmark, tasks, pool, out=out))
    return benchmark, tasks, out


def test_the_toy_is_a_benchmark_by_name(toy):
    benchmark, tasks, refs = toy
    assert BENCHMARKS["toy"] is ToyBenchmark and isinstance(benchmark, ToyBenchmark)
    assert benchmark.config == ToyConfig(max_turns=4, tasks=4)  # tests/toy/toy.yaml
    assert [benchmark.task_type(t) for t in tasks] == ["near", "far", "near", "far"]
    references = load_references(refs, benchmark=benchmark, tasks=[benchmark.task_key(t) for t in tasks])
    assert {k: r.actions for k, r in references.items()} == {
        "task0": ["forward"], "task1": ["forward", "forward"], "task2": ["forward"], "task3": ["forward", "forward"]}
    # Its env: section in a training config, with the toy config's own checks and the registry's list of names.
    train = ["benchmark=toy", "student.model=s", "teacher=t", "rollout.strategy=vanilla"]
    with paths_unchecked():
        assert load_config(TrainConfig, None, train + ["env.max_turns=2"]).env == ToyConfig(max_turns=2)
        with pytest.raises(ConfigError, match=r"^env.max_turns=0: must be >= 1$"):
            load_config(TrainConfig, None, train + ["env.max_turns=0"])
        with pytest.raises(ConfigError, match=r"^toy: rename this section to env: \(benchmark: toy\)$"):
            load_config(TrainConfig, None, train + ["toy.max_turns=2"])


def test_the_transition_check_passes_the_reference_and_fails_a_detour(toy):
    benchmark, _, refs = toy
    reference = load_references(refs, benchmark=benchmark)["task1"]

    async def play(actions):
        with EnvPool(benchmark.env_spec(), size=1) as pool:
            return await replay(pool.workers[0], ToyTask(1, 2), actions)

    _, transitions = asyncio.run(play(["forward", "wait"]))
    checks = [benchmark.check(reference, t, action=a, current=transitions[t], next=transitions[t + 1])
              for t, a in enumerate(["forward", "wait"])]
    assert [(c.passed, c.reason) for c in checks] == [(True, ""), (False, "termination mismatch")]


def test_an_actfirst_episode_with_a_reference(toy, engine, tiny_model_dir):
    """ActFirst-OPD on the toy: every turn a fast action (inverse dynamics while guided, checked against the
    reference; NAP after the fallback) and a full response for training."""
    benchmark, tasks, refs = toy
    references = load_references(refs, benchmark=benchmark)
    engine.reconfigure(SchedulerConfig(b_max=8))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)

    async def go():
        with EnvPool(benchmark.env_spec(), size=2) as pool:
            runner = RolloutRunner(engine=engine, tokenizer=tokenizer, benchmark=benchmark, pool=pool,
                                   strategy=make_strategy("actfirst"), cfg=ROLLOUT, references=references, seed=3)
            return await runner.run_batch(tasks[:2], batch_index=0)

    batch = asyncio.run(go())
    for episode in batch.episodes:
        assert episode.failure is None and episode.guided
        assert 1 <= episode.num_turns <= benchmark.max_turns
        assert len(episode.full_responses) == episode.num_turns
        first = episode.turns[0]  # guided: inverse dynamics (or its NAP retry), checked against the reference
        assert first.fast is not None and first.action == first.fast.action and first.check is not None
        assert first.source in (ActionSource.INVERSE_DYNAMICS, ActionSource.NAP_RETRY)
    assert len(batch.samples) == sum(e.num_turns for e in batch.episodes) > 0


def test_one_training_update(toy, tiny_model_dir, tmp_path):
    """``python -m actfirst.run`` on the toy's training config (``env:`` absent: its default file), in a process that
    imports nothing of the toy but through ``benchmark_module``: one update of the tiny student from a tiny teacher,
    rollouts in the toy's workers, teacher scoring, the update and the weight sync."""
    refs = toy[2]
    teacher = build_model(ModelConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, head_dim=32, intermediate_size=128, seed=7),
                          tmp_path / "teacher")
    paths = [f"student.model={tiny_model_dir}", f"teacher={teacher}", f"references={refs}",
             f"out_dir={tmp_path / 'run'}"]
    cfg = load_config(TrainConfig, TRAIN_CONFIG, paths)
    assert (cfg.benchmark, cfg.benchmark_module, cfg.env) == ("toy", "toy_benchmark", None)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "actfirst.run", "--config", str(TRAIN_CONFIG), *paths]
    unknown = subprocess.run([*command, "benchmark_module=null"], env=env, capture_output=True, text=True, check=False,
                             timeout=600)  # the toy's module on the path, but nothing imports it
    assert unknown.returncode == 2 and "benchmark='toy': must be one of" in unknown.stderr, unknown.stderr[-3000:]
    # parallel.cpu_pin_cores (off by default) reaches the run: the engine, the update and the workers on their cores
    proc = subprocess.run([*command, "parallel.cpu_pin_cores=true"], env=env, capture_output=True, text=True,
                          check=False, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 2:
        assert (f"CPU: engine 1 thread(s), scoring and the update 1; cores: engine {cores[0]}, trainer {cores[1]}, "
                f"environment workers ") in proc.stdout + proc.stderr, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["update"] == 1 and row["weight_version"] == 1 and row["num_supervised"] > 0
    assert row["skipped"] == 0 and row["discarded_tokens"] == 0 and row["cpu/update_threads"] == 1
    summary = json.loads((tmp_path / "run" / "run_summary.json").read_text())
    assert summary["threads"]["end"]["usable_cores"] == len(cores)  # the engine's pin given back at the end
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (saved["benchmark"], saved["benchmark_module"], saved["env"]) == ("toy", "toy_benchmark", None)


def test_a_benchmark_module_that_cannot_be_imported_is_refused_by_key():
    with paths_unchecked():
        with pytest.raises(ConfigError, match=r"^benchmark_module='no_such_toy': cannot import it "
                                              r"\(ModuleNotFoundError: No module named 'no_such_toy'\)"):
            load_config(TrainConfig, TRAIN_CONFIG, ["benchmark_module=no_such_toy"])
        with pytest.raises(ConfigError, match=r"^benchmark='toi': must be one of .*'toy'.* \(benchmark_module="
                                              r"'toy_benchmark' registers no benchmark of this name\)$"):
            load_config(TrainConfig, TRAIN_CONFIG, ["benchmark=toi"])


def test_an_evaluation(toy, engine, tiny_model_dir):
    benchmark = toy[0]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tasks = benchmark.tasks("eval")
    report = asyncio.run(evaluate(engine, tokenizer, benchmark, tasks, seeds=[42, 43], rollout=ROLLOUT,
                                  max_in_flight=4, progress=False))
    assert report.benchmark == "toy" and report.metrics == ("SR", "Round")  # no partial score
    assert len(report.episodes) == 2 * len(tasks) and not report.failures
    assert sorted(report.task_types) == ["far", "near"]
    assert all(1 <= r.turns <= benchmark.max_turns for r in report.episodes)

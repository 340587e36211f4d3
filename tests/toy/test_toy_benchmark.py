"""A benchmark defined only under tests/ (``toy_benchmark.py``: its config, environment, transition check, prompt
templates and ``Benchmark``, plus its ``toy.yaml``), registered through the public registry, through every stage with
no file under ``actfirst/`` for it: an ActFirst-OPD rollout with a reference on the real engine, one training update
of the trainer on tiny models, and an evaluation. Its environment workers are spawned processes that never read the
registry: they receive the toy's class by reference."""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
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

TRAIN = ("import sys, toy_benchmark\n"
         "from actfirst.core.config import TrainConfig\n"
         "from actfirst.parallel.context import init_parallel\n"
         "from actfirst.core.schema import load_config\n"
         "from actfirst.train.trainer import Trainer\n"
         "Trainer(load_config(TrainConfig, sys.argv[1]), init_parallel(), resume=False).train()\n")
"""The trainer in a process of its own (its engine's shutdown ends vLLM's state in its process), with the toy
registered by importing its module."""
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


def test_one_training_update(toy, engine, tiny_model_dir, tmp_path):
    """The trainer on the toy (``env:`` absent: its default file), one update of the tiny student from a tiny
    teacher: rollouts in the toy's workers, teacher scoring, the update and the weight sync."""
    refs = toy[2]
    teacher = build_model(ModelConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, head_dim=32, intermediate_size=128, seed=7),
                          tmp_path / "teacher")
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump({
        "benchmark": "toy", "teacher": str(teacher), "references": str(refs), "out_dir": str(tmp_path / "run"),
        "student": {"model": str(tiny_model_dir), "dtype": "float32", "max_model_len": 2048, "max_num_seqs": 16,
                    "max_num_batched_tokens": 4096, "kv_cache_gib": 1},
        "scheduler": {"b_max": 16},
        "rollout": {"strategy": "actfirst", "batch_tasks": 2, "max_prompt_tokens": 1500,
                    "budget": {"first_stage": 12, "total": 16, "second_stage": 4, "fast_action_tokens": 6}},
        "optim": {"lr": 1e-3}, "batch_samples": 2, "micro_batch_tokens": 4096, "num_updates": 1,
        "probe_contexts": 0}))
    assert load_config(TrainConfig, path).env is None
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", TRAIN, str(path)], env=env, capture_output=True, text=True,
                          check=False, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["update"] == 1 and row["weight_version"] == 1 and row["num_supervised"] > 0
    assert row["skipped"] == 0 and row["discarded_tokens"] == 0
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (saved["benchmark"], saved["env"]) == ("toy", None)


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

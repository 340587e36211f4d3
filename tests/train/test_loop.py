"""The training loop end to end through its command line (a subprocess: its own vLLM engine), on generated ALFWorld
games with tiny models: the update turns (train-inference mismatch near zero, the weight version advancing in the
engine, nothing thrown away), checkpoints are written, and ``--resume`` continues the same series."""

import asyncio
import json
import os
import subprocess
import sys

import pytest
import yaml

from actfirst.config import ALFWorldConfig, ModelConfig
from actfirst.envs.benchmarks import get_benchmark
from actfirst.envs.workers import EnvPool
from actfirst.models.factory import build_model
from actfirst.references import build_references


@pytest.fixture(scope="module")
def run_config(alfworld_games, tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("loop")
    games = alfworld_games[0].game_file.rsplit("/train/", 1)[0]
    env = {"generated_dir": games, "games_per_type": 1, "max_turns": 3}
    benchmark = get_benchmark("alfworld", ALFWorldConfig(**env))
    tasks = benchmark.tasks("train")
    with EnvPool(benchmark.env_spec(), size=2) as pool:
        asyncio.run(build_references(benchmark, tasks, pool, out=root / "refs.jsonl"))
    teacher = build_model(ModelConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, head_dim=32, intermediate_size=128, seed=7),
                          root / "teacher")
    cfg = {
        "benchmark": "alfworld", "alfworld": env, "teacher": str(teacher), "references": str(root / "refs.jsonl"),
        "student": {"model": str(tiny_model_dir), "dtype": "float32", "max_model_len": 2048, "max_num_seqs": 16,
                    "max_num_batched_tokens": 4096, "kv_cache_gib": 1},
        "scheduler": {"b_max": 16},
        "rollout": {"strategy": "actfirst", "batch_tasks": 3, "max_prompt_tokens": 2000,
                    "budget": {"first_stage": 12, "total": 16, "second_stage": 4, "fast_action_tokens": 6}},
        "optim": {"lr": 1e-3}, "num_updates": 2, "batch_samples": 4, "micro_batch_tokens": 4096,
        "probe_contexts": 2, "checkpoint_every": 1, "out_dir": str(root / "run"),
    }
    path = root / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, root / "run"


def train_cli(config, *args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "actfirst.run", "--config", str(config), *args], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_loop_turns_and_resumes(run_config):
    config, run_dir = run_config
    out = train_cli(config)
    assert "update    2" in out and "done: 2 updates" in out
    rows = read_metrics(run_dir)
    assert [r["update"] for r in rows] == [1, 2]
    # Update 1 consumes samples of the engine's current weights: the trainer's log-probs match the engine's.
    assert rows[0]["mismatch_mean"] < 1e-4 and rows[0]["mismatch_max"] < 1e-3
    assert rows[0]["version_lag_mean"] == 0.0
    # The weight version advances in the engine with every update; nothing generated was thrown away.
    assert [r["weight_version"] for r in rows] == [1, 2]
    assert all(r["discarded_tokens"] == 0 and r["skipped"] == 0 for r in rows)
    assert all(r["probe/gap"] is not None and r["probe/gap"] < 0 for r in rows)
    assert all(0 <= r["clip_frac"] <= 1 and r["num_supervised"] > 0 for r in rows)
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "update_000002"

    # A second run without --resume refuses to mix its metrics into this run's.
    proc = subprocess.run([sys.executable, "-m", "actfirst.run", "--config", str(config)], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0 and "--resume" in proc.stderr

    # --resume continues from update 3 of the same series.
    out = train_cli(config, "num_updates=3", "--resume")
    assert "resume:" in out and "update_000002" in out
    rows = read_metrics(run_dir)
    assert [r["update"] for r in rows] == [1, 2, 3]
    assert rows[2]["weight_version"] == 3
    assert rows[2]["elapsed_s"] > rows[1]["elapsed_s"]


def test_bad_config_is_named(run_config, tmp_path):
    config, _ = run_config
    bad = yaml.safe_load(config.read_text())
    bad["rollout"]["strategy"] = "actfrist"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    proc = subprocess.run([sys.executable, "-m", "actfirst.run", "--config", str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "rollout.strategy='actfrist'" in proc.stderr


def test_overlap_keeps_the_staleness_rule(run_config, tmp_path):
    """Rollouts collected while the update runs (in a thread): every consumed sample is of the current or the
    immediately preceding weight version, and weight updates between rollout batches throw nothing away."""
    config, _ = run_config
    train_cli(config, "overlap=true", "num_updates=3", f"out_dir={tmp_path / 'overlap'}")
    rows = read_metrics(tmp_path / "overlap")
    assert [r["weight_version"] for r in rows] == [1, 2, 3]
    assert all(0 <= r["version_lag_mean"] <= 1 for r in rows)
    assert all(r["discarded_tokens"] == 0 and r["skipped"] == 0 for r in rows)
    assert rows[0]["mismatch_mean"] < 1e-4

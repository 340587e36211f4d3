import os
import random

import pytest
import torch


@pytest.fixture
def gen() -> torch.Generator:
    """A generator with a fresh seed, printed; replay with ACTFIRST_TEST_SEED=<seed>."""
    seed = int(os.environ.get("ACTFIRST_TEST_SEED") or random.SystemRandom().randrange(2**31))
    print(f"ACTFIRST_TEST_SEED={seed}")
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="session")
def vocab_size(tiny_model_dir) -> int:
    """Rows of the tiny model's embedding (its tokenizer's size, padded to 64)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(tiny_model_dir).vocab_size


@pytest.fixture(scope="session")
def tiny_run_config(alfworld_games, tiny_model_dir, tmp_path_factory) -> dict:
    """A tiny training run's config, shared (copy before changing it): generated ALFWorld games, their references, a
    tiny teacher and the tiny student, built once for the loop and kill-resume tests."""
    import asyncio

    from actfirst.core.config import ModelConfig
    from actfirst.envs.alfworld.config import ALFWorldConfig
    from actfirst.envs.benchmarks import get_benchmark
    from actfirst.envs.workers import EnvPool
    from actfirst.models.build import build_model
    from actfirst.preparation.reference_cache import build_references

    root = tmp_path_factory.mktemp("tiny_run")
    games = alfworld_games[0].game_file.rsplit("/train/", 1)[0]
    env = {"games": "generated", "generated_dir": games, "games_per_type": 1, "max_turns": 3}
    benchmark = get_benchmark("alfworld", ALFWorldConfig(**env))
    with EnvPool(benchmark.env_spec(), size=2) as pool:
        asyncio.run(build_references(benchmark, benchmark.tasks("train"), pool, out=root / "refs.jsonl"))
    teacher = build_model(ModelConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, head_dim=32, intermediate_size=128, seed=7),
                          root / "teacher")
    return {
        "benchmark": "alfworld", "env": env, "teacher": str(teacher), "references": str(root / "refs.jsonl"),
        "student": {"model": str(tiny_model_dir), "dtype": "float32", "max_model_len": 2048, "max_num_seqs": 16,
                    "max_num_batched_tokens": 4096, "kv_cache_gib": 1},
        "scheduler": {"b_max": 16},
        "rollout": {"strategy": "actfirst", "batch_tasks": 2, "max_prompt_tokens": 2000,
                    "budget": {"first_stage": 12, "total": 16, "second_stage": 4, "fast_action_tokens": 6}},
        "optim": {"lr": 1e-3}, "batch_samples": 4, "micro_batch_tokens": 4096,
    }

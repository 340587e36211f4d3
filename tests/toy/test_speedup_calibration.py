"""The idle-engine calibration of Eq. 36 (``actfirst.train.calibration``) on the real engine with the tiny random
model, on the toy benchmark (the cheapest real environment: spawned worker processes, a reference cache): every timed
request ran alone, its latency is positive, and budgets that make a full response longer than a fast action give
l_full > l_fast. No speed is asserted."""

import asyncio

import pytest
import toy_benchmark  # noqa: F401  (registers the toy)
from transformers import AutoTokenizer

from actfirst.core.config import RolloutConfig, ThinkingBudgetConfig
from actfirst.envs.benchmarks import get_benchmark
from actfirst.envs.workers import EnvPool
from actfirst.preparation.reference_cache import build_references, load_references
from actfirst.rollout.strategies import make_strategy
from actfirst.train.calibration import calibrate, spread
from actfirst.train.speedup import eq36_speedup

# A full response: 16 sampled tokens, the early-stop text, up to 8 more; a fast action: at most 2 tokens.
BUDGET = ThinkingBudgetConfig(first_stage=16, total=32, eval_first_stage=16, eval_total=32, second_stage=8,
                              fast_action_tokens=2)


def test_calibration_times_single_requests(engine, tiny_model_dir, tmp_path):
    benchmark = get_benchmark("toy")
    tasks = spread(benchmark.tasks("train"), 2)
    refs = tmp_path / "refs.jsonl"
    with EnvPool(benchmark.env_spec(), size=1) as pool:
        asyncio.run(build_references(benchmark, tasks, pool, out=refs))
        references = load_references(refs, benchmark=benchmark, tasks=[benchmark.task_key(t) for t in tasks])
        result = asyncio.run(calibrate(
            engine, AutoTokenizer.from_pretrained(tiny_model_dir), benchmark, tasks, pool,
            rollout=RolloutConfig(strategy="actfirst", batch_tasks=1, max_prompt_tokens=1500, budget=BUDGET),
            strategy=make_strategy("actfirst"), references=references, turns=[1, 4], progress=False))
    assert result["fast_strategy"] == "actfirst" and result["peak_in_flight"] == 1  # one request at a time
    lat = result["latencies_s"]
    assert len(lat["full"]) == result["requests"]["full"] >= result["turns_played"]["full"] * len(tasks)
    assert len(lat["fast"]) == result["requests"]["fast"] > 0
    assert min(lat["full"]) > 0 and min(lat["fast"]) > 0
    assert result["tokens_mean"]["full"] > 4 * result["tokens_mean"]["fast"]
    assert result["l_full_s"] > result["l_fast_s"] > 0
    assert result["eq36"] == {str(t): eq36_speedup(l_fast=result["l_fast_s"], l_full=result["l_full_s"], turns=t)
                              for t in (1, 4)}
    assert result["eq36"]["1"] == 1.0
    with pytest.raises(ValueError, match="episodes=0"):
        spread(benchmark.tasks("train"), 0)

"""The fixed interaction contexts of the rollout-speedup benchmark (000 Sec. 5.4, Fig. 3(a): "1,024 initial ALFWorld
contexts, sampled proportionally", seed 42).

``alfworld`` contexts are the first turn of ALFWorld training games (the official ones or generated ones, as the
config's ``alfworld.games`` says), drawn per task type in proportion to the type's share of the training
split, and rendered with the B.1 templates as the rollouts render them: next-action prediction for the fast action
(no reference: the benchmark times generation, not checks), think-then-act for the full response.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from rollout_speedup_config import RolloutSpeedupConfig

from actfirst.envs.benchmarks import get_benchmark
from actfirst.envs.workers import EnvPool
from actfirst.rollout.prompts import Mode, build_prompt

T = TypeVar("T")


def proportional_sample(items: Sequence[T], type_of: Callable[[T], str], n: int, seed: int) -> list[T]:
    """``n`` of ``items``, each type's count in proportion to its share of ``items`` (largest remainders, ties to the
    type seen first), drawn within the type by ``random.Random(seed)``: without replacement while the type has
    enough items, with replacement beyond. Returned type by type in first-seen order."""
    if n < 1 or not items:
        raise ValueError(f"n={n}, {len(items)} items: need n >= 1 and some items")
    by_type: dict[str, list[T]] = {}
    for item in items:
        by_type.setdefault(type_of(item), []).append(item)
    quotas = {t: n * len(group) / len(items) for t, group in by_type.items()}
    counts = {t: int(q) for t, q in quotas.items()}
    for t in sorted(quotas, key=lambda t: counts[t] - quotas[t])[: n - sum(counts.values())]:
        counts[t] += 1
    rng = random.Random(seed)
    out: list[T] = []
    for t, group in by_type.items():
        k = counts[t]
        out += rng.sample(group, k) if k <= len(group) else group + rng.choices(group, k=k - len(group))
    return out


def alfworld_contexts(tokenizer, cfg: RolloutSpeedupConfig, *, workers: int = 8) -> list[tuple[list[int], list[int]]]:
    """(fast-action prompt, full-response prompt) token ids of ``num_batches * num_tasks`` initial ALFWorld
    contexts (see the module docstring), in a seeded shuffled order so every batch mixes the types."""
    benchmark = get_benchmark("alfworld", cfg.alfworld)
    tasks = proportional_sample(benchmark.tasks("train"), benchmark.task_type, cfg.num_batches * cfg.num_tasks,
                                cfg.seed)
    random.Random(cfg.seed).shuffle(tasks)
    budget = cfg.engine.max_model_len - max(cfg.full_response_tokens)

    async def first_turns() -> list[Any]:
        with EnvPool(benchmark.env_spec(), size=min(workers, len(tasks))) as pool:
            return await pool.map(lambda worker, task: worker.areset(task), tasks)

    def render(first, mode: Mode) -> list[int]:
        return build_prompt(tokenizer, benchmark, mode, task_description=first.task_description, history=[],
                            current=first, budget_tokens=budget, limit_tokens=budget).token_ids

    return [(render(first, Mode.NEXT_ACTION), render(first, Mode.FULL_RESPONSE))
            for first in asyncio.run(first_turns())]

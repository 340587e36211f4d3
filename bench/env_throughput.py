"""Environment steps per second through worker processes, and memory per worker.

    python bench/env_throughput.py --benchmarks scienceworld alfworld --workers 1 16 --seconds 30

Each worker plays episodes of uniformly random admissible actions (30-turn limit, then a new task), driven from one
asyncio loop as the rollout drives them. Reported per benchmark and worker count: steps/s (resets excluded from
the count, not from the time), resets, median step and reset latency as the driver sees them, and the resident memory of each worker with what it started (its JVM).
ALFWorld uses generated games (``--games``, generated on first use).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from pathlib import Path

from actfirst.envs.workers import EnvPool, EnvSpec


def tasks_for(benchmark: str, games: str) -> list:
    if benchmark == "scienceworld":
        from actfirst.envs.scienceworld_tasks import ScienceWorldTask

        return [ScienceWorldTask(t, v) for t in ("boil", "find-animal", "chemistry-mix", "lifespan-longest-lived")
                for v in range(3)]
    from actfirst.envs.alfworld_env import alfworld_split

    return alfworld_split("train", games, per_type=2)


async def warm_up(pool: EnvPool, tasks: list) -> None:
    """One episode start and a few steps per worker before timing (a cold JVM is several times slower)."""

    async def one(worker) -> None:
        state = await worker.areset(tasks[0])
        for action in state.admissible[:5]:
            await worker.astep(action)

    await asyncio.gather(*(one(w) for w in pool.workers))


async def drive(pool: EnvPool, tasks: list, seconds: float, max_turns: int, seed: int) -> dict:
    rng = random.Random(seed)
    steps = resets = 0
    step_s: list[float] = []
    reset_s: list[float] = []
    await warm_up(pool, tasks)
    deadline = time.monotonic() + seconds

    async def play(worker) -> None:
        nonlocal steps, resets
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            state = await worker.areset(rng.choice(tasks))
            reset_s.append(time.monotonic() - t0)
            resets += 1
            for _ in range(max_turns):
                if state.done or time.monotonic() >= deadline:
                    break
                t0 = time.monotonic()
                state = await worker.astep(rng.choice(state.admissible))
                step_s.append(time.monotonic() - t0)
                steps += 1

    start = time.monotonic()
    await asyncio.gather(*(play(w) for w in pool.workers))
    elapsed = time.monotonic() - start
    return {"steps": steps, "resets": resets, "seconds": elapsed, "steps_per_s": steps / elapsed,
            "step_ms_median": 1e3 * statistics.median(step_s), "reset_ms_median": 1e3 * statistics.median(reset_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--benchmarks", nargs="+", default=["scienceworld", "alfworld"],
                        choices=["scienceworld", "alfworld"])
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--max-turns", type=int, default=30)
    parser.add_argument("--games", default="runs/alfworld_games", help="generated ALFWorld games")
    parser.add_argument("--out", default="runs/env_throughput.jsonl", help="results, one JSON line per run")
    args = parser.parse_args()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for benchmark in args.benchmarks:
        tasks = tasks_for(benchmark, args.games)
        for n in args.workers:
            t0 = time.monotonic()
            with EnvPool(EnvSpec(benchmark, {"max_turns": args.max_turns}), n) as pool:
                startup = time.monotonic() - t0
                result = asyncio.run(drive(pool, tasks, args.seconds, args.max_turns, seed=n))
                memory = [w.memory_bytes() / 2**20 for w in pool.workers]
            row = {"benchmark": benchmark, "workers": n, **result, "startup_s": startup,
                   "memory_mib_per_worker": statistics.mean(memory), "memory_mib_max": max(memory)}
            print(f"{benchmark:12s} workers={n:2d}: {result['steps_per_s']:7.1f} steps/s "
                  f"({result['steps']} steps, {result['resets']} resets in {result['seconds']:.0f} s; median step "
                  f"{result['step_ms_median']:.0f} ms, reset {result['reset_ms_median']:.0f} ms), "
                  f"{row['memory_mib_per_worker']:.0f} MiB per worker (max {row['memory_mib_max']:.0f}), "
                  f"startup {startup:.1f} s", flush=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()

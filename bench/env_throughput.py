"""Environment steps per second through worker processes, and memory per worker.

    python bench/env_throughput.py --benchmarks scienceworld alfworld --workers 1 16 --seconds 30

Each worker plays episodes of uniformly random admissible actions (up to the configured turn limit, then a new
training task: the first ``--per-type`` of each task type), driven from one asyncio loop as the rollout drives
them. Reported per benchmark and worker count: steps/s (resets excluded from the count, not from the time), resets,
median step and reset latency as the driver sees them, and the resident memory of each worker with what it started
(its JVM). Each benchmark runs its default config (``<name>.yaml`` in its package) with ``--set <name>.<key>=<value>``
overrides; ALFWorld plays generated games by default (``alfworld.games=generated``, generated on first use;
``alfworld.games=real`` for the official ones).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

from actfirst.core.user_input import check_writable_file, command
from actfirst.envs.benchmarks import BENCHMARKS, load_benchmark, select_tasks
from actfirst.envs.workers import EnvPool


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


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--benchmarks", nargs="+", default=["scienceworld", "alfworld"], choices=sorted(BENCHMARKS))
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--per-type", type=int, default=2, help="training tasks played per task type")
    parser.add_argument("--set", nargs="*", default=["alfworld.games=generated", "alfworld.games_per_type=2"],
                        metavar="NAME.KEY=VALUE",
                        help="config overrides per benchmark, e.g. scienceworld.max_turns=30")
    parser.add_argument("--out", default="runs/env_throughput.jsonl", help="results, one JSON line per run")
    args = parser.parse_args(argv)
    check_writable_file(args.out, "--out")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for name in args.benchmarks:
        overrides = [o.removeprefix(f"{name}.") for o in args.set if o.startswith(f"{name}.")]
        benchmark = load_benchmark(name, overrides=overrides)
        tasks = select_tasks(benchmark, benchmark.tasks("train"), per_type=args.per_type)
        for n in args.workers:
            t0 = time.monotonic()
            with EnvPool(benchmark.env_spec(), n) as pool:
                startup = time.monotonic() - t0
                result = asyncio.run(drive(pool, tasks, args.seconds, benchmark.max_turns, seed=n))
                memory = [w.memory_bytes() / 2**20 for w in pool.workers]
            row = {"benchmark": name, "workers": n, **result, "startup_s": startup,
                   "memory_mib_per_worker": statistics.mean(memory), "memory_mib_max": max(memory)}
            print(f"{name:12s} workers={n:2d}: {result['steps_per_s']:7.1f} steps/s "
                  f"({result['steps']} steps, {result['resets']} resets in {result['seconds']:.0f} s; median step "
                  f"{result['step_ms_median']:.0f} ms, reset {result['reset_ms_median']:.0f} ms), "
                  f"{row['memory_mib_per_worker']:.0f} MiB per worker (max {row['memory_mib_max']:.0f}), "
                  f"startup {startup:.1f} s", flush=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    return 0

if __name__ == "__main__":
    sys.exit(main())

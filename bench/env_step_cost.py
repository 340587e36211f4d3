"""What an episode's transitions cost with the admissible-action list built on every one, against on demand.

    python bench/env_step_cost.py --benchmark scienceworld \
        --set "scienceworld.train_task_types=[lifespan-longest-lived]" --tasks 8 --rounds 3

Replays each task's own reference candidate (ScienceWorld: the simulator's gold path) through one worker process,
as a rollout drives it, once with ``reset(task, admissible=True)`` (every transition carries its list: what
evaluation and traces ask for, and what every episode paid before lists were built on demand) and once with
``admissible=False`` (a training rollout's unguided turns: Vanilla OPD's every turn). Rounds alternate the order.
Reported: milliseconds per reset and per step (as the driver sees them: the pipe included), and the ratio. Only a
benchmark whose environment builds lists on demand (ScienceWorld) differs between the two.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

from actfirst.core.user_input import check_writable_file, command
from actfirst.envs.benchmarks import BENCHMARKS, load_benchmark
from actfirst.envs.workers import EnvPool, EnvWorker


async def replay(worker: EnvWorker, task, actions: list[str], lists: bool) -> tuple[float, list[float]]:
    """Seconds of the reset and of each step of ``actions`` from a reset of ``task``."""
    t0 = time.perf_counter()
    await worker.areset(task, lists)
    reset_s, steps = time.perf_counter() - t0, []
    for action in actions:
        t0 = time.perf_counter()
        await worker.astep(action)
        steps.append(time.perf_counter() - t0)
    return reset_s, steps


async def measure(benchmark, tasks: list, rounds: int) -> dict:
    """Per mode (lists on every transition / on demand): reset and step seconds over ``rounds`` alternated rounds."""
    with EnvPool(benchmark.env_spec(), 1) as pool:
        worker = pool.workers[0]
        paths = [(await benchmark.candidates(worker, task))[0][1] for task in tasks]
        for task, actions in zip(tasks, paths, strict=True):  # warm-up: a cold JVM is several times slower
            await replay(worker, task, actions, True)
        times = {True: ([], []), False: ([], [])}
        for r in range(rounds):
            for lists in (True, False) if r % 2 == 0 else (False, True):
                for task, actions in zip(tasks, paths, strict=True):
                    reset_s, steps = await replay(worker, task, actions, lists)
                    times[lists][0].append(reset_s)
                    times[lists][1].extend(steps)
    out = {}
    for lists, (resets, steps) in times.items():
        out["every_transition" if lists else "on_demand"] = {
            "resets": len(resets), "steps": len(steps), "reset_ms_median": 1e3 * statistics.median(resets),
            "step_ms_median": 1e3 * statistics.median(steps), "step_ms_mean": 1e3 * statistics.mean(steps),
            "episode_s_mean": (sum(resets) + sum(steps)) / len(resets)}
    out["episode_ratio"] = out["every_transition"]["episode_s_mean"] / out["on_demand"]["episode_s_mean"]
    out["steps_per_episode"] = statistics.mean(len(p) for p in paths)
    return out


@command
def main(argv: list[str] | None = None) -> int:
    """Measure and print; appends one JSON line to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--benchmark", default="scienceworld", choices=sorted(BENCHMARKS))
    parser.add_argument("--set", nargs="*", default=[], metavar="NAME.KEY=VALUE",
                        help="config overrides, e.g. scienceworld.train_task_types=[lifespan-longest-lived]")
    parser.add_argument("--tasks", type=int, default=8, help="the first N training tasks")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="runs/env_step_cost.jsonl", help="results, one JSON line per run")
    args = parser.parse_args(argv)
    if args.tasks < 1 or args.rounds < 1:
        parser.error(f"--tasks {args.tasks} / --rounds {args.rounds}: must be >= 1")
    check_writable_file(args.out, "--out")
    overrides = [o.removeprefix(f"{args.benchmark}.") for o in args.set if o.startswith(f"{args.benchmark}.")]
    benchmark = load_benchmark(args.benchmark, overrides=overrides)
    tasks = benchmark.tasks("train")[:args.tasks]
    result = asyncio.run(measure(benchmark, tasks, args.rounds))
    for mode in ("every_transition", "on_demand"):
        r = result[mode]
        print(f"{args.benchmark} lists {mode:16s}: reset {r['reset_ms_median']:6.1f} ms, step "
              f"{r['step_ms_median']:6.1f} ms median ({r['step_ms_mean']:.1f} mean) over {r['steps']} steps; "
              f"{r['episode_s_mean']:.3f} s per episode", flush=True)
    print(f"episode time ratio (every transition / on demand): {result['episode_ratio']:.2f}x at "
          f"{result['steps_per_episode']:.1f} steps per episode")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as f:
        f.write(json.dumps({"benchmark": args.benchmark, "set": args.set, "tasks": len(tasks), "rounds": args.rounds,
                            **result}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Reference trajectories (Appendix C.2): one per training task, replayed and cached before training.

    python -m actfirst.references build --benchmark scienceworld --out refs/scienceworld.jsonl
    python -m actfirst.references build --benchmark alfworld --out refs/alfworld.jsonl --candidates teacher.jsonl

The command line over ``actfirst.preparation.reference_cache`` (the candidates, their selection and the cache: its
docstring). Every candidate is replayed under the environment configuration ``--config`` and ``--set`` give;
``--allow-partial`` publishes a cache below 100% coverage, which its metadata then records.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from actfirst.core.user_input import check_writable_file, command
from actfirst.envs.benchmarks import BENCHMARKS, load_benchmark, select_tasks
from actfirst.envs.workers import EnvPool
from actfirst.preparation.reference_cache import build_references, read_candidates


async def _build(args: argparse.Namespace) -> int:
    benchmark = load_benchmark(args.benchmark, args.config, args.set)
    tasks = select_tasks(benchmark, benchmark.tasks("train"), args.task_types, args.per_type)
    read_candidates(args.candidates)  # a bad file is refused before any simulator starts
    check_writable_file(args.out, "--out")
    with EnvPool(benchmark.env_spec(), size=min(args.workers, max(1, len(tasks)))) as pool:
        await build_references(benchmark, tasks, pool, out=args.out, candidate_files=args.candidates,
                               shorten=not args.no_shorten, allow_partial=args.allow_partial)
    return 0


@command
def main(argv: list[str] | None = None) -> int:
    """Build a reference cache (every input checked before any simulator starts); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m actfirst.references", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build a reference cache for a benchmark's training tasks")
    build.add_argument("--benchmark", required=True, choices=sorted(BENCHMARKS))
    build.add_argument("--out", required=True, help="cache path (JSONL); metadata goes to <out>.meta.json")
    build.add_argument("--candidates", nargs="*", default=[], help="JSONL files of candidate action sequences")
    build.add_argument("--workers", type=int, default=4, help="environment worker processes")
    build.add_argument("--config", help="benchmark config (default actfirst/envs/<benchmark>/<benchmark>.yaml)")
    build.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                       help="config overrides, e.g. games=generated generated_dir=runs/games (ALFWorld)")
    build.add_argument("--task-types", nargs="*",
                       help="only training tasks of these types (ScienceWorld task types; ALFWorld Pick, Look, ...)")
    build.add_argument("--per-type", type=int, default=0,
                       help="only the first N training tasks of each type (0: all)")
    build.add_argument("--no-shorten", action="store_true", help="ScienceWorld: skip candidate shortening")
    build.add_argument("--allow-partial", action="store_true", help="publish a cache below 100%% coverage")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers={args.workers}: must be >= 1")
    if args.per_type < 0:
        parser.error(f"--per-type={args.per_type}: must be >= 0")
    return asyncio.run(_build(args))


if __name__ == "__main__":
    sys.exit(main())

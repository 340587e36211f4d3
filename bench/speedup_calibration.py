"""Eq. 36 calibrated as the paper does (000 C.5): l_fast and l_full from single requests on an idle engine, on a
training config's student, contexts and budgets (``actfirst.train.calibration``), and Eq. 36's predicted rollout
speedup for T turns; with ``--runs``, beside the measured rollout speedup and Eq. 36 from each run's own records
(``actfirst.train.speedup``).

    python bench/speedup_calibration.py --config configs/demo/scienceworld_lifespan_surveyed_thoughts.yaml \\
        [--episodes 4] [--turns 12] [--runs VANILLA_RUN_DIR ACTFIRST_RUN_DIR] [--out FILE] [key=value ...]

Writes JSON (default ``<parent of out_dir>/speedup_calibration.json``, beside the config's runs) and prints one line.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch and vLLM start their thread pools

from actfirst.core.config import ConfigError, TrainConfig  # noqa: E402
from actfirst.core.files import write_atomically  # noqa: E402
from actfirst.core.schema import load_config, to_dict  # noqa: E402
from actfirst.core.user_input import check_writable_file, command  # noqa: E402
from actfirst.envs.benchmarks import get_benchmark  # noqa: E402
from actfirst.preparation.build import resolve_models  # noqa: E402
from actfirst.train.speedup import between, read_run_figures, speedup_line  # noqa: E402


async def measure(cfg: TrainConfig, *, episodes: int, turns: list[int] | None) -> dict:
    """The calibration of ``cfg``'s student on its training tasks (``turns`` None: the benchmark's turn limit and
    the mean turns the student played)."""
    from transformers import AutoTokenizer

    from actfirst.engine.core import ActFirstEngine
    from actfirst.envs.workers import EnvPool
    from actfirst.preparation.reference_cache import load_references
    from actfirst.rollout.strategies import make_strategy
    from actfirst.train.calibration import IDLE, calibrate, fast_action_strategy, spread

    benchmark = get_benchmark(cfg.benchmark, cfg.env)
    tasks = spread(cfg.training_tasks(benchmark), episodes)
    strategy = make_strategy(cfg.rollout.strategy, cfg.strategy_section)
    references = (load_references(cfg.references, benchmark=benchmark, tasks=[benchmark.task_key(t) for t in tasks])
                  if fast_action_strategy(strategy).uses_references else None)
    engine = ActFirstEngine.from_config(cfg.student, IDLE)
    tokenizer = AutoTokenizer.from_pretrained(cfg.student.model)
    try:
        with EnvPool(benchmark.env_spec(), size=1, call_timeout_s=cfg.rollout.env_timeout_s) as pool:
            result = await calibrate(engine, tokenizer, benchmark, tasks, pool, rollout=cfg.rollout,
                                     strategy=strategy, references=references, turns=turns,
                                     seed=cfg.seed)
    finally:
        await engine.shutdown()
    return result


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="speedup_calibration", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="a training config (its student, tasks, budgets)")
    parser.add_argument("--episodes", type=int, default=4, help="training tasks played per pass (default 4)")
    parser.add_argument("--turns", type=int, nargs="+", default=None,
                        help="T for Eq. 36 (default: the turn limit and the mean turns played)")
    parser.add_argument("--runs", nargs=2, metavar=("VANILLA_RUN", "ACTFIRST_RUN"), default=None,
                        help="finished run directories: their own records' figures beside the calibration")
    parser.add_argument("--out", default=None, help="the JSON file (default: beside the config's out_dir)")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. student.model=DIR")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        raise ConfigError(f"--episodes={args.episodes}: must be >= 1")
    if args.turns is not None and min(args.turns) < 1:
        raise ConfigError(f"--turns={args.turns}: every T must be >= 1")
    own = None
    if args.runs is not None:
        figures = [read_run_figures(run) for run in args.runs]
        for run, fig in zip(args.runs, figures, strict=True):
            if fig is None:
                raise ConfigError(f"--runs: {run!r} has no finished run's rollout_model in its wall_clock.json")
        own = between(*figures)
    cfg = resolve_models(load_config(TrainConfig, args.config, args.overrides))
    out = Path(args.out or Path(cfg.out_dir).parent / "speedup_calibration.json")
    check_writable_file(out, "--out")
    start = time.perf_counter()
    result = asyncio.run(measure(cfg, episodes=args.episodes, turns=args.turns))
    result.update(config=args.config, student=cfg.student.model, budget=dataclasses.asdict(cfg.rollout.budget),
                  wall_s=time.perf_counter() - start, load=os.getloadavg(), cpus=os.cpu_count(),
                  runs=args.runs, own_records=own, settings=to_dict(cfg)["student"])
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(out, json.dumps(result, indent=1))
    for t in result["eq36"]:
        print(speedup_line(own=own, calibration=result, turns=int(t)), flush=True)
    print(f"wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

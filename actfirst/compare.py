"""Method tables in the layout of the paper's Tables 1-3: any rollout strategies under one training config, each
trained under one or more training seeds.

    python -m actfirst.compare [--config CFG] [--strategies vanilla actfirst] [--seeds K [K ...]] [--out DIR]
                               [--resume] [key=value ...]

Every (strategy, seed) is one run of the same config from the same warm start (``student.model``, which preparation
builds once), only ``rollout.strategy=<strategy> seed=<K> out_dir=<out>/<strategy>/seed<K>`` changed; ``--seeds``
defaults to the config's ``seed``. ``--resume`` continues a killed comparison: a run whose ``wall_clock.json`` records
the config's ``num_updates`` is not trained again, a started one resumes from its latest checkpoint, a missing one
starts (a run whose ``config.json`` differs in more than a resume may change is refused first). Then
``<out>/comparison.md``, ``comparison.json`` and ``comparison.png`` are written and the table printed: the command line
over ``actfirst.comparison`` (what the tables hold: its docstring).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from actfirst.comparison import FINISHED, METHODS, NEW, STARTED, run_dir, run_state, write_comparison
from actfirst.config import ConfigError
from actfirst.rollout.strategies import STRATEGIES
from actfirst.user_input import check_writable_dir, command


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; refuses an unknown or repeated strategy or seed and overrides of what the comparison sets."""
    parser = argparse.ArgumentParser(prog="python -m actfirst.compare", description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="YAML TrainConfig (default: the CPU demo config)")
    parser.add_argument("--strategies", nargs="+", default=["vanilla", "actfirst"], metavar="STRATEGY",
                        help=f"rollout strategies to compare, of {', '.join(STRATEGIES)}")
    parser.add_argument("--seeds", nargs="+", default=None, metavar="K",
                        help="training seeds, one run per strategy and seed (default: the config's seed)")
    parser.add_argument("--out", default="runs/compare",
                        help="one run per strategy and seed in <out>/<strategy>/seed<K>")
    parser.add_argument("--resume", action="store_true",
                        help="skip finished runs, continue started ones from their latest checkpoint")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides applied to every run")
    args = parser.parse_args(argv)
    # ``--strategies a b key=value`` hands the overrides to --strategies (nargs="+" is greedy): take them back.
    listed = args.strategies + (args.seeds or [])
    args.overrides += [s for s in listed if "=" in s]
    args.strategies = [s for s in args.strategies if "=" not in s]
    unknown = [s for s in args.strategies if s not in STRATEGIES]
    if unknown:
        parser.error(f"unknown strategy {', '.join(map(repr, unknown))} (known: {', '.join(STRATEGIES)})")
    if not args.strategies or len(set(args.strategies)) != len(args.strategies):
        parser.error(f"--strategies {' '.join(args.strategies)}: give each strategy once")
    if args.seeds is not None:
        seeds = [s for s in args.seeds if "=" not in s]
        if not seeds or not all(s.isdigit() for s in seeds) or len(set(map(int, seeds))) != len(seeds):
            parser.error(f"--seeds {' '.join(seeds)}: give each training seed once, as an integer >= 0")
        args.seeds = [int(s) for s in seeds]
    for item in args.overrides:
        if item.split("=", 1)[0].strip() in ("rollout.strategy", "seed", "out_dir"):
            parser.error(f"override {item!r}: set by the comparison (use --strategies, --seeds and --out)")
    return args


@command
def main(argv: list[str] | None = None) -> int:
    """Load and prepare every run's config, train each run (under ``--resume`` only those not finished), write and
    print the comparison."""
    args = parse_args(argv)
    from actfirst.eval_report import teacher_summary
    from actfirst.preparation import check_inputs, ensure_prepared, load_run_config, resolve_models
    from actfirst.train.trainer import train

    out = Path(args.out)
    check_writable_dir(out, "--out")
    seeds = args.seeds or [load_run_config(args.config, args.overrides).seed]
    # every config first: a bad one is refused before hours of training; seed by seed, so that a killed comparison
    # has every method of its first seeds
    configs = {(s, k): resolve_models(load_run_config(args.config, [
                   *args.overrides, f"rollout.strategy={s}", f"seed={k}", f"out_dir={run_dir(out, s, k)}"]))
               for k in seeds for s in args.strategies}
    existing = [cfg.out_dir for cfg in configs.values() if (Path(cfg.out_dir) / "metrics.jsonl").exists()]
    if existing and not args.resume:
        raise ConfigError(f"--out={args.out!r}: {', '.join(existing)} already hold a run; pass --resume to "
                          f"continue, or choose another --out")
    states = {key: run_state(cfg) if args.resume else NEW for key, cfg in configs.items()}
    todo = {key: cfg for key, cfg in configs.items() if states[key] != FINISHED}
    for cfg in todo.values():
        check_inputs(cfg, buildable=True)
    for cfg in todo.values():
        ensure_prepared(cfg)  # the first builds what is missing (the warm start included), the others find it
    for (strategy, seed), cfg in configs.items():
        what = f"== {METHODS[strategy]} ({strategy}), seed {seed}"
        if states[(strategy, seed)] == FINISHED:
            print(f"{what}: finished in {cfg.out_dir}, not trained again", flush=True)
            continue
        print(f"{what} -> {cfg.out_dir}{' (resumed)' if states[(strategy, seed)] == STARTED else ''}", flush=True)
        train(cfg, resume=states[(strategy, seed)] == STARTED)
    teacher = teacher_summary(next(iter(configs.values())).teacher)  # one teacher: only strategy and seed differ
    runs = {s: {k: Path(configs[(s, k)].out_dir) for k in seeds} for s in args.strategies}
    print(write_comparison(runs, out, teacher=teacher))
    print(f"comparison: {out / 'comparison.md'}, {out / 'comparison.json'}, {out / 'comparison.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

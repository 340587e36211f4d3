"""Method tables in the layout of the paper's Tables 1-3: any rollout strategies under one training config, each
trained under several training seeds, every run in a process of its own.

    python -m actfirst.compare [--config CFG] [--strategies vanilla actfirst] [--seeds K [K ...]] [--out DIR]
                               [--resume] [key=value ...]

Every (strategy, seed) is one run of the same config from the same warm start (``student.model``), only
``rollout.strategy=<strategy> seed=<K> out_dir=<out>/<strategy>/seed<K>`` changed, with checkpoints every
``compare.checkpoint_every`` updates and no evaluation during training. First the preparation in a child process
(what the runs need, then the warm start and the teacher evaluated), which fixes the same-SR threshold
(``compare.threshold``) in ``<out>/threshold.json`` before any run trains; then the runs as ``python -m
actfirst.run`` in ABBA order over the seeds (seed 0: A B, seed 1: B A, ...); then every run's checkpoints evaluated
on the same episodes, each run's in a child process (``actfirst.comparison.runs``). ``--seeds`` defaults to the
config's ``seed``; six per method is a reasonable start for an interval that can exclude 1. ``--resume`` continues a
killed comparison: a run whose ``wall_clock.json`` records the config's ``num_updates`` is not trained again, a
started one resumes from its latest checkpoint, a missing one starts, an evaluated checkpoint is not evaluated again
(a run whose ``config.json`` differs in more than a resume may change is refused first). Then
``<out>/comparison.md``, ``comparison.json``, ``comparison.png`` and ``curves.png`` are written and the table printed
(what the tables hold: ``actfirst.comparison.tables``'s docstring).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from actfirst.comparison.runs import evaluate_run, fix_threshold, run_order, run_overrides, train_run
from actfirst.comparison.tables import FINISHED, METHODS, NEW, OUTPUTS, STARTED, run_state, write_comparison
from actfirst.core.config import ConfigError
from actfirst.core.user_input import check_writable_dir, command
from actfirst.rollout.strategies import STRATEGIES


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; refuses an unknown or repeated strategy or seed and overrides of what the comparison sets."""
    parser = argparse.ArgumentParser(prog="python -m actfirst.compare", description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="YAML TrainConfig (default: the CPU demo config)")
    parser.add_argument("--strategies", nargs="+", default=["vanilla", "actfirst"], metavar="STRATEGY",
                        help=f"rollout strategies to compare, of {', '.join(STRATEGIES)}")
    parser.add_argument("--seeds", nargs="+", default=None, metavar="K",
                        help="training seeds, one run per strategy and seed (default: the config's seed; "
                             "6 per method is a reasonable start for the paired interval)")
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
        key = item.split("=", 1)[0].strip()
        if key in ("rollout.strategy", "seed", "out_dir"):
            parser.error(f"override {item!r}: set by the comparison (use --strategies, --seeds and --out)")
        if key in ("checkpoint_every", "keep_checkpoints"):
            parser.error(f"override {item!r}: set by the comparison (use compare.checkpoint_every)")
    return args


@command
def main(argv: list[str] | None = None) -> int:
    """Load every run's config, prepare and fix the threshold, train each run (under ``--resume`` only those not
    finished) in ABBA order, evaluate their checkpoints, write and print the comparison."""
    args = parse_args(argv)
    from actfirst.preparation.build import check_inputs, load_run_config, resolve_models

    out = Path(args.out)
    check_writable_dir(out, "--out")
    base = load_run_config(args.config, args.overrides)
    seeds = args.seeds or [base.seed]
    order = run_order(args.strategies, seeds)
    overrides = {key: run_overrides(args.overrides, *key, out, base) for key in order}
    # every config first: a bad one is refused before hours of training
    configs = {key: resolve_models(load_run_config(args.config, overrides[key])) for key in order}
    existing = [cfg.out_dir for cfg in configs.values() if (Path(cfg.out_dir) / "metrics.jsonl").exists()]
    if existing and not args.resume:
        raise ConfigError(f"--out={args.out!r}: {', '.join(existing)} already hold a run; pass --resume to "
                          f"continue, or choose another --out")
    states = {key: run_state(cfg) if args.resume else NEW for key, cfg in configs.items()}
    for key, cfg in configs.items():
        if states[key] != FINISHED:
            check_inputs(cfg, buildable=True)
    fixed = fix_threshold(args.config, {s: [*args.overrides, f"rollout.strategy={s}"] for s in args.strategies},
                          out, base.compare.threshold)
    if not train_all(args.config, order, overrides, configs, states):
        return 1
    for number, (strategy, seed) in enumerate(order, 1):
        print(f"[compare] checkpoints of {METHODS[strategy]}, seed {seed} ({number}/{len(order)})", flush=True)
        evaluate_run(args.config, args.overrides, configs[(strategy, seed)].out_dir)
    runs = {s: {k: Path(configs[(s, k)].out_dir) for k in seeds} for s in args.strategies}
    print(write_comparison(runs, out, teacher=fixed["teacher"]["summary"], fixed=fixed))
    print(f"comparison: {', '.join(str(out / name) for name in OUTPUTS)}")
    return 0


def train_all(config: str | None, order: list[tuple[str, int]], overrides: dict[tuple[str, int], list[str]],
              configs: dict[tuple[str, int], Any], states: dict[tuple[str, int], str]) -> bool:
    """Train the runs not finished in ``order``, each in its own process, with progress and an ETA; False (after
    saying how to continue) when one fails."""
    todo = [key for key in order if states[key] != FINISHED]
    started = time.perf_counter()
    for key in order:
        strategy, seed = key
        what = f"== {METHODS[strategy]} ({strategy}), seed {seed}"
        if states[key] == FINISHED:
            print(f"{what}: finished in {configs[key].out_dir}, not trained again", flush=True)
            continue
        number = todo.index(key)
        eta = (time.perf_counter() - started) / number * (len(todo) - number) if number else None
        print(f"{what} -> {configs[key].out_dir}{' (resumed)' if states[key] == STARTED else ''}; run {number + 1} "
              f"of {len(todo)}{f', ETA {eta:.0f} s for the rest' if eta is not None else ''}", flush=True)
        status = train_run(config, overrides[key], resume=states[key] == STARTED)
        if status != 0:
            print(f"[compare] {what} failed (exit status {status}); continue with --resume", file=sys.stderr,
                  flush=True)
            return False
    return True


if __name__ == "__main__":
    sys.exit(main())

"""``python -m actfirst.train --config FILE [key=value ...]``: one OPD training run (see actfirst.train.loop)."""

from __future__ import annotations

import argparse
import sys

from actfirst.config import ConfigError, TrainConfig, load_config
from actfirst.train.loop import train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m actfirst.train", description=__doc__)
    parser.add_argument("--config", required=True, help="YAML TrainConfig")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. rollout.strategy=vanilla")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in out_dir")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(TrainConfig, args.config, args.overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    result = train(cfg, resume=args.resume)
    print(f"done: {result.num_updates} updates in {result.wall_s:.1f} s, {result.num_transitions} transitions, "
          f"weight version {result.weight_version}; metrics in {result.out_dir / 'metrics.jsonl'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

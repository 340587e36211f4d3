"""Generate ALFRED-style ALFWorld games offline (``actfirst.envs.alfworld.games``) into a folder::

    python -m actfirst.envs.alfworld.generate --out runs/alfworld_games/train [--per-type 10] [--seed 0] [--unseen]
"""

from __future__ import annotations

import argparse
import sys

from actfirst.core.user_input import check_writable_dir, command
from actfirst.envs.alfworld.games import generate_split


@command
def main(argv: list[str] | None = None) -> int:
    """Generate games into ``--out``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m actfirst.envs.alfworld.generate",
                                     description="Generate ALFRED-style ALFWorld games offline.")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--per-type", type=int, default=10, help="games per task type")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--unseen", action="store_true", help="use only the held-out rooms")
    args = parser.parse_args(argv)
    if args.per_type < 1:
        parser.error(f"--per-type={args.per_type}: must be >= 1")
    check_writable_dir(args.out, "--out")
    files = generate_split(args.out, args.per_type, args.seed, args.unseen)
    print(f"{len(files)} solvable games under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

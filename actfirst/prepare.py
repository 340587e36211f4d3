"""Build what a training run needs before it starts.

    python -m actfirst.prepare --config configs/<benchmark>/<setting>.yaml [key=value ...]

The command line over ``actfirst.preparation`` (what is built, and from what: its docstring). Whatever exists is
kept: a second call does nothing.
"""

from __future__ import annotations

import argparse
import sys

from actfirst.preparation import ensure_prepared, load_run_config, resolve_models
from actfirst.user_input import command


@command
def main(argv: list[str] | None = None) -> int:
    """Prepare what the config needs; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m actfirst.prepare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=None, help="a training config (default: the CPU demo's)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    cfg = resolve_models(load_run_config(args.config, args.overrides))
    timings = ensure_prepared(cfg)
    done = ", ".join(f"{k[:-2]} {v:.0f} s" for k, v in timings.items()) or "nothing to do: everything exists"
    print(f"[prepare] {done}; references {cfg.references}, teacher {cfg.teacher}, student {cfg.student.model}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

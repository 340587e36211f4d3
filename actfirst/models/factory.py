"""Build small Qwen3-architecture models from a config and save them as ordinary Hugging Face directories.

    python -m actfirst.models.factory --out runs/models/tiny hidden_size=64 tokenizer=env-bpe

The command line over :func:`actfirst.models.build.build_model`.
"""

from __future__ import annotations

import argparse
import sys

from actfirst.core.config import ModelConfig
from actfirst.core.schema import load_config
from actfirst.core.user_input import check_writable_dir, command
from actfirst.models.build import build_model


@command
def main(argv: list[str] | None = None) -> int:
    """Build a model from a ``ModelConfig`` into ``--out``; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="YAML ModelConfig", default=None)
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of ModelConfig")
    args = parser.parse_args(argv)
    cfg = load_config(ModelConfig, args.config, args.overrides)
    check_writable_dir(args.out, "--out")
    path = build_model(cfg, args.out)
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

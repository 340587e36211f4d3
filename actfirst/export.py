"""Export a training checkpoint as a Hugging Face model directory: no optimizer, trainer or rank state; the weights in
the dtype asked for; the tokenizer and chat template; a model card with the run's evaluations.

    python -m actfirst.export runs/demo/actfirst/checkpoints/update_000020 --out exports/demo [--dtype bfloat16]
    python -m actfirst.export runs/demo/actfirst/checkpoints/latest --out exports/demo --push-to-hub me/demo-student

The command line over ``actfirst.models.export`` (what is written and how: its docstring). ``--push-to-hub`` uploads the
export with huggingface_hub (a token and the network are checked before any work).
"""

from __future__ import annotations

import argparse
import shlex
import sys

from actfirst.core.user_input import check_writable_dir, command
from actfirst.models.export import EXPORT_DTYPES, check_hub_repo, export_checkpoint, push_to_hub
from actfirst.train.checkpoint import named_checkpoint


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m actfirst.export``."""
    parser = argparse.ArgumentParser(prog="python -m actfirst.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a run's checkpoint: <out_dir>/checkpoints/update_NNNNNN, or "
                                           "<out_dir>/checkpoints/latest (the last) or .../best (keep_best's)")
    parser.add_argument("--out", required=True, help="the export's directory (new, or empty)")
    parser.add_argument("--dtype", default="float32", choices=EXPORT_DTYPES, help="the weights' dtype")
    parser.add_argument("--push-to-hub", metavar="REPO", help="upload the export to this Hub model repo")
    parser.add_argument("--private", action="store_true", help="with --push-to-hub: create the repo private")
    parser.add_argument("--license", help="the model card's license (default: the base model's card's)")
    return parser


@command
def main(argv: list[str] | None = None) -> int:
    """Export (and push) a checkpoint, every input checked first; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.push_to_hub:
        check_hub_repo(args.push_to_hub)
    check_writable_dir(args.out, "--out")
    line = shlex.join(["python", "-m", "actfirst.export", *(sys.argv[1:] if argv is None else argv)])
    checkpoint = named_checkpoint(args.checkpoint, "checkpoint")
    out = export_checkpoint(checkpoint, args.out, dtype=args.dtype, command=line, license=args.license)
    print(f"exported {checkpoint} ({args.dtype}) to {out}", flush=True)
    if args.push_to_hub:
        print(f"pushed to {push_to_hub(out, args.push_to_hub, private=args.private)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

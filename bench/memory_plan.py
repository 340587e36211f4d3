"""GPU memory per rank of every shipped training config, colocated (one process per GPU: engines + trainer + teacher).

    python bench/memory_plan.py                          # every config in bench/memory_targets.yaml, 80 and 141 GB
    python bench/memory_plan.py --config configs/train/alfworld/qwen3-4b.yaml micro_batch_tokens=8192 --student Qwen3-4B
    python bench/memory_plan.py --layers                 # measured bytes per token and layer against the old formula

Each config is loaded through actfirst's own config loading (``load_config``, its ``base:`` files and overrides;
input paths unchecked), so every value below is the one the run uses. ``bench/memory_targets.yaml`` is the plan's
input: the GPU each shipped config is sized for (``gpu``) and the published model shapes its placeholder paths stand
for. ``tests/test_memory_plan.py`` fails when a config under configs/train/ is missing there or its peak exceeds its
GPU. The plan itself, term by term, is ``actfirst.parallel.memory_plan`` (``python -m actfirst.run --dry-run``
prints it for one run); docs/memory.md has the table and the arithmetic.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from actfirst.core.config import ConfigError, TrainConfig
from actfirst.core.schema import load_config, paths_unchecked
from actfirst.core.user_input import command
from actfirst.parallel.memory_plan import GPUS, SHAPES, SLACK_GIB, load_activations, plan, settings

ROOT = Path(__file__).resolve().parents[1]
TARGETS = Path(__file__).with_name("memory_targets.yaml")


def load_targets(path: Path = TARGETS) -> dict:
    """The plan's input: ranks, and each shipped config's GPU (a key of ``GPUS``) and model shapes."""
    targets = yaml.safe_load(path.read_text())
    for name, entry in targets["configs"].items():
        for key in ("student", "teacher"):
            if entry[key] not in SHAPES:
                raise ConfigError(f"{path.name}: {name}: {key}={entry[key]!r}: must be one of {list(SHAPES)}")
        if entry["gpu"] not in GPUS:
            raise ConfigError(f"{path.name}: {name}: gpu={entry['gpu']!r}: must be one of {list(GPUS)}")
    return targets


def load_train_config(path: Path, overrides: list[str] | None = None) -> TrainConfig:
    """A training config as the run loads it, but for its input paths (unchecked: the shipped ones are placeholders)
    and its ``env:`` section (dropped: the simulators' settings and data, such as ALFWorld's games on disk, take no
    GPU memory)."""
    with paths_unchecked():
        return load_config(TrainConfig, path, [*(overrides or []), "env=null"])


def table(targets: dict, measured: dict, gpus: list[str], slack_gib: float) -> list[str]:
    """Markdown rows, one per config in ``targets``: the terms that do not depend on the GPU, then the peak (and the
    engines' share) on each GPU in ``gpus``, the KV cache and whether it fits on its own GPU."""
    head = ("| config | student / teacher | settings | shards | transients | activations | teacher | "
            + " | ".join(f"peak on {g} (engines)" for g in gpus) + " | its GPU | KV tokens there | fits |")
    rows = [head, "|---" * (head.count("|") - 1) + "|"]
    for name, entry in targets["configs"].items():
        cfg = load_train_config(ROOT / "configs" / "train" / name)
        r = {g: plan(cfg, entry["student"], entry["teacher"], gpu_gib=GPUS[g], ranks=targets["ranks"],
                     measured=measured, slack_gib=slack_gib) for g in {*gpus, entry["gpu"]}}
        own = r[entry["gpu"]]
        peaks = " | ".join(f"{r[g]['peak']:.1f} ({r[g]['engines']:.1f})" for g in gpus)
        rows.append(f"| {name} | {entry['student']} / {entry['teacher']} | {settings(cfg)} | "
                    f"{own['student_shards']:.1f} | {own['transients']:.1f} | {own['activations']:.1f} | "
                    f"{own['teacher']:.1f} | {peaks} | {entry['gpu']} | {own['kv_tokens'] / 1000:.0f}k | "
                    f"{'yes' if own['fits'] else 'NO'} |")
    return rows


def layer_table(measured: dict) -> list[str]:
    """Markdown rows: the measured bytes per token and layer of each shape against the formula used before."""
    head = ("| shape | old formula | one sample | packed, SDPA (dense mask) | packed, flex (block mask) | "
            "checkpointed | measured / old (one sample) |")
    rows = [head, "|---" * (head.count("|") - 1) + "|"]
    for shape, m in measured.items():
        dense = f"{m['packed_sdpa']['per_token']:,.0f} + {m['packed_sdpa']['per_token_sq']:.2f} T"
        rows.append(f"| {shape} | {m['old_formula']:,} | {m['one']['per_token']:,.0f} | {dense} | "
                    f"{m['packed_flex']['per_token']:,.0f} | {m['one_checkpointed']['per_token']:,.0f} | "
                    f"{m['one']['per_token'] / m['old_formula']:.2f} |")
    return rows


@command
def main(argv: list[str] | None = None) -> int:
    """Print the table (every shipped config), or one config's figures with overrides (``--config``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, help="one training config (its shapes: --student, --teacher)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides for --config (key=value)")
    parser.add_argument("--student", default="Qwen3-1.7B", choices=list(SHAPES))
    parser.add_argument("--teacher", default="Qwen3-8B", choices=list(SHAPES))
    parser.add_argument("--gpus", nargs="+", default=None, help=f"GPU classes (default: all of {list(GPUS)})")
    parser.add_argument("--slack-gib", type=float, default=SLACK_GIB)
    parser.add_argument("--layers", action="store_true", help="print the measured bytes per token and layer instead")
    args = parser.parse_args(argv)
    targets, measured = load_targets(), load_activations()
    if args.layers:
        print("\n".join(layer_table(measured)))
        return 0
    gpus = args.gpus or list(GPUS)
    unknown = [g for g in gpus if g not in GPUS]
    if unknown:
        raise ConfigError(f"--gpus={unknown}: must be among {list(GPUS)}")
    if args.config is None:
        print("\n".join(table(targets, measured, gpus, args.slack_gib)))
        return 0
    cfg = load_train_config(args.config, args.overrides)
    for gpu in gpus:
        r = plan(cfg, args.student, args.teacher, gpu_gib=GPUS[gpu], ranks=targets["ranks"],
                 measured=measured, slack_gib=args.slack_gib)
        figures = {k: round(v, 1) for k, v in {**r, **r.pop("phases")}.items() if isinstance(v, float)}
        print(f"{gpu} ({settings(cfg)}): fits={r['fits']} {json.dumps(figures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

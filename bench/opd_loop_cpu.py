"""The OPD training loop turning on a CPU: tiny models, real ALFWorld games, Vanilla OPD against ActFirst-OPD.

    python bench/opd_loop_cpu.py [--updates 12] [--out runs/opd_loop_cpu] [--set pipeline=serial ...]

Prepares (once, cached under --out) ALFWorld games generated offline, their planner references, a tiny student and
a tiny teacher sharing the student's tokenizer, then runs the same training config with ``rollout.strategy=vanilla``
and ``rollout.strategy=actfirst`` and writes ``results.json``, ``table.md`` and ``probe_gap.png`` (the
teacher-minus-student gap on fixed probe contexts against wall-clock). The B.3 training budget (384 / 512 / 128),
fast actions of at most 32 tokens, rollout batches of 6 tasks with an 8-turn limit, 16 full responses per update.
Both strategies use the same sampling seeds per task, turn and request kind, so while the random student's
actions are all empty (invalid) both see the same contexts: their samples differ only by the engine's
batch-dependent numerics, and the wall-clock by the schedule.

The teacher here is a random model whose LM head is scaled up (peaked, context-dependent next-token distributions):
a target the student can move toward, which is what this check needs (the train-inference mismatch near zero, the
weight version advancing, the gap shrinking). It is not a competent agent: task success is the CPU demo's job.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import torch

from actfirst.core.config import ModelConfig, TrainConfig
from actfirst.core.schema import load_config
from actfirst.core.user_input import check_writable_dir, command
from actfirst.envs.alfworld.config import ALFWorldConfig
from actfirst.envs.benchmarks import get_benchmark
from actfirst.envs.workers import EnvPool
from actfirst.models.build import build_model
from actfirst.preparation.reference_cache import build_references
from actfirst.train.trainer import train

TEACHER_HEAD_SCALE = 6.0


def prepare(out: Path, games_per_type: int) -> dict[str, str]:
    """Games, references, student and teacher under ``out`` (skipped when already there)."""
    env = ALFWorldConfig(games="generated", max_turns=8, generated_dir=str(out / "games"),
                         games_per_type=games_per_type)
    benchmark = get_benchmark("alfworld", env)
    refs = out / "references.jsonl"
    if not refs.exists():
        tasks = benchmark.tasks("train")
        with EnvPool(benchmark.env_spec(), size=2) as pool:
            asyncio.run(build_references(benchmark, tasks, pool, out=refs))
    student, teacher = out / "student", out / "teacher"
    if not (student / "config.json").exists():
        build_model(ModelConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                head_dim=32, intermediate_size=128, seed=1), student)
    if not (teacher / "config.json").exists():
        build_model(ModelConfig(hidden_size=96, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                head_dim=48, intermediate_size=256, seed=2), teacher)
        from safetensors.torch import load_file, save_file

        weights = load_file(teacher / "model.safetensors")
        weights["lm_head.weight"] = weights["lm_head.weight"] * TEACHER_HEAD_SCALE
        save_file(weights, teacher / "model.safetensors", metadata={"format": "pt"})
    return {"references": str(refs), "student": str(student), "teacher": str(teacher),
            "games": str(out / "games")}


def config(paths: dict[str, str], strategy: str, updates: int, out: Path, extra: list[str]) -> TrainConfig:
    overrides = [
        "benchmark=alfworld", "env.games=generated", f"env.generated_dir={paths['games']}", "env.max_turns=8",
        f"env.games_per_type={GAMES_PER_TYPE}",
        f"student.model={paths['student']}", "student.dtype=float32", "student.max_model_len=2048",
        "student.max_num_seqs=64", "student.max_num_batched_tokens=4096", "student.kv_cache_gib=1",
        f"teacher={paths['teacher']}", f"references={paths['references']}",
        f"rollout.strategy={strategy}", "rollout.batch_tasks=6", "rollout.max_prompt_tokens=1536",
        "rollout.budget.first_stage=384", "rollout.budget.total=512", "rollout.budget.second_stage=128",
        "rollout.budget.fast_action_tokens=32", "scheduler.b_max=32",
        f"num_updates={updates}", "batch_samples=16", "micro_batch_tokens=8192", "optim.lr=5e-3",
        "optim.grad_clip=1.0", "probe_contexts=8", f"out_dir={out / strategy}", "seed=0",
    ]
    return load_config(TrainConfig, None, overrides + extra)


GAMES_PER_TYPE = 2


@command
def main(argv: list[str] | None = None) -> int:
    """Train each strategy on generated ALFWorld games and write the comparison; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=12)
    parser.add_argument("--strategies", nargs="+", default=["vanilla", "actfirst"])
    parser.add_argument("--out", default="runs/opd_loop_cpu")
    parser.add_argument("--set", nargs="*", default=[], help="more TrainConfig overrides (key=value)")
    args = parser.parse_args(argv)
    check_writable_dir(args.out, "--out")
    out = Path(args.out)
    paths = prepare(out, GAMES_PER_TYPE)
    results = {}
    for strategy in args.strategies:
        torch.manual_seed(0)
        result = train(config(paths, strategy, args.updates, out, args.set))
        rows = [json.loads(line) for line in (out / strategy / "metrics.jsonl").read_text().splitlines()]
        results[strategy] = {
            "wall_s": result.wall_s, "transitions": result.num_transitions, "weight_version": result.weight_version,
            "probe_gap": [r.get("probe/gap") for r in rows], "elapsed_s": [r["elapsed_s"] for r in rows],
            "mismatch_mean": [r.get("mismatch_mean") for r in rows],
            "mismatch_max": [r.get("mismatch_max") for r in rows],
            "discarded_frac": [r["discarded_frac"] for r in rows],
            "rollout_s": sum(r["rollout_s"] for r in rows),
            "score_update_s": sum(r["score_s"] + r["update_s"] for r in rows),
        }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    lines = table(results)
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    _plot(results, out / "probe_gap.png")
    return 0


def table(results: dict) -> list[str]:
    """The comparison as markdown rows."""
    lines = ["| strategy | wall-clock (s) | rollout (s) | scoring + update (s) | transitions | weight version | "
             "probe gap first -> last | mismatch mean (max) |", "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        gaps = [g for g in r["probe_gap"] if g is not None]
        mm = [m for m in r["mismatch_mean"] if m is not None]
        mx = [m for m in r["mismatch_max"] if m is not None]
        lines.append(f"| {name} | {r['wall_s']:.0f} | {r['rollout_s']:.0f} | {r['score_update_s']:.0f} | "
                     f"{r['transitions']} | {r['weight_version']} | "
                     f"{gaps[0]:+.3f} -> {gaps[-1]:+.3f} | {max(mm):.1e} ({max(mx):.1e}) |")
    return lines


def _plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in results.items():
        ax.plot(r["elapsed_s"], r["probe_gap"], marker="o", label=name)
    ax.set_xlabel("wall-clock (s)")
    ax.set_ylabel("teacher - student log-prob (probe)")
    ax.set_title("OPD on a 2-core CPU: tiny student, ALFWorld games")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())

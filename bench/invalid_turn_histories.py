"""How the built models read contexts whose histories hold invalid turns, as a failing rollout's do.

    python bench/invalid_turn_histories.py --config configs/demo/scienceworld_lifespan_enumerated_thoughts.yaml \
        --max-turns 20 [--teacher DIR] [--student DIR]

Contexts of two kinds, ``--contexts`` of each drawn with ``--seed``: the references' own steps replayed in the
simulator (clean), and the references replayed with 1 to ``--max-turns`` invalid turns inserted before one of their
steps (``actfirst.train.invalid_turns``, ``--variants`` per reference), the steps after the insertion. Each context
is rendered as a rollout renders it, with the reference full response that preparation taught for its step (the
config's ``prepare.build_models.thoughts``). The teacher and the student score that response's tokens (teacher-forced,
temperature 1, float32, through the trainer's LM-head gather: ``packing_cpu.response_logprobs``).

Printed per kind and model: the mean log-prob per token of the fixed text (all but the response's last
``DECISION_TOKENS``: the step and the action) and of the decision, and the share of responses whose every fixed-text
token has probability above 1/2 (greedy decoding would write the whole fixed text). ``--out``: the summary as JSON,
written atomically.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
from pathlib import Path

from opd_gap_sources import DECISION_TOKENS
from packing_cpu import add_model_args, load_cfg, response_logprobs

from actfirst.core.files import write_atomically
from actfirst.core.user_input import check_writable_file, positive_int

HELD = -math.log(2)
"""log(1/2): a token above it is the one greedy decoding writes."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(parser)  # --config: a built-model demo's (prepare.build_models)
    parser.add_argument("--contexts", type=positive_int, default=40, help="contexts of each kind drawn")
    parser.add_argument("--variants", type=positive_int, default=1, help="replays with invalid turns per reference")
    parser.add_argument("--max-turns", type=positive_int, default=20, help="invalid turns inserted: 1 to this many")
    parser.add_argument("--seed", type=int, default=0, help="the invalid turns and the draw of the contexts")
    parser.add_argument("--out", default="runs/invalid_turn_histories/result.json")
    return parser.parse_args(argv)


def contexts(cfg, args: argparse.Namespace) -> dict[str, list]:
    """The clean and the invalid-turn reference steps (``ExpertStep``), ``args.contexts`` of each drawn."""
    from actfirst.envs.benchmarks import get_benchmark
    from actfirst.envs.workers import EnvPool
    from actfirst.preparation.reference_cache import load_references
    from actfirst.train.invalid_turns import invalid_turn_steps
    from actfirst.train.sft import expert_steps

    benchmark = get_benchmark(cfg.benchmark, cfg.env)
    references = load_references(cfg.references, benchmark=benchmark)
    tasks = [t for t in cfg.training_tasks(benchmark) if benchmark.task_key(t) in references]
    with EnvPool(benchmark.env_spec(), size=1) as pool:
        clean = asyncio.run(expert_steps(benchmark, pool, tasks, references))
        invalid = asyncio.run(invalid_turn_steps(benchmark, pool, tasks, references, variants=args.variants,
                                                 max_turns=args.max_turns, seed=args.seed))
    rng = random.Random(args.seed)
    return {kind: rng.sample(steps, min(args.contexts, len(steps)))
            for kind, steps in (("clean", clean), ("invalid turns", invalid))}


def summarize(logprobs: list[list[float]]) -> dict[str, float]:
    """Fixed text and decision log-prob per token, and the share of responses whose fixed text is held."""
    fixed = [x for lp in logprobs for x in lp[:-DECISION_TOKENS]]
    decision = [x for lp in logprobs for x in lp[-DECISION_TOKENS:]]
    held = sum(all(x > HELD for x in lp[:-DECISION_TOKENS]) for lp in logprobs)
    return {"fixed_logprob_per_token": statistics.fmean(fixed),
            "decision_logprob_per_token": statistics.fmean(decision), "fixed_text_held": held / len(logprobs)}


def main(argv: list[str] | None = None) -> int:
    """Build the contexts, score the reference responses with both models, print and write the summary."""
    from transformers import AutoTokenizer

    from actfirst.envs.benchmarks import get_benchmark
    from actfirst.rollout.prompts import Mode
    from actfirst.train.sft import THOUGHTS, examples

    args = parse_args(argv)
    check_writable_file(args.out, "--out")
    cfg, teacher_dir, student_dir = load_cfg(args)
    build = cfg.prepare.build_models
    benchmark, thought = get_benchmark(cfg.benchmark, cfg.env), THOUGHTS[build.thoughts if build else "short"]
    summary: dict[str, dict] = {}
    for kind, steps in contexts(cfg, args).items():
        samples = examples(AutoTokenizer.from_pretrained(teacher_dir), benchmark, steps, modes=[Mode.FULL_RESPONSE],
                           max_prompt_tokens=cfg.rollout.max_prompt_tokens, thought=thought)
        row: dict = {"contexts": len(samples), "history_turns": statistics.fmean(len(s.history) for s in steps),
                     "context_tokens": statistics.fmean(len(s.context_ids) for s in samples)}
        for model, model_dir in (("teacher", teacher_dir), ("student", student_dir)):
            row[model] = summarize(response_logprobs(model_dir, samples, 1.0))
            print(f"{kind}: {row['contexts']} contexts, {row['history_turns']:.1f} history turns, "
                  f"{row['context_tokens']:.0f} context tokens; {model}: fixed text "
                  f"{row[model]['fixed_logprob_per_token']:+.4f} per token, decision "
                  f"{row[model]['decision_logprob_per_token']:+.3f}, fixed text held in "
                  f"{row[model]['fixed_text_held']:.0%}", flush=True)
        summary[kind] = row
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_atomically(args.out, json.dumps({"config": args.config, "overrides": args.overrides, "teacher": teacher_dir,
                                           "student": student_dir, "seed": args.seed, "max_turns": args.max_turns,
                                           "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

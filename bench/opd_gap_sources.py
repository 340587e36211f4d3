"""Where OPD's per-token advantage (B.4, Eq. 29: log pi_teacher - log pi_old) sits on the student's own full responses.

    python bench/opd_gap_sources.py --config configs/demo/scienceworld_lifespan_enumerated_thoughts.yaml \
        --contexts 16 --samples-per-context 2

A built-model demo's thoughts are the same at every step but for the decision, so each of the student's sampled full
responses can be laid against the reference response of its context (the thought preparation taught, with the step's
action): up to its first deviation, and after. Contexts: a seeded draw of the config's reference steps replayed in
the simulator, rendered as a rollout renders them (``bench/packing_cpu.py``'s ``collect``). Responses: the student
(``--student``, default the config's ``student.model``) samples ``--samples-per-context`` of each through
transformers' ``generate`` at the config's rollout temperature and top-p, no top-k, up to the B.3 budget's total,
stopping at ``</action>`` (no B.3 insertion: a rollout's budget rarely binds at these lengths). Each response's tokens
are scored by the student (log pi_old, at the sampling temperature) and the teacher (at temperature 1, as
``TeacherScorer``), float32.

Printed: how many responses deviate from the reference before its last 12 tokens (the decision), the student's own
log-prob of the first deviating token (median and quartiles), and the mean advantage per token before the first
deviation and after it, with the share of the responses' summed advantage after it. ``--out``: the per-response
records, as JSON, written atomically.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
from pathlib import Path

import torch
from packing_cpu import add_model_args, collect, load_cfg

from actfirst.core.files import write_atomically
from actfirst.core.user_input import check_writable_file, positive_int
from actfirst.envs.response_format import ACTION_CLOSE

DECISION_TOKENS = 12
"""The reference response's last tokens (the step, the action): a response may differ there and keep the text."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(parser)  # --config: a built-model demo's (prepare.build_models)
    parser.add_argument("--contexts", type=positive_int, default=16, help="reference steps drawn")
    parser.add_argument("--samples-per-context", type=positive_int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="the draw of the steps and the sampling")
    parser.add_argument("--out", default="runs/opd_gap_sources/result.json")
    return parser.parse_args(argv)


def token_logprobs(model: torch.nn.Module, ids: list[int], start: int, temperature: float) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t >= start, at ``temperature``, float32."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, start - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[start:])[:, None])[:, 0]


def sample_and_score(cfg, models: dict, tokenizer, row: dict, k: int) -> list[dict]:
    """``k`` responses of the student to ``row``'s context, each with both models' log-probs and its first
    deviation from ``row``'s reference response."""
    context, reference = row["context_ids"], row["response_ids"]
    rollout, out = cfg.rollout, []
    for _ in range(k):
        with torch.no_grad():
            ids = models["student"].generate(
                torch.tensor([context]), do_sample=True, temperature=rollout.temperature, top_p=rollout.top_p,
                top_k=0, max_new_tokens=rollout.budget.total, stop_strings=[ACTION_CLOSE], tokenizer=tokenizer,
                pad_token_id=tokenizer.pad_token_id or 0)[0].tolist()
        response = ids[len(context):]
        old = token_logprobs(models["student"], ids, len(context), rollout.temperature)
        teacher = token_logprobs(models["teacher"], ids, len(context), 1.0)
        deviation = next((i for i, (x, y) in enumerate(zip(response, reference, strict=False)) if x != y),
                         min(len(response), len(reference)))
        out.append({"task": row["task"], "turn": row["turn"], "response": response, "reference": reference,
                    "deviation": deviation, "old_logprobs": old.tolist(), "teacher_logprobs": teacher.tolist()})
    return out


def summarize(records: list[dict]) -> dict:
    """The deviations and where the advantage sits (see the module docstring)."""
    deviating = [r for r in records if r["deviation"] < len(r["reference"]) - DECISION_TOKENS]
    before, after = [], []
    for r in records:
        advantage = [t - o for t, o in zip(r["teacher_logprobs"], r["old_logprobs"], strict=True)]
        before += advantage[:r["deviation"]]
        after += advantage[r["deviation"]:]
    first = [r["old_logprobs"][r["deviation"]] for r in deviating]
    total = sum(before) + sum(after)
    return {"responses": len(records), "deviating": len(deviating),
            "deviating_token_old_logprob_quartiles": statistics.quantiles(first, n=4) if len(first) > 1 else first,
            "advantage_per_token_before": sum(before) / max(1, len(before)), "tokens_before": len(before),
            "advantage_per_token_after": sum(after) / max(1, len(after)), "tokens_after": len(after),
            "share_after": sum(after) / total if total else float("nan"),
            "old_logprob_per_token": statistics.fmean(x for r in records for x in r["old_logprobs"]),
            "teacher_logprob_per_token": statistics.fmean(x for r in records for x in r["teacher_logprobs"])}


def main(argv: list[str] | None = None) -> int:
    """Draw the contexts, sample, score, print and write the records."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args = parse_args(argv)
    check_writable_file(args.out, "--out")
    cfg, teacher_dir, student_dir = load_cfg(args)
    rows = collect(dataclasses.replace(cfg, batch_samples=args.contexts), student_dir, "random", args.seed)
    random.Random(args.seed).shuffle(rows)
    torch.manual_seed(args.seed)
    models = {name: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
              for name, path in (("student", student_dir), ("teacher", teacher_dir))}
    tokenizer = AutoTokenizer.from_pretrained(student_dir)
    records = [r for row in rows for r in sample_and_score(cfg, models, tokenizer, row, args.samples_per_context)]
    summary = summarize(records)
    print(f"{summary['responses']} responses, {summary['deviating']} deviate from the reference before its last "
          f"{DECISION_TOKENS} tokens; the student's log-prob of the first deviating token, quartiles: "
          f"{', '.join(f'{q:.1f}' for q in summary['deviating_token_old_logprob_quartiles'])}")
    print(f"advantage per token: {summary['advantage_per_token_before']:+.3f} before the first deviation "
          f"({summary['tokens_before']:,} tokens), {summary['advantage_per_token_after']:+.3f} after it "
          f"({summary['tokens_after']:,}); share of the summed advantage after it: {summary['share_after']:.2f}; "
          f"log-prob per token: student {summary['old_logprob_per_token']:.3f}, "
          f"teacher {summary['teacher_logprob_per_token']:.3f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_atomically(args.out, json.dumps({"config": args.config, "overrides": args.overrides, "teacher": teacher_dir,
                                           "student": student_dir, "seed": args.seed, "summary": summary,
                                           "records": records}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

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
``TeacherScorer``), float32, through the trainer's LM-head gather.

Printed: how many responses deviate from the reference before its last 12 tokens (the decision), the student's own
log-prob of the first deviating token (median and quartiles), and the mean advantage per token before the first
deviation and after it, with the share of the responses' summed advantage after it. ``--out``: the per-response
records, as JSON, written atomically.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

import torch
from packing_cpu import add_model_args, collect, load_cfg, response_logprobs

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


def sample(cfg, student: torch.nn.Module, tokenizer, rows: list[dict], k: int) -> list[dict]:
    """``k`` responses of the student to each row's context (transformers' ``generate``), each with its first
    deviation from the row's reference response."""
    rollout, out = cfg.rollout, []
    for row in rows:
        context, reference = row["context_ids"], row["response_ids"]
        for _ in range(k):
            with torch.no_grad():
                ids = student.generate(
                    torch.tensor([context]), do_sample=True, temperature=rollout.temperature, top_p=rollout.top_p,
                    top_k=0, max_new_tokens=rollout.budget.total, stop_strings=[ACTION_CLOSE], tokenizer=tokenizer,
                    pad_token_id=tokenizer.pad_token_id or 0)[0].tolist()
            response = ids[len(context):]
            deviation = next((i for i, (x, y) in enumerate(zip(response, reference, strict=False)) if x != y),
                             min(len(response), len(reference)))
            out.append({"task": row["task"], "turn": row["turn"], "context": context, "response": response,
                        "reference": reference, "deviation": deviation})
    return out


def score(records: list[dict], student_dir: str, teacher_dir: str, temperature: float) -> None:
    """Set each record's ``old_logprobs`` (the student at the sampling temperature) and ``teacher_logprobs`` (at
    temperature 1, as ``TeacherScorer``), through the trainer's LM-head gather (``packing_cpu.response_logprobs``)."""
    from actfirst.rollout.sample import Sample

    samples = [Sample(context_ids=r["context"], response_ids=r["response"], loss_mask=[1] * len(r["response"]),
                      logprobs=[0.0] * len(r["response"]), weight_version=0, task=r["task"], turn=r["turn"],
                      strategy="bench") for r in records]
    for key, model_dir, t in (("old_logprobs", student_dir, temperature), ("teacher_logprobs", teacher_dir, 1.0)):
        for record, logprobs in zip(records, response_logprobs(model_dir, samples, t), strict=True):
            record[key] = logprobs


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
    torch.manual_seed(args.seed)
    student = AutoModelForCausalLM.from_pretrained(student_dir, dtype=torch.float32).eval()
    records = sample(cfg, student, AutoTokenizer.from_pretrained(student_dir), rows, args.samples_per_context)
    score(records, student_dir, teacher_dir, cfg.rollout.temperature)
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

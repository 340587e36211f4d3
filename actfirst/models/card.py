"""The model card of an export (its ``README.md``), written through ``huggingface_hub.ModelCard``: the metadata the
Hub reads (``base_model`` by Hub id, ``base_model_relation``, ``datasets``, ``license``, ``library_name``, ``tags``
and ``model-index`` with the evaluation results of the exported update, which the Hub renders), then what the model
is, how it was made and how it evaluated::

    card = model_card(checkpoint, state, dtype="bfloat16", command="python -m actfirst.export ...")
    card.save(out / "README.md")                 # ModelCard.load(out / "README.md") reads it back

The student's base and the teacher are named by Hub id and commit where they came from the Hub (a snapshot of the
Hugging Face cache names both); a teacher made by ``python -m actfirst.make_teacher`` by its directory and the Hub
id and commit of the model it was fine-tuned from. The license is the base model's (its own card's, in its
snapshot) unless given.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from actfirst.envs.benchmarks import BENCHMARKS
from actfirst.evaluation.report import EvalReport, load_report
from actfirst.models.hub import hub_name, is_hub_id, model_commit
from actfirst.rollout.strategies import STRATEGIES
from actfirst.train.plots import read_records

TEACHER_RECORD = "actfirst_teacher_sft.json"
"""What ``python -m actfirst.make_teacher`` writes into the teacher it makes (its config names the base model)."""
METRICS = {"SR": ("success_rate", "SR (%)"), "Score": ("score", "Score")}
"""The report's metrics that go into ``model-index``: (metric type, metric name)."""


def hub_origin(path: str, revision: str | None) -> tuple[str, str | None] | None:
    """(Hub id, commit) of a model named ``path`` with ``revision`` in a run's config: a Hugging Face cache
    snapshot names both; an id that was never resolved names itself; None for a local directory."""
    name = hub_name(path)
    if name is not None:
        commit = model_commit(path)
        return name, revision or commit
    if is_hub_id(path) and not Path(path).exists():
        return path, revision
    return None


def described(path: str, revision: str | None) -> str:
    """A model as the card's table names it: ``Qwen/Qwen3-8B`` at a commit, or a directory (with the Hub model a
    made teacher was fine-tuned from)."""
    origin = hub_origin(path, revision)
    if origin is not None:
        return f"`{origin[0]}`" + (f" at commit `{origin[1]}`" if origin[1] else "")
    record = Path(path) / TEACHER_RECORD
    if record.is_file():
        base = json.loads(record.read_text())["config"]["base_model"]
        return f"`{path}`: made by `actfirst.make_teacher`, fine-tuned from {described(base, None)}"
    return f"`{path}` (a local directory)"


def base_license(path: str) -> str | None:
    """The license the base model's own card states (its ``README.md`` beside its weights), if any."""
    from huggingface_hub import ModelCard

    readme = Path(path) / "README.md"
    if not readme.is_file():
        return None
    return ModelCard.load(readme, ignore_metadata_errors=True).data.license


def model_card(checkpoint: Path, state: dict[str, Any], *, dtype: str, command: str, name: str,
               license: str | None = None) -> Any:
    """The export's ``huggingface_hub.ModelCard`` (``name``: the model's name in ``model-index``; ``license``: None
    for the base model's)."""
    from huggingface_hub import ModelCard, ModelCardData

    cfg, update = state["config"], int(state["update"])
    run_dir = checkpoint.parent.parent
    base, teacher = str(cfg["student"]["model"]), str(cfg["teacher"])
    base_origin = hub_origin(base, cfg["student"].get("revision"))
    teacher_origin = hub_origin(teacher, cfg.get("teacher_revision"))
    report = update_report(run_dir, update)
    benchmark = BENCHMARKS[cfg["benchmark"]]
    data = ModelCardData(
        model_name=name, library_name="transformers", pipeline_tag="text-generation",
        license=license or base_license(base),
        base_model=base_origin[0] if base_origin else None, base_model_relation="finetune" if base_origin else None,
        datasets=(benchmark.data.hub_datasets() if benchmark.data is not None else None) or None,
        tags=["actfirst", "on-policy-distillation", "agent", cfg["benchmark"]],
        teacher_model=teacher_origin[0] if teacher_origin else None,
        eval_results=eval_results(report, cfg["benchmark"]) if report is not None else None,
    )
    body = card_body(checkpoint, cfg, update, dtype=dtype, command=command, report=report)
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}")


def update_report(run_dir: Path, update: int) -> EvalReport | None:
    """The run's evaluation report of ``update`` (None when the run did not evaluate it)."""
    rows = [row for row in read_records(run_dir / "evals.jsonl")
            if row["update"] == update and (run_dir / row["report"]).is_file()]
    return load_report(run_dir / rows[-1]["report"]) if rows else None


def eval_results(report: EvalReport, benchmark: str) -> list[Any]:
    """``model-index`` entries: each reported metric overall and per evaluation split (mean over the seeds)."""
    from huggingface_hub import EvalResult

    results = []
    for split in [None, *report.splits]:
        summary = report.summary(split=split)
        for metric in report.metrics:
            if metric not in METRICS or not _finite(summary[metric]["mean"]):
                continue
            kind, label = METRICS[metric]
            results.append(EvalResult(
                task_type="text-generation", task_name=f"{benchmark} episodes (think-then-act)",
                dataset_type=benchmark, dataset_name=benchmark, dataset_split=split or report.meta.get("split", "eval"),
                metric_type=kind, metric_name=label, metric_value=round(summary[metric]["mean"], 2)))
    return results


def card_body(checkpoint: Path, cfg: dict[str, Any], update: int, *, dtype: str, command: str,
              report: EvalReport | None) -> str:
    """The card's text: what the model is, how it was made, how it evaluated."""
    strategy = cfg["rollout"]["strategy"]
    label = STRATEGIES[strategy].label if strategy in STRATEGIES else strategy
    base = described(cfg["student"]["model"], cfg["student"].get("revision"))
    lines = [f"# {label} student on {cfg['benchmark']}", "",
             f"A student model distilled on-policy from a teacher by {label} (`rollout.strategy: {strategy}`) with "
             "ActFirst, exported from a training checkpoint.", "",
             "| | |", "|---|---|",
             f"| base model (the student at update 0) | {base} |",
             f"| teacher | {described(cfg['teacher'], cfg.get('teacher_revision'))} |",
             f"| benchmark | {cfg['benchmark']} |", f"| method | {label} (`{strategy}`) |",
             f"| updates | {update} of {cfg['num_updates']} (batches of {cfg['batch_samples']} full responses) |",
             f"| weights | {dtype} |", f"| checkpoint | `{checkpoint}` |", "",
             "## Evaluation", "", *evaluation_section(checkpoint.parent.parent, update, report), "",
             "## How it was made", "", "```bash", command or "python -m actfirst.export ...", "```", ""]
    return "\n".join(lines)


def evaluation_section(run_dir: Path, update: int, report: EvalReport | None) -> list[str]:
    """The run's evaluations (``evals.jsonl`` beside the checkpoint): SR by update, and the full table of
    ``update``'s ``report`` where the run evaluated it."""
    rows = read_records(run_dir / "evals.jsonl")
    if not rows:
        return [f"No evaluation of the run was found beside the checkpoint ({run_dir / 'evals.jsonl'})."]
    lines = ["The run's own evaluations (think-then-act, the evaluation thinking budget; mean ± sample SD over the "
             "seeds, pooled 95% Wilson interval):", "", "| update | episodes | SR (%) | SR 95% CI |",
             "|---:|---:|---:|---|"]
    for row in rows:
        s = row["summary"]
        sd = f" ± {s['SR']['sd']:.1f}" if _finite(s["SR"]["sd"]) else ""
        lo, hi = s["SR_ci95_pooled"]
        lines.append(f"| {row['update']} | {s['episodes']} | {s['SR']['mean']:.1f}{sd} | [{lo:.1f}, {hi:.1f}] |")
    if report is not None:
        lines += ["", f"At update {update} (this model):", "", report.table()]
    return lines


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)

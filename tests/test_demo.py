"""The CPU demo end to end, shortened: ``python -m actfirst.run`` on the demo config with small overrides prepares
everything from nothing (reference cache, tokenizer, teacher SFT and its evaluation, the student's warm start),
trains a few updates with evaluations, and leaves a checkpoint that transformers and vLLM both load.

Real parts throughout: ScienceWorld, the in-process vLLM engine, Qwen3-architecture models. The models are tiny and
trained for a fraction of an epoch, so this checks that every stage runs and connects, not that the demo learns
(the full demo's numbers are in bench/RESULTS.md)."""

import json
import os
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from actfirst.core.config import EVAL_TEMPERATURE

SMALL_MODEL = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
               "head_dim": 32, "intermediate_size": 128}  # vLLM CPU attention needs head_dim >= 32


def cli(module, *args, timeout=900):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", module, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    overrides = [
        f"references={root / 'refs.jsonl'}", f"teacher={root / 'teacher'}", f"student.model={root / 'student'}",
        f"prepare.build_models.teacher_dir={root / 'teacher'}", f"prepare.build_models.student_dir={root / 'student'}",
        f"out_dir={root / 'run'}", "train_tasks=4", "env.eval_variations=2", "env.max_turns=4",
        "evaluation.seeds=[42]", "evaluation.every=1", "evaluation.max_in_flight=2", "rollout.batch_tasks=2",
        "rollout.budget.first_stage=8", "rollout.budget.total=12", "rollout.budget.second_stage=4",
        "rollout.budget.eval_first_stage=8", "rollout.budget.eval_total=12", "rollout.budget.fast_action_tokens=8",
        "num_updates=2", "batch_samples=2", "num_minibatches=1", "probe_contexts=2", "checkpoint_every=1",
        "prepare.build_models.tokenizer_vocab_size=400", "rollout.max_prompt_tokens=2048", "micro_batch_tokens=4096",
        "prepare.build_models.teacher_sft.epochs=0.2", "prepare.build_models.student_sft.epochs=0.2",
        "prepare.build_models.teacher_sft.invalid_turns.variants=1",  # the teacher's second stage
        "prepare.build_models.teacher_sft.invalid_turns.max_turns=3",
        "prepare.build_models.teacher_sft.invalid_turns.epochs=0.2",
        "prepare.build_models.student_sft.inverse_dynamics_alternatives=1",  # the student's examples of other actions
    ]
    for role in ("teacher", "student"):
        overrides += [f"prepare.build_models.{role}.{k}={v}" for k, v in SMALL_MODEL.items()]
    stdout = cli("actfirst.run", *overrides)
    return root, stdout, overrides


def test_demo_prepares_trains_evaluates(demo_run):
    root, stdout, _ = demo_run
    # prepare built every input from nothing
    refs = [json.loads(line) for line in (root / "refs.jsonl").read_text().splitlines()]
    assert len(refs) == 4 and all(r["source"] == "gold" for r in refs)
    teacher_sft = json.loads((root / "teacher" / "actfirst_sft.json").read_text())
    student_sft = json.loads((root / "student" / "actfirst_sft.json").read_text())
    for sft in (teacher_sft, student_sft):
        assert sft["sft"]["modes"] == ["full_response", "next_action", "inverse_dynamics"]
        # one example per step and mode, and the student's inverse-dynamics examples of other actions (one a step)
        assert sft["examples"] == 3 * sft["steps"] + sft["inverse_dynamics_alternatives"] > 0
    assert teacher_sft["inverse_dynamics_alternatives"] == 0
    assert 0 < student_sft["inverse_dynamics_alternatives"] <= student_sft["steps"]
    assert student_sft["steps"] == teacher_sft["steps"]  # 4 training tasks: fewer than the warm start's 12
    second = teacher_sft["invalid_turns"]  # the first stage's examples and a full response per step after them
    assert second["steps"] > 0 and second["examples"] == teacher_sft["examples"] + second["steps"]
    assert len(second["epoch_losses"]) == 1 and "invalid_turns" not in student_sft
    teacher_eval = json.loads((root / "teacher" / "actfirst_eval.json").read_text())
    assert teacher_eval["summary"]["overall"]["episodes"] == 2  # 2 held-out variations x 1 type x 1 seed
    # the student and the teacher share the teacher's tokenizer (the scorer refuses anything else)
    assert (root / "student" / "tokenizer.json").read_text() == (root / "teacher" / "tokenizer.json").read_text()

    run = root / "run"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["update"] for m in metrics] == [1, 2]
    assert [m["weight_version"] for m in metrics] == [1, 2]
    evals = [json.loads(line) for line in (run / "evals.jsonl").read_text().splitlines()]
    assert [e["update"] for e in evals] == [0, 1, 2]
    assert all(e["summary"]["episodes"] == 2 for e in evals)
    assert all((run / e["report"]).is_file() for e in evals)
    # an evaluation is placed at the training time it evaluates, its own time excluded
    assert 0 <= evals[-1]["elapsed_s"] - metrics[-1]["elapsed_s"] < evals[-1]["eval_wall_s"]
    sampling = json.loads((run / evals[0]["report"]).read_text())["meta"]["rollout"]
    assert (sampling["temperature"], sampling["top_p"]) == (EVAL_TEMPERATURE, 1.0)  # evaluation's own, not training's
    assert (run / "training_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((run / "run_summary.json").read_text())
    # evaluation and the probe are not training time (C.3); the parts of one session sum to its wall-clock
    clock = summary["wall_clock"]
    parts = ("prepare_s", "train_s", "eval_s", "probe_s", "lost_s", "other_s")
    assert clock["probe_s"] > 0 and clock["eval_s"] > 0 and clock["prepare_s"] > 0 and clock["lost_s"] == 0
    assert clock["sessions"] == 1 and sum(clock[k] for k in parts) == pytest.approx(clock["total_s"])
    assert clock["eval_s"] == pytest.approx(sum(e["eval_wall_s"] for e in evals))
    assert [e["update"] for e in summary["evals"]] == [0, 1, 2]
    assert summary["teacher"]["episodes"] == 2
    change = summary["sr_change"]  # update 0 -> 2, from the two evaluations' successes
    first, last = summary["evals"][0], summary["evals"][-1]
    assert (change["from_update"], change["to_update"]) == (0, 2)
    assert change["points"] == pytest.approx(last["SR"]["mean"] - first["SR"]["mean"])
    lo, hi = change["ci95"]  # paired: the same (seed, task) episodes before and after
    assert lo <= change["points"] <= hi and change["beyond_noise"] == (lo > 0 or hi < 0)
    assert sum(change["table"].values()) == first["episodes"] and "paired" in change["method"]
    for where in ("metrics.jsonl", "training_curve.png", "checkpoints", "teacher SR", "student SR at update",
                  "SR change, update 0 -> 2"):
        assert where in stdout


def test_demo_checkpoint_loads_in_transformers_and_vllm(demo_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from actfirst.train.checkpoint import latest_checkpoint

    root = demo_run[0]
    ckpt = latest_checkpoint(root / "run")
    assert ckpt is not None and ckpt.name == "update_000002"
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    saved = load_file(ckpt / "model.safetensors")
    for name, param in model.state_dict().items():
        if name in saved:
            assert (param == saved[name]).all(), name
    assert AutoTokenizer.from_pretrained(ckpt).chat_template
    # vLLM: the evaluation command serves the checkpoint on the in-process engine and plays an episode
    report = root / "ckpt_eval.json"
    cli("actfirst.eval", "--checkpoint", str(ckpt), "--benchmark", "scienceworld", "--tasks", "1", "--seeds", "42",
        "--max-in-flight", "1", "--out", str(report), "rollout.max_prompt_tokens=1024",
        "rollout.budget.eval_first_stage=8", "rollout.budget.eval_total=12", "max_turns=2")
    data = json.loads(report.read_text())
    assert data["summary"]["overall"]["episodes"] == 1 and not data["failures"]


def test_second_run_is_refused_and_prepare_is_cached(demo_run):
    _, _, overrides = demo_run
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "actfirst.run", *overrides], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and "--resume" in proc.stderr
    out = cli("actfirst.prepare", *[o for o in overrides if not o.startswith("out_dir=")], timeout=300)
    assert "nothing to do" in out

"""A short run of the CPU demo's config (the shipped warm start, teacher and references; two updates, two evaluated
episodes per update) and what comes after it: ``python -m actfirst.eval --config`` re-evaluates its final checkpoint
on two ranks and gets the run's own final evaluation episode by episode; ``keep_best`` kept the checkpoint of the best
SR beside the newest; ``python -m actfirst.export`` makes a Hugging Face model of the checkpoint that transformers and
the engine (real vLLM) load and that gives the checkpoint's log-probs (float32 exactly, bfloat16 within its rounding).

Real parts throughout: ScienceWorld, the in-process vLLM engine, the demo's Qwen3-architecture models."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from actfirst.core.config import DEMO_CONFIG

REPO = Path(__file__).resolve().parents[1]
RUN = ["train_tasks=2", "num_updates=2", "batch_samples=2", "num_minibatches=1", "rollout.batch_tasks=2",
       "probe_contexts=0", "checkpoint_every=2", "keep_checkpoints=1", "keep_best=true", "evaluation.every=1",
       "evaluation.before=false", "evaluation.tasks=2", "evaluation.seeds=[42]", "evaluation.max_in_flight=1",
       "rollout.budget.eval_first_stage=48", "rollout.budget.eval_total=64"]
TRAINING_STATE = {"optimizer", "trainer_state.pt", "rank_00000.pt", "checkpoint.json"}
ENGINE_LOGPROBS = r'''
import asyncio, json, sys
from actfirst.core.config import EngineConfig, SchedulerConfig
from actfirst.engine.core import ActFirstEngine
from actfirst.engine.request import RequestKind, SamplingSpec

async def main(model, prompt):
    engine = ActFirstEngine.from_config(EngineConfig(model=model, dtype="float32", max_model_len=256,
                                                     max_num_seqs=4, max_num_batched_tokens=256, kv_cache_gib=1),
                                        SchedulerConfig(b_max=4))
    out = await engine.generate(prompt, RequestKind.FULL_RESPONSE,
                                SamplingSpec(max_tokens=12, temperature=1.0, seed=7, ignore_eos=True))
    await engine.shutdown()
    print("RESULT " + json.dumps({"tokens": out.token_ids, "logprobs": out.logprobs}))

asyncio.run(main(sys.argv[1], json.loads(sys.argv[2])))
'''


def cli(*args, env=None, timeout=900, status=0):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)
    assert proc.returncode == status, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo_short") / "run"
    cli("-m", "actfirst.run", "--config", str(DEMO_CONFIG), f"out_dir={out}", *RUN)
    return out


def episodes(report: Path) -> list[dict]:
    return json.loads(report.read_text())["episodes"]


def test_eval_with_the_run_config_reproduces_the_runs_final_evaluation(run, tmp_path):
    evals = [json.loads(line) for line in (run / "evals.jsonl").read_text().splitlines()]
    assert [e["update"] for e in evals] == [1, 2]
    final = run / evals[-1]["report"]
    report = tmp_path / "again.json"
    # the run's last checkpoint by name (update_000002), on two ranks: each its own engine on one of the two
    # episodes, rank 0 merges
    cli("-m", "actfirst.eval", "--config", str(run / "config.json"), "--checkpoint", "latest", "--out", str(report),
        "--nproc-per-node", "2")
    ours, theirs = json.loads(report.read_text()), json.loads(final.read_text())
    # the same sampling, budgets and environment, taken from the run's config (not the command's own defaults)
    assert ours["meta"]["rollout"] == theirs["meta"]["rollout"] and ours["meta"]["env"] == theirs["meta"]["env"]
    assert ours["meta"]["rollout"]["temperature"] == 0.6 and ours["meta"]["rollout"]["max_prompt_tokens"] == 1024
    assert ours["meta"]["shards"] == 2 and len(ours["episodes"]) == 2
    for mine, run_own in zip(ours["episodes"], theirs["episodes"], strict=True):
        assert mine == run_own  # task, seed, actions, every response's tokens (hashes and lengths), outcome
    # overrides are the run config's keys, checked before any engine starts; the two modes do not mix
    proc = cli("-m", "actfirst.eval", "--config", str(run / "config.json"), "--checkpoint",
               str(run / "checkpoints" / "update_000002"), "student.max_model_len=5000",
               "student.max_num_batched_tokens=8192", status=2)
    assert "student.max_model_len=5000 exceeds the model's max_position_embeddings=4096" in proc.stderr
    proc = cli("-m", "actfirst.eval", "--config", str(run / "config.json"), "--benchmark", "scienceworld",
               "--checkpoint", str(run / "checkpoints" / "update_000002"), status=2)
    assert "give --config (a training run's config) or --benchmark" in proc.stderr


def test_keep_best_keeps_the_best_checkpoint_beside_the_newest(run):
    root = run / "checkpoints"
    evals = [json.loads(line) for line in (run / "evals.jsonl").read_text().splitlines()]
    srs = {e["update"]: e["summary"]["SR"]["mean"] for e in evals}
    best = min(srs, key=lambda u: (-srs[u], u))  # the highest SR, the earlier of equal ones
    assert json.loads((root / "best").read_text()) == {"checkpoint": f"update_{best:06d}", "update": best,
                                                       "SR": srs[best]}
    # checkpoint_every=2, yet update 1 was checkpointed for its evaluation; only the best and the newest stay
    assert sorted(p.name for p in root.glob("update_*")) == sorted({f"update_{best:06d}", "update_000002"})
    assert (root / "latest").read_text().strip() == "update_000002"
    # what eval --checkpoint and export take by name
    from actfirst.core.user_input import ConfigError
    from actfirst.eval import main as eval_main
    from actfirst.train.checkpoint import named_checkpoint

    assert named_checkpoint(root / "best", "--checkpoint") == root / f"update_{best:06d}"
    assert named_checkpoint(root / "latest", "--checkpoint") == root / "update_000002"
    assert named_checkpoint(root / "update_000002", "--checkpoint") == root / "update_000002"
    with pytest.raises(ConfigError, match=r"recorded no best checkpoint \(it keeps one only with keep_best: true"):
        named_checkpoint(run.parent / "elsewhere" / "checkpoints" / "best", "--checkpoint")
    assert eval_main(["--checkpoint", "best", "--benchmark", "scienceworld"]) == 2  # no run to take it from


@pytest.fixture(scope="module")
def exports(run, tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    ckpt = run / "checkpoints" / "update_000002"
    cli("-m", "actfirst.export", str(ckpt), "--out", str(root / "f32"))
    cli("-m", "actfirst.export", str(run / "checkpoints" / "latest"), "--out", str(root / "bf16"), "--dtype",
        "bfloat16", "--license", "apache-2.0")
    return ckpt, root / "f32", root / "bf16"


def test_export_is_a_model_without_training_state(exports):
    from transformers import AutoTokenizer

    ckpt, f32, bf16 = exports
    for out, dtype in ((f32, "float32"), (bf16, "bfloat16")):
        names = {p.name for p in out.iterdir()}
        assert not names & TRAINING_STATE and not [n for n in names if n.startswith(".")], names
        assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", "README.md"} <= names
        config = json.loads((out / "config.json").read_text())
        assert config["dtype"] == config["torch_dtype"] == dtype
        assert AutoTokenizer.from_pretrained(out).chat_template == AutoTokenizer.from_pretrained(ckpt).chat_template
        assert {str(t.dtype) for t in load_file(out / "model.safetensors").values()} == {f"torch.{dtype}"}
    saved = load_file(ckpt / "model.safetensors")
    assert all(torch.equal(saved[k], t) for k, t in load_file(f32 / "model.safetensors").items())
    assert all(torch.equal(saved[k].to(torch.bfloat16), t) for k, t in load_file(bf16 / "model.safetensors").items())
    card = (bf16 / "README.md").read_text()
    for text in ("assets/demo/student-warmstart", "assets/demo/teacher", "scienceworld", "ActFirst-OPD (`actfirst`)",
                 "| updates | 2 of 2", "| 1 | 2 |", "| 2 | 2 |", "At update 2 (this model)", "| Overall | 2 |",
                 f"python -m actfirst.export {ckpt.parent / 'latest'} --out {bf16} --dtype bfloat16"):
        assert text in card, text
    # the Hub's reading of it: metadata and model-index with this update's evaluation (the run's own report)
    from huggingface_hub import ModelCard

    loaded = ModelCard.load(bf16 / "README.md")
    assert "model-index" in loaded.content and loaded.data.license == "apache-2.0"
    assert loaded.data.model_name == "bf16" and loaded.data.library_name == "transformers"
    report = json.loads((ckpt.parents[1] / "evals" / "update_000002.json").read_text())["summary"]["overall"]
    results = {(r.metric_type, r.dataset_split): r.metric_value for r in loaded.data.eval_results}
    assert results == {("success_rate", "eval"): round(report["SR"]["mean"], 2),
                       ("score", "eval"): round(report["Score"]["mean"], 2)}


def logprobs(model_dir, ids, dtype):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_export_gives_the_checkpoints_logprobs_in_transformers_and_the_engine(exports):
    from transformers import AutoTokenizer

    ckpt, f32, bf16 = exports
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Your task is to find the animal with the "
                                          "longest life span. Go outside first."}], tokenize=False,
                                         add_generation_prompt=True)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    # the engine serves the float32 export: its sampled tokens' log-probs are the checkpoint's (transformers)
    out = cli("-c", ENGINE_LOGPROBS, str(f32), json.dumps(prompt), timeout=600).stdout
    served = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
    ids = prompt + served["tokens"]
    reference = logprobs(ckpt, ids, torch.float32)
    assert torch.allclose(torch.tensor(served["logprobs"]), reference[len(prompt) - 1:], atol=1e-4)
    assert torch.equal(logprobs(f32, ids, torch.float32), reference)
    # bfloat16 (weights and compute): within its rounding (8 bits of mantissa: about 0.4% of each weight and
    # activation); measured on 2026-12-03: at most 0.025 nat, 0.005 on average, over log-probs down to -11.5
    diff = (logprobs(bf16, ids, torch.bfloat16) - reference).abs()
    assert diff.max() < 0.1 and diff.mean() < 0.02, diff


def test_export_refusals(run, tmp_path):
    ckpt = run / "checkpoints" / "update_000002"
    warm = REPO / "assets" / "demo" / "student-warmstart"
    proc = cli("-m", "actfirst.export", str(warm), "--out", str(tmp_path / "x"), status=2)
    assert "not a complete training checkpoint (no checkpoint.json)" in proc.stderr and not (tmp_path / "x").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    proc = cli("-m", "actfirst.export", str(ckpt), "--out", str(tmp_path / "full"), status=2)
    assert "--out=" in proc.stderr and "exists and is not an empty directory" in proc.stderr
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]
    # --push-to-hub: refused before any work when offline or without a token (no network or token here)
    hub = ["-m", "actfirst.export", str(ckpt), "--out", str(tmp_path / "y"), "--push-to-hub", "someone/demo"]
    proc = cli(*hub, env={"HF_HUB_OFFLINE": "1"}, status=2)
    assert "--push-to-hub='someone/demo': the Hub is offline here" in proc.stderr
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0", "HF_TOKEN": ""}
    proc = cli(*hub, env=env, status=2)
    assert "--push-to-hub='someone/demo': no Hugging Face token" in proc.stderr
    assert not (tmp_path / "y").exists()


def test_the_model_card_names_the_base_and_the_teacher_by_hub_id_and_commit(tmp_path):
    """A student resolved from the Hub runs from its cache snapshot; the card names the id and the commit, not the
    snapshot's path, takes the base's license from its own card, and names a teacher made by make_teacher by its
    directory and the Hub model it was fine-tuned from."""
    from huggingface_hub import ModelCard

    from actfirst.models.card import TEACHER_RECORD, model_card

    def snapshot(name: str, commit: str) -> Path:
        path = tmp_path / "hub" / f"models--{name.replace('/', '--')}" / "snapshots" / commit
        path.mkdir(parents=True)
        return path

    student, teacher_base = "0123456789abcdef0123456789abcdef01234567", "89abcdef0123456789abcdef0123456789abcdef"
    base = snapshot("Qwen/Qwen3-1.7B", student)
    (base / "README.md").write_text("---\nlicense: apache-2.0\n---\n# Qwen3-1.7B\n")
    teacher = tmp_path / "teachers" / "alfworld"
    teacher.mkdir(parents=True)
    (teacher / TEACHER_RECORD).write_text(json.dumps({"config": {"base_model": str(snapshot("Qwen/Qwen3-8B",
                                                                                            teacher_base))}}))
    state = {"update": 3, "config": {"student": {"model": str(base), "revision": student}, "teacher": str(teacher),
                                     "teacher_revision": None, "benchmark": "search", "num_updates": 9,
                                     "batch_samples": 8, "rollout": {"strategy": "actfirst"}}}
    card = model_card(tmp_path / "run" / "checkpoints" / "update_000003", state, dtype="bfloat16", command="",
                      name="student")
    card.save(tmp_path / "README.md")
    loaded = ModelCard.load(tmp_path / "README.md")
    assert loaded.data.base_model == "Qwen/Qwen3-1.7B" and loaded.data.license == "apache-2.0"
    assert loaded.data.datasets == ["PeterJinGo/wiki-18-corpus", "PeterJinGo/wiki-18-e5-index",
                                    "RUC-NLPIR/FlashRAG_datasets"]
    text = loaded.content
    assert f"| `Qwen/Qwen3-1.7B` at commit `{student}` |" in text and str(base) not in text
    assert f"fine-tuned from `Qwen/Qwen3-8B` at commit `{teacher_base}`" in text
    assert "model-index" not in text  # the run evaluated nothing: no results to claim
    # a teacher from the Hub by its id and commit
    state["config"].update(teacher=str(snapshot("Qwen/Qwen3-32B", teacher_base)), teacher_revision=teacher_base)
    card = model_card(tmp_path / "run" / "checkpoints" / "update_000003", state, dtype="bfloat16", command="",
                      name="student")
    assert card.data.teacher_model == "Qwen/Qwen3-32B" and f"`Qwen/Qwen3-32B` at commit `{teacher_base}`" in str(card)


def test_the_trackers_get_every_evaluation_at_its_update(run):
    """TensorBoard (``report_to``'s default) holds each evaluation's SR at the update it evaluated, as evals.jsonl."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from actfirst.train.trackers import TensorBoardTracker

    rows = [json.loads(line) for line in (run / "evals.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(TensorBoardTracker.log_dir(run)), size_guidance={"scalars": 0})
    events.Reload()
    logged = {e.step: e.value for e in events.Scalars("eval/SR/mean")}
    assert logged == pytest.approx({r["update"]: r["summary"]["SR"]["mean"] for r in rows}) and len(rows) == 2
    assert "eval/eval_wall_s" in events.Tags()["scalars"]

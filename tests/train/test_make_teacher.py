"""``python -m actfirst.make_teacher`` on this CPU: a tiny Qwen3-architecture base model fine-tuned on the replayed
trajectories of generated ALFWorld games (the reference cache plus a candidate file with thoughts, a failing
candidate and one of an unknown task), with configs/teacher/tiny-cpu.yaml.

- One rank: the loss falls; the teacher directory loads with transformers and its log-probs give the NLL the trained
  (FSDP2) model recorded; the filter and the thoughts reach the data.
- Two ranks (gloo, through the elastic launcher, activation checkpointing on), killed with SIGKILL after a
  checkpoint and run again: the rerun continues from the checkpoint and ends with the weights one uninterrupted rank
  trains.
- Bad input: one line naming the key, exit status 2.

The replayed data is built once (``ensure_examples``) and copied into each run's directory, as a rerun finds it.
"""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from actfirst.core.user_input import ConfigError
from actfirst.make_teacher import main
from actfirst.teacher.sft import CONFIG as RUN_CONFIG
from actfirst.teacher.sft import DATA, EXAMPLES, RECORD, ensure_examples, load_teacher_config

CONFIG = str(Path(__file__).parents[2] / "configs" / "teacher" / "tiny-cpu.yaml")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
TIMEOUT_S = 600
THOUGHT = "I follow the plan I know for this task, step"


@pytest.fixture(scope="module")
def overrides(tiny_run_config, tiny_model_dir, tmp_path_factory):
    """The tiny config's paths: the tiny model, the tiny run's games and references, and a candidate file."""
    root = tmp_path_factory.mktemp("make_teacher")
    refs = [json.loads(line) for line in Path(tiny_run_config["references"]).read_text().splitlines()]
    lines = [{"task": r["task"], "actions": r["actions"], "thoughts": [f"{THOUGHT} {i}." for i in
                                                                       range(len(r["actions"]))]} for r in refs[:2]]
    lines.append({"task": refs[2]["task"], "actions": refs[2]["actions"][:-1]})  # stops short of success
    lines.append({"task": "no/such/task", "actions": ["look"]})
    candidates = root / "candidates.jsonl"
    candidates.write_text("".join(json.dumps(line) + "\n" for line in lines))
    env = tiny_run_config["env"]
    return [f"base_model={tiny_model_dir}", f"references={tiny_run_config['references']}",
            f"candidate_files=[{candidates}]", f"env.generated_dir={env['generated_dir']}"]


@pytest.fixture(scope="module")
def data(overrides, tmp_path_factory):
    """The run's data directory (config, data record, samples), built once."""
    cfg = load_teacher_config(CONFIG, [*overrides, f"out={tmp_path_factory.mktemp('data') / 'teacher'}"])
    ensure_examples(cfg)
    return cfg.work_dir


def with_data(data: Path, out: Path) -> None:
    """``out``'s run directory holding the data (a run then skips the replay)."""
    work = out.with_name(f"{out.name}.partial")
    work.mkdir(parents=True)
    for name in (RUN_CONFIG, DATA, EXAMPLES):
        shutil.copy(data / name, work / name)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "actfirst.make_teacher", "--config", CONFIG, *args], env=ENV,
                          capture_output=True, text=True, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def one_rank(overrides, data, tmp_path_factory):
    """One rank, in this process: the teacher directory and what the command printed."""
    out = tmp_path_factory.mktemp("one") / "teacher"
    with_data(data, out)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["--config", CONFIG, *overrides, f"out={out}"]) == 0
    return out, printed.getvalue()


def test_one_rank_lowers_the_loss_and_writes_a_teacher_transformers_loads(one_rank, data, overrides):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from actfirst.teacher.data import Examples

    out, stdout = one_rank
    assert "ETA" in stdout and f"done: {out}" in stdout
    assert not out.with_name(f"{out.name}.partial").exists()
    record = json.loads((out / RECORD).read_text())
    probe = record["probe_nll"]
    print(f"probe NLL {probe['before']:.3f} -> {probe['after']:.3f}; epoch losses {record['epoch_losses']}")
    assert probe["after"] < 0.7 * probe["before"]
    assert record["epoch_losses"][-1] < record["epoch_losses"][0]
    sources = record["data"]["sources"]
    candidates = sources["candidates:candidates.jsonl"]
    assert candidates == {"given": 4, "kept": 2, "filtered": 1, "unknown_task": 1}, sources
    assert record["data"]["with_own_thoughts"] == 2
    assert {"model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja"} <= {p.name for p in
                                                                                            out.iterdir()}
    # The published weights reproduce the trained model's NLL on the probe samples through ordinary logits.
    cfg = load_teacher_config(CONFIG, [*overrides, f"out={out}"])
    examples = Examples(data / EXAMPLES)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    n = len(examples)
    nll, tokens = 0.0, 0
    with torch.no_grad():
        for i in [k * n // cfg.probe_samples for k in range(cfg.probe_samples)]:
            s = examples.sample(i)
            ids = torch.tensor([s.context_ids + s.response_ids])
            logits = model(ids).logits[0, len(s.context_ids) - 1:-1]
            nll += float(F.cross_entropy(logits.float(), torch.tensor(s.response_ids), reduction="sum"))
            tokens += len(s.response_ids)
    assert nll / tokens == pytest.approx(probe["after"], rel=1e-5)
    # The thoughts of the candidate file are in the full responses of its tasks.
    tokenizer = AutoTokenizer.from_pretrained(out)
    texts = [tokenizer.decode(examples.sample(i).response_ids) for i in range(n)]
    refs_path = next(o.split("=", 1)[1] for o in overrides if o.startswith("references="))
    refs = [json.loads(line) for line in Path(refs_path).read_text().splitlines()]
    assert sum(THOUGHT in t for t in texts) == len(refs[0]["actions"]) + len(refs[1]["actions"])
    assert all(t.startswith("<think>") and "</think>" in t and "<action>" in t for t in texts)


def test_two_ranks_killed_and_rerun_end_with_what_one_rank_trains(one_rank, data, overrides, tmp_path):
    out = tmp_path / "teacher"
    with_data(data, out)
    latest = out.with_name("teacher.partial") / "checkpoints" / "latest"
    log = tmp_path / "killed.log"
    args = ["--nproc-per-node", "2", *overrides, f"out={out}", "checkpoint_every=1", "activation_checkpointing=true"]
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "actfirst.make_teacher", "--config", CONFIG, *args], env=ENV,
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.perf_counter() + TIMEOUT_S
    while not latest.exists():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.perf_counter() < deadline, log.read_text()[-3000:]
        time.sleep(0.01)
    launcher = psutil.Process(proc.pid)
    for process in [launcher, *launcher.children(recursive=True)]:  # the launcher and both ranks
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    proc.wait(timeout=60)
    assert not out.exists(), "the run finished before the kill"

    rerun = run(*args)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert "resume: " in rerun.stdout and "on 2 rank(s)" in rerun.stdout
    one, two = json.loads((one_rank[0] / RECORD).read_text()), json.loads((out / RECORD).read_text())
    assert two["world_size"] == 2 and two["optimizer_steps"] == one["optimizer_steps"]
    assert two["step_losses"] == pytest.approx(one["step_losses"], rel=1e-4)
    a, b = load_file(one_rank[0] / "model.safetensors"), load_file(out / "model.safetensors")
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    print(f"2 ranks, killed and rerun, vs 1 rank: largest weight difference {worst:.2e} after "
          f"{one['optimizer_steps']} steps")
    assert worst < 1e-4
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["--config", CONFIG, *overrides, f"out={out}"]) == 0
    assert "nothing to do" in printed.getvalue()


@pytest.mark.parametrize("changes, message", [
    (["references=null", "candidate_files=[]"], "references=None: give a reference cache, candidate_files, or both"),
    (["min_score=150"], "min_score=150.0: must be on [0, 100]"),
    (["epochs=0"], "epochs=0.0: must be > 0"),
    (["optim.lr=-1"], "optim.lr=-1.0: must be > 0"),
    (["modes=[full_response, full_response]"], "modes=['full_response', 'full_response']: need distinct modes"),
])
def test_bad_input_is_one_line_naming_the_key(overrides, tmp_path, capsys, changes, message):
    keys = {c.split("=")[0] for c in changes}
    keep = [o for o in overrides if o.split("=")[0] not in keys]
    assert main(["--config", CONFIG, *keep, f"out={tmp_path / 't'}", *changes]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "t.partial").exists()


def test_an_out_that_is_something_else_is_refused(overrides, tmp_path, capsys):
    (tmp_path / "t").mkdir()
    assert main(["--config", CONFIG, *overrides, f"out={tmp_path / 't'}"]) == 2
    assert "is not a teacher made by python -m actfirst.make_teacher" in capsys.readouterr().err


def test_the_plan_covers_every_sample_once_per_epoch_and_the_ranks_split_each_step():
    from actfirst.teacher.sft import batch_plan, rank_share

    lengths = [7, 30, 12, 5, 50, 9, 21, 3, 14, 8]
    plan = batch_plan(lengths, batch_tokens=40, epochs=2.5, seed=3)
    for epoch in (0, 1):
        seen = sorted(i for e, step in plan if e == epoch for i in step)
        assert seen == list(range(len(lengths)))
    assert {e for e, _ in plan} == {0, 1, 2}
    assert 0 < sum(e == 2 for e, _ in plan) < sum(e == 0 for e, _ in plan)
    assert all(sum(lengths[i] for i in step) <= 40 or len(step) == 1 for _, step in plan)
    assert plan != batch_plan(lengths, batch_tokens=40, epochs=2.5, seed=4)
    for _, step in plan:
        shares = [rank_share(step, lengths, r, 3) for r in range(3)]
        assert sorted(i for s in shares for i in s) == sorted(step)


def test_a_training_config_gives_the_benchmark_env_and_references(tmp_path, alfworld_data):
    train = str(Path(CONFIG).parents[1] / "train" / "alfworld" / "qwen3-1.7b.yaml")
    teacher = str(Path(CONFIG).with_name("alfworld-qwen3-8b-sft.yaml"))
    refs = tmp_path / "refs.jsonl"
    refs.write_text("")
    (tmp_path / "model").mkdir()
    cfg = load_teacher_config(teacher, [f"base_model={tmp_path / 'model'}", f"references={refs}"], train_config=train)
    assert cfg.benchmark == "alfworld" and cfg.env.max_turns == 30 and cfg.references == str(refs)
    with pytest.raises(ConfigError, match="references='runs/refs/alfworld.jsonl': no such file"):
        load_teacher_config(teacher, [f"base_model={tmp_path / 'model'}"], train_config=train)  # the run's cache
    with pytest.raises(ConfigError, match="sets benchmark, which --train-config="):
        load_teacher_config(CONFIG, [], train_config=train)


def test_env_overrides_reach_the_training_configs_env_before_it_loads(tmp_path, monkeypatch):
    """Without ALFWorld's games (no $ALFWORLD_DATA, an empty HOME) the paper config's games: real would be refused;
    env.* overrides apply to the training config's env as the run's own overrides would."""
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    train = str(Path(CONFIG).parents[1] / "train" / "alfworld" / "qwen3-1.7b.yaml")
    refs = tmp_path / "refs.jsonl"
    refs.write_text("")
    (tmp_path / "model").mkdir()
    cfg = load_teacher_config(str(Path(CONFIG).with_name("alfworld-qwen3-8b-sft.yaml")),
                              [f"base_model={tmp_path / 'model'}", f"references={refs}", "env.games=generated",
                               f"env.generated_dir={tmp_path / 'games'}"], train_config=train)
    assert cfg.env.games == "generated" and cfg.env.generated_dir == str(tmp_path / "games")
    assert cfg.env.max_turns == 30  # the rest of the training config's env

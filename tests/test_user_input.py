"""Bad input at every command's door: one line on stderr naming the argument and its value, exit status 2, and
nothing written where the run would have written (issue 19). Each case is what a user could type; the checks run
before any engine, JVM or model load."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from actfirst.core.config import DEMO_CONFIG, ConfigError
from actfirst.core.user_input import check_model_dir, check_writable_dir, check_writable_file

ROOT = Path(__file__).resolve().parents[1]
TEACHER = ROOT / "assets" / "demo" / "teacher"
REFERENCES = ROOT / "assets" / "demo" / "references.jsonl"


def one_line(capsys, prog: str) -> str:
    """The single stderr line a refused command printed (asserting that it is single and names the command)."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"python -m {prog}: error: "), err
    return err[0]


@pytest.fixture
def out_dir(tmp_path) -> Path:
    return tmp_path / "run"


@pytest.fixture
def config_only_model(tmp_path) -> Path:
    """A directory holding only a model's config.json (no tokenizer, no weights)."""
    model = tmp_path / "config-only"
    model.mkdir()
    shutil.copy(TEACHER / "config.json", model)
    return model


@pytest.fixture
def weightless_model(tmp_path) -> Path:
    """A model directory with its config and tokenizer but no weights."""
    model = tmp_path / "weightless"
    shutil.copytree(TEACHER, model, ignore=shutil.ignore_patterns("*.safetensors"))
    return model


def run_main(capsys, *args: str) -> tuple[int, str]:
    from actfirst.run import main

    status = main(list(args))
    return status, one_line(capsys, "actfirst.run")


def test_a_missing_config_file(capsys, out_dir):
    status, line = run_main(capsys, "--config", "/nonexistent.yaml", f"out_dir={out_dir}")
    assert status == 2 and "--config='/nonexistent.yaml': no such file" in line
    assert not out_dir.exists()


def test_a_directory_as_the_config(capsys, tmp_path):
    status, line = run_main(capsys, "--config", str(tmp_path))
    assert status == 2 and f"--config={str(tmp_path)!r}: is a directory, not a file" in line


def test_a_config_that_is_not_text(capsys, tmp_path):
    binary = tmp_path / "model.safetensors"
    binary.write_bytes(bytes(range(256)) * 4)
    status, line = run_main(capsys, "--config", str(binary))
    assert status == 2 and f"--config={str(binary)!r}: is not a text file" in line


def test_malformed_yaml_names_the_file_and_where(capsys, tmp_path, out_dir):
    bad = tmp_path / "bad.yaml"
    bad.write_text("benchmark: scienceworld\nstudent:\n  model: [unclosed\n")
    status, line = run_main(capsys, "--config", str(bad), f"out_dir={out_dir}")
    assert status == 2 and f"--config={str(bad)!r}: not valid YAML at line 4" in line, line
    assert not out_dir.exists()


def test_a_config_whose_top_level_is_not_a_mapping(capsys, tmp_path):
    bad = tmp_path / "list.yaml"
    bad.write_text("- a\n- b\n")
    status, line = run_main(capsys, "--config", str(bad))
    assert status == 2 and "the top level must be a mapping, not list" in line


def test_a_malformed_override_value(capsys, out_dir):
    status, line = run_main(capsys, "rollout.temperature=[1,", f"out_dir={out_dir}")
    assert status == 2 and "override 'rollout.temperature=[1,': not valid YAML" in line
    assert not out_dir.exists()


def test_references_with_a_broken_line_and_no_metadata(capsys, tmp_path, out_dir):
    refs = tmp_path / "refs.jsonl"
    refs.write_text(REFERENCES.read_text().splitlines()[0] + "\n{broken\n")
    status, line = run_main(capsys, f"references={refs}", f"student.model={TEACHER}", f"out_dir={out_dir}")
    assert status == 2 and f"references={str(refs)!r}: no refs.jsonl.meta.json beside it" in line, line
    assert not out_dir.exists()


def test_references_with_a_broken_line(capsys, tmp_path, out_dir):
    refs = tmp_path / "refs.jsonl"
    lines = REFERENCES.read_text().splitlines()
    refs.write_text("\n".join(lines[:3] + ["{broken"] + lines[3:]) + "\n")
    shutil.copy(f"{REFERENCES}.meta.json", f"{refs}.meta.json")
    status, line = run_main(capsys, f"references={refs}", f"student.model={TEACHER}", f"out_dir={out_dir}")
    assert status == 2 and f"references={str(refs)!r}: line 4 is not JSON" in line, line
    assert not out_dir.exists()


def test_references_lines_that_are_not_references(capsys, tmp_path, out_dir):
    refs = tmp_path / "refs.jsonl"
    refs.write_text(json.dumps({"task": "x", "actions": "look"}) + "\n")
    shutil.copy(f"{REFERENCES}.meta.json", f"{refs}.meta.json")
    status, line = run_main(capsys, f"references={refs}", f"student.model={TEACHER}", f"out_dir={out_dir}")
    assert status == 2 and f"references={str(refs)!r}: line 1 is not a reference" in line, line


def test_a_reference_cache_of_another_benchmark(capsys, tmp_path, out_dir):
    refs = tmp_path / "refs.jsonl"
    shutil.copy(REFERENCES, refs)
    meta = json.loads(Path(f"{REFERENCES}.meta.json").read_text())
    Path(f"{refs}.meta.json").write_text(json.dumps({**meta, "benchmark": "alfworld"}))
    status, line = run_main(capsys, f"references={refs}", f"student.model={TEACHER}", f"out_dir={out_dir}")
    assert status == 2 and "a cache of benchmark 'alfworld', not of 'scienceworld'" in line, line
    assert not out_dir.exists()


def test_a_reference_cache_of_another_config(capsys, out_dir):
    refs = f"references={str(REFERENCES.relative_to(ROOT))!r}"
    status, line = run_main(capsys, "env.simplification=teleportAction", f"student.model={TEACHER}",
                            f"out_dir={out_dir}")
    assert status == 2 and f"{refs}: built under another scienceworld config" in line and \
        "simplification: cache 'easy', run 'teleportAction'" in line, line
    status, line = run_main(capsys, "env.max_turns=2", f"student.model={TEACHER}", f"out_dir={out_dir}")
    assert status == 2 and f"{refs}: built under max_turns=12; its reference of task" in line and \
        "does not fit the run's max_turns=2" in line, line
    assert not out_dir.exists()


def test_a_reference_cache_that_misses_training_tasks(capsys, tmp_path, out_dir):
    refs = tmp_path / "refs.jsonl"
    refs.write_text("\n".join(REFERENCES.read_text().splitlines()[:10]) + "\n")
    shutil.copy(f"{REFERENCES}.meta.json", f"{refs}.meta.json")
    status, line = run_main(capsys, f"references={refs}", f"student.model={TEACHER}", f"out_dir={out_dir}")
    assert status == 2 and "no reference for 52 of the 62 training tasks" in line, line


def test_a_partial_reference_cache(capsys, tmp_path, out_dir):
    refs = tmp_path / "refs.jsonl"
    shutil.copy(REFERENCES, refs)
    meta = json.loads(Path(f"{REFERENCES}.meta.json").read_text())
    Path(f"{refs}.meta.json").write_text(json.dumps({**meta, "covered": 61, "coverage": 61 / 62,
                                                     "missing": ["lifespan-longest-lived/7"]}))
    status, line = run_main(capsys, f"references={refs}", f"student.model={TEACHER}", f"out_dir={out_dir}")
    assert status == 2 and "coverage 98.4% (61/62)" in line, line


def test_a_student_directory_with_only_a_config_blames_the_student(capsys, config_only_model, out_dir):
    status, line = run_main(capsys, f"student.model={config_only_model}", f"out_dir={out_dir}")
    assert status == 2 and f"student.model={str(config_only_model)!r}: has no tokenizer" in line, line
    assert "teacher" not in line
    assert not out_dir.exists()


def test_a_student_without_weights(capsys, weightless_model, out_dir):
    status, line = run_main(capsys, f"student.model={weightless_model}", f"out_dir={out_dir}")
    assert status == 2 and f"student.model={str(weightless_model)!r}: has no weights" in line, line


def test_a_teacher_that_is_not_a_model_directory(capsys, tmp_path, out_dir):
    status, line = run_main(capsys, f"student.model={TEACHER}", f"teacher={tmp_path}", f"out_dir={out_dir}")
    assert status == 2 and f"teacher={str(tmp_path)!r}: has no config.json" in line, line


def test_a_teacher_with_another_tokenizer(capsys, tmp_path, tiny_model_dir, out_dir):
    status, line = run_main(capsys, f"student.model={tiny_model_dir}", f"out_dir={out_dir}")
    assert status == 2 and f"teacher={str(TEACHER.relative_to(ROOT))!r}: its tokenizer differs from the " \
                           f"student's (student.model={str(tiny_model_dir)!r}): vocab" in line, line
    assert not out_dir.exists()


@pytest.fixture
def offline(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache and ``HF_HUB_OFFLINE=1`` (environment and huggingface_hub's constants); the
    working directory is ``tmp_path``, where a model built in place of a named one would appear."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    return cache


@pytest.mark.parametrize("prog", ["actfirst.run", "actfirst.prepare"])
def test_a_hub_id_not_cached_offline_on_the_demo_config_is_refused_not_built(capsys, offline, tmp_path, prog):
    """The demo config builds models only into its own directories: a named model that is not found is refused in
    one line naming it, and nothing is built in its place (issue 35)."""
    import importlib

    args = ["student.model=road-test/no-such-model", f"teacher={TEACHER}", f"references={REFERENCES}",
            f"out_dir={tmp_path / 'run'}"]
    assert importlib.import_module(prog).main(args) == 2
    line = one_line(capsys, prog)
    assert line.endswith("student.model='road-test/no-such-model': not a local directory and not in the Hugging Face "
                         f"cache ({offline}; HF_HUB_OFFLINE=1); download it with `hf download road-test/no-such-model`"
                         ", or name a local directory"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == [], list(tmp_path.iterdir())  # no road-test/, no run/


def test_the_demo_builds_only_into_its_own_directories(tmp_path):
    from actfirst.preparation.build import check_inputs, load_run_config, models_to_build

    built = [f"prepare.build_models.teacher_dir={tmp_path / 't'}", f"prepare.build_models.student_dir={tmp_path / 's'}"]
    named = [f"teacher={tmp_path / 't'}", f"student.model={tmp_path / 's'}", f"out_dir={tmp_path / 'run'}"]
    assert models_to_build(load_run_config(None, named + built)) == ["teacher", "student.model"]
    assert models_to_build(load_run_config(None, named + built[:1])) == ["teacher"]
    cfg = load_run_config(None, named)  # the demo's own directories are elsewhere: nothing is built here
    assert models_to_build(cfg) == []
    with pytest.raises(ConfigError, match=rf"^student.model={str(tmp_path / 's')!r}: no such directory$"):
        check_inputs(cfg, buildable=True)
    with pytest.raises(ConfigError, match=r"^prepare.build_models.teacher_dir=None: build_models needs teacher_dir or "
                                          r"student_dir"):
        load_run_config(None, ["prepare.build_models.teacher_dir=null", "prepare.build_models.student_dir=null"])


def test_a_revision_of_a_local_directory_is_refused(capsys, out_dir):
    status, line = run_main(capsys, f"student.model={TEACHER}", "student.revision=v1", f"out_dir={out_dir}")
    assert status == 2 and line.endswith(f"student.revision='v1': student.model={str(TEACHER)!r} is a local "
                                         f"directory, which has no revisions (a revision picks a version of a "
                                         f"Hugging Face Hub id)"), line


def test_a_model_that_is_neither_a_directory_nor_a_hub_id(capsys, out_dir):
    status, line = run_main(capsys, "teacher=/models/qwen3-8b-teacher", f"out_dir={out_dir}")
    assert status == 2 and line.endswith("teacher='/models/qwen3-8b-teacher': no such directory, and not a Hugging "
                                         "Face Hub id (owner/name)"), line
    assert not out_dir.exists()


def test_eval_a_hub_checkpoint_not_cached_offline(capsys, offline):
    from actfirst.eval import main

    assert main(["--checkpoint", "road-test/no-such-model", "--revision", "v2", "--benchmark", "scienceworld"]) == 2
    line = one_line(capsys, "actfirst.eval")
    assert "--checkpoint='road-test/no-such-model': not a local directory and not in the Hugging Face cache" in line
    assert "`hf download road-test/no-such-model --revision v2`" in line, line


@pytest.mark.parametrize("where,why", [("/proc/forbidden", "cannot be written (in '/proc')"),
                                       ("FILE/run", "which is not a directory")])
def test_an_out_dir_that_cannot_be_made(capsys, tmp_path, where, why):
    (tmp_path / "FILE").write_text("a file")
    where = where.replace("FILE", str(tmp_path / "FILE"))
    status, line = run_main(capsys, f"student.model={TEACHER}", f"out_dir={where}")
    assert status == 2 and f"out_dir={where!r}" in line and why in line, line


def test_the_run_refuses_a_run_directory_without_resume(capsys, tmp_path):
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    status, line = run_main(capsys, f"out_dir={tmp_path}")
    assert status == 2 and "holds a run: add --resume" in line


def test_eval_a_checkpoint_without_weights(capsys, weightless_model, tmp_path):
    from actfirst.eval import main

    out = tmp_path / "report" / "eval.json"
    assert main(["--checkpoint", str(weightless_model), "--benchmark", "scienceworld", "--out", str(out)]) == 2
    line = one_line(capsys, "actfirst.eval")
    assert f"--checkpoint={str(weightless_model)!r}: has no weights" in line
    assert not out.parent.exists()


def test_eval_a_checkpoint_that_does_not_exist(capsys):
    from actfirst.eval import main

    assert main(["--checkpoint", "/no/such/checkpoint", "--benchmark", "scienceworld"]) == 2
    assert "--checkpoint='/no/such/checkpoint': no such directory" in one_line(capsys, "actfirst.eval")


def test_eval_an_out_file_that_is_a_directory(capsys, tmp_path):
    from actfirst.eval import main

    assert main(["--checkpoint", str(TEACHER), "--benchmark", "scienceworld", "--out", str(tmp_path)]) == 2
    assert f"--out={str(tmp_path)!r}: is a directory, not a file" in one_line(capsys, "actfirst.eval")


def test_prepare_a_missing_config(capsys):
    from actfirst.prepare import main

    assert main(["--config", "/nonexistent.yaml"]) == 2
    assert "--config='/nonexistent.yaml': no such file" in one_line(capsys, "actfirst.prepare")


def test_prepare_refuses_a_missing_candidate_file_before_building(capsys, tmp_path):
    from actfirst.prepare import main

    refs = tmp_path / "refs.jsonl"
    assert main([f"references={refs}", "prepare.candidate_files=[/no/candidates.jsonl]"]) == 2
    line = one_line(capsys, "actfirst.prepare")
    assert "prepare.candidate_files='/no/candidates.jsonl': no such file" in line, line
    assert list(tmp_path.iterdir()) == []


def test_compare_an_out_that_cannot_be_made(capsys, tmp_path):
    from actfirst.compare import main

    (tmp_path / "FILE").write_text("a file")
    assert main(["--out", str(tmp_path / "FILE" / "cmp")]) == 2
    assert "which is not a directory" in one_line(capsys, "actfirst.compare")


def test_references_build_a_bad_candidate_file(capsys, tmp_path):
    from actfirst.references import main

    bad = tmp_path / "cands.jsonl"
    bad.write_text(json.dumps({"task": "a", "actions": ["x"]}) + "\n" + json.dumps({"task": "b", "actions": "x"}))
    out = tmp_path / "out" / "refs.jsonl"
    assert main(["build", "--benchmark", "scienceworld", "--out", str(out), "--candidates", str(bad)]) == 2
    line = one_line(capsys, "actfirst.references")
    assert f"--candidates={str(bad)!r}: line 2 is not a candidate" in line, line
    assert not out.parent.exists()


def test_references_build_a_missing_config(capsys, tmp_path):
    from actfirst.references import main

    assert main(["build", "--benchmark", "alfworld", "--out", str(tmp_path / "r.jsonl"), "--config", "/x.yaml"]) == 2
    assert "--config='/x.yaml': no such file" in one_line(capsys, "actfirst.references")


def test_references_build_an_unknown_task_type(capsys, tmp_path):
    from actfirst.references import main

    assert main(["build", "--benchmark", "scienceworld", "--out", str(tmp_path / "r.jsonl"),
                 "--task-types", "fly-to-the-moon"]) == 2
    assert "--task-types=['fly-to-the-moon']: no scienceworld tasks" in one_line(capsys, "actfirst.references")


def test_teacher_rollouts_a_teacher_without_a_tokenizer(capsys, config_only_model, tmp_path):
    from actfirst.teacher_rollouts import main

    assert main(["--teacher", str(config_only_model), "--benchmark", "scienceworld",
                 "--out", str(tmp_path / "t.jsonl")]) == 2
    assert f"--teacher={str(config_only_model)!r}: has no tokenizer" in one_line(capsys, "actfirst.teacher_rollouts")


def test_model_factory_a_malformed_config(capsys, tmp_path):
    from actfirst.models.factory import main

    bad = tmp_path / "m.yaml"
    bad.write_text("hidden_size: 64\n  num_hidden_layers: 2\n")
    assert main(["--config", str(bad), "--out", str(tmp_path / "m")]) == 2
    assert f"--config={str(bad)!r}: not valid YAML at line 2" in one_line(capsys, "actfirst.models.factory")


def test_alfworld_games_an_out_under_a_file(capsys, tmp_path):
    from actfirst.envs.alfworld.generate import main

    (tmp_path / "FILE").write_text("a file")
    assert main(["--out", str(tmp_path / "FILE" / "games")]) == 2
    assert "which is not a directory" in one_line(capsys, "actfirst.envs.alfworld.generate")


def test_the_demo_inputs_pass_every_check(tmp_path):
    """The checks refuse nothing a working run uses (the demo's teacher as the student: same tokenizer)."""
    from actfirst.preparation.build import check_inputs, load_run_config

    check_inputs(load_run_config(None, [f"student.model={TEACHER}", f"out_dir={tmp_path / 'run'}"]))
    assert not (tmp_path / "run").exists()


def test_the_probe_leaves_nothing(tmp_path):
    check_writable_dir(tmp_path / "a" / "b", "out_dir")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match="is not a directory"):
        check_model_dir(DEMO_CONFIG, "student.model")


@pytest.mark.parametrize("given,why", [("FILE/x.json", "its directory 'FILE' is not a directory"),
                                       ("FILE/a/x.json", "its directory 'FILE/a' lies under 'FILE', which is not a"),
                                       ("/proc/x.json", "its directory '/proc' cannot be written"),
                                       ("DIR", "is a directory, not a file")])
def test_an_output_file_names_what_is_wrong_with_its_directory(tmp_path, given, why):
    (tmp_path / "FILE").write_text("a file")
    given = given.replace("FILE", str(tmp_path / "FILE")).replace("DIR", str(tmp_path))
    with pytest.raises(ConfigError) as err:
        check_writable_file(given, "--out")
    assert str(err.value).startswith(f"--out={given!r}: ") and why.replace("FILE", str(tmp_path / "FILE")) in \
        str(err.value), str(err.value)
    check_writable_file(tmp_path / "FILE", "--out")  # an existing file is overwritten, not refused


def test_a_bug_keeps_its_traceback(monkeypatch):
    """Only a user's error becomes one line: anything else is a bug and propagates."""
    from actfirst import run

    def broken_launch(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(run, "launch", broken_launch)
    with pytest.raises(RuntimeError, match="a bug"):
        run.main([])


def test_the_command_line_exits_2_with_one_line(tmp_path):
    """The real process: exit status 2, stderr one line (no traceback), stdout empty, nothing created."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "actfirst.run", "--config", "/nonexistent.yaml", f"out_dir={out}"],
                          check=False, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "python -m actfirst.run: error: --config='/nonexistent.yaml': no such file"], proc.stderr
    assert proc.stdout == "" and not out.exists()


# -- weights that cannot be read, configs that say too little (issue 34) ----------------------------------------------


def corrupt(tmp_path: Path, name: str, weights: bytes) -> Path:
    """A copy of the demo's teacher whose ``model.safetensors`` holds ``weights``."""
    model = tmp_path / name
    shutil.copytree(TEACHER, model)
    (model / "model.safetensors").write_bytes(weights)
    return model


@pytest.fixture
def garbage_weights(tmp_path) -> Path:
    """A model directory whose weight file is not safetensors (its first 8 bytes read as a huge header length)."""
    return corrupt(tmp_path, "garbage", b"not a safetensors file, " * 40)


@pytest.fixture
def sharded_model(tmp_path) -> Path:
    """The demo's teacher split into two safetensors shards with their index, as large checkpoints ship."""
    from safetensors.torch import load_file, save_file

    model = tmp_path / "sharded"
    shutil.copytree(TEACHER, model, ignore=shutil.ignore_patterns("*.safetensors"))
    tensors = load_file(TEACHER / "model.safetensors")
    names = sorted(tensors)
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :]), 1):
        shard = f"model-0000{i}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, model / shard, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard))
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return model


@pytest.mark.parametrize("prog,args,key", [
    ("actfirst.run", [f"student.model={TEACHER}", "teacher=BAD", "out_dir=OUT"], "teacher"),
    ("actfirst.run", ["student.model=BAD", "out_dir=OUT"], "student.model"),
    ("actfirst.run", ["rollout.strategy=uopd", f"student.model={TEACHER}", "teacher=BAD", "out_dir=OUT"], "teacher"),
    ("actfirst.prepare", [f"student.model={TEACHER}", "teacher=BAD", "out_dir=OUT"], "teacher"),
    ("actfirst.compare", ["--out", "OUT", f"student.model={TEACHER}", "teacher=BAD"], "teacher"),
    ("actfirst.eval", ["--checkpoint", "BAD", "--benchmark", "scienceworld", "--out", "OUT/eval.json"], "--checkpoint"),
    ("actfirst.teacher_rollouts", ["--teacher", "BAD", "--benchmark", "scienceworld", "--out", "OUT/t.jsonl"],
     "--teacher"),
    ("actfirst.rollout_quality", ["--checkpoint", "BAD", "--config", str(DEMO_CONFIG), "--out", "OUT/q.json"],
     "--checkpoint"),
], ids=["run-teacher", "run-student", "run-uopd-teacher", "prepare", "compare", "eval", "teacher_rollouts",
        "rollout_quality"])
def test_every_command_refuses_weights_that_are_not_safetensors(capsys, garbage_weights, tmp_path, prog, args, key):
    """Each model directory a command takes has its weights' headers read before any engine or rank starts."""
    import importlib

    out = tmp_path / "out"
    argv = [a.replace("BAD", str(garbage_weights)).replace("OUT", str(out)) for a in args]
    assert importlib.import_module(prog).main(argv) == 2
    line = one_line(capsys, prog)
    assert line.endswith(f"{key}={str(garbage_weights)!r}: model.safetensors is not a readable safetensors file "
                         f"(header too large)"), line
    assert not out.exists()


@pytest.mark.parametrize("weights,why", [
    (b"", "model.safetensors is not a readable safetensors file (header too small)"),
    (b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all",
     "model.safetensors is not a readable safetensors file (invalid JSON in header"),
    (b"\x02\x00\x00\x00\x00\x00\x00\x00{}", "its weight files hold no tensors (model.safetensors)"),
    ("half", "model.safetensors is not a readable safetensors file (incomplete metadata, file not fully covered)"),
], ids=["empty", "header-not-json", "no-tensors", "truncated"])
def test_a_weight_file_that_cannot_be_loaded(tmp_path, weights, why):
    if weights == "half":  # an interrupted download or copy
        weights = (TEACHER / "model.safetensors").read_bytes()[: (TEACHER / "model.safetensors").stat().st_size // 2]
    model = corrupt(tmp_path, "bad", weights)
    with pytest.raises(ConfigError) as err:
        check_model_dir(model, "teacher")
    assert str(err.value).startswith(f"teacher={str(model)!r}: {why}"), str(err.value)


def test_weights_of_another_shape_than_the_config_says(capsys, tmp_path, out_dir):
    model = tmp_path / "resized"
    shutil.copytree(TEACHER, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 64}))
    status, line = run_main(capsys, f"student.model={TEACHER}", f"teacher={model}", f"out_dir={out_dir}")
    assert status == 2 and line.endswith(
        f"teacher={str(model)!r}: model.safetensors holds lm_head.weight of shape [{config['vocab_size']}, "
        f"{config['hidden_size']}], but config.json says [vocab_size, hidden_size] = [{config['vocab_size'] + 64}, "
        f"{config['hidden_size']}]"), line


def test_a_sharded_checkpoint_is_checked_shard_by_shard(sharded_model):
    check_model_dir(sharded_model, "teacher")  # whole: accepted
    index = json.loads((sharded_model / "model.safetensors.index.json").read_text())
    first, second = sorted(set(index["weight_map"].values()))
    moved = next(n for n, shard in sorted(index["weight_map"].items()) if shard == second)
    cases = [
        ({**index, "weight_map": {**index["weight_map"], moved: first}},
         f"{first} lacks {moved}, which model.safetensors.index.json places there"),
        ({**index, "weight_map": {**index["weight_map"], moved: "model-00003-of-00002.safetensors"}},
         "model.safetensors.index.json names model-00003-of-00002.safetensors, which is missing"),
        ({"weight_map": ["not", "a", "map"]}, "model.safetensors.index.json is not a readable safetensors index"),
    ]
    for bad_index, why in cases:
        (sharded_model / "model.safetensors.index.json").write_text(json.dumps(bad_index))
        with pytest.raises(ConfigError) as err:
            check_model_dir(sharded_model, "teacher")
        assert str(err.value).startswith(f"teacher={str(sharded_model)!r}: {why}"), str(err.value)
    (sharded_model / "model.safetensors.index.json").write_text(json.dumps(index))
    (sharded_model / second).write_bytes((sharded_model / second).read_bytes()[:100])
    with pytest.raises(ConfigError, match=rf"{second} is not a readable safetensors file \("):
        check_model_dir(sharded_model, "teacher")


@pytest.mark.parametrize("text,why", [
    ("", "the file is empty"),
    ("# settings to come\n", "the file is empty"),
    ("{}\n", "missing benchmark, student, teacher"),
    (f"benchmark: scienceworld\nteacher: {TEACHER}\nstudent:\n  max_model_len: 1024\n", "missing student.model"),
    (f"benchmark: scienceworld\nteacher: {TEACHER}\nstudent:\n  model: {TEACHER}\nenv:\n  max_turns: 5\n",
     "missing env.train_task_types"),
], ids=["empty", "only-a-comment", "no-keys", "a-section-without-its-key", "an-optional-section-without-its-key"])
def test_a_config_that_lacks_required_keys_names_the_file_and_the_keys(capsys, tmp_path, out_dir, text, why):
    config = tmp_path / "empty.yaml"
    config.write_text(text)
    status, line = run_main(capsys, "--config", str(config), f"out_dir={out_dir}")
    assert status == 2 and line == f"python -m actfirst.run: error: --config={str(config)!r}: {why}", line
    assert not out_dir.exists()


def test_overrides_without_a_file_that_lack_required_keys():
    from actfirst.core.config import TrainConfig
    from actfirst.core.schema import load_config

    with pytest.raises(ConfigError) as err:
        load_config(TrainConfig, None, ["benchmark=scienceworld"])
    assert str(err.value) == "missing student, teacher (not in the command-line overrides)"


@pytest.mark.parametrize("case", ["corrupt-teacher", "empty-config"])
def test_the_command_line_exits_2_with_one_line_for_a_corrupt_model_or_an_empty_config(tmp_path, case):
    """The real process (where the corrupt weights had given a rank's traceback): exit 2, one line, nothing made."""
    out = tmp_path / "run"
    if case == "corrupt-teacher":
        model = corrupt(tmp_path, "garbage", b"not a safetensors file, " * 40)
        args, want = [f"student.model={TEACHER}", f"teacher={model}"], \
            f"teacher={str(model)!r}: model.safetensors is not a readable safetensors file (header too large)"
    else:
        (tmp_path / "empty.yaml").write_text("")
        args, want = ["--config", str(tmp_path / "empty.yaml")], \
            f"--config={str(tmp_path / 'empty.yaml')!r}: the file is empty"
    proc = subprocess.run([sys.executable, "-m", "actfirst.run", *args, f"out_dir={out}"], check=False,
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"python -m actfirst.run: error: {want}"], proc.stderr
    assert not out.exists()


# -- benchmark data that is missing (issue 35) -----------------------------------------------------------------------


def test_alfworld_without_its_games_exits_2_before_anything_starts(tmp_path):
    """The paper's ALFWorld config on a machine without ALFWorld's games (no $ALFWORLD_DATA, an empty home): one line
    naming where it looked and the command that fetches them; nothing generated, nothing written."""
    out, home = tmp_path / "run", tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k != "ALFWORLD_DATA"} | {"HOME": str(home), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "actfirst.run", "--config", "configs/train/alfworld/qwen3-1.7b.yaml",
                           f"out_dir={out}", f"env.generated_dir={tmp_path / 'games'}"], check=False,
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr
    folder = home / ".cache" / "alfworld" / "json_2.1.1" / "train"
    assert proc.stderr.strip().splitlines() == [
        f"python -m actfirst.run: error: env.games='real': no ALFWorld games at {folder} (no such folder; the data "
        f"folder from ALFWorld's default ~/.cache/alfworld (no data_dir nor $ALFWORLD_DATA)); fetch them with: "
        f"python -m actfirst.data alfworld (or set data_dir to where they are, or games: generated for games "
        f"generated offline, not the paper's)"], proc.stderr
    assert proc.stdout == "" and not out.exists() and not (tmp_path / "games").exists()

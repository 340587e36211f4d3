"""Bad input at every command's door: one line on stderr naming the argument and its value, exit status 2, and
nothing written where the run would have written (issue 19). Each case is what a user could type; the checks run
before any engine, JVM or model load."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from actfirst.config import DEMO_CONFIG, ConfigError
from actfirst.user_input import check_model_dir, check_writable_dir, check_writable_file

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
    status, line = run_main(capsys, "env.max_turns=30", f"student.model={TEACHER}", f"out_dir={out_dir}")
    assert status == 2 and f"references={str(REFERENCES.relative_to(ROOT))!r}: built under another scienceworld " \
                           f"config" in line and "max_turns: cache 12, run 30" in line, line
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
    from actfirst.preparation import check_inputs, load_run_config

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

"""``python -m actfirst.run --config X --dry-run``: every shipped paper config on a machine without its models and
data lists all that is missing (not only the first), prints the resolved config, the memory plan and the host
memory, starts and writes nothing, and exits 1; the CPU demo, whose inputs ship, exits 0."""

import re
from pathlib import Path

import pytest

from actfirst.run import main

ROOT = Path(__file__).parents[1]
TRAIN = ROOT / "configs" / "train"
SHIPPED = sorted(p.relative_to(TRAIN).as_posix() for p in TRAIN.rglob("*.yaml"))


@pytest.fixture
def bare_machine(tmp_path, monkeypatch):
    """An empty working directory and HOME: no models, no ALFWorld games, no Search questions, no runs."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home").mkdir()
    return tmp_path


@pytest.mark.parametrize("name", SHIPPED)
def test_a_paper_config_without_its_models_and_data_lists_everything_missing(name, bare_machine, capsys):
    status = main(["--config", str(TRAIN / name), "--dry-run", "--gpu", "80GB"])
    out = capsys.readouterr().out
    assert status == 1
    assert re.search(r"^  MISSING +student\.model=/models/", out, re.M)
    assert re.search(r"^  MISSING +teacher=/models/", out, re.M)  # the second missing input is listed too
    benchmark = name.split("/")[0]
    data = {"alfworld": r"^  MISSING +env \(the benchmark's data\): .*python -m actfirst\.data alfworld",
            "search": r"^  MISSING +benchmark search .*python -m actfirst\.data search",
            "scienceworld": r"^  ok +benchmark scienceworld: \d+ training tasks, \d+ evaluation tasks",
            "webshop": r"^  (ok|MISSING) +benchmark webshop"}[benchmark]
    assert re.search(data, out, re.M), out
    assert f"  benchmark: {benchmark}\n" in out  # the resolved config
    assert re.search(r"^  ok +on 80GB: peak [\d.]+ of 79\.6 GiB .* 8 ranks\), KV cache \d+k tokens: fits$", out, re.M)
    assert re.search(r"^  \S+ +training \(its evaluations on the same workers\): \d+ " + benchmark, out, re.M)
    assert out.rstrip().endswith("; nothing was started") and "[dry run] the run could not start: " in out
    assert sorted(p.name for p in bare_machine.iterdir()) == ["home"] and not any((bare_machine / "home").iterdir())


def test_the_demo_could_start_and_a_missing_teacher_and_a_held_out_dir_are_both_named(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the demo's inputs ship under assets/, named relative to the repository
    assert main(["--dry-run", f"out_dir={tmp_path / 'demo'}"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  ok +teacher=assets/demo/teacher: ", out, re.M)
    assert re.search(r"^  ok +references=assets/demo/references\.jsonl: \d+ references covering", out, re.M)
    assert "[dry run] the run could start; nothing was started" in out and not (tmp_path / "demo").exists()
    (tmp_path / "held").mkdir()
    (tmp_path / "held" / "metrics.jsonl").write_text("")
    # overrides on both sides of an option, as a user appends them
    assert main([f"out_dir={tmp_path / 'held'}", "--dry-run", f"teacher={tmp_path / 'absent'}"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^  MISSING +teacher=.*absent: no such directory", out, re.M)
    assert re.search(r"^  REFUSED +out_dir=.*held: holds a run: add --resume", out, re.M)
    assert "the run could not start: 2 problem(s)" in out
    assert main(["--gpu", "80GB"]) == 2 and "--gpu='80GB': goes with --dry-run" in capsys.readouterr().err
    assert main(["--dry-run", "--gpu", "huge"]) == 2 and "--gpu='huge': one of" in capsys.readouterr().err


def test_a_hub_id_not_in_the_cache_is_fetched_at_start_unless_offline(tmp_path, monkeypatch, capsys):
    """Online, an id the cache lacks is downloaded by the run at start (the dry run asks the Hub, here a port where
    nothing answers: the Hub could not be asked); offline it is missing, with the command that fetches it."""
    from huggingface_hub import constants

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    args = ["--dry-run", f"out_dir={tmp_path / 'run'}", "student.model=someone/absent-model"]
    assert main(args) == 0
    assert re.search(r"^  fetched at start +student\.model=someone/absent-model: not in the Hugging Face cache; the "
                     r"run downloads it at start \(the Hub could not be asked now: \w+\); or first: hf download "
                     r"someone/absent-model$", capsys.readouterr().out, re.M)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert main(args) == 1
    assert re.search(r"^  MISSING +student\.model=someone/absent-model: .*HF_HUB_OFFLINE=1.*hf download "
                     r"someone/absent-model", capsys.readouterr().out, re.M)

"""Models named by a Hugging Face Hub id: resolved from a real Hugging Face cache (laid out as huggingface_hub lays
it out: ``models--owner--name/{blobs,snapshots/<commit>,refs}``, checked with its own ``scan_cache_dir``) with
``HF_HUB_OFFLINE=1``, loaded, recorded in the run's config, and handed to other processes without a download."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from actfirst.core.config import ConfigError
from actfirst.models.hub import hub_name, is_hub_id, model_commit, resolve_model

ROOT = Path(__file__).resolve().parents[2]
TEACHER = ROOT / "assets" / "demo" / "teacher"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


def cache_model(cache: Path, repo_id: str, model_dir: Path, commit: str = COMMIT, refs: tuple[str, ...] = ("main",)
                ) -> Path:
    """Put ``model_dir``'s files into the Hugging Face cache ``cache`` as ``repo_id`` at ``commit`` (what ``hf
    download`` leaves: content-addressed blobs, the snapshot's relative symlinks to them, ``refs/<ref>`` holding the
    commit); returns the snapshot directory."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    for file in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / file.relative_to(model_dir)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def offline_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache, with ``HF_HUB_CACHE`` pointing at it and ``HF_HUB_OFFLINE=1`` (in the
    environment, for child processes, and in huggingface_hub's constants, which it reads at import)."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_the_cache_is_laid_out_as_huggingface_hub_reads_it(offline_cache, tiny_model_dir):
    from huggingface_hub import scan_cache_dir

    cache_model(offline_cache, "road-test/tiny", tiny_model_dir)
    (repo,) = scan_cache_dir(offline_cache).repos
    assert (repo.repo_id, repo.repo_type) == ("road-test/tiny", "model")
    (revision,) = repo.revisions
    assert revision.commit_hash == COMMIT and revision.refs == frozenset({"main"})
    assert {f.file_name for f in revision.files} >= {"config.json", "model.safetensors", "tokenizer.json"}


def test_a_hub_id_resolves_offline_to_its_cached_snapshot_which_loads(offline_cache, tiny_model_dir):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    snapshot = cache_model(offline_cache, "road-test/tiny", tiny_model_dir)
    path = resolve_model("road-test/tiny", "student.model")
    assert path == snapshot and model_commit(path) == COMMIT and hub_name(path) == "road-test/tiny"
    assert hub_name(tiny_model_dir) is None
    assert AutoConfig.from_pretrained(path).hidden_size == 64
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert tokenizer.encode("<think>") == AutoTokenizer.from_pretrained(tiny_model_dir).encode("<think>")
    assert AutoModelForCausalLM.from_pretrained(path).num_parameters() > 0


def test_a_revision_picks_the_snapshot_of_that_branch_tag_or_commit(offline_cache, tiny_model_dir):
    cache_model(offline_cache, "road-test/tiny", tiny_model_dir, COMMIT, refs=("main",))
    tagged = cache_model(offline_cache, "road-test/tiny", tiny_model_dir, OTHER_COMMIT, refs=("v1",))
    assert model_commit(resolve_model("road-test/tiny", "teacher")) == COMMIT
    assert resolve_model("road-test/tiny", "teacher", "v1") == tagged
    assert resolve_model("road-test/tiny", "teacher", OTHER_COMMIT) == tagged
    # the resolved snapshot handed on with its commit (as to a rank) is accepted; any other revision of it is not
    assert resolve_model(str(tagged), "teacher", OTHER_COMMIT, download=False) == tagged
    with pytest.raises(ConfigError, match=rf"^teacher_revision='v2': teacher={str(tagged)!r} is a local directory"):
        resolve_model(str(tagged), "teacher", "v2", revision_key="teacher_revision")


def test_an_id_missing_from_the_cache_offline_is_one_line_naming_key_and_value(offline_cache):
    with pytest.raises(ConfigError) as err:
        resolve_model("road-test/no-such-model", "teacher", "v3", revision_key="teacher_revision")
    message = str(err.value)
    assert message.startswith("teacher='road-test/no-such-model': not a local directory and not in the Hugging Face "
                              f"cache ({offline_cache}; HF_HUB_OFFLINE=1); download it with `hf download "
                              "road-test/no-such-model --revision v3`"), message
    assert "\n" not in message


def test_a_process_that_must_not_download_reads_only_the_cache(offline_cache, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # online, yet the rank may only read the cache
    with pytest.raises(ConfigError, match=r"not in the Hugging Face cache \(.*; this process does not download\)"):
        resolve_model("road-test/no-such-model", "student.model", download=False)


def test_an_incomplete_cached_snapshot_is_refused_by_what_it_lacks(offline_cache, tiny_model_dir):
    snapshot = cache_model(offline_cache, "road-test/tiny", tiny_model_dir)
    (snapshot / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match=rf"^student.model={str(snapshot)!r}: has no weights"):
        resolve_model("road-test/tiny", "student.model")


@pytest.mark.parametrize("name,hub", [("Qwen/Qwen3-1.7B", True), ("road-test/no-such-model", True),
                                      ("assets/demo/teacher", False), ("/models/Qwen3-1.7B", False),
                                      ("./Qwen3-1.7B", False), ("Qwen3-1.7B", False), ("a/b/c", False),
                                      ("a--b/c", False), ("a/..", False)])
def test_what_counts_as_a_hub_id(name, hub):
    assert is_hub_id(name) is hub


def test_a_name_that_is_neither_a_directory_nor_an_id(offline_cache):
    with pytest.raises(ConfigError, match=r"^--checkpoint='/models/Qwen3-1.7B': no such directory, and not a "
                                          r"Hugging Face Hub id \(owner/name\)$"):
        resolve_model("/models/Qwen3-1.7B", "--checkpoint")


def test_a_local_directory_is_used_as_is_and_has_no_revision(tiny_model_dir):
    assert resolve_model(str(tiny_model_dir), "teacher") == tiny_model_dir
    assert model_commit(tiny_model_dir) == "local"
    with pytest.raises(ConfigError, match=r"^student.revision='main': student.model=.* is a local directory"):
        resolve_model(str(tiny_model_dir), "student.model", "main", revision_key="student.revision")


def test_a_run_resolves_its_models_records_the_commits_and_hands_them_on(offline_cache, tmp_path):
    """The training run's path: the config names Hub ids; resolution gives snapshot paths and commits that pass
    every input check, land in the config the run saves (config.json, checkpoints' trainer state), and reach a rank
    as overrides that need no lookup."""
    from actfirst.core.schema import config_json, to_dict
    from actfirst.preparation.build import check_inputs, load_run_config, model_overrides, resolve_models

    snapshot = cache_model(offline_cache, "road-test/demo-teacher", TEACHER)
    overrides = ["student.model=road-test/demo-teacher", "teacher=road-test/demo-teacher", "student.revision=main",
                 f"out_dir={tmp_path / 'run'}"]
    cfg = resolve_models(load_run_config(None, overrides))
    assert (cfg.student.model, cfg.student.revision) == (str(snapshot), COMMIT)
    assert (cfg.teacher, cfg.teacher_revision) == (str(snapshot), COMMIT)
    check_inputs(cfg)
    saved = json.loads(config_json(cfg))
    assert saved["student"]["revision"] == saved["teacher_revision"] == COMMIT
    handed = model_overrides(cfg)
    assert handed == [f"student.model={json.dumps(str(snapshot))}", f'student.revision="{COMMIT}"',
                      f"teacher={json.dumps(str(snapshot))}", f'teacher_revision="{COMMIT}"']
    (offline_cache / "models--road-test--demo-teacher" / "refs" / "main").write_text(OTHER_COMMIT)  # main moved on
    rank = resolve_models(load_run_config(None, overrides + handed), download=False)
    assert to_dict(rank) == to_dict(cfg)


def test_a_command_resolves_an_id_from_the_environment_alone(offline_cache, tiny_model_dir, tmp_path):
    """``python -m actfirst.eval`` in a fresh process, told only by ``HF_HUB_OFFLINE=1`` and ``HF_HUB_CACHE``: the id
    resolves (the model's own config then bounds the engine, which refuses a context too short for the prompt and
    the evaluation budget, before any engine starts); an uncached id is refused in one line."""
    import subprocess
    import sys

    cache_model(offline_cache, "road-test/tiny", tiny_model_dir)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the fixture set HF_HUB_OFFLINE and HF_HUB_CACHE
    base = [sys.executable, "-m", "actfirst.eval", "--benchmark", "scienceworld", "--out", str(tmp_path / "r.json")]
    short = subprocess.run(base + ["--checkpoint", "road-test/tiny", "rollout.max_prompt_tokens=900",
                                   "rollout.budget.eval_total=24", "rollout.budget.eval_first_stage=16",
                                   "engine.max_model_len=512"], capture_output=True, text=True, timeout=300, env=env,
                           cwd=ROOT)
    assert short.returncode == 2 and short.stderr.strip().endswith(
        "rollout.max_prompt_tokens=900 + rollout.budget.eval_total=24 = 924 exceeds engine.max_model_len=512"), \
        short.stderr[-2000:]
    missing = subprocess.run(base + ["--checkpoint", "road-test/other"], capture_output=True, text=True, timeout=300,
                             env=env, cwd=ROOT)
    assert missing.returncode == 2 and missing.stderr.strip() == (
        "python -m actfirst.eval: error: --checkpoint='road-test/other': not a local directory and not in the Hugging "
        f"Face cache ({offline_cache}; HF_HUB_OFFLINE=1); download it with `hf download road-test/other`, or name a "
        "local directory"), missing.stderr[-2000:]
    assert not (tmp_path / "r.json").exists()

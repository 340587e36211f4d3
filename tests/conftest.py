import os
import shutil
from pathlib import Path

# vLLM's CPU worker ignores torch.set_num_threads; set before vLLM or torch threads start.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# Without a GPU, Triton kernels run under the interpreter (correctness only, small shapes). It must be set before
# triton is first imported (transformers and vLLM import it too), or triton's own @jit helpers stay compiled-only.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from file_order import FileDurationRecorder, order_longest_first, recorded_seconds  # noqa: E402

from actfirst.core.config import EngineConfig, ModelConfig, SchedulerConfig  # noqa: E402
from actfirst.engine.core import ActFirstEngine  # noqa: E402
from actfirst.models.build import build_model  # noqa: E402


@pytest.fixture
def paths(tmp_path):
    """Overrides that point the three user-given paths at things that exist (nothing is read from them)."""
    (tmp_path / "student").mkdir()
    (tmp_path / "teacher").mkdir()
    refs = tmp_path / "refs.jsonl"
    refs.write_text("")
    return [f"student.model={tmp_path / 'student'}", f"teacher={tmp_path / 'teacher'}", f"references={refs}"]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Qwen3-architecture model with the small env-bpe tokenizer, saved as a HF directory."""
    cfg = ModelConfig(tokenizer="env-bpe", hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=32, intermediate_size=128, seed=1)
    return build_model(cfg, tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture
def alfworld_data(tmp_path, monkeypatch):
    """$ALFWORLD_DATA at a tree shaped like ALFWorld's download (``json_2.1.1/<split>/<task>/<trial>/game.tw-pddl``,
    the files empty), so that configs with ``games: real`` load where nothing is played; returns its root."""
    root = tmp_path / "alfworld_data"
    for split in ("train", "valid_seen", "valid_unseen"):
        trial = root / "json_2.1.1" / split / "pick_and_place_simple-Mug-None-Shelf-1" / "trial_1"
        trial.mkdir(parents=True)
        (trial / "game.tw-pddl").write_text("")
    monkeypatch.setenv("ALFWORLD_DATA", str(root))
    return root


@pytest.fixture(scope="session")
def alfworld_games(tmp_path_factory):
    """One generated ALFWorld game of each of the six task types (real TextWorld games, about 25 s)."""
    from actfirst.envs.alfworld.env import alfworld_tasks
    from actfirst.envs.alfworld.games import generate_split

    root = tmp_path_factory.mktemp("alfworld") / "train"
    generate_split(root, per_type=1, seed=0)
    return alfworld_tasks(root)


@pytest.fixture(scope="session")
def engine(tiny_model_dir):
    """One real in-process vLLM engine for every test that needs one (vLLM starts once per process)."""
    cfg = EngineConfig(model=str(tiny_model_dir), dtype="float32", max_model_len=2048, max_num_seqs=64,
                       max_num_batched_tokens=4096, kv_cache_gib=1)
    return ActFirstEngine.from_config(cfg, SchedulerConfig(b_max=8))


def pytest_addoption(parser):
    parser.addoption("--record-file-durations", metavar="PATH", default=None,
                     help="write each test file's seconds (setup, call and teardown summed) to PATH as JSON, the "
                          "longest first: what tests/file_durations.json holds")


def pytest_configure(config):
    path = config.getoption("record_file_durations")
    if path and not hasattr(config, "workerinput"):  # the controller sees every worker's reports
        config.pluginmanager.register(FileDurationRecorder(Path(path)), "file-duration-recorder")


def pytest_collection_modifyitems(config, items):
    order_longest_first(items, recorded_seconds())

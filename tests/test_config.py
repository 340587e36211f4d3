"""Config loading: YAML, dotted overrides, and errors that name the key and the value."""

import dataclasses
import json
from pathlib import Path

import pytest

from actfirst.config import ConfigError, RolloutSpeedupConfig, SchedulerConfig, TrainConfig, check_resumable
from actfirst.schema import config_json, load_config, paths_unchecked

CONFIGS = Path(__file__).parents[1] / "configs"


@pytest.fixture
def yaml_file(tmp_path, tiny_model_dir):
    path = tmp_path / "cfg.yaml"
    path.write_text(f"engine:\n  model: {tiny_model_dir}\n  max_model_len: 2048\nscheduler:\n  b_max: 32\n"
                    "b_max: [16, 64]\n")
    return path


def test_yaml_and_overrides(yaml_file):
    cfg = load_config(RolloutSpeedupConfig, yaml_file,
                      ["scheduler.b_max=8", "full_response_tokens=[64]", "context_tokens=[10, 20]",
                       "scheduler.fast_action_admission=wait", "temperature=1"])
    assert cfg.scheduler.b_max == 8
    assert cfg.scheduler.fast_action_admission == "wait"
    assert cfg.full_response_tokens == [64]
    assert cfg.context_tokens == (10, 20)
    assert cfg.temperature == 1.0 and isinstance(cfg.temperature, float)
    assert cfg.b_max == [16, 64]


@pytest.mark.parametrize("override,message", [
    ("scheduler.b_max=0", "scheduler.b_max=0: must be >= 1"),
    ("scheduler.bmax=3", "scheduler.bmax=3: unknown key"),
    ("scheduler.b_max=abc", "scheduler.b_max='abc': must be an integer"),
    ("scheduler.b_max=true", "scheduler.b_max=True: must be an integer"),
    ("scheduler.fast_action_admission=never", "scheduler.fast_action_admission='never': must be one of"),
    ("engine.model=/does/not/exist", "engine.model='/does/not/exist': no such directory"),
    ("b_max=[16, 512]", "b_max=[16, 512]: must not exceed engine.max_num_seqs=256"),
    ("full_response_tokens=[4096]", "full_response_tokens=[4096]: context_tokens[1] + full response"),
    ("context_tokens=[5]", "context_tokens=[5]: must have 2 items"),
    ("temperature=-1", "temperature=-1.0: must be > 0"),
    ("scheduler", "expected key=value"),
])
def test_bad_values_name_the_key_and_value(yaml_file, override, message):
    with pytest.raises(ConfigError) as err:
        load_config(RolloutSpeedupConfig, yaml_file, [override])
    assert message in str(err.value)


def test_missing_required_section(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("num_tasks: 4\n")
    with pytest.raises(ConfigError, match="engine"):
        load_config(RolloutSpeedupConfig, path)


def test_direct_construction_validates():
    with pytest.raises(ConfigError, match="b_max=-2"):
        SchedulerConfig(b_max=-2)


def test_shipped_configs_load(tiny_model_dir):
    from pathlib import Path

    for path in sorted(Path(__file__).parents[1].glob("configs/rollout_speedup*.yaml")):
        cfg = load_config(RolloutSpeedupConfig, path, [f"engine.model={tiny_model_dir}"])
        assert cfg.num_tasks >= 1


def test_a_run_resumes_only_under_its_own_config():
    """``check_resumable`` on a real config as the trainer saves it (``config.json``): the same config passes, also
    from a file written before a section or a field existed; a change is refused by field with both values, unless
    it is in a section a resume may change."""
    with paths_unchecked():
        cfg = load_config(TrainConfig, CONFIGS / "demo" / "scienceworld_lifespan.yaml")
        other = load_config(TrainConfig, CONFIGS / "demo" / "scienceworld_lifespan.yaml",
                            ["rollout.strategy=vanilla", "optim.lr=1e-4", "num_updates=3", "out_dir=elsewhere"])
    saved, current = json.loads(config_json(cfg)), json.loads(config_json(cfg))
    check_resumable(saved, current, "resume")
    del saved["uopd"], saved["optim"]["betas"]  # older files: both come back as their defaults
    check_resumable(saved, current, "resume")
    with pytest.raises(ConfigError) as refused:
        check_resumable(saved, dataclasses.asdict(other), "resume")  # tuples and paths as JSON holds them
    assert str(refused.value).startswith("resume: the config differs from the run's saved config: optim.lr: 0.0005 "
                                         "-> 0.0001; rollout.strategy: 'actfirst' -> 'vanilla' (only ['out_dir', ")
    assert str(refused.value).endswith("may change); use another out_dir for a new run")
    check_resumable(saved, dataclasses.asdict(other), "x", may_change=("optim", "rollout", "num_updates", "out_dir"))

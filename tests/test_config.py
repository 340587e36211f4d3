"""Config loading: YAML, dotted overrides, and errors that name the key and the value."""

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from actfirst.core.config import ConfigError, EvaluationConfig, SchedulerConfig, TrainConfig, check_resumable
from actfirst.core.schema import config_json, load_config, paths_unchecked

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
from rollout_speedup_config import RolloutSpeedupConfig  # noqa: E402

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


def test_shipped_configs_load(tiny_model_dir, alfworld_data):
    from pathlib import Path

    for path in sorted(Path(__file__).parents[1].glob("bench/configs/rollout_speedup*.yaml")):
        cfg = load_config(RolloutSpeedupConfig, path, [f"engine.model={tiny_model_dir}"])
        assert cfg.num_tasks >= 1
        assert (cfg.contexts == "alfworld") == (cfg.alfworld is not None)  # the games are said where they are read
    with pytest.raises(ConfigError, match=r"alfworld=None: contexts: alfworld needs an alfworld: section"):
        load_config(RolloutSpeedupConfig, None, [f"engine.model={tiny_model_dir}", "contexts=alfworld"])


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
    del saved["report_to"], saved["tracker_project"]  # saved before the trackers; a resume may change them
    check_resumable(saved, {**current, "report_to": [], "tracker_project": "elsewhere"}, "resume")
    with pytest.raises(ConfigError) as refused:
        check_resumable(saved, dataclasses.asdict(other), "resume")  # tuples and paths as JSON holds them
    assert str(refused.value).startswith("resume: the config differs from the run's saved config: optim.lr: 0.0005 "
                                         "-> 0.0001; rollout.strategy: 'actfirst' -> 'vanilla' (only ['out_dir', ")
    assert str(refused.value).endswith("may change); use another out_dir for a new run")
    check_resumable(saved, dataclasses.asdict(other), "x", may_change=("optim", "rollout", "num_updates", "out_dir"))


def test_a_key_of_a_section_set_to_null_turns_it_on(tmp_path):
    """A comparison's run saves ``evaluation: null`` (no evaluation during training); evaluating it at other seeds
    (``python -m actfirst.eval --config <run>/config.json --seeds 43 44``) sets a key of that section, which then
    holds its defaults but for that key. A key under a value that is not a section is still refused."""
    with paths_unchecked():
        path = tmp_path / "config.json"
        path.write_text(config_json(load_config(TrainConfig, CONFIGS / "demo" / "scienceworld_lifespan.yaml",
                                                ["evaluation=null"])))
        assert load_config(TrainConfig, path).evaluation is None
        cfg = load_config(TrainConfig, path, ["evaluation.seeds=[43, 44]"])
        assert cfg.evaluation == dataclasses.replace(EvaluationConfig(), seeds=[43, 44])
        with pytest.raises(ConfigError, match=r"^override 'num_updates\.x=1': num_updates is not a section"):
            load_config(TrainConfig, path, ["num_updates.x=1"])


def test_the_env_section_is_the_named_benchmarks_config():
    """``env:`` takes the config class of ``benchmark`` (through the registry), with its own checks and errors;
    absent, the benchmark's default file is used (``get_benchmark(cfg.benchmark, None)``)."""
    from actfirst.envs.alfworld.config import ALFWorldConfig
    from actfirst.envs.scienceworld.config import ScienceWorldConfig

    demo = CONFIGS / "demo" / "scienceworld_lifespan.yaml"
    with paths_unchecked():
        cfg = load_config(TrainConfig, demo, ["env.max_turns=7"])
        assert isinstance(cfg.env, ScienceWorldConfig) and cfg.env.max_turns == 7
        assert load_config(TrainConfig, demo, ["env=null"]).env is None
        for override, message in [
            ("env.max_turns=0", "env.max_turns=0: must be >= 1"),
            ("env.max_turn=3", "env.max_turn=3: unknown key (known: eval_task_types, eval_variations, max_turns, "),
            ("env=3", "env=3: must be a mapping for ScienceWorldConfig"),
            ("benchmark=alfword", "benchmark='alfword': must be one of ['alfworld', 'scienceworld', "),
            ("benchmark=alfworld", ("env.train_task_types=['lifespan-longest-lived']: unknown key (known: "
                                    "data_dir, games, games_per_type, generated_dir, max_turns, seed)")),
        ]:
            with pytest.raises(ConfigError) as err:
                load_config(TrainConfig, demo, [override])
            assert str(err.value).startswith(message), (override, str(err.value))
        with pytest.raises(ConfigError, match=r"env=ALFWorldConfig\(.*\): must be a ScienceWorldConfig \(the config "
                                              r"of benchmark='scienceworld'\)"):
            dataclasses.replace(cfg, env=ALFWorldConfig(games="generated"))


@pytest.mark.parametrize("section", ["scienceworld", "alfworld", "webshop", "search"])
def test_a_config_written_before_env_is_refused_with_the_rename(section, tmp_path):
    """The sections configs had before ``env:`` (one per benchmark) are refused, saying what to rename."""
    path = tmp_path / "old.yaml"
    path.write_text((CONFIGS / "demo" / "scienceworld_lifespan.yaml").read_text()
                    .replace("\nenv:\n", f"\n{section}:\n"))
    with paths_unchecked(), pytest.raises(ConfigError) as err:
        load_config(TrainConfig, path)
    assert str(err.value) == f"{section}: rename this section to env: (benchmark: {section})"
    with paths_unchecked(), pytest.raises(ConfigError, match=r"^scienceworld: rename this section to env: "):
        load_config(TrainConfig, CONFIGS / "demo" / "scienceworld_lifespan.yaml", ["scienceworld.max_turns=3"])


def test_a_run_saved_before_env_still_resumes():
    """A ``config.json`` written before ``env:`` (a section per benchmark, null but for the run's) is read in
    today's layout: the same config resumes, and a change of the env section is still refused by name."""
    with paths_unchecked():
        cfg = load_config(TrainConfig, CONFIGS / "demo" / "scienceworld_lifespan.yaml")
        other = load_config(TrainConfig, CONFIGS / "demo" / "scienceworld_lifespan.yaml", ["env.max_turns=13"])
    current = json.loads(config_json(cfg))
    saved = {**{k: v for k, v in current.items() if k != "env"}, "alfworld": None, "scienceworld": current["env"],
             "webshop": None, "search": None}
    check_resumable(saved, current, "resume")
    with pytest.raises(ConfigError, match=r"^resume: the config differs from the run's saved config: env.max_turns: "
                                          r"12 -> 13 \(only"):
        check_resumable(saved, json.loads(config_json(other)), "resume")


def test_overlap_is_refused_with_the_rename(tmp_path):
    """``overlap`` (replaced by ``pipeline``) is refused in a YAML and as an override, in one line naming the key and
    what replaced it."""
    path = tmp_path / "old.yaml"
    path.write_text((CONFIGS / "demo" / "scienceworld_lifespan.yaml").read_text() + "overlap: false\n")
    for where, overrides in ((path, []), (CONFIGS / "demo" / "scienceworld_lifespan.yaml", ["overlap=true"])):
        with paths_unchecked(), pytest.raises(ConfigError) as err:
            load_config(TrainConfig, where, overrides)
        assert str(err.value).startswith("overlap: replaced by pipeline: serial | async | inflight")
        assert "\n" not in str(err.value)
    with paths_unchecked():
        assert load_config(TrainConfig, CONFIGS / "demo" / "scienceworld_lifespan.yaml").pipeline == "async"


@pytest.mark.parametrize("overlap, pipeline", [(False, "serial"), (True, "async")])
def test_a_run_saved_with_overlap_resumes_as_its_pipeline(overlap, pipeline):
    """A ``config.json`` written with ``overlap`` reads as the pipeline it ran (false: serial, true: async): that
    pipeline resumes it, another is refused by name."""
    with paths_unchecked():
        cfg = load_config(TrainConfig, CONFIGS / "demo" / "scienceworld_lifespan.yaml", [f"pipeline={pipeline}"])
        other = load_config(TrainConfig, CONFIGS / "demo" / "scienceworld_lifespan.yaml", ["pipeline=inflight"])
    current = json.loads(config_json(cfg))
    saved = {**{k: v for k, v in current.items() if k != "pipeline"}, "overlap": overlap}
    check_resumable(saved, current, "resume")
    with pytest.raises(ConfigError, match=rf"^resume: the config differs from the run's saved config: pipeline: "
                                          rf"'{pipeline}' -> 'inflight' \(only"):
        check_resumable(saved, json.loads(config_json(other)), "resume")

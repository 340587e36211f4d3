"""Every shipped YAML (configs/, bench/configs/, the benchmarks' default files in their packages) loads into its class;
the nine training configs hold the paper's settings.

No engine, model or environment is started: paths are overridden with empty temporary directories and files.
"""

import sys
from pathlib import Path

import pytest
import yaml

from actfirst.core.config import ConfigError, ModelConfig, TrainConfig
from actfirst.core.schema import load_config
from actfirst.envs.benchmarks import BENCHMARKS as REGISTRY
from actfirst.envs.benchmarks import config_path, get_benchmark
from actfirst.envs.scienceworld.config import ScienceWorldConfig
from actfirst.envs.webshop.config import WebShopConfig
from actfirst.rollout.strategies import STRATEGIES
from actfirst.teacher.sft import TeacherSFTConfig

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
from rollout_speedup_config import RolloutSpeedupConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("alfworld_data")  # configs with games: real load

ROOT = Path(__file__).parents[1]
CONFIGS = ROOT / "configs"
SHIPPED = sorted([*CONFIGS.rglob("*.yaml"), *(ROOT / "bench" / "configs").rglob("*.yaml"),
                  *(ROOT / "actfirst" / "envs").glob("*/*.yaml")])
"""The config files the repository ships (the benchmarks' default env files in their packages)."""
TRAIN = sorted(p for p in (CONFIGS / "train").rglob("qwen3-*.yaml"))
"""The nine ActFirst settings (the other methods' configs build on them: test_method_configs)."""
METHOD_CONFIGS = sorted(p for p in (CONFIGS / "train").rglob("*.yaml") if not p.name.startswith("qwen3-"))
"""One per method and benchmark where a paper runs it: <method>-<student>.yaml (OPD is ``vanilla``)."""
BENCHMARKS = ("alfworld", "scienceworld", "webshop")
SIZES = ("0.6b", "1.7b", "4b")
TURN_LIMITS = {"alfworld": 30, "webshop": 15, "scienceworld": 30}   # Sec. 5.1


def config_class(path: Path) -> type:
    """The config class a shipped YAML is for (an unmapped file fails the test that lists them all)."""
    rel = path.relative_to(ROOT).parts
    if rel[:2] in (("configs", "train"), ("configs", "demo")):
        return TrainConfig
    if rel[:2] == ("actfirst", "envs"):
        return REGISTRY[path.stem].config_class
    if rel[:2] == ("configs", "teacher"):
        return TeacherSFTConfig
    if rel[:3] == ("bench", "configs", "models"):
        return ModelConfig
    if rel[:2] == ("bench", "configs") and path.name.startswith("rollout_speedup"):
        return RolloutSpeedupConfig
    raise AssertionError(f"{path.relative_to(ROOT)}: no config class known for this file; add it to test_configs.py")


def test_nine_training_configs():
    names = {p.relative_to(CONFIGS / "train").as_posix() for p in TRAIN}
    assert names == {f"{b}/qwen3-{s}.yaml" for b in BENCHMARKS for s in SIZES}


@pytest.mark.parametrize("path", TRAIN, ids=lambda p: p.relative_to(CONFIGS).as_posix())
def test_training_config_holds_the_paper_settings(path, paths):
    cfg = load_config(TrainConfig, path, paths)
    bench, size = path.parent.name, path.stem.removeprefix("qwen3-")
    assert cfg.benchmark == bench
    # Only this benchmark's env section, written out, with its turn limit.
    env = cfg.env
    assert isinstance(env, REGISTRY[bench].config_class) and env.max_turns == TURN_LIMITS[bench]
    if bench == "scienceworld":
        default = load_config(ScienceWorldConfig, config_path("scienceworld"))
        assert env.train_task_types == default.train_task_types and len(env.train_task_types) == 17
        assert env.simplification == "easy"
    if bench == "webshop":  # C.1: the full product catalog, as the default env file has it
        assert env == load_config(WebShopConfig, config_path("webshop"))
        assert (env.product_file, env.attribute_file, env.num_products) == ("items_shuffle.json", "items_ins_v2.json",
                                                                          None)
    # The placeholders name this setting (the overrides replaced them in cfg).
    raw = yaml.safe_load(path.read_text())
    assert raw["student"]["model"] == f"/models/Qwen3-{size.upper()}"
    assert raw["teacher"] == f"/models/{bench}-teacher-qwen3-8b"
    assert raw["references"] == f"runs/refs/{bench}.jsonl"
    assert cfg.out_dir == f"runs/{bench}/qwen3-{size}"
    # Sec. 5.1.
    assert (cfg.num_updates, cfg.rollout.batch_tasks, cfg.batch_samples) == (250, 16, 64)
    assert cfg.rollout.strategy == "actfirst"
    assert (cfg.rollout.temperature, cfg.rollout.top_p) == (1.0, 1.0)
    # Appendix B.3.
    b = cfg.rollout.budget
    assert (b.first_stage, b.total, b.eval_first_stage, b.eval_total) == (384, 512, 1920, 2048)
    # C.1, C.4: evaluated on the training engine with seeds 42/43/44; C.2: ten teacher rollouts per task.
    assert cfg.evaluation is not None and cfg.evaluation.seeds == [42, 43, 44]
    assert cfg.rollout.max_prompt_tokens + b.eval_total <= cfg.student.max_model_len
    assert cfg.prepare.teacher_rollouts == 10 and cfg.prepare.build_models is None
    assert (b.second_stage, b.fast_action_tokens) == (128, 512)
    assert cfg.rollout.max_prompt_tokens + b.total <= cfg.student.max_model_len
    # Appendix B.4.
    assert (cfg.loss.clip_eps, cfg.loss.dual_clip, cfg.loss.eps) == (0.2, 3.0, 1e-8)
    # Our choices (Table 6 is empty in our copy of the paper).
    assert (cfg.optim.lr, cfg.optim.grad_clip, cfg.optim.weight_decay) == (1e-6, 1.0, 0.01)
    assert cfg.scheduler.b_max == 256 and cfg.student.max_num_seqs >= cfg.scheduler.b_max
    assert cfg.student.dtype == "bfloat16" and cfg.teacher_dtype == "bfloat16"
    # FSDP2 computes in bfloat16 over float32 master weights (AdamW's ~1e-6 steps would round away in bfloat16).
    assert cfg.parallel.compute_dtype == "bfloat16" and cfg.parallel.teacher == "replicate"
    assert cfg.checkpoint_every == 25


@pytest.mark.parametrize("path", TRAIN, ids=lambda p: p.relative_to(CONFIGS).as_posix())
def test_placeholder_paths_fail_by_key_and_value_before_any_work(path, paths, monkeypatch, capsys):
    import actfirst.run as cli
    import actfirst.train.trainer

    size = path.stem.removeprefix("qwen3-").upper()
    with pytest.raises(ConfigError) as err:
        load_config(TrainConfig, path)
    assert f"student.model='/models/Qwen3-{size}': no such directory" in str(err.value)

    bench = path.parent.name
    student, teacher, _ = paths
    for given, message in (([student], f"teacher='/models/{bench}-teacher-qwen3-8b': no such directory"),
                           ([student, teacher], f"references='runs/refs/{bench}.jsonl': no such file")):
        with pytest.raises(ConfigError, match=message):
            load_config(TrainConfig, path, given)

    # The command stops with status 2 and the message before anything starts.
    def no_work(*args, **kwargs):
        raise AssertionError("train() called with a bad config")

    monkeypatch.setattr(actfirst.train.trainer.Trainer, "train", no_work)
    # One rank here: the config's 2 tasks per rank are for 8 (the layout check would speak first).
    assert cli.main(["--config", str(path), "rollout.tasks_per_rank=null"]) == 2
    assert f"student.model='/models/Qwen3-{size}': no such directory" in capsys.readouterr().err


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_is_one_override(strategy, paths):
    path = CONFIGS / "train" / "alfworld" / "qwen3-1.7b.yaml"
    assert load_config(TrainConfig, path, paths + [f"rollout.strategy={strategy}"]).rollout.strategy == strategy


def test_reference_free_strategies_run_without_references(paths):
    path = CONFIGS / "train" / "webshop" / "qwen3-0.6b.yaml"
    for strategy in STRATEGIES:
        overrides = paths[:2] + ["references=null", f"rollout.strategy={strategy}"]
        if strategy in ("vanilla", "no_id", "f2b", "uopd"):
            assert load_config(TrainConfig, path, overrides).references is None
        else:
            with pytest.raises(ConfigError, match=f"references=None: rollout.strategy='{strategy}' needs"):
                load_config(TrainConfig, path, overrides)


def test_misspelled_strategy_is_rejected_by_name(paths):
    path = CONFIGS / "train" / "scienceworld" / "qwen3-4b.yaml"
    with pytest.raises(ConfigError, match=r"rollout\.strategy='actfist': must be one of \['vanilla', 'actfirst'"):
        load_config(TrainConfig, path, paths + ["rollout.strategy=actfist"])


def test_every_shipped_yaml_loads_into_its_class(tmp_path, paths):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    seen = set()
    for path in SHIPPED:
        cls = config_class(path)
        overrides = {TrainConfig: paths, RolloutSpeedupConfig: [f"engine.model={model_dir}"],
                     # benchmark: the 8B config takes it (and env) from --train-config
                     TeacherSFTConfig: [f"base_model={model_dir}", paths[2], "benchmark=alfworld"]}.get(cls, [])
        assert isinstance(load_config(cls, path, overrides), cls), path
        seen.add(cls)
    builtin = {b.config_class for b in REGISTRY.values() if b.__module__.startswith("actfirst.envs.")}
    assert len(builtin) == 4 and seen == {TrainConfig, RolloutSpeedupConfig, ModelConfig, TeacherSFTConfig, *builtin}


def test_demo_config_builds_its_models_from_nothing():
    """The CPU demo's config: its student and (when not shipped) teacher are prepare's outputs, so it loads under
    ``paths_unchecked`` and names what prepare builds; the task set evaluates held-out variations of the trained
    types, at least 64 sampled episodes per evaluation."""
    from actfirst.core.config import DEMO_CONFIG
    from actfirst.preparation.build import load_run_config

    cfg = load_run_config(None, [])
    assert Path(DEMO_CONFIG).is_file()
    build = cfg.prepare.build_models
    assert build is not None and build.student_sft.modes == ["full_response", "next_action", "inverse_dynamics"]
    assert (build.teacher_dir, build.student_dir) == (cfg.teacher, cfg.student.model)  # it builds only its own
    env = cfg.env
    assert env.eval_task_types == env.train_task_types
    assert len(env.eval_task_types) * env.eval_variations * len(cfg.evaluation.seeds) >= 64
    with pytest.raises(ConfigError, match="student.model="):
        load_config(TrainConfig, DEMO_CONFIG, ["student.model=/does/not/exist"])


@pytest.mark.parametrize("override,named", [
    ("rollout.temperature=1e309", "rollout.temperature=inf: must be a finite number"),
    ("optim.weight_decay=1e309", "optim.weight_decay=inf: must be a finite number"),
    ("optim.lr=.nan", "optim.lr=nan: must be a finite number"),
    ("rollout.temperature=0", "rollout.temperature=0.0: must be > 0 in training"),
    ("evaluation.temperature=-0.1", "evaluation.temperature=-0.1: must be >= 0 (0: greedy)"),
    ("evaluation.top_p=0", "evaluation.top_p=0.0: must be in (0, 1]"),
    ("student.model=''", "student.model='': must name a Hugging Face model directory"),
    ("teacher=''", "teacher='': must name a Hugging Face model directory"),
    ("out_dir=''", "out_dir='': must name a directory"),
    ("references=' '", "references=' ': must name a reference cache file"),
    ("student.sleep_level=true", "student.sleep_level=True: must be one of [0, 1, 2]"),
    ("parallel.teacher=half", "parallel.teacher='half': must be one of ['replicate', 'shard']"),
    ("parallel.sync_bucket_mb=0", "parallel.sync_bucket_mb=0: must be >= 1"),
])
def test_bad_values_are_refused_by_name(override, named):
    """Also where preparation may still build the paths (``paths_unchecked``): an empty path is never a path."""
    from actfirst.preparation.build import load_run_config

    with pytest.raises(ConfigError) as err:
        load_run_config(None, [override])
    assert named in str(err.value)


def test_sleep_needs_an_engine_that_is_idle_during_the_update():
    from actfirst.preparation.build import load_run_config

    with pytest.raises(ConfigError, match=r"student.sleep_level=2: needs pipeline: serial, not inflight"):
        load_run_config(None, ["student.sleep_level=2", "pipeline=inflight"])
    with pytest.raises(ConfigError, match=r"student.sleep_level=1: needs pipeline: serial, not async"):
        load_run_config(None, ["student.sleep_level=1"])  # the default pipeline
    assert load_run_config(None, ["student.sleep_level=1", "pipeline=serial"]).student.sleep_level == 1


def test_uopd_refuses_a_sharded_teacher_and_a_sleeping_student_by_key():
    """UOPD scores proposals with the teacher inside each rank's rollouts (a sharded teacher's collectives would run
    at different times on different ranks: a hang), and its second engine may share the student engine's rotary
    cache, which a sleeping student moves off the GPU (docs/engine.md)."""
    from actfirst.preparation.build import load_run_config

    with pytest.raises(ConfigError, match=r"parallel.teacher='shard': must be 'replicate' with rollout.strategy="):
        load_run_config(None, ["rollout.strategy=uopd", "parallel.teacher=shard"])
    with pytest.raises(ConfigError, match=r"student.sleep_level=2: must be 0 with rollout.strategy='uopd'"):
        load_run_config(None, ["rollout.strategy=uopd", "student.sleep_level=2", "pipeline=serial"])
    assert load_run_config(None, ["rollout.strategy=uopd"]).parallel.teacher == "replicate"


@pytest.mark.parametrize("args,named", [
    (["--nproc-per-node", "0"], "--nproc-per-node=0: must be >= 1"),
    (["--nproc-per-node", "5"], "batch_samples=48: must be a multiple of the ranks (5) x num_minibatches (2)"),
    (["--nproc-per-node", "2", "rollout.batch_tasks=1"], "rollout.batch_tasks=1: fewer than the 2 ranks"),
    (["--nproc-per-node", "2", "rollout.tasks_per_rank=3"], "rollout.tasks_per_rank=3: 2 ranks x 3 is not "
                                                            "rollout.batch_tasks="),
])
def test_a_layout_the_ranks_cannot_share_is_refused_before_launch(args, named, capsys, tmp_path):
    import actfirst.run as cli

    assert cli.main([*args, f"out_dir={tmp_path / 'run'}"]) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("path", METHOD_CONFIGS, ids=lambda p: p.relative_to(CONFIGS).as_posix())
def test_method_configs(path, paths):
    """Each method config names its strategy in its file name and holds its paper's values (003 D.3-D.5)."""
    method, _, student = path.stem.partition("-")
    strategy = {"opd": "vanilla"}.get(method, method)
    overrides = paths if strategy == "b2f" else paths[:2]
    cfg = load_config(TrainConfig, path, overrides)
    assert cfg.benchmark == path.parent.name and cfg.rollout.strategy == strategy
    assert (cfg.references is not None) == cfg.rollout.uses_references
    if student.startswith("qwen2.5"):  # the UOPD paper's settings
        assert cfg.rollout.budget.total == 512 and cfg.evaluation.temperature == (0.0 if cfg.benchmark == "search"
                                                                                  else 0.4)
        assert cfg.num_updates == {"alfworld": 250, "webshop": 150, "search": 300}[cfg.benchmark]
        assert cfg.env is None or cfg.env.max_turns == {"alfworld": 50, "webshop": 15,
                                                        "search": 8}[cfg.benchmark]
        assert cfg.loss.aggregation == "token_mean" and cfg.batch == "rollout"  # D.3, Sec. 5.1
        if cfg.benchmark == "webshop":  # D.1: the 1,000-product catalog, 6,410 / 128 instructions
            assert (cfg.env.product_file, cfg.env.num_products) == ("items_shuffle_1000.json", 1000)
            assert [len(get_benchmark("webshop", cfg.env).tasks(s)) for s in ("train", "eval")] == [6410, 128]
        # E.1/E.2's prompts; Search's one prompt is its observation (E.3) under either set
        assert cfg.rollout.prompts == ("actfirst" if REGISTRY[cfg.benchmark].prompt_is_observation else "uopd")
    else:
        assert cfg.loss.aggregation == "seq_mean_token_mean" and cfg.batch == "turns"  # 000's Eq. 32, Sec. 5.1
        assert cfg.rollout.prompts == "actfirst"  # 000's B.1 templates with B.2's history
    if strategy == "uopd":  # D.4's schedules per student size; Search's signal is the other one 003 defines
        assert cfg.uopd.rate == ((0.5, 0.3) if student == "qwen2.5-1.5b" else (0.3, 0.05))
        assert cfg.uopd.score == ("logprob_gap" if cfg.benchmark == "search" else "teacher_confidence")
        assert cfg.uopd.sft_weight == 1.0 and cfg.uopd.teacher_execution
    if strategy in ("f2b", "b2f"):
        assert cfg.tcod.eta == {"f2b": 6, "b2f": 5}[strategy]


def test_a_base_file_is_merged_section_by_section(tmp_path, paths):
    (tmp_path / "a.yaml").write_text("base: b.yaml\nrollout:\n  strategy: f2b\n")
    (tmp_path / "b.yaml").write_text(f"base: {CONFIGS / 'train' / 'alfworld' / 'qwen3-0.6b.yaml'}\n"
                                     "rollout:\n  batch_tasks: 8\nseed: 3\n")
    cfg = load_config(TrainConfig, tmp_path / "a.yaml", paths)
    assert (cfg.rollout.strategy, cfg.rollout.batch_tasks, cfg.seed) == ("f2b", 8, 3)
    assert cfg.rollout.budget.total == 512  # the sections' other keys come from the base's base
    (tmp_path / "c.yaml").write_text("base: a.yaml\n")
    (tmp_path / "b.yaml").write_text("base: c.yaml\n")
    with pytest.raises(ConfigError, match="a circle of base files"):
        load_config(TrainConfig, tmp_path / "a.yaml", paths)
    (tmp_path / "d.yaml").write_text("base: missing.yaml\n")
    with pytest.raises(ConfigError, match="missing.yaml"):
        load_config(TrainConfig, tmp_path / "d.yaml", paths)

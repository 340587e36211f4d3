"""vLLM's behaviour pinned by ``actfirst/engine/llm.py`` (docs/engine.md, "The model runner" and "CUDA graphs, async
scheduling, sleep"): the V1 model runner where vLLM would pick V2 (a GPU's path), checked at start; async
scheduling off in the real engine, and off where vLLM would turn it on (the CUDA platform's path); the weight
reload's signature checked at start; the versions in pyproject.toml equal to the one the code is written against."""

import tomllib
from pathlib import Path

import pytest

from actfirst.core.config import EngineConfig
from actfirst.engine.llm import (
    V1_RUNNER,
    VLLM_VERSION,
    ModelRunnerError,
    VLLMVersionError,
    _check_worker,
    check_model_runner,
    check_reload_signature,
    vllm_arguments,
)
from actfirst.engine.process import RUNNER_ENV, pin_environment

ROOT = Path(__file__).resolve().parents[2]


def test_the_v1_model_runner_where_vllm_would_pick_v2(tiny_model_dir, monkeypatch):
    """vLLM's own choice, on the path a GPU takes (Triton present): Model Runner V2 when nothing pins it, V1 under
    the environment every engine here sets (read live: vLLM's environment cache set aside for the test)."""
    import vllm.config.vllm as vllm_config
    import vllm.envs as envs
    from vllm.engine.arg_utils import EngineArgs

    monkeypatch.setattr(vllm_config, "HAS_TRITON", True)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.delenv(RUNNER_ENV, raising=False)
    cfg = EngineConfig(model=str(tiny_model_dir), dtype="float32", max_model_len=256, max_num_batched_tokens=256)
    config = EngineArgs(**vllm_arguments(cfg, world_size=1, cuda=False)).create_engine_config()
    cached = envs._is_envs_cache_enabled()
    envs.disable_envs_cache()
    try:
        assert config.use_v2_model_runner is True
        pin_environment()
        assert config.use_v2_model_runner is False
    finally:
        if cached:
            envs.enable_envs_cache()


def test_the_model_runner_is_checked_at_start(engine):
    """The engine runs V1 (the check passes in it); a V2 runner, or V1 where vLLM's config says V2, stops a start."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2Runner

    runner = engine.vllm.llm.llm_engine.model_executor.driver_worker.worker.model_runner
    check_model_runner(runner, use_v2=False)
    for found, use_v2 in ((V2Runner.__new__(V2Runner), False), (runner, True)):
        with pytest.raises(ModelRunnerError) as error:
            check_model_runner(found, use_v2=use_v2)
        name = f"{type(found).__module__}.{type(found).__qualname__}"
        assert str(error.value).startswith(f"vLLM runs the model runner {name} (use_v2_model_runner={use_v2}); "
                                           f"ActFirst pins the V1 runner {V1_RUNNER}")
        assert f"{RUNNER_ENV} must be 0" in str(error.value)


def test_the_real_engine_schedules_synchronously(engine):
    """One batch at a time: every step returns the outputs of the batch it ran (no batch queue)."""
    vllm_engine = engine.vllm.llm.llm_engine
    assert vllm_engine.vllm_config.scheduler_config.async_scheduling is False
    core = vllm_engine.engine_core.engine_core  # in process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
    assert core.batch_queue is None and core.step_fn == core.step


def _cpu_platform_keeping_async_scheduling_fault_injection(original):
    """The CPU platform's config hook with its one async-scheduling line undone: what ``CudaPlatform``'s hook does
    (it leaves the field as ``VllmConfig.__post_init__`` resolved it)."""

    def check_and_update_config(cls, vllm_config) -> None:
        resolved = vllm_config.scheduler_config.async_scheduling
        original(vllm_config)
        vllm_config.scheduler_config.async_scheduling = resolved

    return classmethod(check_and_update_config)


@pytest.mark.parametrize("world_size", [1, 2])
def test_async_scheduling_stays_off_where_vllm_would_turn_it_on(tiny_model_dir, monkeypatch, world_size):
    """vLLM's own config code, on the path a GPU takes: without our argument it turns async scheduling on (for the
    one-rank executor and the external launcher alike); with it, off."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform

    hook = _cpu_platform_keeping_async_scheduling_fault_injection(current_platform.check_and_update_config)
    monkeypatch.setattr(type(current_platform), "check_and_update_config", hook)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    cfg = EngineConfig(model=str(tiny_model_dir), dtype="float32", max_model_len=256, max_num_batched_tokens=256)
    ours = vllm_arguments(cfg, world_size=world_size, cuda=False)
    default = {k: v for k, v in ours.items() if k != "async_scheduling"}
    assert EngineArgs(**default).create_engine_config().scheduler_config.async_scheduling is True
    assert EngineArgs(**ours).create_engine_config().scheduler_config.async_scheduling is False


def test_cuda_graphs_on_a_gpu_eager_on_the_cpu(tiny_model_dir):
    cfg = EngineConfig(model=str(tiny_model_dir))
    assert vllm_arguments(cfg, world_size=1, cuda=True)["enforce_eager"] is False
    assert vllm_arguments(cfg, world_size=1, cuda=False)["enforce_eager"] is True
    for given in (True, False):
        cfg = EngineConfig(model=str(tiny_model_dir), enforce_eager=given)
        assert {vllm_arguments(cfg, world_size=1, cuda=c)["enforce_eager"] for c in (True, False)} == {given}


def reload_weights_fault_injection(self) -> None:
    """The signature of an older vLLM's ``GPUModelRunner.reload_weights``: it reloads from disk, takes no weights."""


def test_the_reload_signature_is_checked(engine):
    import vllm

    engine.vllm.llm.collective_rpc(_check_worker, args=(vllm.__version__,))  # the installed one passes
    for method, found in ((reload_weights_fault_injection, "it has GPUModelRunner.reload_weights(self) -> None"),
                          (None, "it has no GPUModelRunner.reload_weights")):
        with pytest.raises(VLLMVersionError) as error:
            check_reload_signature(method, "GPUModelRunner.reload_weights", "0.9.2")
        assert str(error.value) == (
            f"vllm 0.9.2 cannot load weights in place: {found}, without weights_iterator; ActFirst needs "
            f"vllm=={VLLM_VERSION} (pyproject.toml's gpu extra; vllm-cpu=={VLLM_VERSION} on the CPU)")


def test_the_pins_are_the_versions_the_code_is_written_against():
    from importlib.metadata import version

    import torch

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    torch_pin, = [d for d in project["dependencies"] if d.startswith("torch")]
    assert f"vllm=={VLLM_VERSION}" in extras["gpu"] and torch_pin in extras["gpu"]
    assert f"vllm-cpu=={VLLM_VERSION}" in extras["cpu"]
    assert version("vllm-cpu") == VLLM_VERSION  # the environment these tests run in
    assert torch.__version__.split("+")[0] == torch_pin.removeprefix("torch==")

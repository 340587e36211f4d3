"""vLLM's behaviour pinned by ``actfirst/engine/llm.py`` (docs/engine.md, "CUDA graphs, async scheduling, sleep"): async
scheduling off in the real engine, and off where vLLM would turn it on (the CUDA platform's path); the weight
reload's signature checked at start; the versions in pyproject.toml equal to the one the code is written against."""

import tomllib
from pathlib import Path

import pytest

from actfirst.core.config import EngineConfig
from actfirst.engine.llm import (
    VLLM_VERSION,
    VLLMVersionError,
    _check_worker_reload,
    check_reload_signature,
    vllm_arguments,
)

ROOT = Path(__file__).resolve().parents[2]


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

    engine.vllm.llm.collective_rpc(_check_worker_reload, args=(vllm.__version__,))  # the installed one passes
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

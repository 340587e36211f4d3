import pytest

from actfirst.config import EngineConfig, SchedulerConfig
from actfirst.engine.core import ActFirstEngine


@pytest.fixture(scope="session")
def engine(tiny_model_dir):
    """One real in-process vLLM engine for all engine tests (vLLM starts once per process)."""
    cfg = EngineConfig(model=str(tiny_model_dir), dtype="float32", max_model_len=1024, max_num_seqs=64,
                       max_num_batched_tokens=4096, kv_cache_gib=1)
    return ActFirstEngine.from_config(cfg, SchedulerConfig(b_max=8))

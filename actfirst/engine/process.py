"""What vLLM (0.32) sets up once per process, and how the engines of one process (UOPD: the student's and the
teacher's) share it. Read in vLLM's source; docs/engine.md, "Two engines in one process", has the file:line of each.

- **Its environment is read once.** The first in-process ``EngineCore`` calls ``enable_envs_cache()``
  (``vllm/v1/engine/core.py``): every ``VLLM_*`` variable read through ``vllm.envs`` is frozen from then on. So
  :func:`pin_environment` sets ours before any engine of the process starts, and every engine sets the same values.
  Our one per-engine variable, ``VLLM_CPU_KVCACHE_SPACE``, is read from ``os.environ`` directly at each engine's
  config (``CpuPlatform.check_and_update_config``), so each engine still gets its own.
- **Its model runner is chosen from that environment**: :data:`RUNNER_ENV` pins the V1 runner (docs/engine.md, "The
  model runner"; ``actfirst.engine.llm.check_model_runner`` checks it at every start).
- **Each engine's worker reseeds the process's RNGs** (``set_random_seed(model_config.seed)`` in the GPU and CPU
  workers' ``init_device``: Python's ``random``, NumPy, torch's CPU and CUDA generators), with the engine's seed,
  which is the same on every rank. :func:`caller_rng_kept` gives the caller its generators back as they were.
- **The workspace manager is one global** (``vllm/v1/worker/workspace.py``: ``_manager``). Each GPU worker's start
  replaces it (``init_workspace_manager``, warning that it "reinitializes") and locks it once its CUDA graphs are
  captured; attention backends that take scratch from it do so at run time from whichever manager is current. With
  two engines the first one's manager would be dropped (its scratch freed while its graphs may still point into
  it) and the first engine would then run on the second's, locked to the second's sizes. :class:`OwnWorkspace` keeps
  each engine's manager and makes it current before each of that engine's calls. The CPU worker has none.
- Left as they are, with reasons: the compile caches (each compiling engine points ``TORCHINDUCTOR_CACHE_DIR`` and
  ``TRITON_CACHE_DIR`` at its model's cache directory, process-wide; the caches are content-addressed, so the
  variables only decide where files land); the rotary-embedding cache (``get_rope`` shares one module between
  models of the same RoPE settings: read-only, and moved by nothing but a student's sleep, which UOPD refuses); the
  cuMem allocator (one engine per process may sleep: the teacher's never does).
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
"""The variable vLLM chooses its model runner by (``VllmConfig.use_v2_model_runner``): "0" pins V1."""

ENVIRONMENT = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", RUNNER_ENV: "0"}
"""What every engine here needs of vLLM's environment: the engine core in this process, the V1 model runner."""


def pin_environment() -> None:
    """Set :data:`ENVIRONMENT` (before the process's first engine starts: vLLM reads it once)."""
    os.environ.update(ENVIRONMENT)


@contextlib.contextmanager
def caller_rng_kept() -> Iterator[None]:
    """Give the caller's random generators (Python, NumPy, torch's CPU and CUDA) back as they were when the block
    began: an engine's start reseeds them with the engine's seed, the same on every rank."""
    python, numpy, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


class OwnWorkspace:
    """One engine's vLLM workspace manager, kept alive and made current before each of its calls (see the module
    docstring). Taken right after the engine started, on CUDA; None on the CPU, whose worker sets up none."""

    def __init__(self, cuda: bool) -> None:
        from vllm.v1.worker import workspace

        self._module = workspace
        self.manager: Any = workspace._manager if cuda else None

    def make_current(self) -> None:
        """Make this engine's manager vLLM's current one (no-op without one)."""
        if self.manager is not None:
            self._module._manager = self.manager

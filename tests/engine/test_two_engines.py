"""Two engines in one process (UOPD's teacher beside the student; docs/engine.md, "Two engines in one process"),
started in a process of their own so that the first is the process's first: each generates from its own weights
after the other was reloaded, the caller's random generators survive both starts, and each engine steps with its
own vLLM workspace manager made current."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import random

import numpy as np
import torch
from test_engine import hf_logprobs, perturbed_weights

from actfirst.core.config import EngineConfig, ModelConfig, SchedulerConfig
from actfirst.engine.request import RequestKind, SamplingSpec
from actfirst.models.build import build_model

PROMPT = [21, 22, 23] * 6
SPEC = SamplingSpec(max_tokens=12, min_tokens=12, ignore_eos=True, temperature=1.0, seed=5)


def draws() -> tuple[list[float], float, float]:
    """One draw from each of torch's, Python's and NumPy's global generators."""
    return torch.rand(3).tolist(), random.random(), float(np.random.rand())


def two_engines(student_dir: str, teacher_dir: str) -> dict:
    """In a fresh process: the student's engine, then the teacher's; generate from both, reload the student with
    perturbed weights, generate from both again. Returns the results, whether the generators came back as they
    were, and the workspace manager each engine's steps ran with (a named stand-in per engine: the CPU worker has
    none of its own)."""
    from vllm.v1.worker import workspace

    from actfirst.engine.core import ActFirstEngine

    def engine(model: str) -> ActFirstEngine:
        cfg = EngineConfig(model=model, dtype="float32", max_model_len=512, max_num_seqs=8,
                           max_num_batched_tokens=512, kv_cache_gib=1, seed=0)
        return ActFirstEngine.from_config(cfg, SchedulerConfig(b_max=4))

    for seed in (torch.manual_seed, random.seed, np.random.seed):
        seed(1234)
    student, teacher = engine(student_dir), engine(teacher_dir)
    after_starts = draws()
    for seed in (torch.manual_seed, random.seed, np.random.seed):
        seed(1234)
    rng_kept = after_starts == draws()

    seen: dict[str, list[str]] = {"student": [], "teacher": []}
    for name, e in (("student", student), ("teacher", teacher)):
        e.vllm.workspace.manager = f"workspace of the {name} (test double)"
        step = e.vllm.engine.step

        def recording_step(step=step, name=name):
            seen[name].append(workspace._manager)
            return step()

        e.vllm.engine.step = recording_step

    def generate_both() -> tuple:
        async def run():
            return await asyncio.gather(*(e.generate(PROMPT, RequestKind.FULL_RESPONSE, SPEC)
                                          for e in (student, teacher)))
        return tuple((r.token_ids, r.logprobs) for r in asyncio.run(run()))

    (s0, t0) = generate_both()
    student.update_weights(perturbed_weights(student_dir, seed=1).items())
    (s1, t1) = generate_both()
    return {"student": (s0, s1), "teacher": (t0, t1), "rng_kept": rng_kept, "workspaces": seen}


def test_two_engines_in_one_process_each_generate_from_their_own_weights(tiny_model_dir, tmp_path):
    teacher_dir = build_model(ModelConfig(tokenizer="env-bpe", hidden_size=64, num_hidden_layers=2,
                                          num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                          intermediate_size=128, seed=2), tmp_path / "teacher")
    with mp.get_context("spawn").Pool(1) as pool:
        out = pool.apply(two_engines, (str(tiny_model_dir), str(teacher_dir)))
    (s0, s1), (t0, t1) = out["student"], out["teacher"]
    assert out["rng_kept"], "an engine's start reseeded the caller's generators"
    assert t1 == t0  # the student's reload did not reach the teacher's engine
    for tokens, logprobs in (t0, t1):
        ref = hf_logprobs(teacher_dir, None, PROMPT, tokens, 1.0)
        torch.testing.assert_close(torch.tensor(logprobs, dtype=torch.float64), ref, atol=2e-3, rtol=0)
    new = perturbed_weights(tiny_model_dir, seed=1)
    ref_new = hf_logprobs(tiny_model_dir, new, PROMPT, s1[0], 1.0)
    torch.testing.assert_close(torch.tensor(s1[1], dtype=torch.float64), ref_new, atol=2e-3, rtol=0)
    torch.testing.assert_close(torch.tensor(s0[1], dtype=torch.float64),
                               hf_logprobs(tiny_model_dir, None, PROMPT, s0[0], 1.0), atol=2e-3, rtol=0)
    assert s1[0] != s0[0]
    for name, managers in out["workspaces"].items():
        assert managers and set(managers) == {f"workspace of the {name} (test double)"}, (name, managers)

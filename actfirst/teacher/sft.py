"""A task-specialized teacher by SFT (Appendix C.2's first stage): any Hugging Face causal LM trained on the
successful (or score-filtered) trajectories of the reference cache and of a source model's rollouts, in B.1's
full-response format; ``python -m actfirst.make_teacher`` is its command. C.2's second stage, GiGPO, belongs to an
RL engine (docs/teacher.md).

Layout while it runs, beside ``out``::

    <out>.partial/  config.json        the run's config (a rerun with another one is refused)
                    examples.pt        the tokenized samples (``actfirst.teacher.data``), built once by rank 0
                    data.json          where they came from: per source given / kept / filtered, tasks covered
                    checkpoints/       ``actfirst.train.state``'s checkpoints: the float32 model, AdamW's sharded
                                       state (DCP) and the data position (the optimizer step), committed atomically
    <out>/          the teacher: model.safetensors, config.json, tokenizer, chat template, and
                    actfirst_teacher_sft.json (data, losses, probe NLL before and after); renamed into place last

Every rank runs :func:`train_rank` with the model FSDP2-sharded (``actfirst.parallel.fsdp``), computing in bfloat16
on GPUs and float32 on a CPU (``compute_dtype: auto``) over float32 master weights and AdamW state. An optimizer
step takes whole samples, shuffled per epoch (seed, epoch), until ``batch_tokens``; the ranks split each step's
samples by length and sum their gradients, and the loss is the token mean over the step's samples on all ranks,
so N ranks compute what one does. A rerun after an interruption (kill -9 included) continues from the last
checkpoint, on any number of ranks, and ends where an uninterrupted run ends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any, Literal

import torch

from actfirst.core.config import SFT_MODES, OptimConfig, ThoughtStyle, env_section_type
from actfirst.core.files import write_atomically
from actfirst.core.schema import check, check_dir, config_json, load_config, paths_checked, to_dict, type_from
from actfirst.core.user_input import ConfigError, check_exists
from actfirst.envs.benchmarks import BENCHMARKS, Benchmark, get_benchmark
from actfirst.envs.response_format import ACTION_TAGS
from actfirst.models.hub import is_hub_id

logger = logging.getLogger(__name__)

RECORD = "actfirst_teacher_sft.json"
"""How a teacher made here was trained, in its directory."""
EXAMPLES, DATA, CONFIG = "examples.pt", "data.json", "config.json"
RESUMABLE = ("out", "checkpoint_every", "data_workers", "micro_batch_tokens", "activation_checkpointing")
"""Keys a rerun of an interrupted run may change: where it is (moved or spelled otherwise), and memory and speed, not
what is trained."""
_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclasses.dataclass(kw_only=True, slots=True)
class TeacherSFTConfig:
    """``python -m actfirst.make_teacher``'s config (configs/teacher/*.yaml)."""

    benchmark: str
    """A registered benchmark's name (its training tasks are the ones replayed)."""
    env: Any = dataclasses.field(default=None, metadata=type_from(env_section_type))
    """The benchmark's environment section, as in a training config (absent: its default file)."""
    base_model: str
    """The Hugging Face causal LM to fine-tune (a local directory)."""
    out: str
    """Where the teacher's Hugging Face directory is written (it must not exist yet, unless finished)."""
    references: str | None = None
    """A reference cache (``python -m actfirst.references build`` / ``actfirst.prepare``) as a source."""
    candidate_files: list[str] = dataclasses.field(default_factory=list)
    """Candidate JSONL files as sources, e.g. a source model's rollouts ``<references>.teacher.jsonl``."""
    min_score: float | None = None
    """null: keep the trajectories that succeed (C.1); a number on [0, 100]: those scoring at least this."""
    modes: list[Literal["full_response", "next_action", "inverse_dynamics"]] = dataclasses.field(
        default_factory=lambda: ["full_response"])
    """The B.1 prompt modes trained on (the teacher scores and writes full responses)."""
    thoughts: ThoughtStyle = "short"
    """The reasoning of a full response whose source has none (``actfirst.train.sft.THOUGHTS``)."""
    max_prompt_tokens: int = 3584
    """B.2's prompt budget (the training config's ``rollout.max_prompt_tokens``)."""
    epochs: float = 2.0
    batch_tokens: int = 262144
    """Tokens per optimizer step over all ranks (whole samples)."""
    micro_batch_tokens: int = 16384
    """Tokens per packed forward/backward on a rank."""
    optim: OptimConfig = dataclasses.field(default_factory=lambda: OptimConfig(
        lr=1e-5, weight_decay=0.0, warmup_updates=10, schedule="cosine", min_lr_ratio=0.1))
    """AdamW; its ``warmup_updates`` count optimizer steps."""
    compute_dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    """The forward and backward (auto: bfloat16 on GPUs, float32 on a CPU); master weights are float32."""
    save_dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    """The teacher's weights on disk (auto: the base model's dtype)."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in the backward (long samples of large models)."""
    probe_samples: int = 64
    """Samples (spread over the data) whose mean token NLL is recorded before and after training."""
    data_workers: int = 8
    """Environment workers replaying the trajectories."""
    checkpoint_every: int = 50
    """Optimizer steps between two checkpoints."""
    seed: int = 0

    def __post_init__(self) -> None:
        check(self.benchmark in BENCHMARKS, "benchmark", self.benchmark, f"must be one of {sorted(BENCHMARKS)}")
        cls = BENCHMARKS[self.benchmark]
        check(self.env is None or isinstance(self.env, cls.config_class), "env", self.env,
              f"must be a {cls.config_class.__name__}")
        check(cls.response_format is ACTION_TAGS and not cls.prompt_is_observation, "benchmark", self.benchmark,
              "its full responses are not B.1's <think>/<action> format, which this command writes")
        check(cls.fast_actions or self.modes == ["full_response"], "modes", self.modes,
              f"benchmark {self.benchmark!r} has only full-response prompts")
        check(bool(self.base_model.strip()), "base_model", self.base_model,
              "must name a Hugging Face model directory or Hub id")
        if not is_hub_id(self.base_model):  # an id is checked where it is resolved (actfirst.models.hub)
            check_dir(self.base_model, "base_model")
        check(bool(self.out.strip()), "out", self.out, "must name a directory")
        check(self.references is not None or bool(self.candidate_files), "references", self.references,
              "give a reference cache, candidate_files, or both: there is nothing to train on")
        if paths_checked():
            if self.references is not None:
                check_exists(self.references, "references", "file")
            for i, f in enumerate(self.candidate_files):
                check_exists(f, f"candidate_files[{i}]", "file")
        check(self.min_score is None or 0 <= self.min_score <= 100, "min_score", self.min_score,
              "must be on [0, 100] (or null: success)")
        check(bool(self.modes) and len(set(self.modes)) == len(self.modes), "modes", self.modes,
              f"need distinct modes among {list(SFT_MODES)}")
        check(self.epochs > 0, "epochs", self.epochs, "must be > 0")
        for name in ("max_prompt_tokens", "batch_tokens", "micro_batch_tokens", "data_workers", "checkpoint_every"):
            check(getattr(self, name) >= 1, name, getattr(self, name), "must be >= 1")
        check(self.probe_samples >= 0, "probe_samples", self.probe_samples, "must be >= 0")

    def make_benchmark(self) -> Benchmark:
        return get_benchmark(self.benchmark, self.env)

    @property
    def work_dir(self) -> Path:
        """Where the unfinished run lives (``<out>.partial``)."""
        out = Path(self.out)
        return out.with_name(f"{out.name}.partial")


def load_teacher_config(path: str | None, overrides: list[str], *, train_config: str | None = None
                        ) -> TeacherSFTConfig:
    """The config of ``path`` plus overrides; ``train_config``: a training YAML whose ``benchmark`` and ``env`` (and
    ``references``, when this config names none) the teacher takes, so that it replays what the run trains on; the
    ``env.*`` overrides apply to that training config's ``env`` (as the run's own overrides would)."""
    if train_config is None:
        return load_config(TeacherSFTConfig, path, overrides)
    from actfirst.preparation.build import load_run_config

    run = load_run_config(train_config, [o for o in overrides if o.startswith(("env.", "env="))])
    taken = [f"benchmark={run.benchmark}", f"env={json.dumps(to_dict(run.env) if run.env is not None else None)}"]
    if run.references is not None:
        taken.append(f"references={run.references}")
    if path is not None:
        from actfirst.core.schema import read_config_file

        own = read_config_file(path)
        clash = [k for k in ("benchmark", "env") if k in own]
        if clash:
            raise ConfigError(f"--config={path!r}: sets {clash[0]}, which --train-config={train_config!r} gives; "
                              f"drop one")
        taken = [t for t in taken if t.split("=", 1)[0] not in own]
    return load_config(TeacherSFTConfig, path, taken + list(overrides))


def check_resumable(cfg: TeacherSFTConfig) -> None:
    """An unfinished run at ``cfg.work_dir`` must have been started with ``cfg`` (up to :data:`RESUMABLE`)."""
    saved_path = cfg.work_dir / CONFIG
    if not saved_path.is_file():
        return
    saved, current = json.loads(saved_path.read_text()), json.loads(config_json(cfg))
    differ = [k for k in sorted(set(saved) | set(current)) if k not in RESUMABLE and saved.get(k) != current.get(k)]
    if differ:
        k = differ[0]
        raise ConfigError(f"out={cfg.out!r}: {cfg.work_dir} holds an unfinished run of another config ({k}: "
                          f"{saved.get(k)!r} there, {current.get(k)!r} now); give its config to continue it, or "
                          f"remove {cfg.work_dir} to start afresh")


def ensure_examples(cfg: TeacherSFTConfig) -> Path:
    """Build the run's samples (replayed and filtered trajectories, tokenized) unless they exist; returns the
    file. Rank 0's work: the others wait for the file (:func:`wait_for`)."""
    from transformers import AutoTokenizer

    from actfirst.rollout.prompts import Mode
    from actfirst.teacher.data import build_samples, write_examples

    work = cfg.work_dir
    path = work / EXAMPLES
    if path.is_file():
        return path
    work.mkdir(parents=True, exist_ok=True)
    write_atomically(work / CONFIG, config_json(cfg))
    samples, record = asyncio.run(build_samples(
        cfg.make_benchmark(), AutoTokenizer.from_pretrained(cfg.base_model), references=cfg.references,
        candidate_files=cfg.candidate_files, min_score=cfg.min_score, modes=[Mode(m) for m in cfg.modes],
        max_prompt_tokens=cfg.max_prompt_tokens, thought=cfg.thoughts, workers=cfg.data_workers))
    write_atomically(work / DATA, json.dumps(record, indent=1))
    write_examples(path, samples)
    logger.info(f"[make_teacher] {record['samples']} samples ({record['supervised_tokens']} supervised of "
                f"{record['tokens']} tokens) from {record['trajectories']} trajectories of {record['tasks_covered']}/"
                f"{record['training_tasks']} training tasks")
    return path


def wait_for(path: Path, poll_s: float = 2.0) -> None:
    """Block until ``path`` exists (rank 0 writes it; a failed rank 0 stops this one through the launcher)."""
    while not path.is_file():
        time.sleep(poll_s)


def batch_plan(lengths: list[int], *, batch_tokens: int, epochs: float, seed: int) -> list[tuple[int, list[int]]]:
    """The optimizer steps as (epoch, samples): per epoch a permutation of seed (seed, epoch), cut into runs of whole
    samples of at most ``batch_tokens`` tokens (a longer sample alone); a fractional last epoch keeps its share of
    steps."""
    plan: list[tuple[int, list[int]]] = []
    for epoch in range(math.ceil(epochs)):
        order = list(range(len(lengths)))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        steps: list[list[int]] = []
        load = 0
        for i in order:
            if not steps or load + lengths[i] > batch_tokens:
                steps.append([])
                load = 0
            steps[-1].append(i)
            load += lengths[i]
        if epoch + 1 > epochs:
            steps = steps[: max(1, round((epochs - epoch) * len(steps)))]
        plan += [(epoch, step) for step in steps]
    return plan


def rank_share(step: list[int], lengths: list[int], rank: int, world: int) -> list[int]:
    """This rank's samples of an optimizer step: longest first, each to the rank holding the fewest tokens."""
    loads = [0] * world
    mine = []
    for i in sorted(step, key=lambda i: (-lengths[i], i)):
        r = min(range(world), key=lambda r: (loads[r], r))
        loads[r] += lengths[i]
        if r == rank:
            mine.append(i)
    return mine


def publish(cfg: TeacherSFTConfig, model: Any, tokenizer: Any, full: dict[str, torch.Tensor],
            record: dict[str, Any]) -> Path:
    """Rank 0: the teacher's Hugging Face directory, written beside ``out`` and renamed into place; the unfinished
    run's directory is then removed."""
    out = Path(cfg.out)
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    dtype = save_dtype(cfg)
    model.config.dtype = dtype
    model.save_pretrained(tmp, state_dict={k: v.to(dtype) for k, v in full.items()}, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    write_atomically(tmp / RECORD, json.dumps(record, indent=1))
    os.replace(tmp, out)
    shutil.rmtree(cfg.work_dir, ignore_errors=True)
    return out


def save_dtype(cfg: TeacherSFTConfig) -> torch.dtype:
    """The dtype of the teacher's weights on disk."""
    if cfg.save_dtype != "auto":
        return _DTYPES[cfg.save_dtype]
    from transformers import AutoConfig

    dtype = getattr(AutoConfig.from_pretrained(cfg.base_model), "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def compute_dtype(cfg: TeacherSFTConfig, device: torch.device) -> torch.dtype:
    """The forward/backward dtype: ``compute_dtype``, or for ``auto`` bfloat16 on GPUs and float32 on a CPU."""
    if cfg.compute_dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[cfg.compute_dtype]


def finished(cfg: TeacherSFTConfig) -> bool:
    """Whether ``out`` holds a teacher this command made; a directory that is something else is refused."""
    out = Path(cfg.out)
    if not out.exists():
        return False
    if not (out / RECORD).is_file():
        raise ConfigError(f"out={cfg.out!r}: exists and is not a teacher made by python -m actfirst.make_teacher; "
                          f"remove it or choose another out")
    return True

"""The config sections of a run: the engine, scheduler, rollouts, update, evaluation and preparation, and
:class:`TrainConfig` that holds them (the loading machinery and ``check``: ``actfirst.core.schema``)::

    cfg = load_config(TrainConfig, "configs/demo/scienceworld_lifespan.yaml", ["scheduler.b_max=64"])
"""

from __future__ import annotations

import dataclasses
import json
import reprlib
from pathlib import Path
from typing import Any, Literal

from actfirst.core.schema import check, check_dir, paths_checked, to_dict, type_from
from actfirst.core.user_input import ConfigError, check_exists
from actfirst.envs.benchmarks import BENCHMARKS, import_benchmark_module
from actfirst.models.hub import is_hub_id
from actfirst.rollout.prompts import PromptSet
from actfirst.rollout.strategies import STRATEGIES, TCODConfig, UOPDConfig
from actfirst.train.trackers import check_report_to, report_to_list

DEMO_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "demo" / "scienceworld_lifespan.yaml"
"""The CPU demo's config (``python -m actfirst.run`` with no ``--config``)."""


@dataclasses.dataclass(kw_only=True, slots=True)
class ModelConfig:
    """A small Qwen3-architecture model built from scratch (tests, the CPU demo, the CPU benchmark)."""

    tokenizer: Literal["qwen3", "env-bpe"] = "env-bpe"
    """``qwen3``: Qwen3's own vocabulary and ids; ``env-bpe``: a small BPE trained on environment text."""
    env_bpe_vocab_size: int = 2048
    """Vocabulary size of the ``env-bpe`` tokenizer before its added tokens."""
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 64
    intermediate_size: int = 384
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    seed: int = 0
    """Seed of the random initialization."""

    def __post_init__(self) -> None:
        for name in ("env_bpe_vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings"):
            check(getattr(self, name) >= 1, name, getattr(self, name), "must be >= 1")
        check(self.env_bpe_vocab_size >= 300, "env_bpe_vocab_size", self.env_bpe_vocab_size,
               "must be >= 300 (256 bytes plus merges and special tokens)")
        check(self.num_attention_heads % self.num_key_value_heads == 0, "num_key_value_heads",
               self.num_key_value_heads, f"must divide num_attention_heads={self.num_attention_heads}")


@dataclasses.dataclass(kw_only=True, slots=True)
class EngineConfig:
    """The student's in-process vLLM engine."""

    model: str
    """A Hugging Face model directory, or a Hub repo id (``Qwen/Qwen3-1.7B``) resolved to its snapshot in the Hugging
    Face cache before any work (``actfirst.models.hub``)."""
    revision: str | None = None
    """With a Hub id: the branch, tag or commit to use (null: ``main``). A run records here the commit it resolved to
    (its ``config.json``, its checkpoints); a local directory has none (null)."""
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    max_model_len: int = 4096
    max_num_seqs: int = 256
    """vLLM's own sequence cap; must be >= scheduler.b_max so that admission control stays ours."""
    max_num_batched_tokens: int = 8192
    kv_cache_gib: int = 2
    """CPU only: KV cache size in whole GiB (``VLLM_CPU_KVCACHE_SPACE``)."""
    gpu_memory_utilization: float = 0.5
    """GPU only: fraction of GPU memory vLLM may take (the trainer shares the GPU)."""
    enable_prefix_caching: bool = True
    enforce_eager: bool | None = None
    """vLLM's ``enforce_eager``. null: CUDA graphs on a GPU (decoding a few sequences is bound by kernel launches
    without them; the in-place weight reload and sleep keep them valid: docs/engine.md), eager on the CPU (which has no
    graphs; vLLM would torch.compile instead)."""
    sleep_level: Literal[0, 1, 2] = 0
    """GPU only: free the engine's memory while the trainer updates (vLLM's sleep mode; needs ``pipeline: serial``).
    1: the weights go to CPU memory and the KV cache is dropped; 2: both are dropped (the new weights come from the
    trainer anyway, so level 2 costs nothing more on wake-up). 0: the engine keeps its memory."""
    seed: int = 0

    def __post_init__(self) -> None:
        check(bool(self.model.strip()), "model", self.model, "must name a Hugging Face model directory or Hub id")
        if not is_hub_id(self.model):
            check_dir(self.model, "model")
        check(self.revision is None or bool(self.revision.strip()), "revision", self.revision,
              "must name a branch, tag or commit (or be null)")
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "kv_cache_gib"):
            check(getattr(self, name) >= 1, name, getattr(self, name), "must be >= 1")
        check(0.0 < self.gpu_memory_utilization <= 1.0, "gpu_memory_utilization", self.gpu_memory_utilization,
               "must be in (0, 1]")
        check(self.max_num_batched_tokens >= self.max_model_len, "max_num_batched_tokens",
               self.max_num_batched_tokens, f"must be >= max_model_len={self.max_model_len}")


@dataclasses.dataclass(kw_only=True, slots=True)
class SchedulerConfig:
    """ActFirst's admission control in front of the engine (fast actions before full responses)."""

    b_max: int = 64
    """Cap on admitted generation requests, shared by fast actions and full responses."""
    fast_action_admission: Literal["wait", "reserve", "preempt"] = "preempt"
    """What a fast action does when b_max requests already run: ``wait`` for a slot; ``reserve``: full responses
    never take the last ``reserved_fast_slots`` slots; ``preempt``: the latest-admitted full response is paused
    (its tokens kept) and resumes later from where it stopped."""
    reserved_fast_slots: int = 16
    """With ``reserve``: slots only fast actions may take (capped at b_max - 1)."""

    def __post_init__(self) -> None:
        check(self.b_max >= 1, "b_max", self.b_max, "must be >= 1")
        check(self.reserved_fast_slots >= 0, "reserved_fast_slots", self.reserved_fast_slots, "must be >= 0")


@dataclasses.dataclass(kw_only=True, slots=True)
class ThinkingBudgetConfig:
    """Budgeted decoding of full responses (Appendix B.3) and the action-only decoding of fast actions."""

    first_stage: int = 384
    """Training: token limit of the first request."""
    total: int = 512
    """Training: limit on the whole response (sampled plus inserted tokens)."""
    eval_first_stage: int = 1920
    eval_total: int = 2048
    second_stage: int = 128
    """Limit of the second request, within what the total leaves."""
    fast_action_tokens: int = 512
    """Action-only requests stop at </action> or this many tokens (Appendix C.5)."""

    def __post_init__(self) -> None:
        for name in ("first_stage", "total", "eval_first_stage", "eval_total", "second_stage", "fast_action_tokens"):
            check(getattr(self, name) >= 1, name, getattr(self, name), "must be >= 1")
        check(self.first_stage <= self.total, "first_stage", self.first_stage, f"must be <= total={self.total}")
        check(self.eval_first_stage <= self.eval_total, "eval_first_stage", self.eval_first_stage,
               f"must be <= eval_total={self.eval_total}")


@dataclasses.dataclass(kw_only=True, slots=True)
class RolloutConfig:
    """How a rollout batch is collected (Sec. 4, Sec. 5.3, Appendix B.2-B.3)."""

    strategy: str = "actfirst"
    """The rollout strategy by name, one of ``actfirst.rollout.strategies.STRATEGIES`` (each class says what it
    does, and names its config section where it has one: ``tcod`` for f2b / b2f, ``uopd``)."""
    batch_tasks: int = 16
    """Tasks per rollout batch over all ranks (Sec. 5.1: 16); one environment worker each."""
    tasks_per_rank: int | None = None
    """The tasks each rank's engine plays per rollout batch, stated: a run on R ranks is then refused unless
    ``batch_tasks`` = tasks_per_rank x R. null: ``batch_tasks`` is dealt round-robin over however many ranks run.
    (docs/memory.md: what this means for b_max.)"""
    temperature: float = 1.0
    """Sampling temperature of every request (0: greedy, for evaluation only; training needs a sampled policy)."""
    top_p: float = 1.0
    prompts: PromptSet = "actfirst"
    """The prompt set: ``actfirst``, 000's B.1 templates with B.2's history (as much as fits ``max_prompt_tokens``);
    ``uopd``, the UOPD paper's E.1/E.2 templates with their two-step history, unfitted (think-then-act only: refused
    with a strategy that executes fast actions, and on a benchmark 003 gives none for). Search's one prompt, E.3's,
    is the same under both."""
    max_prompt_tokens: int = 3072
    """Prompt budget after the chat template (B.2: the oldest history pairs are dropped until the prompt fits; with
    ``prompts: uopd`` a prompt over it goes ahead, counted)."""
    env_timeout_s: float = 600.0
    """An environment call without a reply for this long kills and restarts its worker (the episode fails)."""
    budget: ThinkingBudgetConfig = dataclasses.field(default_factory=ThinkingBudgetConfig)

    def __post_init__(self) -> None:
        check(self.strategy in STRATEGIES, "strategy", self.strategy, f"must be one of {list(STRATEGIES)}")
        check(self.batch_tasks >= 1, "batch_tasks", self.batch_tasks, "must be >= 1")
        check(self.tasks_per_rank is None or self.tasks_per_rank >= 1, "tasks_per_rank", self.tasks_per_rank,
              "must be >= 1 (or null)")
        check(self.temperature >= 0, "temperature", self.temperature, "must be >= 0 (0: greedy)")
        check(0 < self.top_p <= 1, "top_p", self.top_p, "must be in (0, 1]")
        check(self.max_prompt_tokens >= 1, "max_prompt_tokens", self.max_prompt_tokens, "must be >= 1")
        check(self.env_timeout_s > 0, "env_timeout_s", self.env_timeout_s, "must be > 0")

    @property
    def uses_references(self) -> bool:
        """Whether the strategy reads the reference cache (B2F's expert prefixes are the reference actions)."""
        return STRATEGIES[self.strategy].uses_references


@dataclasses.dataclass(kw_only=True, slots=True)
class OptimConfig:
    """The student's optimizer. The paper's Table 6 values did not survive in our copy of the paper; these
    defaults are the usual ones for OPD of Qwen3 students (AdamW, constant learning rate, clip 1.0)."""

    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    """Gradient-norm clip (0: off)."""
    warmup_updates: int = 0
    """Linear warm-up over this many updates, then ``schedule``."""
    schedule: Literal["constant", "cosine"] = "constant"
    min_lr_ratio: float = 0.0
    """Cosine: the final learning rate as a fraction of ``lr``."""

    def __post_init__(self) -> None:
        check(self.lr > 0, "lr", self.lr, "must be > 0")
        check(all(0 <= b < 1 for b in self.betas), "betas", self.betas, "must be in [0, 1)")
        check(self.weight_decay >= 0, "weight_decay", self.weight_decay, "must be >= 0")
        check(self.grad_clip >= 0, "grad_clip", self.grad_clip, "must be >= 0")
        check(self.warmup_updates >= 0, "warmup_updates", self.warmup_updates, "must be >= 0")
        check(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]")


@dataclasses.dataclass(kw_only=True, slots=True)
class LossConfig:
    """The dual-clipped PPO token loss (Appendix B.4, Eq. 29-32) and its aggregation; the log-ratio clamp [-20, 20]
    is fixed."""

    clip_eps: float = 0.2
    """delta."""
    dual_clip: float = 3.0
    """kappa."""
    eps: float = 1e-8
    """epsilon of the seq-mean-token-mean normalization (Eq. 32)."""
    aggregation: Literal["seq_mean_token_mean", "token_mean"] = "seq_mean_token_mean"
    """How token losses make the mini-batch's loss. ``seq_mean_token_mean``: 000's Eq. 32, the mean over responses
    of each response's mean over its supervised tokens (an SFT target: beta times its token-mean NLL, one response
    of |B|). ``token_mean``: 003's "token-mean aggregation" (Appendix D.3), the sum over every supervised token of
    the mini-batch (all ranks) over their number; an SFT target's sampled tokens count in that number and each adds
    beta times its NLL (``actfirst.train.student``)."""

    def __post_init__(self) -> None:
        check(0 < self.clip_eps < 1, "clip_eps", self.clip_eps, "must be in (0, 1)")
        check(self.dual_clip > 1, "dual_clip", self.dual_clip, "must be > 1")
        check(self.eps > 0, "eps", self.eps, "must be > 0")


EVAL_TEMPERATURE = 0.6
"""The default evaluation temperature (see ``EvaluationConfig.temperature``): measured on the CPU demo
(docs/open-choices.md), it resolves a trained student from its warm start best of 1.0, 0.6 and 0.4,
and it is Qwen3's recommended thinking-mode temperature."""


@dataclasses.dataclass(kw_only=True, slots=True)
class EvaluationConfig:
    """Evaluation during training (Appendix C.1, C.4): think-then-act without references, the evaluation thinking
    budget, on the training engine with many episodes in flight; wall-clock spent here is not training time."""

    every: int = 0
    """Updates between two evaluations (0: none between the first and the last)."""
    before: bool = True
    """Evaluate the starting student too (update 0)."""
    split: Literal["train", "eval"] = "eval"
    tasks: int = 0
    """Evaluate N tasks of the split, round-robin over task types (0: all)."""
    seeds: list[int] = dataclasses.field(default_factory=lambda: [42, 43, 44])
    max_in_flight: int = 16
    """Episodes (and environment workers) at once."""
    temperature: float = EVAL_TEMPERATURE
    """Evaluation's own sampling temperature (0: greedy); the papers leave it open for 000 (its table of evaluation
    settings is empty) and use 0.4 in 003 (D.5). The default (0.6) and the measurement behind it:
    docs/open-choices.md."""
    top_p: float = 1.0

    def __post_init__(self) -> None:
        check(self.every >= 0, "every", self.every, "must be >= 0")
        check(self.temperature >= 0, "temperature", self.temperature, "must be >= 0 (0: greedy)")
        check(0 < self.top_p <= 1, "top_p", self.top_p, "must be in (0, 1]")
        check(self.tasks >= 0, "tasks", self.tasks, "must be >= 0")
        check(self.max_in_flight >= 1, "max_in_flight", self.max_in_flight, "must be >= 1")
        check(bool(self.seeds) and len(set(self.seeds)) == len(self.seeds) and min(self.seeds) >= 0, "seeds",
               self.seeds, "need distinct seeds >= 0")

    def sampling(self, rollout: RolloutConfig) -> RolloutConfig:
        """``rollout`` with evaluation's own temperature and top-p."""
        return dataclasses.replace(rollout, temperature=self.temperature, top_p=self.top_p)


SFT_MODES = ("full_response", "next_action", "inverse_dynamics")

ThoughtStyle = Literal["short", "restated", "decided", "surveyed", "enumerated"]
"""The reasoning styles a built model learns (the keys of ``actfirst.train.sft.THOUGHTS``)."""


@dataclasses.dataclass(kw_only=True, slots=True)
class InvalidTurnsSFTConfig:
    """A second SFT stage, after the first (``actfirst.train.invalid_turns``): the reference steps again in the
    section's modes, and each reference replayed ``variants`` times with 1 to ``max_turns`` invalid turns inserted
    before one of its steps, the steps after them as full responses (what a teacher scores), so that the model keeps
    its thought on the histories of a failing rollout (measured on the rollout-bound demo in bench/RESULTS.md)."""

    variants: int = 3
    max_turns: int = 24
    epochs: float = 2.0
    lr: float = 5.0e-4
    seed: int = 0
    """The draw of the invalid turns (with the task and the variant; the examples' order follows the section's seed)."""

    def __post_init__(self) -> None:
        check(self.variants >= 1, "variants", self.variants, "must be >= 1")
        check(self.max_turns >= 1, "max_turns", self.max_turns, "must be >= 1")
        check(self.epochs > 0, "epochs", self.epochs, "must be > 0")
        check(self.lr > 0, "lr", self.lr, "must be > 0")


@dataclasses.dataclass(kw_only=True, slots=True)
class SFTConfig:
    """Supervised fine-tuning on the reference steps (``actfirst.train.sft``)."""

    epochs: float
    lr: float
    batch_tokens: int = 8192
    """Tokens per optimizer step (whole samples packed)."""
    micro_batch_tokens: int = 2048
    """Tokens per packed forward/backward row (gradient accumulation over rows)."""
    modes: list[Literal["full_response", "next_action", "inverse_dynamics"]] = dataclasses.field(
        default_factory=lambda: list(SFT_MODES))
    """The prompt modes (B.1) trained on."""
    tasks: int = 0
    """Train only on the references of the first N training tasks (0: all)."""
    stray_token_rate: float = 0.0
    """The probability that a token of a full response's thought is replaced by a stray one, unsupervised
    (``actfirst.train.sft.with_stray_tokens``), so that the model learns to resume the thought after a token a
    sampling student wrote, as a large model would (0: none; measured on the rollout-bound demo in bench/RESULTS.md)."""
    invalid_turns: InvalidTurnsSFTConfig | None = None
    """A second stage on the histories of failing rollouts (null: none)."""
    inverse_dynamics_alternatives: int = 0
    """Per reference step, up to this many inverse-dynamics examples more, each with another admissible action of the
    step's command executed in the simulator, so that only the reference next observation gives the action
    (``actfirst.train.inverse_dynamics``; 0: none). Needs ``inverse_dynamics`` among ``modes``."""
    seed: int = 0

    def __post_init__(self) -> None:
        check(self.epochs > 0, "epochs", self.epochs, "must be > 0")
        check(self.lr > 0, "lr", self.lr, "must be > 0")
        check(self.batch_tokens >= 1, "batch_tokens", self.batch_tokens, "must be >= 1")
        check(self.micro_batch_tokens >= 1, "micro_batch_tokens", self.micro_batch_tokens, "must be >= 1")
        check(bool(self.modes) and len(set(self.modes)) == len(self.modes), "modes", self.modes,
               f"need distinct modes among {list(SFT_MODES)}")
        check(self.tasks >= 0, "tasks", self.tasks, "must be >= 0")
        check(0.0 <= self.stray_token_rate < 1.0, "stray_token_rate", self.stray_token_rate, "must be in [0, 1)")
        check(self.inverse_dynamics_alternatives >= 0, "inverse_dynamics_alternatives",
              self.inverse_dynamics_alternatives, "must be >= 0")
        check(not self.inverse_dynamics_alternatives or "inverse_dynamics" in self.modes,
              "inverse_dynamics_alternatives", self.inverse_dynamics_alternatives,
              f"needs inverse_dynamics among modes (modes: {self.modes})")


@dataclasses.dataclass(kw_only=True, slots=True)
class BuildModelsConfig:
    """Models ``actfirst.prepare`` makes (the CPU demo): a small BPE trained on the task set's own text, a teacher
    trained by SFT on the reference steps in the prompt modes of ``teacher_sft.modes`` and evaluated, and a smaller
    student warm-started by a short SFT in ``student_sft.modes``. Only into ``teacher_dir`` / ``student_dir``, and
    only while ``teacher`` / ``student.model`` name that directory and it does not exist: a model named otherwise
    (another directory, a Hub id) is never built in its place."""

    teacher_dir: str | None = None
    """Where the teacher is built (null: never built); built only when ``teacher`` is this path."""
    student_dir: str | None = None
    """Where the student's warm start is built (null: never built); built only when ``student.model`` is this path."""

    tokenizer_vocab_size: int = 2048
    thoughts: ThoughtStyle = "short"
    """The reasoning of the full-response examples (``actfirst.train.sft.THOUGHTS``): ``short`` (about 30 tokens),
    ``restated`` (the context restated before the step: hundreds of tokens, so that think-then-act rollouts are bound
    by generation), ``decided`` (as long: the step first, then the context restated), ``surveyed`` (the task and
    ScienceWorld's action commands restated, then the short thought: about 150 tokens, fixed but for the step) or
    ``enumerated`` (as surveyed, the commands one per line and numbered: about 365 tokens)."""
    teacher: ModelConfig
    teacher_sft: SFTConfig
    student: ModelConfig
    student_sft: SFTConfig

    def __post_init__(self) -> None:
        check(self.tokenizer_vocab_size >= 300, "tokenizer_vocab_size", self.tokenizer_vocab_size, "must be >= 300")
        for name in ("teacher_dir", "student_dir"):
            value = getattr(self, name)
            check(value is None or bool(value.strip()), name, value, "must name a directory (or be null)")
        check(self.teacher_dir is not None or self.student_dir is not None, "teacher_dir", self.teacher_dir,
              "build_models needs teacher_dir or student_dir: the directories it builds into")

    def builds(self, name: str, role: Literal["teacher", "student"]) -> bool:
        """Whether model ``name`` (the config's ``teacher`` or ``student.model``) is the directory this section
        builds the ``role`` into."""
        target = self.teacher_dir if role == "teacher" else self.student_dir
        return target is not None and Path(name).absolute() == Path(target).absolute()


@dataclasses.dataclass(kw_only=True, slots=True)
class PrepareConfig:
    """What ``python -m actfirst.prepare`` builds for a run (C.2's reference cache; the demo's models)."""

    teacher_rollouts: int = 10
    """Teacher rollouts per training task played as reference candidates (0: none)."""
    candidate_files: list[str] = dataclasses.field(default_factory=list)
    """More candidate action sequences (JSONL, ``{"task": key, "actions": [...]}`` per line)."""
    shorten: bool = True
    """Shorten candidates where the benchmark does (ScienceWorld)."""
    build_models: BuildModelsConfig | None = None

    def __post_init__(self) -> None:
        check(self.teacher_rollouts >= 0, "teacher_rollouts", self.teacher_rollouts, "must be >= 0")
        for i, f in enumerate(self.candidate_files):
            if paths_checked():
                check_exists(f, f"candidate_files[{i}]", "file")


@dataclasses.dataclass(kw_only=True, slots=True)
class ParallelConfig:
    """How the ranks share the work: one process per GPU, each with its own engine, its shard of the student and its
    share of every rollout batch (``actfirst.parallel``; docs/parallel.md, "One node, and several")."""

    compute_dtype: Literal["bfloat16", "float32"] = "float32"
    """The student's forward and backward under FSDP2. Its master weights, gradients and AdamW state are float32
    whatever this says (AdamW's ~1e-6 steps would round away in bfloat16 weights)."""
    teacher: Literal["replicate", "shard"] = "replicate"
    """The frozen teacher: a whole copy on every rank (scoring needs no communication), or FSDP2-sharded over the
    ranks (each holds 1/N of it; every scoring forward all-gathers one block at a time), N a node's ranks when
    ``mesh`` is hybrid."""
    sync_bucket_mb: int = 1024
    """Weight sync: the most the gathered full parameters (in the engine's dtype) take at once, in MiB."""
    peer_timeout_s: float = 30.0
    """With several ranks: a rank whose heartbeat has not moved for this long is taken as dead, and the others stop
    (``actfirst.parallel.watchdog``)."""
    activation_checkpointing: bool = False
    """Keep only each decoder block's input and recompute the block in the backward (torch's non-reentrant checkpoint
    per block, applied before FSDP2: ``actfirst.parallel.checkpointing``): the student's activations shrink to about
    one block's, for about a third more compute. The student only (the teacher never runs a backward). The memory
    plan (``bench/memory_plan.py``, docs/memory.md) says which configs need it."""
    attention: Literal["auto", "flash_attention_2", "flex_attention", "sdpa"] = "auto"
    """The student's and the teacher's attention over packed rows
    (``actfirst.train.packing.attention_implementation``). auto: flash-attn's varlen kernel (sample boundaries from
    position_ids) when ``flash_attn`` imports on a GPU and the model computes in 16 bits, else FlexAttention's block
    mask on a GPU, else sdpa (the CPU: FlexAttention has no CPU backward). sdpa gives a row of several samples a dense
    [T x T] mask, and a [T x T] bias saved per layer for the backward: auto never picks it on a GPU. A named one that
    cannot run here is refused at start."""
    mesh: Literal["auto", "flat", "hybrid"] = "auto"
    """The device mesh the student (and a sharded teacher) are split over: ``flat``, FSDP2 over every rank; ``hybrid``,
    FSDP2 over the ranks of a node and a replica per node (HSDP: only the gradient all-reduce crosses nodes);
    ``auto``, hybrid when the job spans several nodes (``WORLD_SIZE > LOCAL_WORLD_SIZE``), else flat
    (``actfirst.parallel.context``; docs/parallel.md, "Several nodes")."""

    cpu_update_threads: int | None = None
    """On the CPU: the torch threads the teacher's scoring and the student's update run on (in their own thread,
    beside the engine's, whose OpenMP threads vLLM's CPU worker fixes at ``OMP_NUM_THREADS``). null: automatic, this
    rank's share of the cores (``os.sched_getaffinity`` over the node's ranks) less the engine's threads, at least 1,
    in every pipeline (``actfirst.train.update_thread.update_threads``). Not read on a GPU: the update runs on the
    device, beside the engine."""

    cpu_pin_cores: bool = False
    """On the CPU: keep the engine, scoring and the update, and the environment workers on disjoint cores (the engine's
    threads first, then the update's, the rest the workers', who share the engine's when none is left: the
    paper's rollouts and trainer on disjoint GPUs; ``actfirst.train.update_thread.cpu_split``). Off: every thread
    on every core, as the OS schedules them. Not read on a GPU."""

    def __post_init__(self) -> None:
        check(self.sync_bucket_mb >= 1, "sync_bucket_mb", self.sync_bucket_mb, "must be >= 1")
        check(self.cpu_update_threads is None or self.cpu_update_threads >= 1, "cpu_update_threads",
              self.cpu_update_threads, "must be >= 1 (or null: automatic)")
        check(self.peer_timeout_s >= 5, "peer_timeout_s", self.peer_timeout_s, "must be >= 5")


def env_section_type(values: dict[str, Any]) -> Any:
    """The type of a config's ``env:`` (a training config's, ``actfirst.teacher.sft``'s), from its ``benchmark``
    (None for none or an unknown one: the config's own check names it), once its ``benchmark_module`` (if any) is
    imported."""
    import_benchmark_module(values.get("benchmark_module"))
    name = values.get("benchmark")
    return BENCHMARKS[name].config_class | None if name in BENCHMARKS else None


RENAMED = {"overlap": "replaced by pipeline: serial | async | inflight (overlap: false was serial, true async)"}
"""Top-level keys a training config no longer has, and what to write instead."""


@dataclasses.dataclass(kw_only=True, slots=True)
class CompareConfig:
    """How ``python -m actfirst.compare`` compares methods on this config (read by the comparison only; a single run
    ignores it)."""

    threshold: Literal["auto"] | float = "auto"
    """The same-SR comparison's SR threshold (percent), fixed before any training run starts: ``auto`` is the warm
    start's SR plus half the gap to the teacher's SR, both evaluated by the comparison's preparation on the
    evaluation's episodes; a number is taken as given."""
    checkpoint_every: int = 2
    """Updates between two checkpoints of every run (the last is always one); each is evaluated after training."""

    def __post_init__(self) -> None:
        check(self.threshold == "auto" or 0 < self.threshold <= 100, "threshold", self.threshold,
              "must be auto or an SR in (0, 100]")
        check(self.checkpoint_every >= 1, "checkpoint_every", self.checkpoint_every, "must be >= 1")


@dataclasses.dataclass(kw_only=True, slots=True)
class TrainConfig:
    """One OPD training run: benchmark, student engine, teacher, rollouts, update (Sec. 5.1, Appendix B-C)."""

    benchmark: str
    """A registered benchmark's name (``actfirst.envs.benchmarks.BENCHMARKS``)."""
    benchmark_module: str | None = None
    """A module that registers ``benchmark`` when imported, for a benchmark defined outside ``actfirst/envs`` (a
    dotted name importable from the working directory or ``PYTHONPATH``; ``tests/toy/train.yaml``); every process of
    the run imports it (ranks, preparation, environment workers). null: a built-in benchmark."""
    env: Any = dataclasses.field(default=None, metadata=type_from(env_section_type))
    """The benchmark's environment section, of its ``Benchmark.config_class`` (absent or null: its default file,
    actfirst/envs/<benchmark>/<benchmark>.yaml)."""
    student: EngineConfig
    """The student: its Hugging Face directory and the in-process vLLM engine serving it."""
    teacher: str
    """The frozen teacher's Hugging Face directory or Hub repo id (same tokenizer as the student)."""
    teacher_revision: str | None = None
    """With a Hub id: the teacher's branch, tag or commit (null: ``main``); the run records the commit it used."""
    teacher_dtype: Literal["bfloat16", "float16", "float32"] = "float32"
    references: str | None = None
    """Reference cache (JSONL of ``python -m actfirst.references build``); required by the strategies that use it."""
    train_tasks: int = 0
    """Use only the first N training tasks (0: all)."""
    scheduler: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    tcod: TCODConfig = dataclasses.field(default_factory=TCODConfig)
    """Read by the strategies whose class declares ``section = "tcod"`` (f2b, b2f)."""
    uopd: UOPDConfig = dataclasses.field(default_factory=UOPDConfig)
    """Read by the strategies whose class declares ``section = "uopd"`` (uopd)."""
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    num_updates: int = 250
    batch: Literal["turns", "rollout"] = "turns"
    """What one update trains on. ``turns`` (000, Sec. 5.1 and B.4): ``batch_samples`` turn-level full responses
    from the FIFO buffer, of the current or the preceding weight version (a rollout batch may feed several updates,
    or several batches one). ``rollout`` (003, Sec. 5.1: "we train for 250 steps on ALFWorld and 150 on WebShop with
    rollout batch size 16"): one step trains on every sample of one rollout batch (``rollout.batch_tasks`` tasks),
    in ``num_minibatches`` mini-batches, and the next batch is collected under the new weights (unless ``pipeline:
    serial``: during the update, one version behind); ``batch_samples`` is not read. TCOD's n and UOPD's r_n then
    advance once per step, as in 003."""
    batch_samples: int = 64
    """Full responses per update with ``batch: turns`` (Sec. 5.1: optimization batches of 64)."""
    num_minibatches: int = 1
    """Optimizer steps per update: the batch is split into this many mini-batches."""
    micro_batch_tokens: int = 8192
    """Tokens per forward/backward pass of scoring and the update, padding included (gradient accumulation over
    micro-batches; ``actfirst.train.packing``). Samples are never split: a longer sample gets a pass of its own, so a
    pass holds at most max(this, one sample's tokens), and 1 gives every sample its own."""
    pipeline: Literal["serial", "async", "inflight"] = "async"
    """How rollouts and the update share the time (C.3: "rollout collection and student optimization proceed
    asynchronously"; ``actfirst.train.pipeline``). ``serial``: rollouts, then scoring and the update, then the weight
    sync. ``async``: the next update's rollout batch, sized to what it still needs, is collected while the teacher
    scores and the student updates; the new weights enter the engine when that batch ends (B.4's bound: every sample
    at most one version behind). ``inflight``: as ``async``, but the weights enter the engine between its steps while
    requests continue (each token carries its version;
    ``ActFirstEngine.update_weights(..., keep_in_flight=True)``)."""
    collection: Literal["sized", "whole_batch"] | None = None
    """The rollout batches an update's samples are collected in. ``whole_batch``: every rollout batch of
    ``rollout.batch_tasks`` tasks, whatever the update still lacks (the papers' protocol: 000 C.5, "both methods use
    16 tasks per rollout batch"; what a batch gives beyond the update's samples waits in the buffer for the next
    update, or is dropped once two versions behind). ``sized``: each rollout batch of the tasks expected to give what
    the update still lacks (at most ``batch_tasks``), so that transitions per update stay near ``batch_samples``.
    Unset: the pipeline's own, ``whole_batch`` under ``serial``, ``sized`` under ``async`` and ``inflight``
    (``actfirst.train.pipeline``). With ``batch: rollout`` every batch is whole."""
    max_empty_batches: int = 8
    """Rollout batches in a row that give no sample while an update collects its samples (every episode failed: an
    environment whose ``reset`` fails, a turn-0 prompt too long) after which the run stops with an error naming the
    benchmark and the first failures (``actfirst.train.pipeline.NoSamplesError``), on any rank where it happens."""
    probe_contexts: int = 8
    """Fixed contexts on which the teacher-minus-student gap is tracked (0: off)."""
    probe_every: int = 1
    """Updates between two probe measurements."""
    checkpoint_every: int = 10
    """Updates between two checkpoints (the last update is always checkpointed)."""
    keep_checkpoints: int = 1
    """Checkpoints kept on disk (the newest ones)."""
    keep_best: bool = False
    """Also keep the checkpoint of the best evaluation SR so far (``<out_dir>/checkpoints/best`` names it); every
    evaluated update is then checkpointed. Matters only with evaluations between the first and the last
    (``evaluation.every`` > 0); the starting student (update 0) is not a checkpoint."""
    evaluation: EvaluationConfig | None = None
    """Evaluations during the run (absent or null: none)."""
    compare: CompareConfig = dataclasses.field(default_factory=CompareConfig)
    """What ``python -m actfirst.compare`` reads (the same-SR threshold, its checkpoints)."""
    vllm_console_level: Literal["debug", "info", "warning", "error", "off"] = "error"
    """vLLM's own log lines on the console from this level up; all of them (INFO and up) go to
    ``<out_dir>/logs/vllm_rank<r>.log``."""
    prepare: PrepareConfig = dataclasses.field(default_factory=PrepareConfig)
    report_to: list[str] | str = dataclasses.field(default_factory=lambda: ["tensorboard"])
    """Trackers that receive every update's metrics, the config and the training curve (rank 0 only):
    ``tensorboard``, ``wandb``, ``trackio`` (``actfirst.train.trackers``); ``[]`` or ``none``: none; ``all``: every
    installed one; one name alone as TRL takes it (a list once loaded). ``metrics.jsonl`` is always written."""
    tracker_project: str = "actfirst"
    """The wandb / Trackio project (the run's name there: its out_dir's last part)."""
    seed: int = 0
    out_dir: str = "runs/train"

    def __post_init__(self) -> None:
        import_benchmark_module(self.benchmark_module)
        check(self.benchmark in BENCHMARKS, "benchmark", self.benchmark, f"must be one of {sorted(BENCHMARKS)}"
              + ("" if self.benchmark_module is None else f" (benchmark_module={self.benchmark_module!r} registers "
                                                          f"no benchmark of this name)"))
        benchmark = BENCHMARKS[self.benchmark]
        check(self.env is None or isinstance(self.env, benchmark.config_class), "env", self.env,
               f"must be a {benchmark.config_class.__name__} (the config of benchmark={self.benchmark!r})")
        strategy = STRATEGIES[self.rollout.strategy]
        anywhere = [name for name, c in STRATEGIES.items() if not c.needs_fast_action_benchmark()]
        check(not strategy.needs_fast_action_benchmark() or benchmark.fast_actions, "rollout.strategy",
               self.rollout.strategy, f"needs next-action-prediction or inverse-dynamics prompts (B.1) or reference "
               f"trajectories, which benchmark {self.benchmark!r} does not have; use {', '.join(anywhere[:-1])} or "
               f"{anywhere[-1]}")
        if self.rollout.prompts == "uopd":
            thinking = [name for name, c in STRATEGIES.items() if not c.fast_actions]
            check(not strategy.fast_actions, "rollout.prompts", self.rollout.prompts,
                  f"has only think-then-act templates (003 E.1/E.2), and rollout.strategy={self.rollout.strategy!r} "
                  f"executes fast actions; use rollout.prompts=actfirst or a strategy of {thinking}")
            check(benchmark.uopd_prompts is not None or benchmark.prompt_is_observation, "rollout.prompts",
                  self.rollout.prompts, f"benchmark {self.benchmark!r} has no UOPD-paper prompts (003 Appendix E "
                  f"gives ALFWorld's, WebShop's and Search's); use rollout.prompts=actfirst")
        check(bool(self.teacher.strip()), "teacher", self.teacher, "must name a Hugging Face model directory or Hub id")
        check(self.teacher_revision is None or bool(self.teacher_revision.strip()), "teacher_revision",
              self.teacher_revision, "must name a branch, tag or commit (or be null)")
        check(bool(self.out_dir.strip()), "out_dir", self.out_dir, "must name a directory")
        self.report_to = report_to_list(self.report_to)
        check_report_to(self.report_to)
        check(bool(self.tracker_project.strip()), "tracker_project", self.tracker_project, "must name a project")
        check(self.references is None or bool(self.references.strip()), "references", self.references,
               "must name a reference cache file (or be null)")
        check(not (self.student.sleep_level and self.pipeline != "serial"), "student.sleep_level",
              self.student.sleep_level, f"needs pipeline: serial, not {self.pipeline} (a sleeping engine cannot serve "
              f"rollouts during the update)")
        check(self.rollout.temperature > 0, "rollout.temperature", self.rollout.temperature,
               "must be > 0 in training (log pi_old needs a sampled policy; greedy is for evaluation)")
        strategy.check_config(self)
        if self.rollout.uses_references:
            check(self.references is not None, "references", self.references,
                   f"rollout.strategy={self.rollout.strategy!r} needs a reference cache")
        if paths_checked():
            check_paths(self)
        for name in ("num_updates", "batch_samples", "num_minibatches", "micro_batch_tokens", "probe_every",
                     "checkpoint_every", "keep_checkpoints", "max_empty_batches"):
            check(getattr(self, name) >= 1, name, getattr(self, name), "must be >= 1")
        for name in ("train_tasks", "probe_contexts"):
            check(getattr(self, name) >= 0, name, getattr(self, name), "must be >= 0")
        check(self.batch == "rollout" or self.batch_samples % self.num_minibatches == 0, "num_minibatches",
              self.num_minibatches, f"must divide batch_samples={self.batch_samples}")
        check(self.scheduler.b_max <= self.student.max_num_seqs, "scheduler.b_max", self.scheduler.b_max,
               f"must not exceed student.max_num_seqs={self.student.max_num_seqs}")
        need = self.rollout.max_prompt_tokens + max(self.rollout.budget.total, self.rollout.budget.fast_action_tokens)
        check(need <= self.student.max_model_len, "rollout.max_prompt_tokens", self.rollout.max_prompt_tokens,
               f"+ the longest response ({need - self.rollout.max_prompt_tokens} tokens) exceeds student.max_model_len="
               f"{self.student.max_model_len}")
        # log pi_theta in the update applies the temperature only; vLLM's processed log-probs would include a top-p
        # renormalization, and the ratio of Eq. 30 would compare two different distributions.
        check(self.rollout.top_p == 1.0, "rollout.top_p", self.rollout.top_p, "must be 1.0 for training")
        if self.evaluation is not None:
            need = self.rollout.max_prompt_tokens + self.rollout.budget.eval_total
            check(need <= self.student.max_model_len, "student.max_model_len", self.student.max_model_len,
                   f"must hold an evaluation request (rollout.max_prompt_tokens + rollout.budget.eval_total = {need})")

    @classmethod
    def moved_key(cls, name: str) -> str | None:
        """Where a top-level key of older configs went: a benchmark's own section (before ``env:``), ``overlap``."""
        if name in RENAMED:
            return RENAMED[name]
        return f"rename this section to env: (benchmark: {name})" if name in BENCHMARKS else None

    @property
    def strategy_section(self) -> TCODConfig | UOPDConfig | None:
        """The section ``rollout.strategy`` is built from (None: it has none)."""
        section = STRATEGIES[self.rollout.strategy].section
        return getattr(self, section) if section is not None else None

    def training_tasks(self, benchmark: Any) -> list[Any]:
        """The benchmark's training tasks this run uses (the first ``train_tasks``; all when 0)."""
        return benchmark.tasks("train")[: self.train_tasks or None]


def check_paths(cfg: TrainConfig, *, references: bool = True) -> None:
    """Raise :class:`ConfigError` naming the first input path of ``cfg`` that does not exist (``references``: the
    reference cache too); a Hub id is resolved later (``actfirst.preparation.build.resolve_models``)."""
    for key, name in (("student.model", cfg.student.model), ("teacher", cfg.teacher)):
        if not is_hub_id(name):
            check_exists(name, key)
    if references and cfg.references is not None:
        check_exists(cfg.references, "references", "file")


RESUMABLE_CHANGES = ("out_dir", "num_updates", "checkpoint_every", "keep_checkpoints", "keep_best", "probe_every",
                     "evaluation", "prepare", "parallel", "vllm_console_level", "report_to", "tracker_project",
                     "compare")
"""Config sections a resumed run may change (``out_dir``: a run is where it is, moved or spelled otherwise;
``compare``: a run ignores it, and a comparison's threshold is held by its ``threshold.json``); any other difference
from the run's saved config is refused."""


def check_resumable(saved: dict[str, Any], current: dict[str, Any], what: str, *,
                    may_change: tuple[str, ...] = RESUMABLE_CHANGES,
                    remedy: str = "use another out_dir for a new run") -> None:
    """Refuse to continue or reuse a run under a different config (a different strategy, benchmark, model...):
    ``saved`` is the run's (checkpointed or finished), ``current`` the one given now, ``what`` names the action, and
    the message names every differing field outside the sections ``may_change`` with both values. A field the saved
    config does not have (written before it existed) counts as its default."""
    made = {f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(TrainConfig)}
    defaults = _plain({k: to_dict(v) if dataclasses.is_dataclass(v) else v for k, v in made.items()
                       if v is not dataclasses.MISSING})
    saved = _pipeline_key(_env_section(saved))
    keys, saved, current = sorted(set(saved) | set(current)), _with_defaults(_plain(saved), defaults), _plain(current)
    differ = [d for k in keys if k not in may_change for d in _differences(saved.get(k), current.get(k), k)]
    if differ:
        more = f" and {len(differ) - 5} more" if len(differ) > 5 else ""
        raise ConfigError(f"{what}: the config differs from the run's saved config: {'; '.join(differ[:5])}{more} "
                          f"(only {list(may_change)} may change); {remedy}")


def _env_section(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved config written before ``env:`` (a top-level section per benchmark, null but for its own) in today's
    layout: its benchmark's section as ``env``."""
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    old = [k for k in saved if k not in fields and k in BENCHMARKS]
    if not old or "env" in saved:
        return saved
    return {**{k: v for k, v in saved.items() if k not in old}, "env": saved.get(saved.get("benchmark"))}


def _pipeline_key(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved config written before ``pipeline`` (``overlap: true | false``) in today's terms: ``async | serial``."""
    if "overlap" not in saved or "pipeline" in saved:
        return saved
    rest = {k: v for k, v in saved.items() if k != "overlap"}
    return {**rest, "pipeline": "async" if saved["overlap"] else "serial"}


def _plain(value: Any) -> Any:
    """``value`` as JSON holds it (tuples as lists, paths as strings)."""
    return json.loads(json.dumps(value, default=str))


def _with_defaults(saved: Any, defaults: Any) -> Any:
    """``saved`` with what it lacks of ``defaults`` filled in, section by section."""
    if not (isinstance(saved, dict) and isinstance(defaults, dict)):
        return saved
    return {**defaults, **{k: _with_defaults(v, defaults.get(k)) for k, v in saved.items()}}


def _differences(saved: Any, current: Any, key: str) -> list[str]:
    """``key.field: saved -> current`` for each leaf that differs."""
    if isinstance(saved, dict) and isinstance(current, dict):
        return [d for k in sorted(set(saved) | set(current))
                for d in _differences(saved.get(k), current.get(k), f"{key}.{k}")]
    return [] if saved == current else [f"{key}: {reprlib.repr(saved)} -> {reprlib.repr(current)}"]

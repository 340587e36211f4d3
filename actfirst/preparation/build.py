"""Build what a training run needs before it starts (``python -m actfirst.prepare``, and ``actfirst.run`` before it
starts the ranks).

- The reference cache (Appendix C.2) at ``references``, from every candidate we can produce: the benchmark's own
  (ScienceWorld gold paths, ALFWorld planner walkthroughs, WebShop's goal-derived paths), the files in
  ``prepare.candidate_files``, and ``prepare.teacher_rollouts`` think-then-act rollouts of the teacher per training
  task, played on the same in-process vLLM engine the student uses (cached beside the references as
  ``<references>.teacher.jsonl``).
- With ``prepare.build_models`` (the CPU demo, where no weights can be downloaded), into its ``teacher_dir`` and
  ``student_dir`` when ``teacher`` / ``student.model`` name them and they do not exist (a model named otherwise, a
  directory or a Hub id, is resolved by :func:`resolve_models`, never built): a small BPE trained on the
  task set's own prompts, a teacher trained by SFT on the reference steps (its ``teacher_sft.modes``) and evaluated
  (``<teacher>/actfirst_eval.json``: its SR is the demo's target), and a smaller student warm-started by a short
  SFT on all three prompt modes (``actfirst.train.sft``). The teacher's rollouts would need the teacher, which needs
  the references: a built teacher plays none.

Whatever exists is kept: a second call does nothing. Every artifact is written into a temporary path and renamed
into place, so an interrupted preparation never leaves a half-written model or cache behind.

The teacher's rollouts and the replay (:data:`STAGES`) are shared by ``nproc`` ranks, one in this process or several
started as ``python -m actfirst.prepare --stage`` (:func:`run_stage`: rank r takes the training tasks r, r + R, ...;
the teacher on each rank's own engine, ``scheduler.b_max`` episodes in flight). Each rank appends every finished
task to its journal (``actfirst.core.journal``), so that a killed preparation resumes, on any number of ranks, with the
missing tasks only; the journals are merged atomically once every task is done.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from actfirst.core.config import DEMO_CONFIG, BuildModelsConfig, ConfigError, EngineConfig, SFTConfig, TrainConfig
from actfirst.core.files import write_atomically
from actfirst.core.schema import load_config, paths_unchecked
from actfirst.core.user_input import check_model_dir, check_writable_dir
from actfirst.envs.benchmarks import Benchmark, get_benchmark
from actfirst.evaluation.report import TEACHER_EVAL
from actfirst.models.hub import model_commit, resolve_model
from actfirst.models.tokenizers import check_tokenizers_match
from actfirst.preparation.reference_cache import load_references, read_candidates

logger = logging.getLogger(__name__)

SFT_RECORD = "actfirst_sft.json"
"""How a built model was trained (losses, wall-clock, throughput), in its directory."""


def load_run_config(config: str | None, overrides: list[str]) -> TrainConfig:
    """The run's config (``None``: the CPU demo's), whose reference cache and built models may not exist yet (the
    paths preparation produces; :func:`ensure_prepared` builds them and then checks every path)."""
    with paths_unchecked():
        return load_config(TrainConfig, config or str(DEMO_CONFIG), overrides)


def ensure_prepared(cfg: TrainConfig, nproc: int = 1) -> dict[str, float]:
    """Build whatever ``cfg`` needs that is missing (see the module docstring), the teacher's rollouts and the
    reference replay on ``nproc`` ranks (:func:`run_stage`); returns each stage's wall-clock (s) for the stages that
    ran. Every input is checked first (:func:`check_inputs` with ``buildable``) and again once built; a
    ``ConfigError`` names the first that cannot be used."""
    check_inputs(cfg, buildable=True)
    build = cfg.prepare.build_models
    benchmark = get_benchmark(cfg.benchmark, cfg.env)
    timings: dict[str, float] = {}
    if cfg.references is not None and not Path(cfg.references).is_file():
        started = time.perf_counter()
        candidates = list(cfg.prepare.candidate_files)
        if plays_teacher_rollouts(cfg):
            candidates.append(str(_teacher_rollouts(cfg, benchmark, nproc)))
        _build_references(cfg, benchmark, candidates, nproc)
        timings["references_s"] = time.perf_counter() - started
    missing = models_to_build(cfg)
    if missing:
        if cfg.references is None or not Path(cfg.references).is_file():
            raise ConfigError(f"references={cfg.references!r}: prepare.build_models trains on the reference "
                              f"cache; set references")
        steps = _expert_steps(cfg, benchmark)
        if "teacher" in missing:
            started = time.perf_counter()
            _build_teacher(cfg, build, benchmark, steps)
            timings["teacher_s"] = time.perf_counter() - started
            started = time.perf_counter()
            evaluate_teacher(cfg, benchmark)
            timings["teacher_eval_s"] = time.perf_counter() - started
        if "student.model" in missing:
            started = time.perf_counter()
            _build_student(cfg, build, benchmark, steps)
            timings["student_warm_start_s"] = time.perf_counter() - started
    if timings:
        check_inputs(cfg)
    return timings


def check_inputs(cfg: TrainConfig, *, buildable: bool = False) -> None:
    """Everything a training run reads, before any engine, JVM or model starts: the student and the teacher are
    Hugging Face model directories (config, tokenizer, weights; a Hub id resolved first by :func:`resolve_models`)
    with the same tokenizer, the reference cache is one of this benchmark and config covering the training tasks,
    and ``out_dir`` can be written. ``buildable``: a model that preparation builds (:func:`models_to_build`) may be
    missing (its directory must then be writable)."""
    built = models_to_build(cfg) if buildable else []
    for key, path in [("student.model", cfg.student.model), ("teacher", cfg.teacher)]:
        if key in built:
            check_writable_dir(Path(path).parent, key)
        else:
            check_model_dir(path, key)
    if not built:
        check_tokenizers_match(cfg.student.model, cfg.teacher)
    if cfg.references is not None:
        if Path(cfg.references).is_file():
            benchmark = get_benchmark(cfg.benchmark, cfg.env)
            load_references(cfg.references, benchmark=benchmark,
                            tasks=[benchmark.task_key(t) for t in cfg.training_tasks(benchmark)])
        elif buildable:
            read_candidates(cfg.prepare.candidate_files, "prepare.candidate_files")
            check_writable_dir(Path(cfg.references).parent, "references")
        else:
            raise ConfigError(f"references={cfg.references!r}: no such file")
    check_writable_dir(cfg.out_dir, "out_dir")


def plays_teacher_rollouts(cfg: TrainConfig) -> bool:
    """Whether preparation will play the teacher's rollouts: the reference cache is still to be built, with
    ``prepare.teacher_rollouts`` per task, by a teacher that is not built (a built teacher plays none)."""
    return (cfg.references is not None and not Path(cfg.references).is_file() and cfg.prepare.teacher_rollouts > 0
            and cfg.prepare.build_models is None)


def models_to_build(cfg: TrainConfig) -> list[str]:
    """The keys (``teacher``, ``student.model``) of the models preparation builds: those that name their
    ``prepare.build_models`` directory (``teacher_dir``, ``student_dir``) while it does not exist. A model named
    otherwise is resolved (:func:`resolve_models`), never built."""
    build = cfg.prepare.build_models
    if build is None:
        return []
    named = [("teacher", cfg.teacher, "teacher"), ("student.model", cfg.student.model, "student")]
    return [key for key, name, role in named if build.builds(name, role) and not Path(name).exists()]


def resolve_models(cfg: TrainConfig, *, download: bool = True) -> TrainConfig:
    """``cfg`` with its student and teacher as local model directories (:func:`~actfirst.models.hub.resolve_model`:
    a directory as it is; a Hub id as its snapshot in the Hugging Face cache, downloaded unless ``download`` is
    False or ``HF_HUB_OFFLINE=1``, its revision set to the commit used, which the run's ``config.json`` and its
    checkpoints then record). The models preparation builds stay as they are. Call once, before any engine or
    process group starts; :func:`model_overrides` hands the result to other processes."""
    built = models_to_build(cfg)
    student, teacher, teacher_revision = cfg.student, cfg.teacher, cfg.teacher_revision
    if "student.model" not in built:
        model, revision = _resolve(student.model, "student.model", student.revision, "student.revision", download)
        student = dataclasses.replace(student, model=model, revision=revision)
    if "teacher" not in built:
        teacher, teacher_revision = _resolve(teacher, "teacher", teacher_revision, "teacher_revision", download)
    with paths_unchecked():  # a model still to be built does not exist yet
        return dataclasses.replace(cfg, student=student, teacher=teacher, teacher_revision=teacher_revision)


def _resolve(name: str, key: str, revision: str | None, revision_key: str, download: bool) -> tuple[str, str | None]:
    """:func:`~actfirst.models.hub.resolve_model` as config values: a Hub snapshot's path and commit (announced where
    it may have been downloaded); a local directory as it was named, without a revision."""
    path = resolve_model(name, key, revision, download=download, revision_key=revision_key)
    commit = model_commit(path)
    if commit == "local":
        return name, None
    if download:
        logger.info(f"[models] {key}={name!r}: {path} (commit {commit})")
    return str(path), commit


def model_overrides(cfg: TrainConfig) -> list[str]:
    """``key=value`` overrides that hand the Hub models :func:`resolve_models` resolved in ``cfg`` to another
    process (a rank, preparation's child): their snapshot paths and commits, so that it neither looks a revision up
    again nor downloads. Local directories need none (the same config names them)."""
    models = [("student.model", "student.revision", cfg.student.model, cfg.student.revision),
              ("teacher", "teacher_revision", cfg.teacher, cfg.teacher_revision)]
    overrides = []
    for key, revision_key, name, revision in models:
        if revision is not None and model_commit(name) == revision:
            overrides += [f"{key}={json.dumps(name)}", f"{revision_key}={json.dumps(revision)}"]
    return overrides


# -- the reference cache ------------------------------------------------------------------------------------------


def _engine_config(cfg: TrainConfig, model: str, need_tokens: int) -> EngineConfig:
    return dataclasses.replace(cfg.student, model=model, max_model_len=max(cfg.student.max_model_len, need_tokens),
                               max_num_batched_tokens=max(cfg.student.max_num_batched_tokens, need_tokens))


STAGES = ("teacher", "references")
"""The stages of preparation that every rank shares (:func:`run_stage`): the teacher's rollouts, the replay."""


STAGE_TIMEOUT_S = 30 * 24 * 3600.0
"""How long a rank that has played its share waits for the others (the process group's timeout)."""


class RankFailed(RuntimeError):
    """A rank of a preparation stage failed; the launcher has printed which and why."""


def _teacher_rollouts(cfg: TrainConfig, benchmark: Benchmark, nproc: int) -> Path:
    """The teacher's rollouts that may become references, as candidates (cached as ``<references>.teacher.jsonl``):
    played on ``nproc`` ranks, each task's as it finishes in its rank's journal, merged once all are done."""
    from actfirst.preparation.teacher_candidates import merge_candidates

    path = _teacher_path(cfg)
    if path.is_file():
        return path
    tasks = cfg.training_tasks(benchmark)
    logger.info(f"[prepare] teacher rollouts: {cfg.prepare.teacher_rollouts} per task x {len(tasks)} training tasks "
                f"on {nproc} rank(s), up to {cfg.scheduler.b_max} episodes at once on each")
    started = time.perf_counter()
    _on_ranks(cfg, "teacher", nproc)
    merge_candidates(path, [benchmark.task_key(t) for t in tasks])
    logger.info(f"[prepare] teacher rollouts: {time.perf_counter() - started:.0f} s on {nproc} rank(s) -> {path}")
    return path


def _build_references(cfg: TrainConfig, benchmark: Benchmark, candidate_files: list[str], nproc: int) -> None:
    from actfirst.preparation.reference_cache import publish_references

    tasks = cfg.training_tasks(benchmark)
    logger.info(f"[prepare] reference cache for {len(tasks)} training tasks on {nproc} rank(s) -> {cfg.references}")
    with paths_unchecked():  # the ranks read every candidate file from their config
        cfg = dataclasses.replace(cfg, prepare=dataclasses.replace(cfg.prepare, candidate_files=candidate_files))
    _on_ranks(cfg, "references", nproc)
    publish_references(benchmark, tasks, out=cfg.references, candidate_files=candidate_files,
                       shorten=cfg.prepare.shorten)


def _teacher_path(cfg: TrainConfig) -> Path:
    return Path(f"{cfg.references}.teacher.jsonl")


def _on_ranks(cfg: TrainConfig, stage: str, nproc: int) -> None:
    """Run ``stage`` on ``nproc`` ranks: one in this process; several as the ranks of a one-node job, each
    ``python -m actfirst.prepare --stage <stage> --config <cfg as JSON>`` (the JSON beside the references)."""
    if nproc == 1:
        run_stage(cfg, stage)
        return
    from actfirst.core.schema import config_json
    from actfirst.parallel.launch import launch_ranks

    config = Path(f"{cfg.references}.{stage}.config.json")
    config.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(config, config_json(cfg))
    try:
        status = launch_ranks(nproc, ["-m", "actfirst.prepare", "--stage", stage, "--config", str(config)],
                              advice="rerun to resume: every finished task is kept")
    finally:
        config.unlink(missing_ok=True)
    if status != 0:
        raise RankFailed(f"preparation stage {stage!r} failed on a rank (above); rerun to resume")


def run_stage(cfg: TrainConfig, stage: str) -> None:
    """This process's share of ``stage`` (one of :data:`STAGES`): a rank of a launched job (torchrun's
    environment) takes every R-th training task from its rank; any other process takes them all."""
    from actfirst.parallel.context import launched_as_rank

    rank, world = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE")) if launched_as_rank() else (0, 1)
    share = _teacher_share if stage == "teacher" else _references_share
    share(cfg, get_benchmark(cfg.benchmark, cfg.env), rank, world)


def _teacher_share(cfg: TrainConfig, benchmark: Benchmark, rank: int, world: int) -> None:
    """Rank ``rank``'s teacher rollouts on its own engine (in the job's process group when ``world`` > 1), with
    ``scheduler.b_max`` episodes in flight."""
    from transformers import AutoTokenizer

    from actfirst.engine.core import ActFirstEngine
    from actfirst.parallel.context import all_gather_objects, init_parallel
    from actfirst.preparation.teacher_candidates import play_share

    if world > 1:  # every rank's engine joins the job's group (vLLM's external_launcher); ranks may finish days apart
        init_parallel(timeout_s=STAGE_TIMEOUT_S)
    need = cfg.rollout.max_prompt_tokens + cfg.rollout.budget.total

    async def run() -> None:
        engine = ActFirstEngine.from_config(_engine_config(cfg, cfg.teacher, need), cfg.scheduler, world_size=world)
        try:
            await play_share(engine, AutoTokenizer.from_pretrained(cfg.teacher), benchmark,
                             cfg.training_tasks(benchmark), out=_teacher_path(cfg), rank=rank, world=world,
                             per_task=cfg.prepare.teacher_rollouts, rollout=cfg.rollout,
                             max_in_flight=cfg.scheduler.b_max, seed=cfg.seed)
            all_gather_objects(rank)  # the engines leave together: vLLM's teardown takes the group down
        finally:
            await engine.shutdown()

    asyncio.run(run())


def _references_share(cfg: TrainConfig, benchmark: Benchmark, rank: int, world: int) -> None:
    """Rank ``rank``'s reference replay, with its share of the CPU cores as simulator workers."""
    from actfirst.envs.workers import EnvPool
    from actfirst.preparation.reference_cache import replay_references

    tasks = cfg.training_tasks(benchmark)
    size = max(1, min(len(range(rank, len(tasks), world)), (os.cpu_count() or 2) // world))
    with EnvPool(benchmark.env_spec(), size=size) as pool:
        asyncio.run(replay_references(benchmark, tasks, pool, out=cfg.references,
                                      candidate_files=cfg.prepare.candidate_files, shorten=cfg.prepare.shorten,
                                      rank=rank, world=world))


# -- the demo's models ----------------------------------------------------------------------------------------------


def _expert_steps(cfg: TrainConfig, benchmark: Benchmark):
    from actfirst.envs.workers import EnvPool
    from actfirst.train.sft import expert_steps

    references = load_references(cfg.references)
    tasks = [t for t in cfg.training_tasks(benchmark) if benchmark.task_key(t) in references]
    with EnvPool(benchmark.env_spec(), size=min(len(tasks), os.cpu_count() or 2)) as pool:
        steps = asyncio.run(expert_steps(benchmark, pool, tasks, references))
    logger.info(f"[prepare] {len(steps)} expert steps from {len(tasks)} references")
    return steps


def _sft_model(cfg: TrainConfig, model_cfg, sft_cfg: SFTConfig, tokenizer, benchmark: Benchmark, steps,
               out: Path, what: str) -> None:
    """Build ``model_cfg`` around ``tokenizer``, train it on ``steps`` and publish it at ``out`` atomically."""
    import torch
    from transformers import AutoModelForCausalLM

    from actfirst.models.build import build_model
    from actfirst.rollout.prompts import Mode
    from actfirst.train.sft import THOUGHTS, examples, sft

    thoughts = cfg.prepare.build_models.thoughts
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    build_model(model_cfg, tmp, tokenizer=tokenizer)
    torch.manual_seed(sft_cfg.seed)
    model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
    if sft_cfg.tasks:
        keep = list(dict.fromkeys(s.task for s in steps))[: sft_cfg.tasks]
        steps = [s for s in steps if s.task in keep]
    data = examples(tokenizer, benchmark, steps, modes=[Mode(m) for m in sft_cfg.modes],
                    max_prompt_tokens=cfg.rollout.max_prompt_tokens, thought=THOUGHTS[thoughts],
                    stray_token_rate=sft_cfg.stray_token_rate, seed=sft_cfg.seed)
    alternatives = (_alternative_examples(cfg, sft_cfg, tokenizer, benchmark, steps, what)
                    if sft_cfg.inverse_dynamics_alternatives else [])
    data += alternatives
    params = sum(p.numel() for p in model.parameters())
    logger.info(f"[prepare] {what}: {params / 1e6:.2f}M parameters, SFT on {len(data)} examples "
                f"({', '.join(sft_cfg.modes)}), {sft_cfg.epochs} epochs")
    result = sft(model, data, epochs=sft_cfg.epochs, lr=sft_cfg.lr, batch_tokens=sft_cfg.batch_tokens,
                 micro_batch_tokens=sft_cfg.micro_batch_tokens, seed=sft_cfg.seed)
    record = {"parameters": params, "examples": len(data), "steps": len(steps), "sft": dataclasses.asdict(sft_cfg),
              "thoughts": thoughts, "inverse_dynamics_alternatives": len(alternatives),
              "epoch_losses": result.epoch_losses, "wall_s": result.wall_s, "tokens_per_s": result.tokens_per_s}
    if sft_cfg.invalid_turns is not None:
        record["invalid_turns"] = _invalid_turns_stage(cfg, sft_cfg, model, tokenizer, benchmark, steps, data, what)
    model.save_pretrained(tmp, safe_serialization=True)
    (tmp / SFT_RECORD).write_text(json.dumps(record, indent=1))
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out)


def _on_references(cfg: TrainConfig, benchmark: Benchmark, steps, play) -> list:
    """``play(pool, tasks, references)`` (a coroutine) on a pool of the simulator, for the training tasks that
    ``steps`` come from and the reference cache; its result."""
    from actfirst.envs.workers import EnvPool

    references = load_references(cfg.references)
    keys = set(s.task for s in steps)
    tasks = [t for t in cfg.training_tasks(benchmark) if benchmark.task_key(t) in keys]
    with EnvPool(benchmark.env_spec(), size=min(len(tasks), os.cpu_count() or 2)) as pool:
        return asyncio.run(play(pool, tasks, references))


def _alternative_examples(cfg: TrainConfig, sft_cfg: SFTConfig, tokenizer, benchmark: Benchmark, steps, what: str
                          ) -> list:
    """Inverse-dynamics examples of ``sft_cfg.inverse_dynamics_alternatives`` other actions at each of ``steps``
    (``actfirst.train.inverse_dynamics``), each executed in the simulator."""
    from actfirst.rollout.prompts import Mode
    from actfirst.train.inverse_dynamics import alternative_steps
    from actfirst.train.sft import examples

    alternatives = _on_references(cfg, benchmark, steps, lambda pool, tasks, references: alternative_steps(
        benchmark, pool, tasks, references, steps, alternatives=sft_cfg.inverse_dynamics_alternatives,
        seed=sft_cfg.seed))
    logger.info(f"[prepare] {what}: {len(alternatives)} inverse-dynamics examples of other actions at "
                f"{len(steps)} reference steps")
    return examples(tokenizer, benchmark, alternatives, modes=[Mode.INVERSE_DYNAMICS],
                    max_prompt_tokens=cfg.rollout.max_prompt_tokens)


def _invalid_turns_stage(cfg: TrainConfig, sft_cfg: SFTConfig, model, tokenizer, benchmark: Benchmark, steps, data,
                         what: str) -> dict[str, Any]:
    """``sft_cfg.invalid_turns``'s second stage on ``model``: the first stage's examples (``data``) and full responses
    at the steps of ``steps``' references replayed with invalid turns (``actfirst.train.invalid_turns``); its record."""
    from actfirst.rollout.prompts import Mode
    from actfirst.train.invalid_turns import invalid_turn_steps
    from actfirst.train.sft import THOUGHTS, examples, sft

    stage = sft_cfg.invalid_turns
    invalid = _on_references(cfg, benchmark, steps, lambda pool, tasks, references: invalid_turn_steps(
        benchmark, pool, tasks, references, variants=stage.variants, max_turns=stage.max_turns, seed=stage.seed))
    tasks = set(s.task for s in steps)
    thought = THOUGHTS[cfg.prepare.build_models.thoughts]
    extra = examples(tokenizer, benchmark, invalid, modes=[Mode.FULL_RESPONSE],
                     max_prompt_tokens=cfg.rollout.max_prompt_tokens, thought=thought)
    logger.info(f"[prepare] {what}: second stage on {len(invalid)} steps after invalid turns ({len(tasks)} references "
                f"x {stage.variants}) and the first stage's {len(data)} examples, {stage.epochs} epochs")
    result = sft(model, data + extra, epochs=stage.epochs, lr=stage.lr, batch_tokens=sft_cfg.batch_tokens,
                 micro_batch_tokens=sft_cfg.micro_batch_tokens, seed=sft_cfg.seed)
    return {"steps": len(invalid), "examples": len(data) + len(extra), "epoch_losses": result.epoch_losses,
            "wall_s": result.wall_s, "tokens_per_s": result.tokens_per_s}


def _build_teacher(cfg: TrainConfig, build: BuildModelsConfig, benchmark: Benchmark, steps) -> None:
    from actfirst.models.build import environment_corpus
    from actfirst.models.tokenizers import train_env_bpe_tokenizer
    from actfirst.train.sft import THOUGHTS, corpus

    tokenizer = train_env_bpe_tokenizer(environment_corpus() + corpus(benchmark, steps,
                                                                      thought=THOUGHTS[build.thoughts]),
                                        vocab_size=build.tokenizer_vocab_size)
    _sft_model(cfg, build.teacher, build.teacher_sft, tokenizer, benchmark, steps, Path(cfg.teacher), "teacher")


def _build_student(cfg: TrainConfig, build: BuildModelsConfig, benchmark: Benchmark, steps) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg.teacher)  # the teacher scores the student's tokens
    _sft_model(cfg, build.student, build.student_sft, tokenizer, benchmark, steps, Path(cfg.student.model),
               "student warm start")


def evaluate_teacher(cfg: TrainConfig, benchmark: Benchmark) -> dict[str, Any]:
    """Evaluate the teacher as the run evaluates the student (C.1, C.4) and store the report in its directory."""
    from transformers import AutoTokenizer

    from actfirst.engine.core import ActFirstEngine
    from actfirst.evaluation.evaluate import evaluate, pick_tasks

    spec = cfg.evaluation
    if spec is None:
        raise ConfigError("evaluation=None: the teacher is evaluated as the student is; set an evaluation section")
    tasks = pick_tasks(benchmark, benchmark.tasks(spec.split), spec.tasks)
    need = cfg.rollout.max_prompt_tokens + cfg.rollout.budget.eval_total

    async def run():
        engine = ActFirstEngine.from_config(_engine_config(cfg, cfg.teacher, need), cfg.scheduler)
        try:
            return await evaluate(engine, AutoTokenizer.from_pretrained(cfg.teacher), benchmark, tasks,
                                  seeds=spec.seeds, rollout=spec.sampling(cfg.rollout),
                                  max_in_flight=spec.max_in_flight)
        finally:
            await engine.shutdown()

    report = asyncio.run(run())
    report.meta.update({"model": cfg.teacher, "split": spec.split})
    write_atomically(Path(cfg.teacher) / TEACHER_EVAL, report.to_json())
    logger.info(f"[prepare] the teacher's evaluation ({Path(cfg.teacher) / TEACHER_EVAL}):\n{report.table()}")
    return report.summary()

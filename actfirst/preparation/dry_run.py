"""What ``python -m actfirst.run --config X --dry-run`` prints, and whether the run could start: the resolved config,
where each model and data set resolves (or that it is missing, and the command that fetches it), the GPU memory plan
for the detected (or named) GPU, the host memory of the environment workers. Nothing is downloaded, built or
started; every check runs, so that everything missing is listed, not only the first::

    report = dry_run(cfg_path, overrides, nproc=None, gpu=None, resume=False)
    print("\\n".join(report.lines())); sys.exit(0 if report.could_start else 1)
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Literal

import yaml

from actfirst.core.config import DEMO_CONFIG, TrainConfig
from actfirst.core.schema import config_json
from actfirst.core.user_input import ConfigError, UserError, check_writable_dir
from actfirst.envs.benchmarks import BENCHMARKS, get_benchmark
from actfirst.models.hub import download_command, is_hub_id, model_commit, resolve_model
from actfirst.parallel.host_memory import check_host_memory, run_worker_stages
from actfirst.parallel.memory_plan import GPUS, load_activations, model_shape, plan, settings
from actfirst.preparation.build import load_run_config, models_to_build, plays_teacher_rollouts

Status = Literal["ok", "built at start", "fetched at start", "MISSING", "REFUSED", "warning"]
PROBLEMS = ("MISSING", "REFUSED")
PAPER_NODE = 8
"""Ranks planned for on a GPU named by ``--gpu`` without ``--nproc-per-node``: one node of 8 GPUs (Sec. 5.1)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Item:
    """One line of the report: a check's status, what it is about and what was found."""

    status: Status
    what: str
    text: str

    def line(self) -> str:
        return f"  {self.status:<16} {self.what}: {self.text}"


@dataclasses.dataclass(slots=True)
class DryRunReport:
    """The sections of a dry run: the resolved config, the inputs, the GPU plan, the host memory."""

    config: str
    resolved: str
    inputs: list[Item] = dataclasses.field(default_factory=list)
    gpu: list[Item] = dataclasses.field(default_factory=list)
    host: list[Item] = dataclasses.field(default_factory=list)

    @property
    def problems(self) -> list[Item]:
        return [i for i in (*self.inputs, *self.gpu, *self.host) if i.status in PROBLEMS]

    @property
    def could_start(self) -> bool:
        """Whether nothing would stop the run."""
        return not self.problems

    def lines(self) -> list[str]:
        named = ", ".join(p.what for p in self.problems)
        verdict = "the run could start" if self.could_start else \
            f"the run could not start: {len(self.problems)} problem(s) ({named})"
        return [f"[dry run] config {self.config}", "resolved config:",
                *("  " + line for line in self.resolved.splitlines()),
                "inputs:", *(i.line() for i in self.inputs),
                "GPU memory per rank (actfirst.parallel.memory_plan; docs/memory.md):", *(i.line() for i in self.gpu),
                "host memory of the environment workers (actfirst.parallel.host_memory):",
                *(i.line() for i in self.host), f"[dry run] {verdict}; nothing was started"]


def dry_run(config: str | None, overrides: list[str], *, nproc: int | None, gpu: str | None,
            resume: bool) -> DryRunReport:
    """Check everything a run of ``config`` with ``overrides`` needs, on ``nproc`` ranks (None: one per GPU here, as
    the run takes them; :data:`PAPER_NODE` for a named ``gpu``; one on a CPU), planning GPU memory for ``gpu`` (a
    class of :data:`GPUS` or a size in GiB; None: the GPU here, else every class, for information). A config that
    does not load raises ``ConfigError`` as the run would."""
    gpu_gib = _gpu_gib(gpu) if gpu is not None else None
    inputs: list[Item] = []
    cfg = _load(config, overrides, inputs)
    report = DryRunReport(str(config or DEMO_CONFIG), yaml.safe_dump(json.loads(config_json(cfg)), sort_keys=False))
    here = _local_gpu()
    ranks = nproc or (here[2] if here else PAPER_NODE if gpu is not None else 1)
    dirs = _models(cfg, inputs)
    _data(cfg, inputs)
    _references(cfg, inputs)
    _out_dir(cfg, resume, inputs)
    _layout(cfg, ranks, inputs)
    report.inputs = inputs
    report.gpu = _gpu_plan(cfg, dirs, ranks, (gpu, gpu_gib) if gpu is not None else None, here)
    report.host = _host(cfg, ranks)
    return report


def _load(config: str | None, overrides: list[str], inputs: list[Item]) -> TrainConfig:
    """The run's config (input paths unchecked, as the launcher loads it). A benchmark section whose data is missing
    is reported and left out (``env=null``), so that the rest can still be checked."""
    try:
        return load_run_config(config, overrides)
    except ConfigError as e:
        if not str(e).startswith("env."):
            raise
        inputs.append(Item("MISSING", "env (the benchmark's data)", _with_fetch(str(e), None)))
        return load_run_config(config, [*overrides, "env=null"])


def _with_fetch(message: str, benchmark: str | None) -> str:
    """``message`` with the command that fetches the benchmark's data, where it declares some and says none."""
    if benchmark is None or "python -m actfirst.data" in message:
        return message
    data = BENCHMARKS[benchmark].data
    return message + (f" (the benchmark's data: python -m actfirst.data {benchmark})" if data and data.sources else "")


def _models(cfg: TrainConfig, inputs: list[Item]) -> dict[str, Path | None]:
    """Where the student and the teacher resolve (never downloading), and whether their tokenizers agree."""
    built = models_to_build(cfg)
    dirs: dict[str, Path | None] = {}
    for key, name, revision, revision_key in (
            ("student.model", cfg.student.model, cfg.student.revision, "student.revision"),
            ("teacher", cfg.teacher, cfg.teacher_revision, "teacher_revision")):
        if key in built:
            inputs.append(Item("built at start", f"{key}={name}", "prepare.build_models trains it first"))
            dirs[key] = None
            continue
        try:
            path = resolve_model(name, key, revision, download=False, revision_key=revision_key)
        except ConfigError as e:
            why = str(e).removeprefix(f"{key}={name!r}: ")
            inputs.append(_on_hub(key, name, revision, why) if is_hub_id(name) and not Path(name).exists() else
                          Item("MISSING", f"{key}={name}", f"{why}; put the model there (hf download <owner/name> "
                                                           f"--local-dir {name}) or name its Hub id"))
            dirs[key] = None
            continue
        commit = model_commit(path)
        where = str(path) + (f" (Hugging Face cache, commit {commit})" if commit != "local" else "")
        inputs.append(Item("ok", f"{key}={name}", where))
        dirs[key] = path
    if dirs["student.model"] is not None and dirs["teacher"] is not None:
        from actfirst.models.tokenizers import check_tokenizers_match

        try:
            check_tokenizers_match(str(dirs["student.model"]), str(dirs["teacher"]))
            inputs.append(Item("ok", "tokenizers", "the student's and the teacher's give the same ids"))
        except ConfigError as e:
            inputs.append(Item("REFUSED", "tokenizers", str(e)))
    return dirs


def _on_hub(key: str, name: str, revision: str | None, why: str) -> Item:
    """A Hub id that is not in the cache: the run downloads it at start, if the Hub has it (asked now, when it can
    be: its commit and size); missing offline or when the Hub has no such model or revision."""
    import httpx2
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    what = f"{key}={name}"
    if constants.HF_HUB_OFFLINE:
        return Item("MISSING", what, why)
    fetch = download_command(name, revision)
    try:
        info = HfApi().model_info(name, revision=revision, files_metadata=True)
    except RepositoryNotFoundError:
        return Item("MISSING", what, "the Hugging Face Hub has no such model (or it is private: hf auth login)")
    except RevisionNotFoundError:
        return Item("MISSING", what, f"the Hugging Face Hub has no revision {revision!r} of it")
    except (httpx2.HTTPError, OSError) as e:  # the network: the Hub could not be asked now
        return Item("fetched at start", what, f"not in the Hugging Face cache; the run downloads it at start (the "
                                              f"Hub could not be asked now: {type(e).__name__}); or first: {fetch}")
    size = sum(f.size or 0 for f in info.siblings or [] if f.rfilename.endswith(".safetensors"))
    return Item("fetched at start", what, f"not in the Hugging Face cache; the run downloads it at start (commit "
                                          f"{info.sha}, {size / 2**30:.1f} GiB of weights); or first: {fetch}")


def _data(cfg: TrainConfig, inputs: list[Item]) -> None:
    """The benchmark's tasks, as the run enumerates them (its data and simulator)."""
    if any(i.what.startswith("env ") for i in inputs):
        return
    try:
        benchmark = get_benchmark(cfg.benchmark, cfg.env)
        made = benchmark.made_at_start()
        if made is not None:
            inputs.append(Item("built at start", f"benchmark {cfg.benchmark}", made))
            return
        train, evaluation = cfg.training_tasks(benchmark), benchmark.tasks("eval")
    except UserError as e:
        inputs.append(Item("MISSING", f"benchmark {cfg.benchmark} (its data and simulator)",
                           _with_fetch(str(e), cfg.benchmark)))
        return
    inputs.append(Item("ok", f"benchmark {cfg.benchmark}", f"{len(train)} training tasks, {len(evaluation)} "
                                                           f"evaluation tasks"))


def _references(cfg: TrainConfig, inputs: list[Item]) -> None:
    """The reference cache: there and valid, or built at start from the candidates (which must exist)."""
    from actfirst.preparation.reference_cache import load_references, read_candidates

    if cfg.references is None:
        return
    what = f"references={cfg.references}"
    try:
        read_candidates(cfg.prepare.candidate_files, "prepare.candidate_files")
    except ConfigError as e:
        inputs.append(Item("MISSING", "prepare.candidate_files", str(e)))
    if not Path(cfg.references).is_file():
        rollouts = (f" and {cfg.prepare.teacher_rollouts} teacher rollouts per training task" if
                    plays_teacher_rollouts(cfg) else "")
        inputs.append(Item("built at start", what, f"preparation builds it from the benchmark's own candidates"
                                                   f"{rollouts} (or first: python -m actfirst.prepare with the same "
                                                   f"--config and overrides)"))
        return
    if any(i.what.startswith(("env ", "benchmark ")) and i.status != "ok" for i in inputs):
        inputs.append(Item("ok", what, "there (its coverage not checked: the benchmark's tasks are not there yet)"))
        return
    try:
        benchmark = get_benchmark(cfg.benchmark, cfg.env)
        refs = load_references(cfg.references, benchmark=benchmark,
                               tasks=[benchmark.task_key(t) for t in cfg.training_tasks(benchmark)])
        inputs.append(Item("ok", what, f"{len(refs)} references covering the training tasks"))
    except ConfigError as e:
        inputs.append(Item("REFUSED", what, str(e)))


def _out_dir(cfg: TrainConfig, resume: bool, inputs: list[Item]) -> None:
    what = f"out_dir={cfg.out_dir}"
    try:
        check_writable_dir(cfg.out_dir, "out_dir")
    except ConfigError as e:
        inputs.append(Item("REFUSED", what, str(e)))
        return
    held = (Path(cfg.out_dir) / "metrics.jsonl").exists()
    if held and not resume:
        inputs.append(Item("REFUSED", what, "holds a run: add --resume to continue it, or give another out_dir"))
    else:
        inputs.append(Item("ok", what, "writable" + (", a run to resume" if held else "")))


def _layout(cfg: TrainConfig, ranks: int, inputs: list[Item]) -> None:
    from actfirst.train.pipeline import check_layout

    try:
        check_layout(cfg, ranks)
        inputs.append(Item("ok", f"{ranks} rank(s)", f"rollout.batch_tasks={cfg.rollout.batch_tasks} and "
                                                     f"batch_samples={cfg.batch_samples} divide over them"))
    except ConfigError as e:
        inputs.append(Item("REFUSED", f"{ranks} rank(s)", str(e)))


def _local_gpu() -> tuple[str, float, int] | None:
    """(name, GiB, count) of this machine's first GPU, or None."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return props.name, props.total_memory / 2**30, torch.cuda.device_count()


def _gpu_plan(cfg: TrainConfig, dirs: dict[str, Path | None], ranks: int, gpu: tuple[str, float] | None,
              here: tuple[str, float, int] | None) -> list[Item]:
    """The plan per rank on the named GPU, the one here, or (neither) every GPU class; a problem only where the run
    would run on it (named or here) and it does not fit."""
    student = model_shape(cfg.student.model, dirs["student.model"])
    teacher = model_shape(cfg.teacher, dirs["teacher"])
    items = [Item("ok" if shape else "warning", key, f"{shape} ({why})" if shape else f"not planned: {why}")
             for key, (shape, why) in (("student shape", student), ("teacher shape", teacher))]
    if student[0] is None or teacher[0] is None:
        return items
    if gpu is not None:
        targets, binding = {gpu[0]: gpu[1]}, True
    elif here is not None:
        targets, binding = {f"{here[0]} (here)": here[1]}, True
    else:
        items.append(Item("warning", "no GPU here", f"planned for each GPU class on {ranks} rank(s), for information; "
                                                    f"plan a node with --gpu 80GB --nproc-per-node 8"))
        targets, binding = {f"{name} (no GPU here)": gib for name, gib in GPUS.items()}, False
    measured = load_activations()
    for name, gib in targets.items():
        r = plan(cfg, student[0], teacher[0], gpu_gib=gib, ranks=ranks, measured=measured)
        phases = ", ".join(f"{k} {v:.1f}" for k, v in r["phases"].items())
        text = (f"peak {r['peak']:.1f} of {gib:.1f} GiB ({phases}; {settings(cfg)}; {ranks} ranks), KV cache "
                f"{r['kv_tokens'] / 1000:.0f}k tokens: {'fits' if r['fits'] else 'does NOT fit'}")
        items.append(Item("ok" if r["fits"] else ("REFUSED" if binding else "warning"), f"on {name}", text))
    return items


def _gpu_gib(gpu: str) -> float:
    """``--gpu``: a class of :data:`GPUS` (80GB, 141GB) or a size in GiB."""
    if gpu in GPUS:
        return GPUS[gpu]
    try:
        return float(gpu.removesuffix("GiB"))
    except ValueError:
        raise ConfigError(f"--gpu={gpu!r}: one of {list(GPUS)} or a size in GiB (94, 94GiB)") from None


def _host(cfg: TrainConfig, ranks: int) -> list[Item]:
    """Each stage's workers against this machine's memory."""
    stages = run_worker_stages(cfg, ranks, preparing=plays_teacher_rollouts(cfg))
    items = [Item("ok", stage.what.split(":")[0], stage.line().split(": ", 1)[1]) for stage in stages]
    try:
        for warning in check_host_memory(stages):
            items.append(Item("warning", "this machine", warning.removeprefix("warning: ")))
    except ConfigError as e:
        items.append(Item("REFUSED", "this machine", str(e)))
    return items


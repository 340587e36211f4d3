"""The runs of ``python -m actfirst.compare``, each in a process of its own, so that no run inherits another's warm
state or memory:

1. Preparation (a spawned child): what every run needs (``actfirst.preparation.build.ensure_prepared``), then the warm
   start and the teacher evaluated on the run config's evaluation episodes. From these two SRs the same-SR threshold
   is fixed (``compare.threshold``; ``actfirst.comparison.tables.fixed_threshold``) and written to ``threshold.json``
   before any training run starts.
2. Training: every (strategy, seed) as ``python -m actfirst.run`` in its own process, in ABBA order over the seeds
   (:func:`run_order`), with checkpoints every ``compare.checkpoint_every`` updates, all kept, and no evaluation
   during training.
3. Evaluation after training (a spawned child per run): every checkpoint of the run on the same episodes (the
   comparison's config's ``evaluation:`` section), on one engine into which each checkpoint's weights are loaded
   in turn; rows in ``<run>/checkpoint_evals.jsonl``, reports in ``<run>/checkpoint_evals/``. A point's time is the
   training wall-clock at that update's metrics record; the evaluation's own time is outside it.

Every step resumes: a finished preparation, run or checkpoint evaluation is not done again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import multiprocessing as mp
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from actfirst.comparison.tables import CHECKPOINT_EVALS, fixed_threshold, run_dir
from actfirst.core.config import DEMO_CONFIG, ConfigError, TrainConfig
from actfirst.core.files import write_atomically
from actfirst.core.logs import current_log_dir, setup_logging
from actfirst.core.threads import thread_counts
from actfirst.train.plots import read_records

logger = logging.getLogger(__name__)

THRESHOLD = "threshold.json"
"""What the comparison fixed before training: the threshold, the warm start's and the teacher's evaluations."""
PREPARED = "prepare"
"""The preparation's evaluation reports, under the comparison's ``--out``."""
CHECKPOINT_DIR = re.compile(r"update_(\d+)")
COMMITTED = "checkpoint.json"
"""A checkpoint is complete once this file is in it (``actfirst.train.checkpoint``)."""


def run_order(strategies: Sequence[str], seeds: Sequence[int]) -> list[tuple[str, int]]:
    """ABBA: the i-th seed (as given) runs the strategies in the given order when i is even, in reverse when odd, so
    that drift of the machine and warm state favour no method (seed 0: A B, seed 1: B A, seed 2: A B, ...)."""
    return [(s, k) for i, k in enumerate(seeds) for s in (strategies if i % 2 == 0 else list(reversed(strategies)))]


def run_overrides(common: Sequence[str], strategy: str, seed: int, out: Path, cfg: TrainConfig) -> list[str]:
    """The overrides of one run: ``common`` (the user's), its strategy, seed and directory, checkpoints every
    ``compare.checkpoint_every`` updates with every one kept, no evaluation during training."""
    every = cfg.compare.checkpoint_every
    return [*common, f"rollout.strategy={strategy}", f"seed={seed}", f"out_dir={run_dir(out, strategy, seed)}",
            f"checkpoint_every={every}", f"keep_checkpoints={math.ceil(cfg.num_updates / every) + 1}",
            "evaluation=null"]


def fix_threshold(config: str | None, overrides: dict[str, list[str]], out: Path, setting: str | float) -> dict:
    """Step 1: prepare in a child process (once: a ``threshold.json`` already there is read back, and must have been
    fixed under the same ``setting``), fix the threshold from its evaluations and write ``threshold.json``; returns
    its content."""
    path = out / THRESHOLD
    if path.is_file():
        fixed = json.loads(path.read_text())
        if fixed["setting"] != setting:
            raise ConfigError(f"compare.threshold={setting!r}: this comparison fixed {fixed['setting']!r} "
                              f"({fixed['threshold']:.1f}%) before its runs ({path}); keep it, or use another --out")
        return fixed
    rows = in_child(prepare_and_evaluate, config, overrides, str(out / PREPARED))
    warm_sr, teacher_sr = (rows[k]["summary"]["SR"]["mean"] for k in ("warm_start", "teacher"))
    threshold = fixed_threshold(setting, warm_sr, teacher_sr)
    how = (f"warm start {warm_sr:.1f}% + (teacher {teacher_sr:.1f}% - warm start) / 2" if setting == "auto" else
           f"given; warm start {warm_sr:.1f}%, teacher {teacher_sr:.1f}%")
    fixed = {"setting": setting, "threshold": threshold, "how": how, "fixed_at": time.time(), **rows}
    write_atomically(path, json.dumps(fixed, indent=1) + "\n")
    logger.info(f"[compare] same-SR threshold {threshold:.1f}% ({how}), fixed before training: {path}")
    return fixed


def prepare_and_evaluate(config: str | None, overrides: dict[str, list[str]], where: str) -> dict[str, dict]:
    """In the preparation's child: build what every strategy's run needs, then evaluate the warm start and the
    teacher on the evaluation's episodes; returns their rows (as ``evals.jsonl``'s, at update 0 and 0 s)."""
    from actfirst.preparation.build import ensure_prepared, load_run_config, resolve_models

    cfgs = [resolve_models(load_run_config(config, o)) for o in overrides.values()]
    for cfg in cfgs:
        ensure_prepared(cfg)
    common = next(iter(overrides.values()))
    rows = {}
    for key, model in (("warm_start", cfgs[0].student.model), ("teacher", cfgs[0].teacher)):
        rows[key] = evaluate_models(config, common, [(0, model, 0.0)], Path(where), name=key)[0]
    return rows


def in_child(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a fresh spawned process (not a daemon: the evaluation starts environment workers)
    that logs as this one does; returns its result, raises its exception."""
    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"), initializer=setup_logging,
                             initargs=(current_log_dir(),)) as pool:
        return pool.submit(fn, *args, **kwargs).result()


def train_run(config: str | None, overrides: Sequence[str], *, resume: bool) -> int:
    """Step 2: one run as ``python -m actfirst.run`` in its own process; returns its exit status."""
    argv = [sys.executable, "-m", "actfirst.run", "--config", str(config or DEMO_CONFIG), *overrides]
    return subprocess.run(argv + (["--resume"] if resume else [])).returncode


def checkpoints(path: str | Path) -> list[tuple[int, Path]]:
    """A run's complete checkpoints as (update, directory), in update order."""
    found = []
    for item in (Path(path) / "checkpoints").glob("update_*"):
        match = CHECKPOINT_DIR.fullmatch(item.name)
        if match and (item / COMMITTED).is_file():
            found.append((int(match.group(1)), item))
    return sorted(found)


def evaluate_run(config: str | None, overrides: Sequence[str], path: str | Path) -> int:
    """Step 3: evaluate the checkpoints of the run in ``path`` not evaluated yet, in a child process (none when every
    one is); returns how many were."""
    done = {r["update"] for r in read_records(Path(path) / CHECKPOINT_EVALS)}
    elapsed = {r["update"]: r["elapsed_s"] for r in read_records(Path(path) / "metrics.jsonl")}
    todo = [(u, str(d), elapsed[u]) for u, d in checkpoints(path) if u not in done]
    if todo:
        in_child(evaluate_models, config, list(overrides), todo, Path(path) / "checkpoint_evals",
                 rows=Path(path) / CHECKPOINT_EVALS)
    return len(todo)


def evaluate_models(config: str | None, overrides: Sequence[str], models: list[tuple[int, str, float]],
                    where: Path, *, name: str = "update", rows: Path | None = None) -> list[dict[str, Any]]:
    """Evaluate each (update, model directory, training seconds) of ``models`` as the run of ``config`` evaluates
    (``actfirst.evaluation.evaluate.run_serving``), on one engine started on the first model into which every later
    one's weights are loaded (the same architecture); reports ``<where>/<name>_<update>.json``, rows (returned, and
    appended to ``rows`` as each finishes)."""
    from actfirst.evaluation.evaluate import run_serving, served

    plan, engine_cfg, scheduler_cfg = run_serving(str(config or DEMO_CONFIG), models[0][1], overrides)
    where.mkdir(parents=True, exist_ok=True)
    out = []

    async def play_all() -> None:
        async with served(engine_cfg, scheduler_cfg) as (engine, tokenizer):
            started = time.perf_counter()
            for i, (update, model, elapsed) in enumerate(models):
                t0 = time.perf_counter()
                if i:
                    engine.update_weights(_weights(model))
                report = await plan.play(engine, tokenizer, progress=False)
                wall = time.perf_counter() - t0
                report.meta.update({"checkpoint": model, "split": plan.spec.split})
                report_path = write_atomically(where / f"{name}_{update:06d}.json", report.to_json())
                row = {"update": update, "elapsed_s": elapsed, "eval_wall_s": wall, "report": str(report_path),
                       "model": model, "summary": report.summary(),
                       "splits": {s: report.summary(split=s) for s in report.splits}, "threads": thread_counts()}
                out.append(row)
                if rows is not None:
                    with rows.open("a") as f:
                        f.write(json.dumps(row, default=str) + "\n")
                eta = (time.perf_counter() - started) / (i + 1) * (len(models) - i - 1)
                logger.info(f"[compare] evaluated {name} {update} ({model}): SR {row['summary']['SR']['mean']:.1f}% "
                            f"in {wall:.0f} s; {i + 1}/{len(models)}, ETA {eta:.0f} s")

    asyncio.run(play_all())
    return out


def _weights(model: str) -> Iterator[tuple[str, Any]]:
    """A Hugging Face checkpoint's tensors by name (its safetensors files)."""
    from safetensors.torch import load_file

    for file in sorted(Path(model).glob("*.safetensors")):
        yield from load_file(file).items()

"""The experiment trackers a training run reports to (``report_to``, TRL's key): TensorBoard, Weights & Biases and
Trackio. Each receives, from rank 0 only, the same scalars of every update (those of ``metrics.jsonl``, nested keys
as ``a/b``), the run's config once, and the training-curve PNG whenever it is drawn::

    check_report_to(["tensorboard", "wandb"])            # at config time: unknown or not installed -> ConfigError
    trackers = open_trackers(["tensorboard"], TrackedRun(out_dir, "actfirst", config))
    MetricsSink(out_dir, trackers)                       # actfirst.train.metrics fans out to them

Each backend's own environment variables keep their meaning (``WANDB_MODE=offline``, ``WANDB_DIR``,
``TRACKIO_DIR``, ``TRACKIO_SPACE_ID``...). A resumed run continues its series: TensorBoard discards the events of the
updates after the checkpoint (``purge_step``), wandb and Trackio continue the same run.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib.util
import json
import os
from pathlib import Path
from typing import Any, ClassVar

from actfirst.core.files import write_atomically
from actfirst.core.schema import check


@dataclasses.dataclass(frozen=True)
class TrackedRun:
    """What every tracker is told about the run."""

    out_dir: Path
    project: str
    """The wandb / Trackio project (``tracker_project``)."""
    config: dict[str, Any]
    """The run's config as JSON holds it (hyperparameters)."""
    first_update: int = 1
    """The first update this session logs (> 1: a resumed run)."""

    @property
    def name(self) -> str:
        """The run's name in wandb and Trackio: its out_dir's last part."""
        return run_name(self.out_dir)


def run_name(out_dir: str | Path) -> str:
    """The tracker run name of the run in ``out_dir`` (its last part: ``runs/demo/actfirst`` -> ``actfirst``)."""
    return Path(out_dir).resolve().name


class Tracker(abc.ABC):
    """One tracker backend: constructing it opens its run (the backend's package is imported then)."""

    key: ClassVar[str]
    """Its name in ``report_to``."""
    module: ClassVar[str]
    """The package it imports (and ``pip install``s)."""

    @abc.abstractmethod
    def log(self, update: int, scalars: dict[str, float]) -> None:
        """Record one update's finite scalars."""

    @abc.abstractmethod
    def log_image(self, update: int, key: str, path: Path) -> None:
        """Record the PNG at ``path`` under ``key`` at ``update``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Write everything out and end the run."""

    @classmethod
    @abc.abstractmethod
    def where(cls, out_dir: Path, project: str) -> str:
        """Where this tracker's data of the run in ``out_dir`` went, and how to look at it."""


class TensorBoardTracker(Tracker):
    """Event files in ``<out_dir>/tensorboard`` (``torch.utils.tensorboard``); the config as a text summary."""

    key = "tensorboard"
    module = "tensorboard"

    def __init__(self, run: TrackedRun) -> None:
        from torch.utils.tensorboard import SummaryWriter

        resumed = run.first_update > 1
        self.writer = SummaryWriter(str(self.log_dir(run.out_dir)), purge_step=run.first_update if resumed else None)
        self.writer.add_text("config", f"```\n{json.dumps(run.config, indent=1)}\n```", run.first_update - 1)
        self.writer.flush()

    @staticmethod
    def log_dir(out_dir: Path) -> Path:
        """The run's TensorBoard log directory."""
        return Path(out_dir) / "tensorboard"

    def log(self, update: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, update)
        self.writer.flush()  # readable while the run goes on

    def log_image(self, update: int, key: str, path: Path) -> None:
        import numpy as np
        from PIL import Image

        with Image.open(path) as image:
            pixels = np.asarray(image.convert("RGB"))
        self.writer.add_image(key, pixels, update, dataformats="HWC")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

    @classmethod
    def where(cls, out_dir: Path, project: str) -> str:
        return f"{cls.log_dir(out_dir)} (tensorboard --logdir {cls.log_dir(out_dir)})"


class WandbTracker(Tracker):
    """A Weights & Biases run (``wandb.init`` with the run's config), its local files under ``<out_dir>/wandb``
    unless ``WANDB_DIR`` says otherwise; ``WANDB_MODE=offline`` keeps it on this machine (``wandb sync`` uploads
    it). The run's id is kept in ``<out_dir>/wandb_run_id`` so that ``--resume`` continues the same run."""

    key = "wandb"
    module = "wandb"

    def __init__(self, run: TrackedRun) -> None:
        import wandb

        self.wandb = wandb
        id_file = run.out_dir / "wandb_run_id"
        run_id = id_file.read_text().strip() if run.first_update > 1 and id_file.is_file() else None
        self.run = wandb.init(project=run.project, name=run.name, config=run.config, dir=str(self.root(run.out_dir)),
                              id=run_id, resume="allow" if run_id else None)
        if run_id is None:
            run.out_dir.mkdir(parents=True, exist_ok=True)
            write_atomically(id_file, self.run.id)

    @staticmethod
    def root(out_dir: Path) -> Path:
        """The directory wandb writes its ``wandb/`` folder into."""
        return Path(os.environ.get("WANDB_DIR") or out_dir)

    def log(self, update: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=update)

    def log_image(self, update: int, key: str, path: Path) -> None:
        self.run.log({key: self.wandb.Image(str(path))}, step=update)

    def close(self) -> None:
        self.run.finish()
        self.wandb.teardown()  # waits for wandb's service to write (or upload) everything: ranks end by os._exit

    @classmethod
    def where(cls, out_dir: Path, project: str) -> str:
        files = cls.root(out_dir) / "wandb"
        mode = os.environ.get("WANDB_MODE", "online")
        if mode in ("offline", "dryrun"):
            return f"{files} (offline; wandb sync {files}/offline-run-* uploads it)"
        return f"W&B project {project!r}, run {run_name(out_dir)!r} (mode {mode}; local files {files})"


class TrackioTracker(Tracker):
    """A Trackio run in the project's local SQLite database (``TRACKIO_DIR``, by default
    ``~/.cache/huggingface/trackio``), or on a Space where ``TRACKIO_SPACE_ID`` names one."""

    key = "trackio"
    module = "trackio"

    def __init__(self, run: TrackedRun) -> None:
        import trackio

        self.trackio = trackio
        self.run = trackio.init(project=run.project, name=run.name, config=run.config, embed=False,
                                resume="allow" if run.first_update > 1 else "never", auto_log_cpu=False,
                                auto_log_gpu=False)

    def log(self, update: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=update)

    def log_image(self, update: int, key: str, path: Path) -> None:
        self.run.log({key: self.trackio.Image(str(path))}, step=update)

    def close(self) -> None:
        self.run.finish()

    @classmethod
    def where(cls, out_dir: Path, project: str) -> str:
        space = os.environ.get("TRACKIO_SPACE_ID")
        home = os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"
        store = f"Space {space}" if space else str(os.environ.get("TRACKIO_DIR") or Path(home) / "trackio")
        return f"project {project!r}, run {run_name(out_dir)!r} in {store} (trackio show --project {project})"


TRACKERS: dict[str, type[Tracker]] = {t.key: t for t in (TensorBoardTracker, WandbTracker, TrackioTracker)}
"""The trackers ``report_to`` may name."""


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (found on the import path; nothing is imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: in sys.modules without a spec
        return False


def report_to_list(value: str | list[str]) -> list[str]:
    """``report_to`` as TRL users write it, as a list of tracker names: a list as it is, ``"none"`` (or
    ``["none"]``) no tracker, ``"all"`` every installed one, any other string that one tracker."""
    names = [value] if isinstance(value, str) else list(value)
    if names == ["none"]:
        return []
    if names == ["all"]:
        return [name for name, tracker in sorted(TRACKERS.items()) if installed(tracker.module)]
    return names


def check_report_to(names: list[str]) -> None:
    """Refuse, naming ``report_to``, a tracker that is unknown, named twice, or not installed."""
    for name in names:
        check(name in TRACKERS, "report_to", names, f"unknown tracker {name!r}; choose from {sorted(TRACKERS)}")
        module = TRACKERS[name].module
        check(installed(module), "report_to", names, f"{name} is not installed (pip install {module})")
    check(len(set(names)) == len(names), "report_to", names, "names a tracker twice")


def open_trackers(names: list[str], run: TrackedRun) -> list[Tracker]:
    """The trackers of ``report_to``, each with its run open (closing those already open if one fails)."""
    trackers: list[Tracker] = []
    try:
        for name in names:
            trackers.append(TRACKERS[name](run))
    except BaseException:
        for tracker in trackers:
            tracker.close()
        raise
    return trackers


def tracker_locations(names: list[str], out_dir: str | Path, project: str) -> dict[str, str]:
    """Where each tracker of ``report_to`` put the data of the run in ``out_dir`` (the run's final message)."""
    return {name: TRACKERS[name].where(Path(out_dir), project) for name in names}

"""Training checkpoints: a Hugging Face directory plus the trainer's state, written atomically.

    <out_dir>/checkpoints/update_000012/   config.json, generation_config.json, model.safetensors, tokenizer files,
                                           chat_template.jinja (transformers and vLLM load it as is),
                                           trainer_state.pt (optimizer, schedule, buffer, RNG, counters, extra),
                                           checkpoint.json (written last: update, time, contents)
    <out_dir>/checkpoints/latest           the name of the newest committed checkpoint
    <out_dir>/checkpoints/best             with ``keep_best``: the checkpoint of the best evaluation SR so far
                                           (``{"checkpoint": "update_000010", "update": 10, "SR": 41.7}``), kept
                                           beside the ``keep`` newest ones

A checkpoint is written into ``.tmp-update_000012-<pid>``, fsynced, renamed into place, and committed by atomically
replacing ``latest``; a kill at any moment leaves the previous checkpoint and the pointer intact, and the ``.tmp-``
leftovers are removed by the next save. Resuming loses at most the update in flight.

The loop logs an update's metrics before checkpointing it, and on resume calls :func:`truncate_metrics` with the
checkpoint's update before appending again, so ``metrics.jsonl`` continues the same series without duplicates.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import json
import os
import random
import re
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from actfirst.core.files import fsync_path
from actfirst.core.user_input import ConfigError
from actfirst.parallel.context import all_gather_objects, broadcast_object

_TMP = ".tmp-"
"""Prefix of everything written but not committed (removed by the next save)."""
_NAME = re.compile(r"update_(\d{6,})")
TRAINER_STATE = "trainer_state.pt"
BEST = "best"
"""The record of the best checkpoint by evaluation SR (``keep_best``), beside ``latest``."""
_SCALARS = (str, int, float, bool, type(None))
"""Exact types (numpy's float64 is a float, yet ``torch.load(weights_only=True)`` refuses it)."""


class CheckpointError(RuntimeError):
    """A checkpoint could not be written (unwritable directory, full disk); nothing earlier was changed."""


@contextlib.contextmanager
def checkpoint_transaction(out_dir: str | Path, *, update: int, keep: int = 1, keep_best: bool = False,
                           contents: dict[str, Any] | None = None) -> Iterator[Path]:
    """Write the checkpoint of ``update`` into the yielded directory; commit it when the block ends cleanly.

    The directory is ``<out_dir>/checkpoints/.tmp-update_<NNNNNN>-<pid>``. On a clean exit it is fsynced, completed
    by ``checkpoint.json`` (``contents`` added to it), renamed to ``update_<NNNNNN>`` and committed by atomically
    replacing ``latest``; the checkpoints beyond ``keep`` are then deleted (with ``keep_best``, not the one ``best``
    names; without it, ``best`` goes too). When the block raises, or a write
    fails, it is removed and :class:`CheckpointError` raised: the previous checkpoint and ``latest`` are untouched.

    With several ranks every rank enters (a collective): rank 0 makes the directory, every rank writes its parts
    into it, and rank 0 commits only when every rank's block succeeded; every rank then raises or returns alike.
    """
    if update < 0 or keep < 1:
        raise ValueError(f"update={update!r}, keep={keep!r}: need update >= 0 and keep >= 1")
    root = Path(out_dir) / "checkpoints"
    name = f"update_{update:06d}"
    if _read_pointer(root) == name:
        raise ValueError(f"update={update}: {root / name} is already the latest checkpoint")
    lead = not dist.is_initialized() or dist.get_rank() == 0
    tmp = Path(broadcast_object(str(root / f"{_TMP}{name}-{os.getpid()}")))
    _agree(update, root, tmp, _attempt(lambda: _make_tmp(root, tmp)) if lead else None)
    failure: BaseException | None = None
    try:
        yield tmp
    except Exception as e:  # OSError, and the Rust writers' errors (safetensors, tokenizers) on a full disk
        failure = e
    _agree(update, root, tmp, failure)
    _agree(update, root, tmp, _attempt(lambda: _commit(root, tmp, name, update, contents or {})) if lead else None)
    if lead:
        _prune(root, update, keep, spare=_read_best(root) if keep_best else None)


def _attempt(fn) -> BaseException | None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - reported by _agree
        return e
    return None


def _agree(update: int, root: Path, tmp: Path, failure: BaseException | None) -> None:
    """Raise :class:`CheckpointError` on every rank when any rank failed (rank 0 removes the temporary directory)."""
    cause = _os_error(failure) if failure is not None else None
    reports = all_gather_objects(None if cause is None else f"{type(cause).__name__}: {cause}")
    failed = [(rank, r) for rank, r in enumerate(reports) if r is not None]
    if not failed:
        return
    if not dist.is_initialized() or dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(OSError):
            (root / f"{_TMP}latest-{os.getpid()}").unlink(missing_ok=True)
    rank, report = failed[0]
    where = f" (rank {rank})" if len(reports) > 1 else ""
    raise CheckpointError(f"checkpoint of update {update} not written to {root}{where}: {report}; the previous "
                          f"checkpoint and {root / 'latest'} are unchanged") from failure


def _make_tmp(root: Path, tmp: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(root)
    tmp.mkdir()


def _commit(root: Path, tmp: Path, name: str, update: int, contents: dict[str, Any]) -> None:
    """fsync what the ranks wrote, write ``checkpoint.json``, move the directory into place, replace ``latest``."""
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    for path in files:
        fsync_path(path)
    for path in sorted((p for p in tmp.rglob("*") if p.is_dir()), reverse=True):
        fsync_path(path)
    _write_synced(tmp / "checkpoint.json", json.dumps({
        "update": update, "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "files": {str(p.relative_to(tmp)): p.stat().st_size for p in files}, **contents}, indent=1))
    fsync_path(tmp)
    pointer, final = root / f"{_TMP}latest-{os.getpid()}", root / name
    _write_synced(pointer, name + "\n")
    if final.exists():  # written by a run killed before it moved `latest`; not what `latest` names
        final.rename(root / f"{_TMP}old-{name}-{os.getpid()}")
    tmp.rename(final)
    os.replace(pointer, root / "latest")  # the commit
    fsync_path(root)


def save_checkpoint(out_dir: str | Path, *, update: int, model: Any, tokenizer: Any, trainer_state: dict[str, Any],
                    extra: dict[str, Any] | None = None, keep: int = 1) -> Path:
    """One process's checkpoint: ``<out_dir>/checkpoints/update_<NNNNNN>`` (the model as a Hugging Face directory,
    the tokenizer, ``trainer_state.pt``) written by :func:`checkpoint_transaction`; returns its path.

    ``trainer_state`` (counters, an optimizer's ``state_dict()``...) and ``extra`` must hold only dicts, lists,
    tuples, strings, numbers, None and tensors (checkpoints load with ``weights_only=True``); the python/numpy/torch
    RNG states are added under ``"rng"``. Raises :class:`CheckpointError` when the write fails.
    """
    if {"extra", "rng"} & trainer_state.keys() or trainer_state.get("update", update) != update:
        raise ValueError(f"trainer_state keys {sorted(trainer_state)}: 'extra' and 'rng' are set by save_checkpoint, "
                         f"and 'update' must equal update={update}")
    state = {**trainer_state, "update": update, "extra": dict(extra or {}), "rng": rng_state()}
    _check_plain(state, "trainer_state")
    with checkpoint_transaction(out_dir, update=update, keep=keep,
                                contents={"trainer_state": sorted(state), "extra": sorted(state["extra"])}) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)  # + config.json, generation_config.json
        tokenizer.save_pretrained(tmp)  # + chat_template.jinja
        save_plain(tmp / TRAINER_STATE, state)
    return Path(out_dir) / "checkpoints" / f"update_{update:06d}"


def save_plain(path: Path, state: dict[str, Any]) -> None:
    """``torch.save`` of plain data (see :func:`save_checkpoint`), through a file object: a failed write raises the
    OSError itself."""
    _check_plain(state, path.stem)
    with open(path, "wb") as f:
        torch.save(state, f)


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The checkpoint ``latest`` names; without a valid pointer the newest complete ``update_*`` (None if none)."""
    root = Path(out_dir) / "checkpoints"
    name = _read_pointer(root)
    if name is not None and (root / name / "checkpoint.json").is_file():
        return root / name
    complete = [p for _, p in _checkpoints(root) if (p / "checkpoint.json").is_file()]
    return complete[-1] if complete else None


NAMED = ("best", "latest")
"""The checkpoints a command takes by name: ``<out_dir>/checkpoints/best`` and ``.../latest`` name them."""


def named_checkpoint(path: str | Path, key: str) -> Path:
    """The checkpoint directory ``path`` stands for: ``<out_dir>/checkpoints/latest`` the newest committed one,
    ``<out_dir>/checkpoints/best`` the one of the best evaluation SR (``keep_best``); any other path as it is.
    ``ConfigError`` naming ``key`` when the run has no such checkpoint."""
    path = Path(path)
    if path.name not in NAMED or path.parent.name != "checkpoints":
        return path
    root = path.parent
    if path.name == "latest":
        found = latest_checkpoint(root.parent)
        if found is None:
            raise ConfigError(f"{key}={str(path)!r}: the run in {str(root.parent)!r} has no complete checkpoint")
        return found
    best = _read_best(root)
    if best is None:
        raise ConfigError(f"{key}={str(path)!r}: the run in {str(root.parent)!r} recorded no best checkpoint (it "
                          f"keeps one only with keep_best: true and evaluation.every > 0); take "
                          f"{root / 'latest'}, the last one")
    return root / best


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """The trainer state saved in checkpoint ``path`` (with ``update``, ``extra`` and ``rng``; see
    :func:`restore_rng`); the model and tokenizer load from ``path`` with ``from_pretrained``."""
    path = Path(path)
    if not (path / "checkpoint.json").is_file():
        raise CheckpointError(f"{path}: not a complete checkpoint (no checkpoint.json)")
    return torch.load(path / TRAINER_STATE, map_location="cpu", weights_only=True)


def restore_rng(state: dict[str, Any]) -> None:
    """Put back the python, numpy and torch (CPU, CUDA) RNG states saved with ``state``."""
    rng = state["rng"]
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = rng["numpy"]
    np.random.set_state((np_state["kind"], np.asarray(np_state["key"], dtype=np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["gauss"]))
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def truncate_metrics(path: str | Path, last_update: int) -> int:
    """Drop the records of ``path`` (metrics JSONL) with ``update > last_update`` and a cut last line (no newline),
    rewriting it atomically; returns the number of lines dropped (0: the file, if any, is unchanged)."""
    path = Path(path)
    if not path.exists():
        return 0
    *lines, cut = path.read_text().split("\n")  # cut is "" when the last record is complete
    kept = []
    for i, line in enumerate(lines, 1):
        try:
            record_update = json.loads(line)["update"]
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"{path}:{i}: not a metrics record with an update ({e}): {line[:80]!r}") from e
        if record_update <= last_update:
            kept.append(line + "\n")
    dropped = len(lines) - len(kept) + (cut != "")
    if dropped:
        tmp = path.with_name(f"{_TMP}{path.name}-{os.getpid()}")
        try:
            _write_synced(tmp, "".join(kept))
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        fsync_path(path.parent)
    return dropped


def _os_error(e: BaseException) -> BaseException:
    """The OSError behind ``e`` (torch.save raises a RuntimeError over it), else ``e``."""
    cause: BaseException | None = e
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    return cause or e


def rng_state() -> dict[str, Any]:
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    return {"python": random.getstate(),
            "numpy": {"kind": kind, "key": key.tolist(), "pos": pos, "has_gauss": has_gauss, "gauss": gauss},
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def _check_plain(value: Any, where: str) -> None:
    """Raise TypeError naming the first value that ``weights_only`` loading would refuse."""
    if type(value) in (dict, collections.OrderedDict):
        for k, v in value.items():
            if type(k) not in (str, int):
                raise TypeError(f"{where}: key {k!r} of type {type(k).__name__}; checkpoints take str or int keys")
            _check_plain(v, f"{where}[{k!r}]")
    elif type(value) in (list, tuple):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]")
    elif type(value) not in _SCALARS and not isinstance(value, (torch.Tensor, torch.Size, torch.dtype)):
        raise TypeError(f"{where}: {type(value).__name__} cannot be checkpointed; convert it to dicts, lists, "
                        "numbers, strings or tensors")


def _checkpoints(root: Path) -> list[tuple[int, Path]]:
    """The ``update_*`` directories of ``root`` with their updates, oldest first."""
    if not root.is_dir():
        return []
    return sorted((int(m[1]), p) for p in root.iterdir() if (m := _NAME.fullmatch(p.name)) and p.is_dir())


def _read_pointer(root: Path) -> str | None:
    try:
        name = (root / "latest").read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return name if _NAME.fullmatch(name) else None


def _prune(root: Path, update: int, keep: int, spare: str | None = None) -> None:
    """Delete the checkpoints other than ``update``, the ``keep - 1`` newest before it and ``spare`` (the best one, or
    None: then the ``best`` record goes too), renamed to ``.tmp-`` names first (a kill inside the deletion never
    leaves a half-deleted ``update_*``), and every other ``.tmp-`` entry."""
    others = [(u, p) for u, p in _checkpoints(root) if u != update]
    older = [p for u, p in others if u < update]
    kept = set(older[max(0, len(older) - keep + 1):]) | ({root / spare} if spare is not None else set())
    try:
        if spare is None:
            (root / BEST).unlink(missing_ok=True)
        for _, path in others:
            if path not in kept:
                path.rename(root / f"{_TMP}del-{path.name}-{os.getpid()}")
        _remove_leftovers(root)
    except OSError as e:  # the new checkpoint is committed; what is left behind is only disk space
        warnings.warn(f"could not delete old checkpoints in {root}: {e}", stacklevel=3)


def record_best(out_dir: str | Path, *, update: int, sr: float, keep: int) -> bool:
    """``keep_best``: after the evaluation of ``update`` (its SR ``sr``), make its checkpoint the ``best`` one when it
    has a checkpoint and its SR beats the recorded best's (of equal SRs the earlier stays); the checkpoint it replaces
    is deleted unless it is one of the ``keep`` newest. Returns whether ``best`` changed. The record is written
    atomically (a temporary file renamed over it)."""
    root = Path(out_dir) / "checkpoints"
    name = f"update_{update:06d}"
    best = _read_best(root)
    if not (root / name / "checkpoint.json").is_file() or (best is not None and _best_record(root)["SR"] >= sr):
        return False
    tmp = root / f"{_TMP}best-{os.getpid()}"
    _write_synced(tmp, json.dumps({"checkpoint": name, "update": update, "SR": sr}) + "\n")
    os.replace(tmp, root / BEST)
    fsync_path(root)
    latest = _read_pointer(root)
    if latest is not None:
        _prune(root, int(_NAME.fullmatch(latest)[1]), keep, spare=name)
    return True


def _best_record(root: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((root / BEST).read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None
    if not (isinstance(record, dict) and isinstance(record.get("checkpoint"), str)
            and _NAME.fullmatch(record["checkpoint"]) and isinstance(record.get("SR"), (int, float))):
        return None
    return record


def _read_best(root: Path) -> str | None:
    """The name of the checkpoint ``best`` names, while it is on disk (None otherwise)."""
    record = _best_record(root)
    return record["checkpoint"] if record is not None and (root / record["checkpoint"]).is_dir() else None


def _remove_leftovers(root: Path) -> None:
    """Remove what killed or failed saves left (``.tmp-*``)."""
    for path in root.iterdir():
        if path.name.startswith(_TMP):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


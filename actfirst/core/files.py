"""Files written so that a reader (or a resumed run) never sees half of one, and values JSON can hold."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any


def write_atomically(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to a temporary file beside ``path``, then rename it into place; returns the path."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a file or a directory (its entries: a rename into it) to disk."""
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def json_safe(value: Any) -> Any:
    """``value`` with every NaN and infinity, at any depth of dicts, lists and tuples, made None (JSON has neither:
    ``json.dumps`` would write ``NaN``, which strict readers refuse)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value

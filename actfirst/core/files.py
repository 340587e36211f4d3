"""Files written so that a reader (or a resumed run) never sees half of one."""

from __future__ import annotations

import os
from pathlib import Path


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

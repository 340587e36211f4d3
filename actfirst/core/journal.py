"""Append-only journals of finished work, one per rank, so that an interrupted job resumes without redoing it; and
the ETA its progress lines print.

::

    done = read_journals(out)                  # every rank's finished tasks, by key (any earlier number of ranks)
    with Journal(out, rank) as journal:        # this rank's file: <out>.partial (rank 0) or <out>.partial.<rank>
        journal.append(json.dumps({"task": key, ...}))    # written, flushed and fsynced as each task finishes
    ...                                        # once every task is done: write <out> atomically, then
    remove_journals(out)

A line is one finished task, a JSON object with a ``"task"`` key. A kill can cut the last line of a file: a reader
skips a line that does not parse, and the rank that appends next cuts it off first. A task may be in any rank's
file (a resume may run on another number of ranks); when two hold it, the last file read wins (both are finished).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import TracebackType


def journal_path(out: str | os.PathLike, rank: int) -> Path:
    """Rank ``rank``'s journal of the work that ends in ``out``."""
    return Path(f"{out}.partial") if rank == 0 else Path(f"{out}.partial.{rank}")


def journal_paths(out: str | os.PathLike) -> list[Path]:
    """The journals of ``out`` that exist, rank 0's first."""
    out = Path(out)
    ranks = [p for p in out.parent.glob(f"{out.name}.partial.*") if p.name.rsplit(".", 1)[1].isdigit()]
    first = [journal_path(out, 0)] if journal_path(out, 0).is_file() else []
    return first + sorted(ranks, key=lambda p: int(p.name.rsplit(".", 1)[1]))


def read_journals(out: str | os.PathLike) -> dict[str, str]:
    """Every finished task's line in the journals of ``out``, by its ``"task"``; lines that do not parse (a kill's
    cut) are skipped."""
    done: dict[str, str] = {}
    for path in journal_paths(out):
        for line in path.read_text().splitlines():
            try:
                done[json.loads(line)["task"]] = line
            except (json.JSONDecodeError, KeyError, TypeError):
                pass
    return done


def remove_journals(out: str | os.PathLike) -> None:
    """Delete the journals of ``out`` (once ``out`` holds their work)."""
    for path in journal_paths(out):
        path.unlink(missing_ok=True)


def format_eta(seconds: float) -> str:
    """A remaining time as ``1h02m``, ``3m10s`` or ``12s``."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class Journal:
    """Rank ``rank``'s journal of ``out``, open for appending (a cut last line is removed first)."""

    def __init__(self, out: str | os.PathLike, rank: int) -> None:
        self.path = journal_path(out, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _cut_torn_tail(self.path)
        self._file = self.path.open("a")

    def append(self, line: str) -> None:
        """Write one finished task's line and make it durable before returning."""
        if "\n" in line:
            raise ValueError("a journal line must not hold a newline")
        self._file.write(line + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


def _cut_torn_tail(path: Path) -> None:
    """Truncate ``path`` after its last complete line (a kill during a write leaves a partial one)."""
    if not path.is_file():
        return
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with path.open("r+b") as f:
            f.truncate(end)

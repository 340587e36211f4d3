"""Where log lines go: ActFirst's own (:func:`setup_logging`) and vLLM's (:func:`route_vllm_logs`).

Library modules log through ``logging.getLogger(__name__)``; commands print their results. Every command calls
:func:`setup_logging` at its start (``actfirst.core.user_input.command`` does), and a command that runs in a run's
output directory calls it again with the directory's ``logs/``:

- the console: rank 0 shows INFO and up, every other rank WARNING and up; INFO on stdout and WARNING and up on
  stderr, as the prints they replace were. A line is written through ``tqdm.write``, so that a progress bar on the
  console (the trainer's ``updates`` bar, whose ``\\r`` line holds the ETA) is cleared, the line written, and the bar
  drawn again below it;
- every rank's file, ``<log_dir>/actfirst_rank<rank>.log`` (appended; the launching process writes rank 0's),
  with time, level and logger: INFO and up of ``actfirst``, WARNING and up of the other libraries. It is created at
  its first line, so that a command refused before it logs anything leaves no directory behind.

The handlers sit on the root logger (a library's later ``logging.basicConfig`` then adds none); only the ``actfirst``
logger is lowered to INFO, so the other libraries keep their own levels.

vLLM logs every engine start, weight reload and prefix-cache reset at INFO or WARNING; a training run does all of
those every update, so its console would be mostly vLLM. vLLM is therefore told not to configure its logging
(``VLLM_CONFIGURE_LOGGING=0``, set before vLLM is imported) and :func:`route_vllm_logs` gives its ``vllm`` logger
a file of everything from INFO up and a console handler from a level the user chooses.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from tqdm import tqdm

LEVELS = ("debug", "info", "warning", "error", "off")
"""Console levels for vLLM's lines (``off``: none; the file still gets them)."""

os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")

PACKAGE = "actfirst"
"""The logger every library module's logger descends from."""

FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_handlers: list[logging.Handler] = []
"""What :func:`setup_logging` put on the root logger (replaced by its next call)."""


class ConsoleHandler(logging.Handler):
    """INFO and below to stdout, WARNING and up to stderr (the streams of the moment: a test's capture included),
    through ``tqdm.write`` so that a progress bar shares the console (see the module docstring)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
            tqdm.write(self.format(record), file=stream)
            stream.flush()
        except Exception:  # logging's contract: a failed emit is reported, never raised
            self.handleError(record)


class ConsoleFormatter(logging.Formatter):
    """ActFirst's lines as their message (they name their stage: ``[prepare] ...``); another library's with its
    level and logger's name."""

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        if record.name == PACKAGE or record.name.startswith(PACKAGE + "."):
            return message
        return f"{record.levelname} {record.name}: {message}"


class RankFileHandler(logging.FileHandler):
    """A rank's log file, opened (and its directory made) at its first line."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, mode="a", delay=True)

    def emit(self, record: logging.LogRecord) -> None:
        if self.stream is None:  # the first line: the directory may not exist yet
            Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        super().emit(record)


def run_log_dir(out_dir: str | Path) -> Path:
    """Where a training run's log files go: ``<out_dir>/logs`` (beside vLLM's)."""
    return Path(out_dir) / "logs"


def log_file(log_dir: str | Path, rank: int) -> Path:
    """Rank ``rank``'s log file in ``log_dir``."""
    return Path(log_dir) / f"actfirst_rank{rank}.log"


def setup_logging(log_dir: str | Path | None = None, *, rank: int | None = None) -> None:
    """Send log records to the console and (with ``log_dir``) to this rank's file, as the module docstring says;
    ``rank``: this process's (None: torchrun's ``RANK``, 0 without one). Replaces what an earlier call set."""
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    root = logging.getLogger()
    for handler in _handlers:
        root.removeHandler(handler)
        handler.close()
    _handlers.clear()
    console = ConsoleHandler(logging.INFO if rank == 0 else logging.WARNING)
    console.setFormatter(ConsoleFormatter())
    _handlers.append(console)
    if log_dir is not None:
        file = RankFileHandler(log_file(log_dir, rank))
        file.setFormatter(logging.Formatter(FILE_FORMAT))
        _handlers.append(file)
    for handler in _handlers:
        root.addHandler(handler)
    logging.getLogger(PACKAGE).setLevel(logging.INFO)


def current_log_dir() -> Path | None:
    """The ``log_dir`` of the last :func:`setup_logging` (for a spawned child: ``setup_logging`` as its
    initializer with this)."""
    files = [h for h in _handlers if isinstance(h, RankFileHandler)]
    return Path(files[0].baseFilename).parent if files else None


def route_vllm_logs(path: str | Path | None, console_level: str = "warning") -> None:
    """Send vLLM's log records to ``path`` (INFO and up, appended; None: no file) and to stderr from
    ``console_level`` up; replaces what an earlier call set."""
    if console_level not in LEVELS:
        raise ValueError(f"console_level={console_level!r}: must be one of {list(LEVELS)}")
    logger = logging.getLogger("vllm")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    logger.setLevel(logging.DEBUG if console_level == "debug" else logging.INFO)
    logger.propagate = False
    fmt = logging.Formatter("%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s", "%m-%d %H:%M:%S")
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        file_handler = logging.FileHandler(path)
        file_handler.setFormatter(fmt)
        logger.addHandler(file_handler)
    if console_level != "off":
        console = logging.StreamHandler(sys.stderr)
        console.setLevel(getattr(logging, console_level.upper()))
        console.setFormatter(fmt)
        logger.addHandler(console)


def vllm_logs_routed() -> bool:
    """Whether :func:`route_vllm_logs` has set vLLM's handlers."""
    return bool(logging.getLogger("vllm").handlers)

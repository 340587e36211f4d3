"""Where vLLM's own log lines go.

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

LEVELS = ("debug", "info", "warning", "error", "off")
"""Console levels for vLLM's lines (``off``: none; the file still gets them)."""

os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")


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

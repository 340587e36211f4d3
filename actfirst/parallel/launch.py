"""Start every rank of a one-node job through PyTorch's elastic launcher, the machinery behind torchrun.

``python -m actfirst.run`` without torchrun's environment calls :func:`launch_ranks`, which runs the same command
once per rank under a local elastic agent (a c10d rendezvous on a free loopback port, no restarts): each rank then
sees exactly what torchrun would give it. Under torchrun (one node or several) this module is not used.

When a rank fails (an exception, or a kill), the agent stops the others within its monitor interval and reports
every failure; :func:`describe_failure` turns that report into one line naming the rank and its error.
"""

from __future__ import annotations

import logging
import signal
import sys
import uuid
from typing import Any

logger = logging.getLogger(__name__)

PEER_STOPPED_EXIT = 3
"""Exit status of a rank that stopped because another rank failed (``actfirst.parallel.watchdog``): never the
cause of a failure."""


def default_nproc() -> int:
    """Ranks per node when the user gives none: one per visible GPU; one on a CPU."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 1


TRAINING_ADVICE = "continue from the last checkpoint with --resume"
"""What the failure line of a training run's ranks tells the user to do."""


def launch_ranks(nproc: int, command: list[str], *, monitor_interval_s: float = 0.5,
                 advice: str = TRAINING_ADVICE) -> int:
    """Run ``python <command>`` (``["-m", "actfirst.run", ...]`` or a script and its arguments) as ``nproc`` ranks
    of one node; returns 0, or 1 after printing which rank failed and why, and ``advice`` (130 on Ctrl-C)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if nproc < 1:
        raise ValueError(f"--nproc-per-node={nproc}: must be >= 1")
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                          monitor_interval=monitor_interval_s, start_method="spawn")
    try:
        elastic_launch(config, sys.executable)(*command)
    except ChildFailedError as error:
        logger.error(describe_failure(error.failures, advice))
        return 1
    except SignalException as error:
        logger.error(f"[launch] stopped by {error.sigval.name}: every rank was stopped")
        return 130
    return 0


def describe_failure(failures: dict[int, Any], advice: str = TRAINING_ADVICE) -> str:
    """One line per failed rank, the cause first: a rank that raised (its exception) or was killed (its signal),
    before the ranks that stopped because of it; then ``advice``."""
    def order(item: tuple[int, Any]) -> tuple[int, int, int]:
        rank, failure = item  # the agent stops the others with SIGTERM; the watchdog's exits come after
        consequence = {-signal.SIGTERM: 1, PEER_STOPPED_EXIT: 2}.get(failure.exitcode, 0)
        return consequence, failure.timestamp, rank

    lines = []
    for rank, failure in sorted(failures.items(), key=order):
        lines.append(f"rank {rank} (pid {failure.pid}) {_what(failure)}")
    cause = lines[0]
    more = f"; then {'; '.join(lines[1:])}" if len(lines) > 1 else ""
    return f"[launch] {cause}{more}. Every rank was stopped; {advice}."


def _what(failure: Any) -> str:
    if failure.exitcode < 0:
        return f"was killed by signal {-failure.exitcode} ({failure.signal_name()})"
    if failure.exitcode == PEER_STOPPED_EXIT:
        return "stopped because another rank failed"
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    if message and not str(message).startswith("To enable traceback"):
        return f"failed: {message}"
    return f"exited with status {failure.exitcode}"

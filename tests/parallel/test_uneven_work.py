"""Ranks whose share of uneven work (an evaluation's episodes) ends far apart: the gather after it outlasts the
process group's timeout unless every rank first waits for the others with ``wait_for_ranks`` (2 gloo ranks on the
CPU, the group's timeout cut to 3 s and the slower rank 6 s behind)."""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
from train_helpers import spawn_ranks

GROUP_TIMEOUT_S, BEHIND_S = 3.0, 6.0


def gather_after_uneven_work() -> list:
    """One rank: join a group whose timeout is GROUP_TIMEOUT_S; twice, work BEHIND_S longer on rank 1 and gather
    every rank's result, the first time after ``wait_for_ranks``, the second time without (last: a timed-out gloo
    group is not used again). Returns each gather's results or its error."""
    from actfirst.parallel.context import all_gather_objects, init_parallel, wait_for_ranks

    ctx = init_parallel(timeout_s=GROUP_TIMEOUT_S)
    out = []
    for wait in (True, False):
        time.sleep(BEHIND_S if ctx.rank == 1 else 0.0)
        try:
            if wait:
                wait_for_ranks()
            out.append(all_gather_objects(f"report of rank {ctx.rank}"))
        except RuntimeError as error:
            out.append(f"{type(error).__name__}: {error}")
    return out


def test_the_gather_after_uneven_work_waits_for_every_rank():
    (waited, unguarded), (waited_1, _) = spawn_ranks(gather_after_uneven_work, 2, timeout=120)
    assert waited == waited_1 == ["report of rank 0", "report of rank 1"]
    assert "timed out" in str(unguarded).lower(), unguarded  # rank 0 gave up on the slower rank

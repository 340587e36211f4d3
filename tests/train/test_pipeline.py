"""The pipeline's pieces without an engine: the size of the rollout batches collected ahead, and the CPU split (the
loop through them, serial against async: tests/train/test_loop.py)."""

import os
import threading

import pytest
import torch

from actfirst.train.pipeline import SampleYield, set_torch_threads, update_threads


def test_the_batch_collected_ahead_is_sized_to_what_the_update_lacks():
    """Tasks expected to give ``need`` samples at the latest batches' samples per episode, rounded up (a batch that
    falls short is followed by another), between 1 and the rollout batch's tasks; the whole batch before any is
    known; the window survives a checkpoint."""
    sizes = SampleYield()
    assert sizes.per_episode() is None and sizes.tasks_for(5, most=16) == 16
    sizes.add(episodes=4, samples=0)  # every episode failed: nothing known yet
    assert sizes.tasks_for(5, most=16) == 16
    sizes.add(episodes=4, samples=24)  # 3 samples per episode over the window
    assert sizes.per_episode() == 3.0
    assert [sizes.tasks_for(n, most=16) for n in (1, 3, 4, 48, 100)] == [1, 1, 2, 16, 16]
    with pytest.raises(ValueError, match="need=0"):
        sizes.tasks_for(0, most=16)
    for _ in range(20):  # only the latest batches count
        sizes.add(episodes=2, samples=20)
    assert sizes.per_episode() == 10.0 and sizes.tasks_for(48, most=16) == 5
    restored = SampleYield()
    restored.load_state_dict(sizes.state_dict())
    assert restored.per_episode() == 10.0 and len(restored.window) == len(sizes.window)


def test_the_update_gets_the_cores_the_engine_does_not_use():
    cores = len(os.sched_getaffinity(0))
    assert update_threads(3, engine_threads=1, ranks_here=1) == 3  # parallel.cpu_update_threads
    assert update_threads(None, engine_threads=1, ranks_here=1) == max(1, cores - 1)
    assert update_threads(None, engine_threads=cores, ranks_here=1) == 1
    assert update_threads(None, engine_threads=0, ranks_here=2) == max(1, cores // 2)


def test_the_update_threads_are_its_own():
    """Setting the update's threads in its thread leaves the calling thread's (the engine's) as they were."""
    before = torch.get_num_threads()
    seen = []
    worker = threading.Thread(target=lambda: seen.append(set_torch_threads(before + 1)))
    worker.start()
    worker.join()
    assert seen == [before + 1] and torch.get_num_threads() == before

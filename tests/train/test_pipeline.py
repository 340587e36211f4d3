"""The pipeline's pieces without an engine: the policies by name, a checkpoint's state, the size of the rollout
batches collected ahead, and the CPU split (the loop through them, serial against async and inflight:
tests/train/test_loop.py)."""

import asyncio
import os
import threading
import typing

import pytest
import torch

from actfirst.core.config import TrainConfig
from actfirst.core.schema import load_config, paths_unchecked
from actfirst.parallel.context import init_parallel
from actfirst.train.clock import RunClock
from actfirst.train.pipeline import (
    AsyncPipeline,
    InflightPipeline,
    PipelineKind,
    SampleYield,
    SerialPipeline,
    create_pipeline,
)
from actfirst.train.update_record import UpdateRecords
from actfirst.train.update_thread import UpdateThread, cpu_split, set_torch_threads, update_threads

TASKS = [f"task{i}" for i in range(5)]


def make(name: str, **changes):
    overrides = ["benchmark=alfworld", "student.model=s", "teacher=t", "rollout.strategy=vanilla",
                 f"pipeline={name}", *[f"{k}={v}" for k, v in changes.items()]]
    with paths_unchecked():
        cfg = load_config(TrainConfig, None, overrides)
    records = UpdateRecords(clock=RunClock(), ctx=init_parallel(), b_max=8, pipeline=name, uopd=False)
    return create_pipeline(cfg.pipeline, cfg, rank=0, world_size=1, tasks=TASKS, task_key=str, clock=RunClock(),
                           records=records, on_batch=lambda batch: None)


def test_the_pipelines_by_name():
    """``pipeline:`` names a class (every value the config allows); another name is refused, naming the known."""
    allowed = typing.get_args(typing.get_type_hints(TrainConfig)["pipeline"])
    assert {k.value for k in PipelineKind} == set(allowed)
    made = {name: make(name) for name in allowed}
    assert {name: type(p) for name, p in made.items()} == {
        "serial": SerialPipeline, "async": AsyncPipeline, "inflight": InflightPipeline}
    assert [p.keeps_in_flight for p in made.values()] == [False, False, True]
    assert [p.collects_ahead(1) for p in made.values()] == [False, True, True]
    assert not made["async"].collects_ahead(made["async"].cfg.num_updates)  # nothing after the last
    assert made["serial"].tasks_for(1) == made["serial"].batch_tasks == 16
    with pytest.raises(ValueError, match=r"^pipeline='overlap': not one of \['serial', 'async', 'inflight'\]$"):
        create_pipeline("overlap", made["serial"].cfg)


def test_collection_whole_or_sized_under_every_pipeline():
    """``collection:`` unset: serial's rollout batches whole, async's and inflight's sized to what the update lacks
    (at the latest batches' samples per episode); ``whole_batch`` or ``sized`` given: so under every pipeline;
    ``batch: rollout`` (003's step) always whole."""
    for name in ("serial", "async", "inflight"):
        for collection in (None, "whole_batch", "sized"):
            pipeline = make(name, **({} if collection is None else {"collection": collection}))
            assert pipeline.tasks_for(6) == 16  # nothing known yet: a whole batch either way
            pipeline.sample_yield.add(episodes=4, samples=12)  # 3 samples per episode
            whole = collection == "whole_batch" or (collection is None and name == "serial")
            assert pipeline.whole_batches is whole
            assert [pipeline.tasks_for(n) for n in (1, 6, 7, 100)] == ([16] * 4 if whole else [1, 2, 3, 16]), name
    rollout = make("async", collection="sized", batch="rollout")
    rollout.sample_yield.add(episodes=4, samples=12)
    assert rollout.tasks_for(1) == 16
    with pytest.raises(ValueError, match=r"collection='whole': must be one of \['sized', 'whole_batch'\]"):
        make("async", collection="whole")


def test_a_checkpoint_of_the_earlier_trainer_loads():
    """A rank state as the trainer before the pipeline classes wrote it (its keys unchanged: ``buffer``,
    ``tasks``, ``batch_index``, ``sample_yield``; an older one without ``sample_yield``) continues the stream."""
    saved = make("async", batch_samples=4)
    saved.stream.next(3)
    saved.sample_yield.add(2, 6)
    saved.batch_index = 7
    state = {**saved.state_dict(), "probe_contexts": [], "recent": [], "rng": {}}
    assert sorted(saved.state_dict()) == ["batch_index", "buffer", "sample_yield", "tasks"]
    for older in (state, {k: v for k, v in state.items() if k != "sample_yield"}):
        resumed = make("async", batch_samples=4)
        resumed.load_state_dict(older)
        assert resumed.batch_index == 7 and resumed.stream.next(4) == saved.stream.next(4)
        saved.stream.load_state_dict(state["tasks"], str)  # (the same tasks again for the next round)
        assert resumed.sample_yield.per_episode() == (3.0 if "sample_yield" in older else None)


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


@pytest.mark.parametrize(("cores", "ranks", "setting", "want", "threads"), [
    (2, 1, None, ((0,), (1,), (0,)), 1),  # this machine's shape: the workers share the engine's core
    (8, 1, None, ((0,), (1, 2, 3, 4), (5, 6, 7)), 4),  # half of what the engine leaves, rounded up
    (8, 1, 2, ((0,), (1, 2), (3, 4, 5, 6, 7)), 2),  # parallel.cpu_update_threads
    (8, 2, None, ((4,), (5, 6), (7,)), 2),  # local rank 1 of 2: cores 4-7
    (5, 1, 9, ((0,), (1, 2, 3, 4), (0,)), 4),  # more asked than there are
    (2, 2, None, ((1,), (1,), (1,)), 1),  # one core per rank: every side on it
])
def test_pinned_cores_are_dealt_out_engine_update_workers(monkeypatch, cores, ranks, setting, want, threads):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    split = cpu_split(setting, pin=True, engine_threads=1, local_rank=ranks - 1, ranks_here=ranks)
    assert (split.engine_cores, split.trainer_cores, split.worker_cores) == want
    assert split.update_threads == threads
    assert "cores: engine " in split.describe()
    shared = cpu_split(setting, pin=False, engine_threads=1, local_rank=0, ranks_here=ranks)
    assert shared.engine_cores is None and shared.update_threads == update_threads(setting, engine_threads=1,
                                                                                  ranks_here=ranks)


def test_the_update_thread_runs_on_its_cores():
    """Pinned, the update thread (and the OpenMP threads it starts) run on the trainer's cores, the caller's
    cores untouched."""
    mine = os.sched_getaffinity(0)
    core = max(mine)
    thread = UpdateThread(cores=(core,))
    before = set(os.listdir("/proc/self/task"))

    def work():
        set_torch_threads(2)
        a = torch.randn(512, 512)
        (a @ a).sum()  # a parallel region: its OpenMP thread starts now
        started = set(os.listdir("/proc/self/task")) - before
        return os.sched_getaffinity(0), {int(t): os.sched_getaffinity(int(t)) for t in started}

    try:
        seen, started = asyncio.run(thread.run(work))
    finally:
        assert thread.close(10)
    assert seen == {core} and os.sched_getaffinity(0) == mine
    assert len(started) >= 2 and all(cores == {core} for cores in started.values()), started  # it and its OpenMP's


def test_the_update_threads_are_its_own():
    """Setting the update's threads in its thread leaves the calling thread's (the engine's) as they were."""
    before = torch.get_num_threads()
    seen = []
    worker = threading.Thread(target=lambda: seen.append(set_torch_threads(before + 1)))
    worker.start()
    worker.join()
    assert seen == [before + 1] and torch.get_num_threads() == before

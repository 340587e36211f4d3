"""Shared builders for the train tests."""

import contextlib
from pathlib import Path

import torch

from actfirst.rollout.sample import Sample


def random_samples(gen: torch.Generator, num: int, vocab: int, *, max_context: int = 24, max_response: int = 12,
                   version: int = 0, scored: bool = True) -> list[Sample]:
    """Samples of random lengths and ids, some inserted (masked) tokens, log-probs in a plausible range."""
    out = []
    for i in range(num):
        c = int(torch.randint(1, max_context + 1, (), generator=gen))
        r = int(torch.randint(1, max_response + 1, (), generator=gen))
        mask = (torch.rand(r, generator=gen) > 0.2).long()
        old = (-torch.rand(r, generator=gen) * 6) * mask
        teacher = old + torch.randn(r, generator=gen) * 0.5
        out.append(Sample(context_ids=torch.randint(0, vocab, (c,), generator=gen).tolist(),
                          response_ids=torch.randint(0, vocab, (r,), generator=gen).tolist(),
                          loss_mask=mask.tolist(), logprobs=old.tolist(), weight_version=version, task=f"t{i}",
                          turn=i, strategy="actfirst", teacher_logprobs=teacher.tolist() if scored else None))
    return out


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(fn, world_size: int, *args, timeout: float = 300.0, ranks_per_node: int | None = None) -> list:
    """Run ``fn(*args)`` in ``world_size`` spawned processes with torchrun's environment (one rank each, over gloo
    on the loopback interface; ``ranks_per_node``: as if on nodes of that many ranks, default one node); returns each
    rank's return value in rank order. A rank's exception fails the call with its traceback."""
    import io

    procs, results = start_ranks(fn, world_size, *args, ranks_per_node=ranks_per_node)
    out: dict[int, object] = {}
    try:
        for _ in procs:
            rank, ok, value = results.get(timeout=timeout)
            if not ok:
                raise AssertionError(f"rank {rank} failed:\n{value}")
            out[rank] = torch.load(io.BytesIO(value), weights_only=False)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert not [p.exitcode for p in procs if p.exitcode], [p.exitcode for p in procs]
    return [out[r] for r in range(world_size)]


def start_ranks(fn, world_size: int, *args, ranks_per_node: int | None = None) -> tuple[list, object]:
    """The started processes of :func:`spawn_ranks` and the queue their results arrive on."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    per_node = ranks_per_node or world_size
    env = {"WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(per_node), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    procs = [ctx.Process(target=_rank_entry, args=(fn, rank, {**env, "RANK": str(rank),
                                                              "LOCAL_RANK": str(rank % per_node)}, args, results))
             for rank in range(world_size)]
    for p in procs:
        p.start()
    return procs, results


def _rank_entry(fn, rank: int, env: dict, args: tuple, results) -> None:
    import io
    import os
    import traceback

    os.environ.update(env)
    try:
        buffer = io.BytesIO()  # bytes, not tensors: a queued tensor lives in memory this process takes with it
        torch.save(fn(*args), buffer)
        results.put((rank, True, buffer.getvalue()))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, False, traceback.format_exc()))


DEMO = Path(__file__).parents[2] / "configs" / "demo" / "scienceworld_lifespan.yaml"


@contextlib.contextmanager
def demo_references(tasks: int):
    """The demo config's benchmark, its shipped references, the first ``tasks`` training tasks that have one, and a
    one-worker pool of the real simulator (closed on exit)."""
    from actfirst.core.config import TrainConfig
    from actfirst.core.schema import load_config
    from actfirst.envs.benchmarks import get_benchmark
    from actfirst.envs.workers import EnvPool
    from actfirst.preparation.reference_cache import load_references

    cfg = load_config(TrainConfig, DEMO)
    benchmark = get_benchmark(cfg.benchmark, cfg.env)
    references = load_references(cfg.references, benchmark=benchmark)
    found = [t for t in cfg.training_tasks(benchmark) if benchmark.task_key(t) in references][:tasks]
    with EnvPool(benchmark.env_spec(), size=1) as pool:
        yield benchmark, references, found, pool

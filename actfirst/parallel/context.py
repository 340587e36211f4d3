"""The process group every rank joins, and the few collectives the trainer needs.

A rank is one process: on a GPU node one per GPU (``cuda:<local rank>``), on a CPU one per process. Launched by
torchrun, or by ``python -m actfirst.run`` through the same elastic launcher (``actfirst.parallel.launch``), a rank
reads torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``); started any
other way it is a world of one. The backend is gloo on the CPU and NCCL on GPUs; the small collectives below
(metrics, Python objects) run on the CPU over a gloo group of the same ranks.

vLLM's in-process engine joins this world rather than making its own: with several ranks it runs under vLLM's
``external_launcher`` executor, tensor parallel 1, so every rank's engine generates on its own.

The device mesh FSDP2 shards over (``parallel.mesh``): ``flat``, one dimension of every rank (``("shard",)``); or
``hybrid``, two dimensions ``("replicate", "shard")``: the ranks of a node shard the model among themselves and each
node holds a replica, so the all-gathers and reduce-scatters stay inside a node and only the gradient all-reduce
between replicas crosses nodes (FSDP2's HSDP). ``auto`` is hybrid when the job spans more than one node
(``WORLD_SIZE > LOCAL_WORLD_SIZE``), else flat.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
from typing import Any, Literal, get_args

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from actfirst.core.user_input import ConfigError

_CPU_GROUP: Any = None
"""The gloo group of every rank that the helpers below use (None: the default group, gloo already)."""

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
"""What torchrun (and the elastic launcher behind ``python -m actfirst.run``) sets for every rank."""

MeshKind = Literal["auto", "flat", "hybrid"]
"""The values of ``parallel.mesh`` (see the module docstring; ``ParallelConfig.mesh`` spells the same ones, without
importing torch)."""
MESHES = get_args(MeshKind)
SHARD_DIM, REPLICATE_DIM = "shard", "replicate"
"""The mesh's dimension names: FSDP2 shards over ``shard`` (a node's ranks); ``replicate`` (hybrid only) pairs the
same shard on every node."""


def launched_as_rank() -> bool:
    """Whether this process is one rank of a launched job (torchrun's environment is set)."""
    return all(name in os.environ for name in TORCHRUN_VARS)


@dataclasses.dataclass(frozen=True, slots=True)
class ParallelContext:
    """This rank's place in the job."""

    rank: int
    world_size: int
    device: torch.device
    """This rank's device: ``cuda:<LOCAL_RANK>`` on GPUs."""
    mesh: DeviceMesh
    """The mesh FSDP2 shards over: 1-D ``("shard",)`` of every rank, or 2-D ``("replicate", "shard")`` of nodes x
    ranks per node (``parallel.mesh``)."""

    @property
    def lead(self) -> bool:
        """Rank 0 writes the metrics, evaluations, plots and the Hugging Face checkpoint."""
        return self.rank == 0


UNEVEN_WAIT_S = 30 * 24 * 3600.0
"""How long :func:`wait_for_ranks` waits for the other ranks: without a limit in practice. A peer that died is found by
the peer watch (``actfirst.parallel.watchdog``: it stops this process naming that peer within its timeout), so the
only wait left is for ranks that are still working; the process group's own timeout (``init_parallel``'s 30
minutes) stays for every other collective, where a wait that long means a hang."""


def init_parallel(timeout_s: float = 1800.0, mesh: MeshKind = "auto") -> ParallelContext:
    """Join the job's process group (torchrun's environment) or make a world of one; returns this rank's context,
    its device mesh of the shape ``mesh`` names (``parallel.mesh``: one of :data:`MESHES`).

    A world of one reuses a process group that already exists in this process (vLLM makes one when an engine starts
    before training, as preparation does)."""
    cuda = torch.cuda.is_available()
    if launched_as_rank():
        rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))  # torchrun's --nproc-per-node
    else:
        rank, world, local, per_node = 0, 1, 0, 1
    shape = mesh_shape(mesh, rank=rank, world=world, local=local, per_node=per_node)  # refused before joining
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    global _CPU_GROUP
    if not dist.is_initialized():
        backend = "nccl" if cuda else "gloo"
        timeout = datetime.timedelta(seconds=timeout_s)
        if launched_as_rank():
            dist.init_process_group(backend, timeout=timeout)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    elif dist.get_world_size() != world:
        raise RuntimeError(f"a process group of {dist.get_world_size()} ranks exists already; this rank expects "
                           f"WORLD_SIZE={world}")
    if dist.get_backend() != "gloo":
        _CPU_GROUP = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    names = (REPLICATE_DIM, SHARD_DIM) if len(shape) == 2 else (SHARD_DIM,)
    device_mesh = init_device_mesh(device.type, shape, mesh_dim_names=names)
    return ParallelContext(rank=rank, world_size=world, device=device, mesh=device_mesh)


def mesh_shape(mesh: MeshKind, *, rank: int, world: int, local: int, per_node: int) -> tuple[int, ...]:
    """The device mesh's shape for ``parallel.mesh=mesh`` on this rank (global ``rank`` of ``world``, ``local`` of
    ``per_node`` ranks on its node): ``(world,)`` flat, ``(nodes, per_node)`` hybrid. Hybrid needs every node to
    hold ``per_node`` consecutive ranks (torchrun's numbering with one ``--nproc-per-node``); a ConfigError says
    which condition failed."""
    if mesh not in MESHES:
        raise ConfigError(f"parallel.mesh={mesh!r}: must be one of {list(MESHES)}")
    if mesh == "flat" or (mesh == "auto" and world <= per_node):
        return (world,)
    if per_node < 1 or world % per_node or rank % per_node != local:
        raise ConfigError(f"parallel.mesh={mesh!r}: a hybrid mesh needs the same number of ranks on every node, "
                          f"numbered node by node; this rank is RANK={rank} LOCAL_RANK={local} of WORLD_SIZE={world} "
                          f"with LOCAL_WORLD_SIZE={per_node} (set parallel.mesh=flat)")
    return (world // per_node, per_node)


def shutdown_parallel() -> None:
    """Leave the process group (vLLM may have torn parts of it down already at engine shutdown)."""
    global _CPU_GROUP
    _CPU_GROUP = None
    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def wait_for_ranks() -> None:
    """Wait on the host until every rank reaches this call, however long the others take (:data:`UNEVEN_WAIT_S`):
    call it after work whose length differs between ranks by more than the process group's timeout allows (an
    evaluation's share of the episodes), before the collective that gathers its results."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.monitored_barrier(group=_CPU_GROUP, timeout=datetime.timedelta(seconds=UNEVEN_WAIT_S))


def reduce_sum(values: list[float]) -> list[float]:
    """Element-wise sums over ranks (float64 on the CPU: exact for counts below 2**53)."""
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=_CPU_GROUP)
    return t.tolist()


def reduce_max(values: list[float]) -> list[float]:
    """Element-wise maxima over ranks."""
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=_CPU_GROUP)
    return t.tolist()


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=_CPU_GROUP)
    return out


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_CPU_GROUP)
    return box[0]

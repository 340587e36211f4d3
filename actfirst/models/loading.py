"""Models built on the meta device and filled from their safetensors files: no rank ever holds a whole copy it does
not keep.

``from_pretrained`` on every rank before FSDP2 sharding puts a whole float32 student (16 GB for a 4B model) in every
rank's host memory at once. Here a model is loaded in three steps, torchtitan's order:

1. :func:`empty_model`: the architecture of the directory's ``config.json``, built on the meta device (no memory);
2. the caller shards it (``actfirst.parallel.fsdp.apply_fsdp``; activation checkpointing, if any, before that), or
   not (a replicated teacher);
3. :func:`load_weights`: ``to_empty`` on the rank's device, then every parameter (and persistent buffer) filled
   from the safetensors files, reading only the rows of this rank's shard (``safe_open(...).get_slice``), cast to
   the model's dtype on the way (float32 master weights from a bfloat16 checkpoint); the non-persistent buffers,
   which no checkpoint holds (rotary ``inv_freq``), computed again as ``from_pretrained`` does.

Tied parameters (Qwen3's small models tie ``lm_head`` to ``embed_tokens``) are one parameter built tied on the meta
device, sharded once and filled once, under whichever of their names the checkpoint holds.
"""

from __future__ import annotations

import json
import resource
import sys
from collections import defaultdict
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PreTrainedModel

SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_FILE = "model.safetensors"


class WeightsError(ValueError):
    """A model directory whose safetensors files do not hold what its config's architecture needs."""


def empty_model(model_dir: str | Path, dtype: torch.dtype, **config_kwargs) -> PreTrainedModel:
    """The causal LM of ``model_dir``'s config on the meta device, parameters in ``dtype`` (tied weights tied), in
    eval mode as ``from_pretrained`` returns it, with the directory's generation config; ``config_kwargs`` go to
    ``from_config`` (e.g. ``attn_implementation``)."""
    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, **config_kwargs)
    if (Path(model_dir) / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(str(model_dir))
    return model.eval()


def load_weights(model: PreTrainedModel, model_dir: str | Path, device: torch.device) -> None:
    """Materialize ``model`` (from :func:`empty_model`, sharded or not) on ``device`` and fill it from
    ``model_dir``'s safetensors files: a sharded (DTensor) parameter gets only this rank's slice, read alone from
    the file. Raises :class:`WeightsError` naming a parameter the files lack."""
    tied = _tied_names(model)
    model.to_empty(device=device)  # (may untie a parameter that is not a DTensor: tied again below)
    for alias, name in tied.items():
        owner, _, attr = alias.rpartition(".")
        setattr(model.get_submodule(owner), attr, model.get_parameter(name))
    _init_non_persistent_buffers(model)
    files = weight_files(model_dir)
    by_file: dict[Path, list[tuple[str, torch.Tensor]]] = defaultdict(list)
    for names, tensor in _tensors_to_fill(model):
        found = next((n for n in names if n in files), None)
        if found is None:
            raise WeightsError(f"{model_dir}: no tensor {names[0]!r} in its safetensors files (the architecture of its "
                               f"config.json needs it)")
        by_file[files[found]].append((found, tensor))
    with torch.no_grad():
        for path, wanted in by_file.items():
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for name, tensor in wanted:
                    _fill(tensor, f, name, model_dir)


def weight_files(model_dir: str | Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file of ``model_dir`` that holds it (one ``model.safetensors``, or the files
    its ``model.safetensors.index.json`` maps)."""
    model_dir = Path(model_dir)
    index = model_dir / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: model_dir / file for name, file in weight_map.items()}
    single = model_dir / SAFETENSORS_FILE
    if not single.is_file():
        raise WeightsError(f"{model_dir}: neither {SAFETENSORS_FILE} nor {SAFETENSORS_INDEX} (the weights are read "
                           f"from safetensors files only)")
    with safe_open(str(single), framework="pt") as f:
        return dict.fromkeys(f.keys(), single)


def _tied_names(model: nn.Module) -> dict[str, str]:
    """Each further name of a parameter that has several -> its first name."""
    first: dict[int, str] = {}
    tied = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            tied[name] = first[id(p)]
        else:
            first[id(p)] = name
    return tied


def _tensors_to_fill(model: nn.Module) -> list[tuple[list[str], torch.Tensor]]:
    """Every parameter and persistent buffer once, with all the names it has (a tied one has several)."""
    names: dict[int, list[str]] = defaultdict(list)
    tensors: dict[int, torch.Tensor] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names[id(p)].append(name)
        tensors[id(p)] = p
    for module_name, module in model.named_modules():
        for name, b in module.named_buffers(recurse=False):
            if b is not None and name not in module._non_persistent_buffers_set:
                names[id(b)].append(f"{module_name}.{name}" if module_name else name)
                tensors[id(b)] = b
    return [(names[k], tensors[k]) for k in tensors]


def _init_non_persistent_buffers(model: PreTrainedModel) -> None:
    """The buffers no checkpoint holds (rotary ``inv_freq``), computed as ``from_pretrained`` computes them: the
    model's own ``_init_weights`` on each module that owns one (such modules hold no parameters in Qwen3)."""
    for module in model.modules():
        if module._non_persistent_buffers_set:
            if any(True for _ in module.parameters(recurse=False)):
                raise WeightsError(f"{type(module).__name__}: a module with both parameters and non-persistent "
                                   f"buffers; its buffers' initialization would overwrite its parameters")
            model._init_weights(module)


def _fill(tensor: torch.Tensor, f, name: str, model_dir: str | Path) -> None:
    """Copy this rank's part of checkpoint tensor ``name`` into ``tensor`` (a DTensor's local shard, or whole)."""
    local, shape, offset = tensor, tuple(tensor.shape), (0,) * tensor.dim()
    if isinstance(tensor, DTensor):
        local = tensor.to_local()
        shape, offset = local_shape_and_offset(tuple(tensor.shape), tensor.device_mesh.get_coordinate(),
                                               tensor.device_mesh.shape, tensor.placements)
    stored = f.get_slice(name)
    if tuple(stored.get_shape()) != tuple(tensor.shape):
        raise WeightsError(f"{model_dir}: tensor {name!r} has shape {tuple(stored.get_shape())} in its safetensors "
                           f"files, the config's architecture {tuple(tensor.shape)}")
    if tuple(local.shape) != shape:
        raise WeightsError(f"{name!r}: this rank's shard has shape {tuple(local.shape)}, expected {shape}")
    if local.dim() == 0:
        local.copy_(f.get_tensor(name))
    elif local.numel():
        local.copy_(stored[tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))])


def local_shape_and_offset(global_shape: tuple[int, ...], coordinate: list[int], mesh_shape: tuple[int, ...],
                           placements) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shape and global offset of the part of a ``global_shape`` tensor that the rank at mesh ``coordinate``
    holds under ``placements`` (``Shard(d)``: ``torch.chunk`` of dim d, the last chunks shorter or empty, as DTensor
    and FSDP2 cut; ``Replicate()``: whole)."""
    shape, offset = list(global_shape), [0] * len(global_shape)
    for mesh_dim, placement in enumerate(placements):
        if type(placement) is Shard:  # (not _StridedShard: another cut)
            d, n, k = placement.dim, mesh_shape[mesh_dim], coordinate[mesh_dim]
            chunk = -(-shape[d] // n)
            start = min(k * chunk, shape[d])
            offset[d] += start
            shape[d] = min(chunk, shape[d] - start)
        elif not isinstance(placement, Replicate):
            raise WeightsError(f"placement {placement!r}: only Shard and Replicate are loaded from safetensors")
    return tuple(shape), tuple(offset)


def host_peak_gib() -> float:
    """This process's peak resident host memory so far, in GiB: Linux's ``VmHWM`` (``/proc/self/status``), elsewhere
    ``ru_maxrss``."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20  # kB
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20  # bytes on macOS, KiB elsewhere

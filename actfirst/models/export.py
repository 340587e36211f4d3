"""Export of a training checkpoint as a model to hand on: a plain Hugging Face directory with no training state.

::

    out = export_checkpoint("runs/demo/actfirst/checkpoints/update_000020", "exports/demo", dtype="bfloat16",
                            command="python -m actfirst.export ...")
    push_to_hub(out, "me/actfirst-demo")           # optional: huggingface_hub's upload (needs a token and the net)

A checkpoint (``actfirst.train.state``) holds the float32 student beside AdamW's shards, the trainer's state and each
rank's state. The export keeps only what loads the model: ``config.json`` (its ``dtype``/``torch_dtype`` the export's
dtype), ``generation_config.json``, the weights (every floating tensor cast to the dtype, round to nearest even as
``Tensor.to`` does; shard by shard, so no more than one shard is in memory), the tokenizer with its chat template,
and a model card ``README.md`` (``actfirst.models.card``, through ``huggingface_hub.ModelCard``): the base model and
the teacher by Hub id and commit, the benchmark's datasets, the license, the method (``rollout.strategy``), the
updates, the run's evaluations found beside the checkpoint (``evals.jsonl``; this update's as ``model-index``), and
the command that made it.

The directory is written under a temporary name beside ``out``, fsynced and renamed into place: an interrupted export
leaves no ``out`` (its leftover is removed by the next export to the same ``out``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from actfirst.core.files import fsync_path
from actfirst.core.user_input import ConfigError, check_model_dir
from actfirst.models.card import model_card
from actfirst.train.checkpoint import load_checkpoint

EXPORT_DTYPES = ("float32", "bfloat16", "float16")
MODEL_FILES = ("config.json", "generation_config.json")
"""Copied from the checkpoint (``config.json`` with the export's dtype)."""
SAFETENSORS_INDEX = "model.safetensors.index.json"


def export_checkpoint(checkpoint: str | os.PathLike, out: str | os.PathLike, *, dtype: str = "float32",
                      command: str = "", license: str | None = None) -> Path:
    """Write the export of training checkpoint ``checkpoint`` to ``out`` (see the module docstring); returns ``out``.
    ``command``: the command line that made it, for the model card; ``license``: the card's (None: the base
    model's). Raises ``ConfigError`` for a directory that is not a complete training checkpoint, an unknown dtype,
    or an ``out`` that exists and is not empty."""
    checkpoint, out = Path(checkpoint), Path(out)
    if dtype not in EXPORT_DTYPES:
        raise ConfigError(f"--dtype={dtype!r}: must be one of {list(EXPORT_DTYPES)}")
    state = read_training_state(checkpoint)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out={str(out)!r}: exists and is not an empty directory; choose another or remove it")
    out.parent.mkdir(parents=True, exist_ok=True)
    for leftover in out.parent.glob(f".tmp-{out.name}-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    tmp.mkdir()
    try:
        _write_model(checkpoint, tmp, dtype)
        _write_tokenizer(checkpoint, tmp)
        model_card(checkpoint, state, dtype=dtype, command=command, name=out.name, license=license).save(
            tmp / "README.md")
        check_model_dir(tmp, "the export")
        mode = 0o666 & ~_umask()  # as a plain file the user writes (the safetensors writer makes 0600 files)
        for path in tmp.iterdir():
            path.chmod(mode)
            fsync_path(path)
        fsync_path(tmp)
        if out.exists():
            out.rmdir()  # empty (checked above)
        tmp.rename(out)
        fsync_path(out.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def read_training_state(checkpoint: Path) -> dict[str, Any]:
    """The trainer state of a complete training checkpoint (its ``config`` and ``update``); ``ConfigError`` for any
    other directory."""
    check_model_dir(checkpoint, "checkpoint")
    if not (checkpoint / "checkpoint.json").is_file():
        raise ConfigError(f"checkpoint={str(checkpoint)!r}: not a complete training checkpoint (no checkpoint.json): "
                          f"export takes <out_dir>/checkpoints/update_NNNNNN of a run")
    state = load_checkpoint(checkpoint)
    if not isinstance(state.get("config"), dict):
        raise ConfigError(f"checkpoint={str(checkpoint)!r}: its trainer_state.pt holds no run config")
    return state


def _write_model(checkpoint: Path, out: Path, dtype: str) -> None:
    """config.json (with ``dtype``), generation_config.json, and the weights cast shard by shard."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    target = getattr(torch, dtype)
    config = json.loads((checkpoint / "config.json").read_text())
    config.update(dtype=dtype, torch_dtype=dtype)  # transformers 5 reads dtype; older readers and tools torch_dtype
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if (checkpoint / MODEL_FILES[1]).is_file():
        shutil.copyfile(checkpoint / MODEL_FILES[1], out / MODEL_FILES[1])
    total = 0
    for shard in sorted(checkpoint.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            metadata = f.metadata()
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # a safe_open is not iterable
        tensors = {k: t.to(target) if t.is_floating_point() else t for k, t in tensors.items()}
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        save_file(tensors, str(out / shard.name), metadata=metadata)
    if (checkpoint / SAFETENSORS_INDEX).is_file():
        index = json.loads((checkpoint / SAFETENSORS_INDEX).read_text())
        index["metadata"] = {**index.get("metadata", {}), "total_size": total}
        (out / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2) + "\n")


def _write_tokenizer(checkpoint: Path, out: Path) -> None:
    """The checkpoint's tokenizer and chat template, as transformers saves them."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    if not tokenizer.chat_template:
        raise ConfigError(f"checkpoint={str(checkpoint)!r}: its tokenizer has no chat template")
    tokenizer.save_pretrained(out)


def check_hub_repo(repo: str) -> None:
    """Refuse a push that cannot happen, before any work: a malformed repo id, offline mode, no token."""
    from huggingface_hub import constants, get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as e:
        raise ConfigError(f"--push-to-hub={repo!r}: not a Hub repo id ({e})") from None
    if constants.HF_HUB_OFFLINE:
        raise ConfigError(f"--push-to-hub={repo!r}: the Hub is offline here (HF_HUB_OFFLINE is set); export without "
                          f"--push-to-hub and upload the directory later (hf upload {repo} DIR)")
    if get_token() is None:
        raise ConfigError(f"--push-to-hub={repo!r}: no Hugging Face token (set HF_TOKEN or run `hf auth login`)")


def push_to_hub(out: Path, repo: str, *, private: bool = False) -> str:
    """Upload the export ``out`` to model repo ``repo`` (created when missing) with huggingface_hub; returns the
    commit's URL. A failed upload is refused in one line naming the repo; the export stays complete at ``out``."""
    from huggingface_hub import HfApi

    check_hub_repo(repo)
    api = HfApi()
    try:
        api.create_repo(repo, repo_type="model", private=private, exist_ok=True)
        info = api.upload_folder(repo_id=repo, folder_path=out, repo_type="model",
                                 commit_message=f"ActFirst export of {out.name}")
    except Exception as e:  # noqa: BLE001 - the network's and the Hub's errors, reported in one line
        raise ConfigError(f"--push-to-hub={repo!r}: the upload failed ({type(e).__name__}: {e}); the export is "
                          f"complete at {out}") from None
    return str(info.commit_url)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


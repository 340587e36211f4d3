"""Models named by a local directory or by a Hugging Face Hub id, resolved to a local directory before any work.

Wherever a model is named (``student.model``, ``teacher``, ``--checkpoint``, ``--teacher``) the name is either an
existing directory, used as it is, or a Hub repo id (``owner/name``, optionally with a revision: a branch, tag or
commit), whose snapshot :func:`resolve_model` takes from the standard Hugging Face cache (``HF_HUB_CACHE``, by default
``~/.cache/huggingface/hub``), downloading what is missing unless ``HF_HUB_OFFLINE=1``. A name that is neither, an id
the Hub does not have, or one that is not cached while offline, is refused in one line naming the key and the value.

A resolved snapshot is ``<cache>/models--<owner>--<name>/snapshots/<commit>``: :func:`model_commit` reads the commit
back from the path (``"local"`` for any other directory).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from actfirst.core.user_input import ConfigError, check_model_dir

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")
"""What a Hub model repo id looks like (``Qwen/Qwen3-1.7B``): exactly one ``/``, neither part empty."""

COMMIT = re.compile(r"[0-9a-f]{40}")

HUB_IGNORE = ["original/*", "*.pth", "*.gguf", "*.onnx", "*.onnx_data", "onnx/*", "openvino/*", "coreml/*",
              "*.msgpack", "*.h5", "*.tflite", "*.ot"]
"""Files of a Hub model repo never downloaded: other frameworks' copies of the weights (the ``original/`` checkpoints
of some repos, ONNX, GGUF, Flax, TensorFlow). The same patterns decide whether a cached snapshot is complete."""


def is_hub_id(name: str) -> bool:
    """Whether ``name`` has the form of a Hub model repo id (``owner/name``); it may still name no repo."""
    return bool(HUB_ID.fullmatch(name)) and ".." not in name and "--" not in name


def model_commit(path: str | os.PathLike) -> str:
    """The commit of a resolved Hub snapshot (its directory's name), or ``"local"`` for any other directory."""
    p = Path(path).absolute()
    if p.parent.name == "snapshots" and p.parent.parent.name.startswith("models--") and COMMIT.fullmatch(p.name):
        return p.name
    return "local"


def hub_name(path: str | os.PathLike) -> str | None:
    """The Hub repo id a resolved snapshot directory holds (``<cache>/models--Qwen--Qwen3-1.7B/snapshots/<commit>``
    holds ``Qwen/Qwen3-1.7B``), or None for any other directory."""
    if model_commit(path) == "local":
        return None
    owner, _, name = Path(path).absolute().parent.parent.name.removeprefix("models--").partition("--")
    return f"{owner}/{name}" if owner and name else None


def download_command(name: str, revision: str | None) -> str:
    """The command that puts Hub model ``name`` (at ``revision``) into the Hugging Face cache."""
    return f"hf download {name}" + (f" --revision {revision}" if revision else "")


def resolve_model(name: str, key: str, revision: str | None = None, *, download: bool = True,
                  revision_key: str = "revision") -> Path:
    """The local Hugging Face model directory that ``name`` (the value of config key or flag ``key``) stands for,
    checked by :func:`~actfirst.core.user_input.check_model_dir`:

    - an existing directory is used as it is (a ``revision`` is then refused, except the commit of the Hub snapshot
      the directory is: a name resolved before, handed on);
    - otherwise a Hub repo id is resolved to its snapshot at ``revision`` (None: ``main``) in the Hugging Face cache,
      downloaded when missing or outdated, unless ``download`` is False or ``HF_HUB_OFFLINE=1`` (then only the cache
      is read: a process that must not download, such as a rank, passes ``download=False``).

    ``revision_key`` is how messages name the revision's own key (``student.revision``, ``--revision``). Anything
    that cannot be resolved raises :class:`ConfigError` in one line, naming ``key`` and ``name``."""
    path = Path(name)
    if path.is_dir():
        if revision is not None and model_commit(path) != revision:
            raise ConfigError(f"{revision_key}={revision!r}: {key}={name!r} is a local directory, which has no "
                              f"revisions (a revision picks a version of a Hugging Face Hub id)")
        check_model_dir(name, key)
        return path
    if not is_hub_id(name):
        raise ConfigError(f"{key}={name!r}: no such directory, and not a Hugging Face Hub id (owner/name)")
    path = Path(_snapshot(name, key, revision, download, revision_key))
    check_model_dir(path, key)
    return path


def _snapshot(name: str, key: str, revision: str | None, download: bool, revision_key: str) -> str:
    """``snapshot_download`` of Hub model ``name``, its failures as one-line :class:`ConfigError` s."""
    import httpx2
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{key}={name!r}"
    fetch = f"`{download_command(name, revision)}`"
    try:
        return snapshot_download(name, revision=revision, local_files_only=not download,
                                 ignore_patterns=HUB_IGNORE)
    except GatedRepoError:
        raise ConfigError(f"{where}: a gated model on the Hugging Face Hub: accept its terms on its page and log in "
                          f"(`hf auth login`)") from None
    except RepositoryNotFoundError:
        raise ConfigError(f"{where}: not a local directory, and the Hugging Face Hub has no such model (or it is "
                          f"private: log in with `hf auth login`)") from None
    except RevisionNotFoundError:
        raise ConfigError(f"{revision_key}={revision!r}: the Hugging Face Hub has no such revision of "
                          f"{where}") from None
    except IncompleteSnapshotError as e:
        raise ConfigError(f"{where}: its snapshot in the Hugging Face cache ({e.snapshot_path}) is incomplete and "
                          f"the Hub cannot be reached; complete it with {fetch}") from None
    except LocalEntryNotFoundError:
        if constants.HF_HUB_OFFLINE:
            why = "HF_HUB_OFFLINE=1"
        elif not download:
            why = "this process does not download"
        else:
            why = "the Hub cannot be reached"
        raise ConfigError(f"{where}: not a local directory and not in the Hugging Face cache "
                          f"({constants.HF_HUB_CACHE}; {why}); download it with {fetch}, or name a local "
                          f"directory") from None
    except (OSError, httpx2.HTTPError, ValueError) as e:
        raise ConfigError(f"{where}: resolving it on the Hugging Face Hub into {constants.HF_HUB_CACHE} failed "
                          f"({type(e).__name__}: {' '.join(str(e).split())[:300]})") from None

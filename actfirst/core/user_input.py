"""What the user names (files, directories, models, output paths), checked before anything expensive starts, and
the one place every command sets up its logging and turns a user's error into one line.

Every check raises :class:`ConfigError` (also importable from :mod:`actfirst.core.config`) naming the argument (a config
key such as ``student.model``, or a flag such as ``--checkpoint``), its value and what is wrong. :func:`command` wraps a
command's ``main``: logging is set up first (``actfirst.core.logs``); a :class:`UserError` (a ``ConfigError``, or a
problem of the machine such as a simulator that cannot start: ``actfirst.envs.startup.EnvStartError``) becomes one
line on stderr and its exit status (2 for a refused input, as argparse's own refusals); any other exception is a bug
and keeps its traceback.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from actfirst.core.logs import setup_logging

EXIT_USAGE = 2
"""The exit status of a command refused for its input (argparse's own)."""


class UserError(Exception):
    """What stops a command with one line and no traceback: something the user can fix (an input they gave, their
    machine's setup), never a bug. Its message says what and where, whole, on one line."""

    exit_status: int = 1
    """The command's exit status when it stops on this error."""


class ConfigError(UserError, ValueError):
    """An input the user gave was refused: a config value, a command-line argument, or a file or directory one of
    them names. The message names the key or argument and its value (``student.model='x': has no weights``)."""

    exit_status = EXIT_USAGE


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
"""Any one of these makes a directory's tokenizer loadable (with ``tokenizer_config.json`` where it has one)."""

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
"""The weight files Hugging Face and vLLM load."""

SAFETENSORS_INDEX = "model.safetensors.index.json"
"""A sharded checkpoint's map of each tensor to its shard file."""

EMBEDDING_NAMES = ("embed_tokens.weight", "lm_head.weight")
"""Tensor name endings whose shape is ``[vocab_size, hidden_size]`` of the model's ``config.json``."""


def command(main: Callable[[list[str] | None], int]) -> Callable[[list[str] | None], int]:
    """Wrap a command's ``main(argv) -> status``: logging set up for the console (:func:`setup_logging`), then a
    :class:`UserError` writes ``<prog>: error: <message>`` on stderr, as argparse's ``parser.error`` does (no log
    record: a refused command leaves no log file), and returns its ``exit_status`` (:data:`EXIT_USAGE` for a
    :class:`ConfigError`); Ctrl-C (once the command has stopped what it ran) writes ``<prog>: interrupted`` and
    returns 130, as a shell reports SIGINT; other exceptions propagate with their traceback."""

    @functools.wraps(main)
    def wrapped(argv: list[str] | None = None) -> int:
        setup_logging()
        try:
            return main(argv)
        except UserError as e:
            message = " ".join(str(e).split())  # one line, whatever the message held
            sys.stderr.write(f"{_prog(main.__module__)}: error: {message}\n")
            sys.stderr.flush()
            return e.exit_status
        except KeyboardInterrupt:
            sys.stderr.write(f"{_prog(main.__module__)}: interrupted\n")
            sys.stderr.flush()
            return 128 + signal.SIGINT

    return wrapped


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (``--max-in-flight``), refused by argparse with the value otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be >= 1")
    return value


def check_exists(path: str | os.PathLike, key: str, kind: str = "directory") -> None:
    """``path`` must be an existing ``kind`` (``"file"`` or ``"directory"``)."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{key}={str(path)!r}: no such {kind}")
    if kind == "directory" and not p.is_dir():
        raise ConfigError(f"{key}={str(path)!r}: is not a directory")
    if kind == "file" and not p.is_file():
        raise ConfigError(f"{key}={str(path)!r}: is {'a directory' if p.is_dir() else 'not a regular file'}, not a "
                          f"file")


def _prog(module: str) -> str:
    """How the user started the command: ``python -m <module>``, or ``python <script>`` for a script."""
    if module != "__main__":
        return f"python -m {module}"
    spec = sys.modules["__main__"].__spec__  # run with -m: the module's own name is its spec's
    return f"python -m {spec.name}" if spec is not None else f"python {sys.argv[0]}"


def read_text(path: str | os.PathLike, key: str) -> str:
    """The text of the file ``key`` names: missing, a directory, unreadable or not text is refused."""
    p = Path(path)
    try:
        return p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{key}={str(path)!r}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{key}={str(path)!r}: is a directory, not a file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{key}={str(path)!r}: is not a text file") from None
    except OSError as e:
        raise ConfigError(f"{key}={str(path)!r}: cannot be read ({e.strerror or e})") from None


def read_jsonl(path: str | os.PathLike, key: str) -> list[tuple[int, dict]]:
    """``(line number, object)`` for every non-blank line of a JSONL file; a line that is not a JSON object is
    refused, naming the file and the line."""
    out = []
    for n, line in enumerate(read_text(path, key).splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{key}={str(path)!r}: line {n} is not JSON ({e.msg} at column {e.colno}): "
                              f"{line[:80]!r}") from None
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={str(path)!r}: line {n} is not a JSON object: {line[:80]!r}")
        out.append((n, value))
    return out


def check_model_dir(path: str | os.PathLike, key: str, *, weights: bool = True) -> None:
    """``path`` must be a Hugging Face model directory: ``config.json`` (valid JSON), a tokenizer, and (with
    ``weights``) weight files whose safetensors headers read and agree with ``config.json`` (:func:`_check_weights`:
    headers only, no tensor is loaded). Every command that takes a model directory calls this before any engine,
    process group or model load; run before any tokenizer comparison, so that a message blames the right side."""
    check_exists(path, key)
    p = Path(path)
    if not (p / "config.json").is_file():
        raise ConfigError(f"{key}={str(path)!r}: has no config.json: not a Hugging Face model directory")
    try:
        config = json.loads(read_text(p / "config.json", key))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{key}={str(path)!r}: its config.json is not JSON ({e.msg}, line {e.lineno})") from None
    if not any((p / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(f"{key}={str(path)!r}: has no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    if weights:
        if not any(any(p.glob(pattern)) for pattern in WEIGHT_PATTERNS):
            raise ConfigError(f"{key}={str(path)!r}: has no weights (no {' or '.join(WEIGHT_PATTERNS)} file)")
        _check_weights(p, f"{key}={str(path)!r}", config if isinstance(config, dict) else {})


def _check_weights(p: Path, where: str, config: dict) -> None:
    """Every ``*.safetensors`` file of ``p`` and every shard its :data:`SAFETENSORS_INDEX` names has a readable
    header holding the tensors the index places there; together they hold some tensor, and the embedding and LM
    head have the ``[vocab_size, hidden_size]`` of ``config``. ``where``: ``key='path'`` for the messages."""
    placed = _weight_map(p, where)
    files = sorted({f.name for f in p.glob("*.safetensors")} | set(placed.values()))
    tensors: dict[str, tuple[str, list[int]]] = {}  # name -> (file, shape)
    for name in files:
        if not (p / name).exists():
            raise ConfigError(f"{where}: {SAFETENSORS_INDEX} names {name}, which is missing")
        shapes = _safetensors_shapes(p / name, where)
        lacking = [t for t, shard in placed.items() if shard == name and t not in shapes]
        if lacking:
            raise ConfigError(f"{where}: {name} lacks {lacking[0]}, which {SAFETENSORS_INDEX} places there"
                              f"{f' (and {len(lacking) - 1} more)' if len(lacking) > 1 else ''}")
        tensors.update({t: (name, shape) for t, shape in shapes.items()})
    if files and not tensors:
        raise ConfigError(f"{where}: its weight files hold no tensors ({', '.join(files)})")
    vocab, hidden = config.get("vocab_size"), config.get("hidden_size")
    if not (isinstance(vocab, int) and isinstance(hidden, int)) or "quantization_config" in config:
        return  # nothing to compare with, or packed weights of other shapes
    for name, (file, shape) in sorted(tensors.items()):
        if name.endswith(EMBEDDING_NAMES) and shape != [vocab, hidden]:
            raise ConfigError(f"{where}: {file} holds {name} of shape {shape}, but config.json says [vocab_size, "
                              f"hidden_size] = [{vocab}, {hidden}]")


def _weight_map(p: Path, where: str) -> dict[str, str]:
    """The tensor -> shard file map of ``p``'s :data:`SAFETENSORS_INDEX` (empty without one)."""
    index = p / SAFETENSORS_INDEX
    if not index.is_file():
        return {}
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        weight_map = None
    if not (isinstance(weight_map, dict) and all(isinstance(v, str) for v in weight_map.values())):
        raise ConfigError(f"{where}: {SAFETENSORS_INDEX} is not a readable safetensors index (a JSON object whose "
                          f"weight_map maps tensor names to files)")
    return weight_map


def _safetensors_shapes(file: Path, where: str) -> dict[str, list[int]]:
    """Each tensor's shape in the header of safetensors ``file`` (the header is validated; no data is read)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="numpy") as f:
            names = f.keys()  # a safe_open is not iterable
            return {k: list(f.get_slice(k).get_shape()) for k in names}
    except SafetensorError as e:
        why = str(e).removeprefix("Error while deserializing header: ")
        raise ConfigError(f"{where}: {file.name} is not a readable safetensors file ({why})") from None
    except OSError as e:
        raise ConfigError(f"{where}: {file.name} cannot be read ({e.strerror or e})") from None


def check_writable_dir(path: str | os.PathLike, key: str) -> None:
    """``path`` must be a directory this process can create (if missing) and write in. Probed with a temporary
    directory that is removed at once: nothing is left at ``path``."""
    problem = _unwritable(Path(path).absolute())
    if problem:
        raise ConfigError(f"{key}={str(path)!r}: {problem}")


def check_writable_file(path: str | os.PathLike, key: str) -> None:
    """``path`` (an output file) must not be a directory, and its directory must be one :func:`check_writable_dir`
    accepts."""
    p = Path(path).absolute()
    if p.is_dir():
        raise ConfigError(f"{key}={str(path)!r}: is a directory, not a file")
    problem = _unwritable(p.parent)
    if problem:
        raise ConfigError(f"{key}={str(path)!r}: its directory {str(p.parent)!r} {problem}")


def _unwritable(p: Path) -> str | None:
    """Why directory ``p`` cannot be made or written (None: it can)."""
    existing = next(a for a in (p, *p.parents) if a.exists())
    if not existing.is_dir():
        return "is not a directory" if existing == p else f"lies under {str(existing)!r}, which is not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".actfirst-write-probe-", dir=existing))
    except OSError as e:
        where = "" if existing == p else f" (in {str(existing)!r})"
        return f"cannot be written{where}: {e.strerror or e}"
    return None


def add_nproc_argument(parser: argparse.ArgumentParser, ranks: str) -> None:
    """``--nproc-per-node N`` of a command that starts its own ranks; ``ranks``: what the ranks do, for the help."""
    parser.add_argument("--nproc-per-node", type=int, default=None, metavar="N",
                        help=f"{ranks} (default: one per GPU; one on a CPU)")


def ranks_per_node(nproc_per_node: int | None) -> int:
    """The ranks to start: ``--nproc-per-node`` as given (>= 1), or one per visible GPU (one on a CPU)."""
    from actfirst.parallel.launch import default_nproc

    nproc = default_nproc() if nproc_per_node is None else nproc_per_node
    if nproc < 1:
        raise ConfigError(f"--nproc-per-node={nproc}: must be >= 1")
    return nproc

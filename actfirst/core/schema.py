"""The config machinery: ``kw_only`` dataclasses loaded from YAML with dotted command-line overrides.

Every config section is a dataclass whose ``__post_init__`` calls :func:`check`; :func:`load_config` rejects an
unknown key, a wrong type or an impossible value before any work starts, with a :class:`ConfigError` that names the
dotted key and the value::

    cfg = load_config(TrainConfig, "configs/demo/scienceworld_lifespan.yaml", ["scheduler.b_max=64"])

The sections themselves live with their owners (``actfirst.core.config``, each benchmark's package, each strategy).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import math
import os
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml

from actfirst.core.user_input import ConfigError, check_exists, read_text

_CHECK_PATHS: contextvars.ContextVar[bool] = contextvars.ContextVar("actfirst_check_paths", default=True)


@contextlib.contextmanager
def paths_unchecked():
    """Build configs whose input paths need not exist yet (``actfirst.preparation.build`` makes them; it then calls
    :func:`check_paths`)."""
    token = _CHECK_PATHS.set(False)
    try:
        yield
    finally:
        _CHECK_PATHS.reset(token)


def paths_checked() -> bool:
    """Whether input paths are checked now (False inside :func:`paths_unchecked`)."""
    return _CHECK_PATHS.get()


def check_dir(path: str, key: str) -> None:
    """Refuse a directory ``key`` that does not exist (unless inside :func:`paths_unchecked`)."""
    if _CHECK_PATHS.get():
        check_exists(path, key)


def check(ok: bool, key: str, value: Any, why: str) -> None:
    """Raise :class:`ConfigError` ``key=value: why`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key}={value!r}: {why}")


_TYPE_FROM = "actfirst.core.schema.type_from"


def type_from(resolve: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    """The ``metadata`` of a dataclass field whose type the loader takes from the section's other values:
    ``resolve(values)`` gets them checked (by their own annotations) and returns the type to check this field's value
    against, or None when they cannot tell (a missing or unknown key, which the section's own checks then name)::

        env: Any = dataclasses.field(default=None, metadata=type_from(env_type))
    """
    return {_TYPE_FROM: resolve}


def _coerce(tp: Any, value: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and convert YAML lists to tuples where declared."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        check(isinstance(value, dict), key, value, f"must be a mapping for {tp.__name__}")
        return _build(tp, value, key)
    if origin is Literal:
        check(any(value == a and type(value) is type(a) for a in typing.get_args(tp)), key, value,
               f"must be one of {list(typing.get_args(tp))}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, key)
            except ConfigError as e:
                errors.append(e)
        raise errors[0] if errors else ConfigError(f"{key}={value!r}: wrong type")
    if origin in (list, tuple):
        check(isinstance(value, (list, tuple)), key, value, f"must be a list, not {type(value).__name__}")
        args = typing.get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            check(len(value) == len(args), key, value, f"must have {len(args)} items")
            return tuple(_coerce(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
        item = args[0] if args else Any
        items = [_coerce(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "2e-3" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        check(isinstance(value, (int, float)) and not isinstance(value, bool), key, value, "must be a number")
        check(math.isfinite(value), key, value, "must be a finite number")
        return float(value)
    if tp is int:
        check(isinstance(value, int) and not isinstance(value, bool), key, value, "must be an integer")
        return value
    if tp is bool:
        check(isinstance(value, bool), key, value, "must be true or false")
        return value
    if tp is str:
        check(isinstance(value, str), key, value, "must be a string")
        return value
    raise TypeError(f"unsupported config annotation {tp!r} at {key}")


class MissingKeys(ConfigError):
    """Required config keys were not given: ``keys`` holds their dotted names. :func:`load_config` names where
    they were looked for."""

    def __init__(self, keys: list[str]) -> None:
        super().__init__(f"missing {', '.join(keys)}")
        self.keys = keys


def _required(cls: type) -> list[str]:
    """The fields of dataclass ``cls`` that have no default: a config must give them."""
    return [f.name for f in dataclasses.fields(cls)
            if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]


def _build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    """``cls`` from ``data``: every key known and checked against its annotation (or the type its
    :func:`type_from` gives), then ``cls``'s own checks. A section may name where a key it no longer has went:
    a ``moved_key(name)`` classmethod returning the message, or None for a key it never had."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in data:
        if name not in fields:
            key = f"{prefix}.{name}" if prefix else name
            moved = cls.moved_key(name) if hasattr(cls, "moved_key") else None
            if moved is not None:
                raise ConfigError(f"{key}: {moved}")
            raise ConfigError(f"{key}={data[name]!r}: unknown key (known: {', '.join(sorted(fields))})")
    missing = [f"{prefix}.{name}" if prefix else name for name in _required(cls) if name not in data]
    if missing:
        raise MissingKeys(missing)
    kwargs = {}
    resolved = {name: value for name, value in data.items() if _TYPE_FROM in fields[name].metadata}
    for name, value in data.items():
        if name not in resolved:
            kwargs[name] = _coerce(hints[name], value, f"{prefix}.{name}" if prefix else name)
    for name, value in resolved.items():
        tp = fields[name].metadata[_TYPE_FROM](kwargs)
        if tp is not None:
            kwargs[name] = _coerce(tp, value, f"{prefix}.{name}" if prefix else name)
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{prefix}.{e}" if prefix else str(e)) from None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML) to a nested dict, in place."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value, e.g. scheduler.b_max=64")
        key, raw = item.split("=", 1)
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            if node.get(part) is None:  # absent, or a section saved as null (off): a key turns it on, the rest default
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part} is not a section")
        node[parts[-1]] = parse_yaml(raw, f"override {item!r}")
    return data


def load_config(cls: type, path: str | os.PathLike | None, overrides: list[str] | None = None, *,
                key: str = "--config") -> Any:
    """Load ``cls`` from a YAML file (or from nothing) plus dotted overrides, validating everything (input paths
    too, except inside :func:`paths_unchecked`). ``key``: what errors about the file call it."""
    data = read_config_file(path, key) if path is not None else {}
    apply_overrides(data, list(overrides or []))
    try:
        return _build(cls, data, "")
    except MissingKeys as e:
        where = f"{key}={str(path)!r}: " if path is not None else ""
        given = "" if path is not None else " (not in the command-line overrides)"
        raise ConfigError(f"{where}{e}{given}") from None


def read_config_file(path: str | os.PathLike, key: str = "--config", seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A YAML config as a dict. A top-level ``base: <file>`` (relative to this file) is read first and this file's
    keys are merged into it: sections key by key, any other value replacing the base's."""
    data = parse_yaml(read_text(path, key), f"{key}={str(path)!r}")
    if data is None:
        raise ConfigError(f"{key}={str(path)!r}: the file is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"{key}={str(path)!r}: the top level must be a mapping, not {type(data).__name__}")
    base = data.pop("base", None)
    if base is None:
        return data
    here = Path(path).resolve()
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"base={base!r} (in {str(path)!r}): must name a YAML file")
    base_path = here.parent / base
    if base_path.resolve() in (*seen, here):
        raise ConfigError(f"base={base!r} (in {str(path)!r}): a circle of base files")
    return merge_sections(read_config_file(base_path, f"base (in {str(path)!r})", (*seen, here)), data)


def merge_sections(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` merged into a copy of ``base``: mappings merged key by key, other values replaced."""
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merge_sections(out[key], value) if both else value
    return out


def parse_yaml(text: str, what: str) -> Any:
    """``text`` as YAML; malformed YAML is refused naming ``what`` and where the parser stopped."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{what}: not valid YAML{where}: {problem}") from None


def to_dict(cfg: Any) -> dict[str, Any]:
    """A plain dict of a config (for logging and result files)."""
    return dataclasses.asdict(cfg)


def config_json(cfg: Any) -> str:
    """A config as its run's ``config.json`` holds it (:func:`check_resumable` compares configs in this form)."""
    return json.dumps(to_dict(cfg), indent=1, default=str)

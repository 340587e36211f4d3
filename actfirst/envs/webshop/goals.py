"""WebShop's goal pools: which of WebShop's goals (instructions, by index in its shuffled goal list) a split plays.

000 (C.1): goals 0-4095 train and 4096-4195 evaluation, over the full catalog. 003 (D.1): "Training draws from a pool
of 6,410 instructions, and evaluation uses 128 test instructions that are disjoint from the pool and shared by every
method", over the 1,000-product catalog: there WebShop builds 6,910 goals, and the upstream split of the GiGPO
teachers' code (verl-agent's WebShop environment) is ``test`` = goals 0-499 and ``train`` = goals 500-6909, the
6,410 of the pool. Which 128 of the test goals 003 evaluates on is not stated; this package ships the first 128
(``actfirst/envs/webshop/003-test-128.txt``) and the pool (``003-train.txt``).

A pool file holds one goal index (``17``) or one inclusive range (``500-6909``) per line; blank lines and ``#``
comments are skipped.
"""

from __future__ import annotations

from actfirst.core.user_input import ConfigError
from actfirst.envs.benchmarks import moved_file

C1_POOLS = {"train": range(0, 4096), "eval": range(4096, 4196)}
"""000's split (C.1), the pools of a config that names no file."""


def read_goal_pool(path: str, key: str) -> list[int]:
    """The goal indices of the pool file ``path`` in file order; a missing file, a malformed line, a negative or a
    repeated index is a :class:`ConfigError` naming ``key``, the file and the line."""
    file = moved_file(path)
    if not file.is_file():
        raise ConfigError(f"{key}={path!r}: no such file (a goal pool: one index or inclusive range a-b per line)")
    goals: list[int] = []
    for number, raw in enumerate(file.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        first, sep, last = line.partition("-")
        try:
            start, stop = int(first), int(last if sep else first)
        except ValueError:
            raise ConfigError(f"{key}={path!r}: line {number} ({raw.strip()!r}) is neither an index nor a range "
                              "a-b") from None
        if start > stop:
            raise ConfigError(f"{key}={path!r}: line {number} ({raw.strip()!r}) is an empty range")
        goals.extend(range(start, stop + 1))
    if not goals:
        raise ConfigError(f"{key}={path!r}: holds no goal index")
    if len(set(goals)) < len(goals):
        repeated = next(g for i, g in enumerate(goals) if g in goals[:i])
        raise ConfigError(f"{key}={path!r}: goal {repeated} is listed twice")
    return goals


def goal_pool(split: str, file: str | None, key: str) -> list[int]:
    """The goals of ``split`` ("train" or "eval"): those of the pool file ``file`` (config key ``key``), or C.1's."""
    if split not in C1_POOLS:
        raise ValueError(f"split={split!r}: not one of {sorted(C1_POOLS)}")
    return read_goal_pool(file, key) if file is not None else list(C1_POOLS[split])

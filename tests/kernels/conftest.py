import os
import secrets

import pytest
import torch


@pytest.fixture
def seed() -> int:
    """A fresh seed per test, printed (pytest shows it with a failure); ACTFIRST_TEST_SEED=<seed> replays one."""
    value = int(os.environ.get("ACTFIRST_TEST_SEED") or secrets.randbelow(2**31))
    print(f"seed={value} (replay: ACTFIRST_TEST_SEED={value})")
    return value


@pytest.fixture
def gen(seed) -> torch.Generator:
    """A CPU generator seeded with :func:`seed`; every random input of a kernel test comes from it."""
    return torch.Generator().manual_seed(seed)

import os
import random

import pytest
import torch


@pytest.fixture
def gen() -> torch.Generator:
    """A generator with a fresh seed, printed; replay with ACTFIRST_TEST_SEED=<seed>."""
    seed = int(os.environ.get("ACTFIRST_TEST_SEED") or random.SystemRandom().randrange(2**31))
    print(f"ACTFIRST_TEST_SEED={seed}")
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="session")
def vocab_size(tiny_model_dir) -> int:
    """Rows of the tiny model's embedding (its tokenizer's size, padded to 64)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(tiny_model_dir).vocab_size

"""The rollout-speedup benchmark's contexts as the paper's Figure 3 takes them: initial ALFWorld contexts sampled
proportionally across the training task types with a seed (000 Appendix C.5)."""

import sys
from collections import Counter
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from actfirst.core.config import EngineConfig
from actfirst.envs.alfworld.config import ALFWorldConfig

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
from rollout_speedup_config import RolloutSpeedupConfig  # noqa: E402
from speedup_contexts import alfworld_contexts, proportional_sample  # noqa: E402

ITEMS = [("A", i) for i in range(6)] + [("B", i) for i in range(3)] + [("C", 0)]


@pytest.mark.parametrize("n,want", [(5, {"A": 3, "B": 2}), (10, {"A": 6, "B": 3, "C": 1}),
                                    (20, {"A": 12, "B": 6, "C": 2}), (1, {"A": 1})])
def test_counts_follow_the_type_shares(n, want):
    picked = proportional_sample(ITEMS, lambda x: x[0], n, seed=42)
    assert len(picked) == n and Counter(t for t, _ in picked) == want
    for t, k in want.items():  # without replacement while the type has enough items
        assert len({x for x in picked if x[0] == t}) == min(k, sum(x[0] == t for x in ITEMS))
    assert picked == proportional_sample(ITEMS, lambda x: x[0], n, seed=42)


def test_the_seed_draws_within_a_type():
    draws = {tuple(proportional_sample(ITEMS, lambda x: x[0], 3, seed=s)) for s in range(20)}
    assert len(draws) > 1
    with pytest.raises(ValueError, match="n=0"):
        proportional_sample(ITEMS, lambda x: x[0], 0, seed=1)


def test_alfworld_contexts_are_the_games_first_turns(alfworld_games, tiny_model_dir):
    """Six generated games, one per type: six contexts, each type once; the fast prompt is the action-only one
    (no reference), the full prompt think-then-act, both holding the game's own task and admissible actions."""
    root = Path(alfworld_games[0].game_file).parents[2]
    cfg = RolloutSpeedupConfig(engine=EngineConfig(model=str(tiny_model_dir), dtype="float32", max_model_len=2048),
                               contexts="alfworld",
                               alfworld=ALFWorldConfig(games="generated", generated_dir=str(root), games_per_type=1),
                               num_tasks=3, num_batches=2, full_response_tokens=[128], b_max=[4],
                               concurrency_sweep=[1, 4], seed=42)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    contexts = alfworld_contexts(tokenizer, cfg, workers=2)
    assert len(contexts) == 6
    fast_texts = [tokenizer.decode(fast) for fast, _ in contexts]
    full_texts = [tokenizer.decode(full) for _, full in contexts]
    assert len(set(fast_texts)) == 6  # six different games
    assert all("<think>" in t and "reference" not in t.lower() for t in full_texts)
    assert all("<think>" not in t.split("<|im_start|>assistant")[0] and "admissible" in t for t in fast_texts)
    assert all(len(full) > len(fast) for fast, full in contexts)

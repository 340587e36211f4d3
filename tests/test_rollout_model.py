"""The rollout benchmark's step model against the paper's closed forms (Prop. 1, Eq. 8 and Eq. 24)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
from rollout_model import attainable_rate, rate_at, simulate_batch  # noqa: E402

# Overlap is free when the decode rate grows linearly with concurrency: every step takes 1 / 100 s.
FREE_OVERLAP = {1: 100.0, 1024: 102_400.0}


@pytest.mark.parametrize("turns,fast,full", [(1, 16, 128), (4, 16, 128), (4, 16, 512), (10, 8, 64)])
def test_free_overlap_reproduces_proposition_1(turns, fast, full):
    kw = dict(num_tasks=16, turns=turns, fast_tokens=fast, full_tokens=full, b_max=1024, rates=FREE_OVERLAP)
    vanilla = simulate_batch("vanilla", policy="wait", **kw)
    actfirst = simulate_batch("actfirst", policy="preempt", **kw)
    assert vanilla == pytest.approx(turns * full / 100)  # T l_full
    assert actfirst == pytest.approx(((turns - 1) * fast + full) / 100)  # (T - 1) l_fast + l_full
    assert vanilla / actfirst == pytest.approx(turns * full / ((turns - 1) * fast + full))  # Eq. 8


def test_a_tight_cap_serializes_the_work():
    # b_max = 1: ActFirst's N T (l_fast + l_full) slot time runs one request at a time (Eq. 24 with equality).
    kw = dict(num_tasks=3, turns=2, fast_tokens=4, full_tokens=10, b_max=1, rates=FREE_OVERLAP)
    assert simulate_batch("actfirst", policy="wait", **kw) == pytest.approx(3 * 2 * (4 + 10) / 100)
    assert simulate_batch("vanilla", policy="wait", **kw) == pytest.approx(3 * 2 * 10 / 100)


def test_rates_interpolate_and_cap():
    rates = {1: 100.0, 16: 1000.0, 64: 2000.0}
    assert rate_at(rates, 40) == pytest.approx(1500.0)
    assert rate_at(rates, 500) == 2000.0
    assert attainable_rate(rates, 32) == pytest.approx(1000 + 1000 * 16 / 48)

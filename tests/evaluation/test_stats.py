"""``actfirst.evaluation.stats`` against independent computations: the Student t quantile against ``scipy.stats`` and
the t distribution's closed forms, the Wilson interval against its float64 textbook formula on random inputs, the
paired ratio's t interval on a hand example, and the bootstrap against the hand-written resampling the comparison
used before ``scipy.stats.bootstrap`` (the same resamples, so stored tables keep their figures). The worked examples
of the difference intervals are in tests/test_eval.py, the comparison's use of these in tests/test_compare.py."""

import math
import os
import random

import numpy as np
import pytest
import scipy.special
import scipy.stats

from actfirst.evaluation.stats import (
    normal_quantile,
    paired_ratio,
    speedup_interval,
    t_quantile,
    wilson_interval,
)

Z95, Z90 = 1.959963984540054, 1.6448536269514722
"""The standard normal 97.5% and 95% quantiles (tables), written out rather than computed."""


def test_normal_quantile():
    assert normal_quantile() == Z95 and normal_quantile(0.90) == pytest.approx(Z90, rel=1e-15)
    for level in (0.0, 1.0, 95.0):
        with pytest.raises(ValueError, match=f"level={level}"):
            normal_quantile(level)


@pytest.mark.parametrize("df", [1, 2, 5, 30, 1000])
@pytest.mark.parametrize("p", [0.95, 0.975, 0.995])
def test_t_quantile_against_scipy_and_the_t_cdf(df, p):
    t = t_quantile(p, df)
    assert t == pytest.approx(scipy.stats.t.ppf(p, df), rel=1e-14)
    # The t CDF through the regularized incomplete beta function: 1 - I_{df / (df + t^2)}(df / 2, 1 / 2) / 2.
    assert 1 - scipy.special.betainc(df / 2, 0.5, df / (df + t * t)) / 2 == pytest.approx(p, rel=1e-13)
    assert t > scipy.stats.norm.ppf(p)  # heavier tails than the normal at every df


def test_t_quantile_closed_forms():
    for p in (0.9, 0.95, 0.975, 0.995):
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-12)  # Cauchy
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-12)
    assert t_quantile(0.975, 10**7) == pytest.approx(Z95, rel=1e-6)  # the normal limit
    for p, df in ((0.5, 3), (1.0, 3), (0.975, 0)):
        with pytest.raises(ValueError, match=f"p={p}, df={df}"):
            t_quantile(p, df)


def wilson_by_hand(k: int, n: int, z: float) -> tuple[float, float]:
    """(2np + z^2 -+ z sqrt(z^2 + 4np(1 - p))) / (2(n + z^2)), in float64."""
    p = np.float64(k) / n
    root = z * np.sqrt(z * z + 4 * n * p * (1 - p))
    return float((2 * n * p + z * z - root) / (2 * (n + z * z))), float((2 * n * p + z * z + root) / (2 * (n + z * z)))


def test_wilson_against_the_hand_formula():
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    cases = [(0, 1), (1, 1), (0, 96), (96, 96), (0, 5000), (5000, 5000)]
    for _ in range(300):
        n = rng.randrange(1, 2000)
        cases += [(rng.randrange(0, n + 1), n), (0, n), (n, n)]
    print(f"seed {seed}: {len(cases)} cases, first random ones {cases[6:12]}")
    for level, z in ((0.95, Z95), (0.90, Z90)):
        for k, n in cases:
            lo, hi = wilson_interval(k, n, level)
            hand_lo, hand_hi = wilson_by_hand(k, n, z)
            assert (lo, hi) == pytest.approx((hand_lo, hand_hi), rel=1e-12, abs=1e-15), (seed, k, n, level)
            assert 0.0 <= lo <= k / n <= hi <= 1.0, (seed, k, n, level)
            if k == 0:
                assert lo == 0.0 and hi == pytest.approx(z * z / (n + z * z), rel=1e-12)
            if k == n:
                assert hi == 1.0 and lo == pytest.approx(n / (n + z * z), rel=1e-12)
    assert wilson_interval(3, 10, 0.90)[1] < wilson_interval(3, 10)[1]  # a lower level, a narrower interval
    assert all(math.isnan(x) for x in wilson_interval(0, 0))
    for k, n in ((-1, 5), (6, 5)):
        with pytest.raises(ValueError, match=f"successes={k}: must be in \\[0, n={n}\\]"):
            wilson_interval(k, n)


def test_paired_ratio_by_hand():
    # Ratios 2, 4, 8 over three seeds: log ratios ln2 (1, 2, 3), mean 2 ln2 (ratio 4, their geometric mean), SD ln2;
    # the 95% interval 4 * 2^(-+ t_{0.975, 2} / sqrt(3)), t_{0.975, 2} = 0.95 / sqrt(2 * 0.975 * 0.025).
    result = paired_ratio({0: 200.0, 1: 400.0, 2: 800.0, 9: 1.0}, {0: 100.0, 1: 100.0, 2: 100.0})
    t2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)
    assert result["seeds"] == [0, 1, 2]  # seed 9 is not paired
    assert result["ratio"] == pytest.approx(4.0, rel=1e-14)
    assert result["log_sd"] == pytest.approx(math.log(2), rel=1e-14)
    assert result["log_ratios"] == pytest.approx([math.log(2), math.log(4), math.log(8)], rel=1e-14)
    assert result["ci95"] == pytest.approx([4 * 2 ** (-t2 / math.sqrt(3)), 4 * 2 ** (t2 / math.sqrt(3))], rel=1e-12)
    assert result["ci95"] == pytest.approx([0.7149, 22.380], abs=5e-4)
    # At 90%: t_{0.95, 2} = 0.9 / sqrt(2 * 0.95 * 0.05); two seeds (2 and 8): SD ln2 sqrt(2), t_{0.975, 1} the Cauchy's.
    narrow = paired_ratio({0: 200.0, 1: 400.0, 2: 800.0}, {0: 100.0, 1: 100.0, 2: 100.0}, level=0.90)
    t2_90 = 0.9 / math.sqrt(2 * 0.95 * 0.05)
    assert narrow["ci95"] == pytest.approx([4 * 2 ** (-t2_90 / math.sqrt(3)), 4 * 2 ** (t2_90 / math.sqrt(3))],
                                           rel=1e-12)
    two = paired_ratio({0: 200.0, 1: 800.0}, {0: 100.0, 1: 100.0})
    t1 = math.tan(0.475 * math.pi)
    assert two["ci95"] == pytest.approx([4 * 2 ** -t1, 4 * 2 ** t1], rel=1e-12)
    # One seed: a ratio, no interval; a non-positive figure or no common seed: nothing.
    assert paired_ratio({0: 300.0}, {0: 100.0}) == {"ratio": pytest.approx(3.0), "ci95": None, "seeds": [0],
                                                     "log_ratios": [pytest.approx(math.log(3))], "log_sd": None}
    assert paired_ratio({0: 300.0, 1: 0.0}, {0: 100.0, 1: 100.0})["ratio"] is None
    assert paired_ratio({0: 300.0}, {1: 100.0})["ratio"] is None


def test_bootstrap_resamples_as_before():
    """``scipy.stats.bootstrap`` draws each sample's resamples as the comparison's own code drew them (one
    ``integers(0, n, (resamples, n))`` per sample from one generator): the interval is the percentiles of those
    ratios of means."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")
    data_rng = np.random.default_rng(seed)
    for _ in range(5):
        baseline, method = (list(data_rng.uniform(50, 600, data_rng.integers(2, 9))) for _ in range(2))
        for resamples, boot_seed in ((10_000, 0), (2_000, 7)):
            rng = np.random.default_rng(boot_seed)
            means = [np.asarray(x)[rng.integers(0, len(x), (resamples, len(x)))].mean(axis=1)
                     for x in (baseline, method)]
            expected = np.percentile(means[0] / means[1], [2.5, 97.5])
            got = speedup_interval(baseline, method, resamples=resamples, seed=boot_seed)
            assert got == pytest.approx(expected, rel=1e-12), (seed, baseline, method)
    assert speedup_interval([1.0, 2.0], [3.0]) is None

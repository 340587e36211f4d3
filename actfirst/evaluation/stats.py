"""Every interval and summary statistic the project reports, as plain functions of numbers (quantiles from
``scipy.stats``):

- :func:`mean_sd`: mean and sample SD across seeds (Eq. 34).
- :func:`wilson_interval`: a binomial proportion's score interval (Wilson 1927): the evaluation report's pooled SR
  interval.
- :func:`difference_interval`: two independent proportions' difference (Newcombe 1998, method 10 for independent
  proportions); :func:`paired_difference_interval`: two proportions measured on the same units (Newcombe 1998,
  method 10 for paired data): the SR change of a training run.
- :func:`t_quantile` and :func:`paired_ratio`: a ratio of paired positive figures (per seed) as exp of the mean log
  ratio with its Student t interval: the comparison's speedups.
- :func:`speedup_interval`: the percentile bootstrap of a ratio of two independent samples' means, the speedups'
  cross-check.

Every interval is two-sided at ``level`` (default :data:`CONFIDENCE`); the normal and t quantiles are
``scipy.stats.norm.ppf`` and ``scipy.stats.t.ppf``, the bootstrap ``scipy.stats.bootstrap``. scipy is imported where
it is used: the commands that start environment workers import this module, and each worker, a spawned process, runs
the command's module again (``tests/test_command_imports.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

CONFIDENCE = 0.95
"""The level of every interval reported (two-sided)."""
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
"""The bootstrap's RNG seed: the same runs give the same interval."""


def normal_quantile(level: float = CONFIDENCE) -> float:
    """z of a two-sided ``level`` interval: the standard normal's (1 + level) / 2 quantile (1.959963984540054 at
    0.95)."""
    if not 0 < level < 1:
        raise ValueError(f"level={level}: must be in (0, 1)")
    import scipy.stats

    return float(scipy.stats.norm.ppf(0.5 + level / 2))


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (0.5 < p < 1) of Student's t with ``df`` >= 1 degrees of freedom (``scipy.stats.t.ppf``)."""
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"t_quantile(p={p}, df={df}): needs 0.5 < p < 1 and df >= 1")
    import scipy.stats

    return float(scipy.stats.t.ppf(p, df))


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Eq. 34: the mean and the sample standard deviation (n - 1); NaNs for no values, the SD of one value NaN."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n == 1:
        return mean, math.nan
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def wilson_interval(successes: int, n: int, level: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval (Wilson, "Probable inference, the law of succession, and statistical inference",
    JASA 22, 209-212, 1927) of a binomial proportion, ``successes`` of ``n``, as proportions in [0, 1]; NaNs for
    n = 0. Exact at the edges: 0 of n has the lower bound 0, n of n the upper bound 1."""
    if not 0 <= successes <= n:
        raise ValueError(f"successes={successes}: must be in [0, n={n}]")
    if n == 0:
        return math.nan, math.nan
    z = normal_quantile(level)
    p = successes / n
    z2 = z * z
    denom = 1 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    return (0.0 if successes == 0 else max(0.0, center - half)), (1.0 if successes == n else min(1.0, center + half))


def difference_interval(successes_a: int, n_a: int, successes_b: int, n_b: int,
                        level: float = CONFIDENCE) -> tuple[float, float, float]:
    """The difference p_b - p_a of two independent binomial proportions with its confidence interval, as
    proportions: (difference, low, high); NaNs when either sample is empty.

    Newcombe's hybrid score interval from the two Wilson intervals (method 10 of "Interval estimation for the
    difference between independent proportions: comparison of eleven methods", Statistics in Medicine 17, 873-890,
    1998). For two evaluations of one student on the same tasks and seeds the samples are paired and positively
    correlated, so this interval is conservative there (:func:`paired_difference_interval` is the one to use)."""
    if n_a == 0 or n_b == 0:
        return math.nan, math.nan, math.nan
    p_a, p_b = successes_a / n_a, successes_b / n_b
    lo_a, hi_a = wilson_interval(successes_a, n_a, level)
    lo_b, hi_b = wilson_interval(successes_b, n_b, level)
    d = p_b - p_a
    return d, d - math.sqrt((p_b - lo_b) ** 2 + (hi_a - p_a) ** 2), d + math.sqrt((hi_b - p_b) ** 2 + (p_a - lo_a) ** 2)


def paired_difference_interval(both: int, first_only: int, second_only: int, neither: int,
                               level: float = CONFIDENCE) -> tuple[float, float, float]:
    """The difference p_2 - p_1 of two proportions measured on the same n units (a paired 2x2 table: ``both``
    succeeded in the two measurements, ``first_only``, ``second_only``, ``neither``) with its confidence interval,
    as proportions: (difference, low, high); NaNs for an empty table.

    Newcombe's method 10 ("Improved confidence intervals for the difference between binomial proportions based on
    paired data", Statistics in Medicine 17, 2635-2650, 1998), the square-and-add interval of Fagerland, Lydersen
    and Laake (*Statistical Analysis of Contingency Tables*, 2017, Ch. 8): the two Wilson intervals combined with
    the correlation phi of the two margins, whose numerator AD - BC is continuity-corrected (reduced by n/2 when it
    exceeds n/2, zero in [0, n/2], kept when negative); phi is 0 when a margin is empty."""
    n = both + first_only + second_only + neither
    if min(both, first_only, second_only, neither) < 0:
        raise ValueError(f"paired table ({both}, {first_only}, {second_only}, {neither}): counts must be >= 0")
    if n == 0:
        return math.nan, math.nan, math.nan
    first, second = both + first_only, both + second_only  # successes in each measurement
    p_1, p_2 = first / n, second / n
    lo_1, hi_1 = wilson_interval(first, n, level)
    lo_2, hi_2 = wilson_interval(second, n, level)
    margins = first * (n - first) * second * (n - second)
    cross = both * neither - first_only * second_only
    corrected = cross - n / 2 if cross > n / 2 else (0.0 if cross >= 0 else cross)
    phi = corrected / math.sqrt(margins) if margins > 0 else 0.0
    d = p_2 - p_1
    below = (p_2 - lo_2) ** 2 + (hi_1 - p_1) ** 2 - 2 * phi * (p_2 - lo_2) * (hi_1 - p_1)
    above = (hi_2 - p_2) ** 2 + (p_1 - lo_1) ** 2 - 2 * phi * (hi_2 - p_2) * (p_1 - lo_1)
    return d, d - math.sqrt(max(below, 0.0)), d + math.sqrt(max(above, 0.0))


def paired_ratio(baseline: Mapping[int, float], method: Mapping[int, float], *,
                 level: float = CONFIDENCE) -> dict[str, Any]:
    """The paired ratio baseline / method over the keys (seeds) both hold: per seed the log ratio
    log(baseline / method), their mean m and sample SD s over n seeds; the ratio exp(m) and its Student t interval
    exp(m -+ t_{(1 + level) / 2, n - 1} s / sqrt(n)) under "ci95" (None with fewer than two seeds). With a seed
    whose figure is not positive, or no common seed, the ratio is None too."""
    seeds = sorted(set(baseline) & set(method))
    logs = [math.log(baseline[k] / method[k]) for k in seeds if baseline[k] > 0 and method[k] > 0]
    if len(logs) != len(seeds) or not seeds:
        return {"ratio": None, "ci95": None, "seeds": seeds, "log_ratios": logs, "log_sd": None}
    mean = math.fsum(logs) / len(logs)
    if len(logs) < 2:
        return {"ratio": math.exp(mean), "ci95": None, "seeds": seeds, "log_ratios": logs, "log_sd": None}
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
    half = t_quantile(0.5 + level / 2, len(logs) - 1) * sd / math.sqrt(len(logs))
    return {"ratio": math.exp(mean), "ci95": [math.exp(mean - half), math.exp(mean + half)], "seeds": seeds,
            "log_ratios": logs, "log_sd": sd}


def speedup_interval(baseline: Sequence[float], method: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES,
                     seed: int = BOOTSTRAP_SEED, level: float = CONFIDENCE) -> list[float] | None:
    """The percentile-bootstrap interval (``scipy.stats.bootstrap``, ``resamples`` resamples from an RNG seeded
    with ``seed``) of mean(baseline) / mean(method), each sample resampled with replacement on its own (unpaired; too
    narrow with few seeds: a cross-check beside :func:`paired_ratio`); None when either has fewer than two values."""
    if min(len(baseline), len(method)) < 2:
        return None
    import scipy.stats

    def ratio_of_means(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        return x.mean(axis=axis) / y.mean(axis=axis)

    result = scipy.stats.bootstrap((np.asarray(baseline, dtype=float), np.asarray(method, dtype=float)),
                                   ratio_of_means, n_resamples=resamples, confidence_level=level,
                                   method="percentile", paired=False, vectorized=True,
                                   rng=np.random.default_rng(seed))
    return [float(result.confidence_interval.low), float(result.confidence_interval.high)]

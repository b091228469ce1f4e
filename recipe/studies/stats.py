"""Across-seed statistics for the studies: Student's t quantiles, a mean with its 95% interval, a paired difference,
and the power calculation. Pure python (no scipy: neither environment ships it).

For n values x_1..x_n (one per seed; for a paired comparison, d_s = x_s(method A) - x_s(method B) at the same seed):

    mean = sum(x) / n,   sd = sqrt(sum((x - mean)^2) / (n - 1)),   se = sd / sqrt(n)
    95% interval = mean -/+ t(0.975, n - 1) * se          (Student's t, n - 1 degrees of freedom)
    standardised effect dz = mean / sd                      (Cohen's d for paired data)

Power (two-sided test at level alpha, power 1 - beta, n seeds, per-seed sd of the difference sigma): the smallest
true mean difference the study detects is

    mde(n) = (t(1 - alpha/2, n - 1) + t(1 - beta, n - 1)) * sigma / sqrt(n)

and the seeds needed for a meaningful difference delta are the smallest n with mde(n) <= delta (the usual
approximation that ignores the noncentrality of the t distribution; it errs by well under one seed for n >= 8).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def t_cdf(x: float, df: int) -> float:
    """P(T <= x) for Student's t with `df` degrees of freedom: through the regularized incomplete beta function,
    I_{df/(df+x^2)}(df/2, 1/2) = P(|T| > |x|), evaluated by its continued fraction (Numerical Recipes' betacf form,
    written from the formula)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if x == 0:
        return 0.5
    tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + x * x))
    return 1.0 - tail if x > 0 else tail


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) for 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def t_quantile(p: float, df: int) -> float:
    """x with P(T <= x) = p for Student's t with `df` degrees of freedom (bisection on t_cdf to 1e-12);
    t_quantile(0.975, 11) = 2.2010, t_quantile(0.975, 1) = 12.706."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-12:
            break
    return 0.5 * (low + high)


def summary(values: Sequence[float], level: float = 0.95) -> dict:
    """n, mean, sd, se, the `level` interval (low, high) by Student's t, and dz = mean / sd of per-seed values.
    With one value: sd, se, interval and dz are None (no spread to estimate)."""
    values = [float(v) for v in values]
    n = len(values)
    if n == 0:
        raise ValueError("summary of no values")
    mean = sum(values) / n
    if n < 2:
        return {"n": 1, "mean": mean, "sd": None, "se": None, "low": None, "high": None, "dz": None}
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    se = sd / math.sqrt(n)
    half = t_quantile(0.5 + level / 2.0, n - 1) * se
    return {"n": n, "mean": mean, "sd": sd, "se": se, "low": mean - half, "high": mean + half,
            "dz": mean / sd if sd > 0 else None}


def paired(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict:
    """`summary` of the per-seed differences a_s - b_s (the two lists in seed order, same length)."""
    if len(a) != len(b):
        raise ValueError(f"paired values need one of each per seed: {len(a)} vs {len(b)}")
    return summary([x - y for x, y in zip(a, b)], level)


def verdict(interval: dict) -> str:
    """'above 0', 'below 0' or 'includes 0': where the interval lies ('one seed' with no interval)."""
    if interval["low"] is None:
        return "one seed"
    if interval["low"] > 0:
        return "above 0"
    if interval["high"] < 0:
        return "below 0"
    return "includes 0"


def minimum_detectable(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """mde(n) of the module docstring: the smallest true mean difference a two-sided test at `alpha` detects with
    probability `power`, given the per-seed sd of the difference."""
    if n < 2:
        raise ValueError(f"need n >= 2 seeds, got {n}")
    return (t_quantile(1.0 - alpha / 2.0, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n)


def seeds_needed(sd: float, delta: float, alpha: float = 0.05, power: float = 0.8, most: int = 1000) -> int | None:
    """The smallest n >= 2 with minimum_detectable(sd, n) <= delta; None when `most` seeds are not enough."""
    if delta <= 0:
        raise ValueError(f"the meaningful difference must be > 0, got {delta}")
    for n in range(2, most + 1):
        if minimum_detectable(sd, n, alpha, power) <= delta:
            return n
    return None

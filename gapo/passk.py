"""pass@k by the unbiased estimator, coverage and solve-rate distributions: pure python, no torch.

For a problem with n samples of which c are correct, the unbiased estimate of pass@k (the chance that
at least one of k samples drawn without replacement is correct) is

    pass@k = 1 - C(n - c, k) / C(n, k)

It is computed exactly, in integers: (C(n, k) - C(n - c, k)) / C(n, k) with ``math.comb`` (Python's
integers do not overflow, and dividing two integers rounds once, correctly), so pass@256 of n = 256 is
the float nearest the true value. Floats of the binomials would overflow for n in the hundreds
(C(256, 128) ~ 5.8e75 still fits, C(1100, 550) does not), and a product of k rounded factors drifts by a
few ulps. A benchmark's pass@k is the mean over its problems, also summed exactly (:func:`mean_pass_at_k`).

Coverage (the paper's "problems above a 5% solve rate") counts problems with c / n > threshold. The
threshold only means something when n resolves it: a problem needs at least
:func:`min_successes` (n, threshold) = floor(threshold * n) + 1 successes. At n = 16 and 5% that is 1
(1/16 = 6.25% > 5%), so coverage@5% is just "problems solved at least once" (pass@16 > 0); at n = 64 it
is 4 (3/64 = 4.7% is not above 5%). :func:`coverage_resolution` says which case a run is in.

Used by the evaluator (:mod:`eval.report`) and by the trainer's validation metrics
(:func:`passk_metrics`, logged as ``val-passk/<data_source>/...``).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from fractions import Fraction

DEFAULT_COVERAGE_THRESHOLD = 0.05
RECOMMENDED_MIN_SUCCESSES = 3  # coverage should need a few successes, not one lucky sample (docs/evaluation.md)


def _check(n: int, c: int, k: int) -> tuple[int, int, int]:
    if isinstance(n, bool) or isinstance(c, bool) or isinstance(k, bool):
        raise TypeError("n, c, k must be integers, not booleans")
    n, c, k = int(n), int(c), int(k)
    if n < 1:
        raise ValueError(f"need at least one sample, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"correct count c={c} outside [0, n={n}]")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} outside [1, n={n}]: pass@k needs at least k samples per problem")
    return n, c, k


def pass_at_k_exact(n: int, c: int, k: int) -> Fraction:
    """Unbiased pass@k of one problem as an exact fraction: 1 - C(n - c, k) / C(n, k)."""
    n, c, k = _check(n, c, k)
    total = math.comb(n, k)
    return Fraction(total - math.comb(n - c, k), total)  # comb(m, k) = 0 for m < k


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` correct out of ``n`` samples.

    The float nearest the exact value (one rounding of an integer ratio; see the module docstring).

    Raises:
        ValueError: unless 1 <= k <= n and 0 <= c <= n.
    """
    n, c, k = _check(n, c, k)
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    total = math.comb(n, k)
    return (total - math.comb(n - c, k)) / total


def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself when it is not a power of two."""
    if n < 1:
        raise ValueError(f"need n >= 1, got {n}")
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    if ks[-1] != n:
        ks.append(n)
    return ks


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """Mean over problems of pass@k, ``counts`` = one ``(n, c)`` per problem (NaN for no problem).

    Summed as exact fractions (one denominator C(n, k) per distinct n), rounded once at the end.
    """
    numerators: dict[int, int] = defaultdict(int)
    problems = 0
    for n, c in counts:
        n, c, k = _check(n, c, k)
        total = math.comb(n, k)
        numerators[n] += total - math.comb(n - c, k)
        problems += 1
    if not problems:
        return float("nan")
    exact = sum((Fraction(num, math.comb(n, k)) for n, num in numerators.items()), Fraction(0))
    return float(exact / problems)


def min_successes(n: int, threshold: float = DEFAULT_COVERAGE_THRESHOLD) -> int:
    """Fewest successes out of ``n`` that count as covered (solve rate c / n strictly above ``threshold``);
    ``n + 1`` when none does."""
    return next((c for c in range(n + 1) if c / n > threshold), n + 1)


def coverage_resolution(n: int, threshold: float = DEFAULT_COVERAGE_THRESHOLD) -> dict:
    """How well ``n`` samples resolve the coverage threshold.

    Returns ``{"n", "threshold", "min_successes", "degenerate", "recommended_n"}``: ``degenerate`` when one
    success already counts (1 / n > threshold: coverage is then "solved at least once", i.e. pass@n > 0);
    ``recommended_n``: the smallest power of two at which a problem needs at least
    :data:`RECOMMENDED_MIN_SUCCESSES` successes (64 for 5%).
    """
    need = min_successes(n, threshold)
    rec = 1
    while min_successes(rec, threshold) < RECOMMENDED_MIN_SUCCESSES and rec < 2**20:
        rec *= 2
    return {"n": n, "threshold": threshold, "min_successes": need, "degenerate": need <= 1, "recommended_n": rec}


def coverage_warning(n: int, threshold: float = DEFAULT_COVERAGE_THRESHOLD) -> str | None:
    """A one-line warning when ``n`` is too small for ``threshold`` (see :func:`coverage_resolution`), else None."""
    res = coverage_resolution(n, threshold)
    if res["min_successes"] >= RECOMMENDED_MIN_SUCCESSES:
        return None
    pct = f"{100 * threshold:g}%"
    what = ("any single success counts (1/{n} = {r:.2%} > {pct}), so it only counts problems solved at least once"
            .format(n=n, r=1 / n, pct=pct) if res["degenerate"] else
            f"{res['min_successes']} successes out of {n} already count")
    return (f"coverage@{pct} with n = {n}: {what}; use n >= {res['recommended_n']} "
            f"(a problem then needs >= {min_successes(res['recommended_n'], threshold)} successes)")


def spread(values: Sequence[float]) -> dict:
    """Mean, sample standard deviation (n - 1 denominator; None for fewer than two values), min and max."""
    vals = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return {"mean": None, "std": None, "min": None, "max": None, "count": 0}
    return {"mean": statistics.fmean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else None,
            "min": min(vals), "max": max(vals), "count": len(vals)}


def solve_rate_histogram(counts: Sequence[tuple[int, int]]) -> list[dict]:
    """Distribution of per-problem solve rates, exact: one entry per (c, n) from 0 to n for every n seen.

    Returns a list of ``{"solved": c, "of": n, "problems": count}`` sorted by rate, zero counts included.
    """
    tally: dict[tuple[int, int], int] = defaultdict(int)
    for n, c in counts:
        tally[(c, n)] += 1
    for n in {n for n, _ in counts}:
        for c in range(n + 1):
            tally.setdefault((c, n), 0)
    keys = sorted(tally, key=lambda cn: (cn[0] / cn[1], cn[1]))
    return [{"solved": c, "of": n, "problems": tally[(c, n)]} for c, n in keys]


def summarize(counts: Sequence[tuple[int, int]], ks: Sequence[int] | None = None,
              coverage_threshold: float = DEFAULT_COVERAGE_THRESHOLD) -> dict:
    """pass@k, coverage and the solve-rate distribution of one benchmark.

    Args:
        counts: one ``(n, c)`` per problem.
        ks: the k to report (default: :func:`default_ks` of the smallest n); each must be <= every n.
        coverage_threshold: a problem is covered when its solve rate c / n is strictly above this.

    Returns:
        ``{"problems", "samples", "n_min", "n_max", "pass@k": {k: value}, "coverage": {...},
        "solve_rate": {"mean", "unsolved", "all_solved", "histogram"}}`` (JSON-ready; keys of
        ``pass@k`` are strings).
    """
    counts = [(int(n), int(c)) for n, c in counts]
    if not counts:
        return {"problems": 0, "samples": 0, "pass@k": {}, "coverage": {"threshold": coverage_threshold,
                "problems": 0, "fraction": float("nan")}, "solve_rate": {"histogram": []}}
    n_min, n_max = min(n for n, _ in counts), max(n for n, _ in counts)
    ks = list(ks) if ks is not None else default_ks(n_min)
    if any(k > n_min for k in ks):
        raise ValueError(f"k={max(ks)} > {n_min} samples of some problem")
    rates = [c / n for n, c in counts]
    covered = sum(rate > coverage_threshold for rate in rates)
    return {
        "problems": len(counts),
        "samples": sum(n for n, _ in counts),
        "n_min": n_min,
        "n_max": n_max,
        "pass@k": {str(k): mean_pass_at_k(counts, k) for k in ks},
        "coverage": {"threshold": coverage_threshold, "problems": covered, "fraction": covered / len(counts),
                     "min_successes": min_successes(n_min, coverage_threshold)},
        "solve_rate": {
            "mean": sum(rates) / len(rates),
            "unsolved": sum(c == 0 for _, c in counts),
            "all_solved": sum(c == n for n, c in counts),
            "histogram": solve_rate_histogram(counts),
        },
    }


def group_counts(groups: Sequence, correct: Sequence[bool],
                 expected: dict | None = None) -> dict:
    """``{group: (n, c)}`` from per-sample group keys and verdicts.

    ``expected``, optional ``{group: n}``: samples that never came back (failed sessions) count as
    incorrect, so n is the number requested, not the number received.
    """
    n_of: dict = defaultdict(int)
    c_of: dict = defaultdict(int)
    for group, ok in zip(groups, correct, strict=True):
        n_of[group] += 1
        c_of[group] += bool(ok)
    if expected:
        for group, n in expected.items():
            n_of[group] = max(n_of[group], int(n))
    return {group: (n_of[group], c_of[group]) for group in n_of}


def passk_metrics(data_sources: Sequence[str], uids: Sequence, correct: Sequence[bool], *,
                  expected: dict | None = None, coverage_threshold: float = DEFAULT_COVERAGE_THRESHOLD,
                  prefix: str = "val-passk") -> dict[str, float]:
    """Flat metrics for a logger from per-sample (data_source, uid, correct), one group per benchmark.

    Names: ``{prefix}/{source}/pass@{k}`` for k = 1, 2, 4, ... <= the smallest group size,
    ``{prefix}/{source}/coverage@{threshold %}`` (problems above the threshold),
    ``.../coverage_frac@{threshold %}``, ``.../unsolved_frac``, ``.../all_solved_frac`` and ``.../problems``.
    ``expected``: ``{(data_source, uid): n}`` requested samples (missing ones count as incorrect).
    """
    keys = [(str(source), str(uid)) for source, uid in zip(data_sources, uids, strict=True)]
    expected = {(str(s), str(u)): n for (s, u), n in (expected or {}).items()}
    by_source: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for (source, _uid), nc in group_counts(keys, correct, expected).items():
        by_source[source].append(nc)
    pct = f"{100 * coverage_threshold:g}%"
    out: dict[str, float] = {}
    for source, counts in sorted(by_source.items()):
        s = summarize(counts, coverage_threshold=coverage_threshold)
        base = f"{prefix}/{source}"
        for k, value in s["pass@k"].items():
            out[f"{base}/pass@{k}"] = value
        out[f"{base}/coverage@{pct}"] = float(s["coverage"]["problems"])
        out[f"{base}/coverage_frac@{pct}"] = s["coverage"]["fraction"]
        out[f"{base}/unsolved_frac"] = s["solve_rate"]["unsolved"] / s["problems"]
        out[f"{base}/all_solved_frac"] = s["solve_rate"]["all_solved"] / s["problems"]
        out[f"{base}/problems"] = float(s["problems"])
    return out

"""The pass@k estimator (gapo/passk.py) against brute force, exact at n = 256; its summary, coverage threshold, and
the trainer's per-source metrics."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from gapo.passk import default_ks, group_counts, mean_pass_at_k, pass_at_k, passk_metrics, summarize
from tests.eval_helpers import brute_force_pass_at_k


@pytest.mark.parametrize("n", range(1, 9))
def test_estimator_matches_enumeration_of_all_subsets(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(brute_force_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


def test_estimator_edge_cases():
    assert pass_at_k(16, 0, 1) == 0.0 and pass_at_k(16, 0, 16) == 0.0
    assert pass_at_k(16, 16, 1) == 1.0 and pass_at_k(5, 5, 5) == 1.0
    assert pass_at_k(16, 13, 4) == 1.0  # n - c = 3 < k: every 4-subset has a correct sample
    assert pass_at_k(16, 1, 1) == pytest.approx(1 / 16)
    assert pass_at_k(16, 1, 16) == 1.0
    for bad in [(4, 1, 5), (4, 1, 0), (4, 5, 1), (4, -1, 1), (0, 0, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)
    with pytest.raises(TypeError):
        pass_at_k(4, True, 1)


def test_estimator_is_stable_for_large_n():
    # binomials of this size overflow a float; the product form stays exact to rounding
    n, c, k = 1000, 7, 300
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)
    assert 0.0 <= pass_at_k(5000, 1, 2500) <= 1.0


def test_default_ks_and_summary():
    assert default_ks(16) == [1, 2, 4, 8, 16]
    assert default_ks(12) == [1, 2, 4, 8, 12]
    assert default_ks(1) == [1]
    counts = [(4, 0), (4, 1), (4, 2), (4, 4)]
    s = summarize(counts, coverage_threshold=0.25)
    assert s["pass@k"]["1"] == pytest.approx((0 + 0.25 + 0.5 + 1) / 4)
    assert s["pass@k"]["4"] == pytest.approx(0.75)
    assert s["pass@k"]["2"] == pytest.approx(mean_pass_at_k(counts, 2))
    assert s["coverage"]["problems"] == 2  # strictly above 25%: c=2 and c=4
    assert [e["problems"] for e in s["solve_rate"]["histogram"]] == [1, 1, 1, 0, 1]
    assert s["solve_rate"]["unsolved"] == 1 and s["solve_rate"]["all_solved"] == 1
    with pytest.raises(ValueError):
        summarize(counts, ks=[8])


def test_passk_metrics_for_the_trainer_count_missing_sessions_as_wrong():
    sources = ["aime24"] * 4 + ["math500"] * 4
    uids = ["a", "a", "b", "b", "c", "c", "d", "d"]
    correct = [1, 0, 0, 0, 1, 1, 0, 1]
    m = passk_metrics(sources, uids, correct)
    assert m["val-passk/aime24/pass@1"] == pytest.approx(0.25)
    assert m["val-passk/aime24/pass@2"] == pytest.approx(0.5)
    assert m["val-passk/math500/pass@2"] == pytest.approx(1.0)
    assert m["val-passk/aime24/coverage@5%"] == 1.0 and m["val-passk/math500/coverage@5%"] == 2.0
    assert m["val-passk/aime24/unsolved_frac"] == 0.5
    assert "val-passk/aime24/pass@4" not in m
    # prompt "b" asked for 4 samples and one more prompt "e" came back with none
    expected = {("aime24", "a"): 2, ("aime24", "b"): 4, ("aime24", "e"): 2}
    assert group_counts(list(zip(sources[:4], uids[:4])), correct[:4], expected)[("aime24", "b")] == (4, 0)
    m = passk_metrics(sources[:4], uids[:4], correct[:4], expected=expected)
    assert m["val-passk/aime24/problems"] == 3
    assert m["val-passk/aime24/pass@1"] == pytest.approx((0.5 + 0 + 0) / 3)


def test_estimator_is_exact_at_n_256():
    """pass@k of n = 256 (the Qwen / Llama evaluations report pass@256) is the float nearest the exact
    fraction for every c and every reported k; the benchmark mean is rounded once from the exact sum."""
    from gapo.passk import pass_at_k_exact

    n = 256
    for k in default_ks(n):
        for c in range(n + 1):
            exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
            assert pass_at_k_exact(n, c, k) == exact
            assert pass_at_k(n, c, k) == float(exact), (c, k)
    counts = [(n, c) for c in (0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 256)] + [(255, 1), (300, 7)]
    for k in (1, 16, 64, 128, 255):
        exact = sum(1 - Fraction(math.comb(m - c, k), math.comb(m, k)) for m, c in counts) / len(counts)
        assert mean_pass_at_k(counts, k) == float(exact), k
    assert pass_at_k(1100, 1, 550) == 0.5  # C(1100, 550) overflows a float; the integer ratio does not


def test_coverage_threshold_needs_enough_samples():
    """5% at n = 16: one success (6.25%) already counts. At n = 64 a problem needs 4 (3/64 = 4.7% does not)."""
    from gapo.passk import coverage_resolution, coverage_warning, min_successes

    assert summarize([(16, 1)])["coverage"]["problems"] == 1
    assert summarize([(64, 3)])["coverage"]["problems"] == 0
    assert summarize([(64, 4)])["coverage"]["problems"] == 1
    assert (min_successes(16, 0.05), min_successes(20, 0.05), min_successes(64, 0.05)) == (1, 2, 4)
    assert coverage_resolution(16)["degenerate"] and not coverage_resolution(64)["degenerate"]
    assert coverage_resolution(16)["recommended_n"] == 64
    assert "any single success counts (1/16 = 6.25% > 5%)" in coverage_warning(16, 0.05)
    assert "use n >= 64" in coverage_warning(16, 0.05) and coverage_warning(64, 0.05) is None
    assert coverage_warning(16, 0.2) is None  # 4/16 needed: fine
    s = summarize([(16, 1), (16, 0)], coverage_threshold=0.1)
    assert s["coverage"]["problems"] == 0 and s["coverage"]["min_successes"] == 2

"""The paper's correlation between per-c importance-ratio deviation and advantage (gapo/diagnostics.py, and the
trainer's `diagnostics_from_sums`): known values, the degenerate cases (undefined, never NaN), the window."""

import math
import statistics

import pytest

from gapo.diagnostics import (
    IS_ADV_CORR,
    IS_ADV_CORR_LEVELS,
    IS_ADV_CORR_WINDOW,
    IS_ADV_CORR_WINDOW_POINTS,
    CorrelationWindow,
    pearson,
    step_correlation,
)

# --- Pearson on constructed points ----------------------------------------------------------------------------


def test_proportional_points_give_one_and_reversed_minus_one():
    xs = [0.3, 0.2, 0.1, 0.05]
    assert pearson([(x, 2.5 * x) for x in xs]) == pytest.approx(1.0)
    assert pearson([(x, 1 - 3 * x) for x in xs]) == pytest.approx(-1.0)


def test_hand_computed_non_linear_set():
    # x = 1, 2, 3, y = x^2: dx = (-1, 0, 1), dy = (-11/3, -2/3, 13/3), sum dx dy = 8, sum dx^2 = 2,
    # sum dy^2 = 294 / 9, so r = 8 / sqrt(2 * 294 / 9) = 12 / (7 sqrt 3).
    points = [(1.0, 1.0), (2.0, 4.0), (3.0, 9.0)]
    assert pearson(points) == pytest.approx(12 / (7 * math.sqrt(3)), rel=1e-12)
    assert pearson(points) == pytest.approx(statistics.correlation([1, 2, 3], [1, 4, 9]), rel=1e-12)


def test_uncorrelated_points_give_zero_not_undefined():
    # symmetric: y = (x - 1.5)^2 shape, sum dx dy = 0
    assert pearson([(0.0, 1.0), (1.0, 0.0), (2.0, 0.0), (3.0, 1.0)]) == 0.0


def test_paper_like_levels():
    # k = 8 Dr.GRPO advantages (k - c) / k at c = 1, 3, 5, 7 with ratio deviations shrinking unevenly in c
    x = [0.0031, 0.0024, 0.0011, 0.0009]
    y = [7 / 8, 5 / 8, 3 / 8, 1 / 8]
    assert pearson(list(zip(x, y))) == pytest.approx(statistics.correlation(x, y), rel=1e-12)


@pytest.mark.parametrize("points", [
    [],
    [(0.1, 0.875)],  # one c present
    [(0.1, 0.875), (0.1, 0.5), (0.1, 0.125)],  # constant ratios
    [(0.0, 0.875), (0.0, 0.5)],  # on-policy: every ratio exactly 1
    [(0.1, 0.875), (0.1 + 1e-8, 0.5), (0.1 - 1e-8, 0.125)],  # equal up to float32 rounding of a ratio near 1
    [(0.3, 0.5), (0.1, 0.5)],  # constant advantage
    [(0.3, 0.5), (float("nan"), 0.25)],
    [(0.3, 0.5), (float("inf"), 0.25)],
], ids=["none", "one_c", "constant_ratios", "on_policy", "float32_rounding", "constant_advantage", "nan", "inf"])
def test_degenerate_points_give_no_value(points):
    assert pearson(points) is None
    out = step_correlation(points)
    assert out == {IS_ADV_CORR_LEVELS: float(len(points))}  # the count explains the absence; nothing is NaN


def test_small_but_real_deviations_are_not_constant():
    # R1's clips: ratio deviations ~1e-4, different per c by ~1e-5: far above float32 rounding, r defined
    points = [(1.2e-4, 0.875), (1.0e-4, 0.5), (0.9e-4, 0.125)]
    assert pearson(points) == pytest.approx(statistics.correlation([1.2e-4, 1.0e-4, 0.9e-4], [0.875, 0.5, 0.125]))


def test_step_correlation_reports_levels_and_r():
    assert step_correlation([(0.2, 0.75), (0.1, 0.25)]) == {IS_ADV_CORR_LEVELS: 2.0, IS_ADV_CORR: pytest.approx(1.0)}


# --- the window ------------------------------------------------------------------------------------------------


def test_window_pools_exactly_the_latest_steps():
    window = CorrelationWindow(2)
    # step 1 alone: r = 1
    out = window.add([(1.0, 1.0), (2.0, 2.0)])
    assert out == {IS_ADV_CORR_WINDOW_POINTS: 2.0, IS_ADV_CORR_WINDOW: pytest.approx(1.0)}
    # steps 1 + 2: (1, 1), (2, 2), (3, 1): dx = (-1, 0, 1), dy = (-1/3, 2/3, -1/3), sum dx dy = 0 -> r = 0
    out = window.add([(3.0, 1.0)])
    assert out == {IS_ADV_CORR_WINDOW_POINTS: 3.0, IS_ADV_CORR_WINDOW: pytest.approx(0.0, abs=1e-12)}
    # steps 2 + 3: step 1 left the window: (3, 1), (4, 2) -> r = 1; had it stayed, the four points give 1/sqrt(5)
    assert window.add([(4.0, 2.0)]) == {IS_ADV_CORR_WINDOW_POINTS: 2.0, IS_ADV_CORR_WINDOW: pytest.approx(1.0)}
    assert pearson([(1.0, 1.0), (2.0, 2.0), (3.0, 1.0), (4.0, 2.0)]) == pytest.approx(1 / math.sqrt(5))
    # a step without points still takes its place: steps 3 + 4 hold one point, r undefined
    assert window.add([]) == {IS_ADV_CORR_WINDOW_POINTS: 1.0}


def test_window_of_one_repeats_the_step_value():
    window = CorrelationWindow(1)
    points = [(0.3, 0.875), (0.25, 0.625), (0.1, 0.125)]
    assert window.add(points)[IS_ADV_CORR_WINDOW] == pytest.approx(pearson(points))
    assert window.add([(0.1, 0.5)]) == {IS_ADV_CORR_WINDOW_POINTS: 1.0}


@pytest.mark.parametrize("size", [0, -1, 1.5, True])
def test_window_size_must_be_a_positive_integer(size):
    with pytest.raises(ValueError, match="integer >= 1"):
        CorrelationWindow(size)


# --- from the loss's per-c sums (the trainer's diagnostics_from_sums) ------------------------------------------


def _sums(levels: dict[int, tuple[float, float, float]], k: int = 4) -> dict[str, float]:
    """The loss's raw sums for c = 1 .. k as the trainer receives them; levels: c -> (tokens, ratio_dev, advantage)."""
    out = {"actor/gapo_sums/eps_high_sum": 0.0, "actor/gapo_sums/positive_rollouts": 0.0}
    for c in range(1, k + 1):
        tokens, ratio_dev, advantage = levels.get(c, (0.0, 0.0, 0.0))
        out.update({f"actor/gapo_sums/c{c}/clipped": 0.0, f"actor/gapo_sums/c{c}/ratio_dev": ratio_dev,
                    f"actor/gapo_sums/c{c}/tokens": tokens, f"actor/gapo_sums/c{c}/rollouts": 1.0 if tokens else 0.0,
                    f"actor/gapo_sums/c{c}/advantage": advantage})
    return out


def test_diagnostics_give_per_c_advantage_and_the_step_correlation():
    from gapo.clip_diagnostics import diagnostics_from_sums, is_adv_points

    # c = 1: 10 tokens, mean |ratio - 1| 0.3, mean A 0.75; c = 2: 4 tokens, 0.1, 0.5; c = 3: 5 tokens, 0.2, 0.25
    out = diagnostics_from_sums(_sums({1: (10.0, 3.0, 7.5), 2: (4.0, 0.4, 2.0), 3: (5.0, 1.0, 1.25)}))
    assert out["gapo/adv_pos/c1"] == pytest.approx(0.75) and out["gapo/adv_pos/c3"] == pytest.approx(0.25)
    points = is_adv_points(out)
    assert [x for x, _ in points] == pytest.approx([0.3, 0.1, 0.2])  # by c
    assert [y for _, y in points] == pytest.approx([0.75, 0.5, 0.25])
    assert out[IS_ADV_CORR_LEVELS] == 3
    assert out[IS_ADV_CORR] == pytest.approx(statistics.correlation([0.3, 0.1, 0.2], [0.75, 0.5, 0.25]))
    assert "gapo/adv_pos/c4" not in out  # absent c: no point


@pytest.mark.parametrize("levels, count", [
    ({2: (6.0, 0.6, 3.0)}, 1),  # one c present
    ({1: (10.0, 1.0, 7.5), 2: (4.0, 0.4, 2.0), 3: (5.0, 0.5, 1.25)}, 3),  # constant ratios (0.1 everywhere)
    ({}, 0),  # no success with a positive advantage this step
])
def test_diagnostics_leave_an_undefined_correlation_out(levels, count):
    from gapo.clip_diagnostics import diagnostics_from_sums

    out = diagnostics_from_sums(_sums(levels))
    assert IS_ADV_CORR not in out and out[IS_ADV_CORR_LEVELS] == count
    assert all(math.isfinite(v) for v in out.values())


def test_without_sums_there_are_no_correlation_metrics():
    from gapo.clip_diagnostics import diagnostics_from_sums

    assert diagnostics_from_sums({"actor/pg_clipfrac": 0.1}) == {}  # diagnostics off, or a baseline loss

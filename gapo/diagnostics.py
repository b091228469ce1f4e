"""The paper's correlation between per-c importance-ratio deviation and advantage, per step and windowed (pure python).

For the successes with a positive advantage, the trainer has per group success count c (c = 1 .. k) the
token-weighted means (exact over the step, from the loss's per-c sums):
    x_c = mean |ratio - 1|    (`gapo/ratio_dev_pos/c{c}`)
    y_c = mean advantage      (`gapo/adv_pos/c{c}`)
One step gives one point (x_c, y_c) per c present. The diagnostic is their Pearson correlation, unweighted
(every c level present counts once, however many rollouts it has: the paper's question is whether the
ratios of the rare, high-advantage successes move more than those of the common ones, not how the rollouts
are spread over c):
    `gapo/is_adv_corr`         r over this step's points;
    `gapo/is_adv_corr_window`  r over the pooled points of the latest W steps (W = `policy_loss.diag_corr_window`).
The paper reports the windowed value: GAPO stays above ~0.8, fixed-clip baselines collapse late in training.

r is undefined (and then not logged, never NaN) with fewer than 2 points, or when all x or all y are equal
(e.g. on-policy ratios, all exactly 1); the point counts are logged beside it so that an absence is explained:
`gapo/is_adv_corr_levels` (c levels present this step) and `gapo/is_adv_corr_window_points`.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Iterable, Optional, Sequence

IS_ADV_CORR = "gapo/is_adv_corr"
IS_ADV_CORR_LEVELS = "gapo/is_adv_corr_levels"
IS_ADV_CORR_WINDOW = "gapo/is_adv_corr_window"
IS_ADV_CORR_WINDOW_POINTS = "gapo/is_adv_corr_window_points"

# Values whose spread (max - min) is at most this times max(1, largest |value|) count as equal: the x_c are
# float32 means of |ratio - 1|, and float32 rounding of a ratio near 1 (spacing 1.2e-7) must not make a
# correlation out of ratios that are all the same.
CONSTANT_TOL = 1e-6

Point = tuple[float, float]  # (x_c, y_c): mean |ratio - 1| and mean advantage at one success count c


def is_constant(values: Sequence[float]) -> bool:
    """True when the values are all equal up to CONSTANT_TOL * max(1, max |value|) (see above)."""
    scale = max(1.0, max(abs(v) for v in values))
    return max(values) - min(values) <= CONSTANT_TOL * scale


def pearson(points: Sequence[Point]) -> Optional[float]:
    """Unweighted Pearson correlation of n (x, y) points, or None where it is undefined.

        r = sum_i (x_i - mx) (y_i - my) / sqrt(sum_i (x_i - mx)^2 * sum_i (y_i - my)^2),   mx, my the means

    Args:
        points: n pairs (x_i, y_i) of floats.

    Returns:
        r in [-1, 1] (clamped against rounding), or None when n < 2, a value is not finite, or the x or the y
        are constant (`is_constant`): then r is 0 / 0.
    """
    if len(points) < 2:
        return None
    xs, ys = [float(x) for x, _ in points], [float(y) for _, y in points]
    if not all(math.isfinite(v) for v in (*xs, *ys)) or is_constant(xs) or is_constant(ys):
        return None
    mx, my = math.fsum(xs) / len(xs), math.fsum(ys) / len(ys)
    dx, dy = [x - mx for x in xs], [y - my for y in ys]
    sxx, syy = math.fsum(d * d for d in dx), math.fsum(d * d for d in dy)
    if sxx <= 0 or syy <= 0:
        return None
    r = math.fsum(a * b for a, b in zip(dx, dy)) / math.sqrt(sxx * syy)
    return min(1.0, max(-1.0, r))


def step_correlation(points: Sequence[Point]) -> dict[str, float]:
    """One step's `gapo/is_adv_corr_levels` (len(points)) and, where defined, `gapo/is_adv_corr`."""
    out = {IS_ADV_CORR_LEVELS: float(len(points))}
    r = pearson(points)
    if r is not None:
        out[IS_ADV_CORR] = r
    return out


class CorrelationWindow:
    """`gapo/is_adv_corr_window`: Pearson r over the pooled per-c points of the latest ``size`` steps.

    ``add(points)`` records one step's points (a step with none still takes its place in the window) and returns
    ``gapo/is_adv_corr_window_points`` (the pooled count) and, where defined (see `pearson`),
    ``gapo/is_adv_corr_window``. The same c in two steps gives two points. The window lives in the driver
    (GAPOTrainer) and restarts with the process: it is not checkpointed, so after a resume it pools fewer steps
    until ``size`` more have run.
    """

    def __init__(self, size: int):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"the correlation window must be an integer >= 1 (steps), got {size!r}")
        self.size = size
        self.steps: deque[list[Point]] = deque(maxlen=size)

    def add(self, points: Iterable[Point]) -> dict[str, float]:
        """Record one step's (x, y) points; returns the pooled count and, where defined, the window's Pearson r."""
        self.steps.append([(float(x), float(y)) for x, y in points])
        pooled = [point for step in self.steps for point in step]
        out = {IS_ADV_CORR_WINDOW_POINTS: float(len(pooled))}
        r = pearson(pooled)
        if r is not None:
            out[IS_ADV_CORR_WINDOW] = r
        return out

"""The GAPO trainer's actor-update hook: the per-step IS-deviation / advantage correlation and its window of steps."""

import math
import statistics

import pytest
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from gapo.diagnostics import CorrelationWindow
from gapo.verl_plugin.trainer import GAPOTrainer

# --- the trainer's hook: gapo/is_adv_corr per step and over its window -------------------------------------------

def _loss_sums(levels: dict[int, tuple[float, float]], k: int = 4, tokens: float = 5.0) -> dict[str, float]:
    """One step's raw sums as verl hands them to the trainer; levels: c -> (mean |ratio - 1|, mean advantage)."""
    out = {"actor/gapo_sums/eps_high_sum": 0.0, "actor/gapo_sums/positive_rollouts": 0.0, "actor/pg_clipfrac": 0.0}
    for c in range(1, k + 1):
        x, y = levels.get(c, (0.0, 0.0))
        n = tokens if c in levels else 0.0
        out.update({f"actor/gapo_sums/c{c}/clipped": 0.0, f"actor/gapo_sums/c{c}/ratio_dev": x * n,
                    f"actor/gapo_sums/c{c}/tokens": n, f"actor/gapo_sums/c{c}/rollouts": float(c in levels),
                    f"actor/gapo_sums/c{c}/advantage": y * n})
    return out


def test_update_actor_logs_the_step_correlation_and_a_window_of_steps(monkeypatch):
    steps = iter([
        _loss_sums({1: (0.3, 0.75), 2: (0.1, 0.5)}),
        _loss_sums({3: (0.2, 0.25)}),  # one c: no step value, the window still has one
        {"actor/pg_clipfrac": 0.0},  # no sums (diagnostics off): the window is left alone
        _loss_sums({1: (0.4, 0.75), 3: (0.1, 0.25)}),
    ])

    def verl_update_actor(self, batch, metrics):  # stands in for verl's actor update: the worker's reduced metrics
        metrics.update(next(steps))
        return batch

    monkeypatch.setattr(PPOTrainerSync, "_update_actor", verl_update_actor)
    trainer = object.__new__(GAPOTrainer)  # no workers or Ray: only the hook under test
    trainer._is_adv_window = CorrelationWindow(2)
    logged = []
    for _ in range(4):
        metrics = {}
        assert trainer._update_actor("batch", metrics) == "batch"
        logged.append(metrics)

    assert all(not key.startswith("actor/gapo_sums/") for m in logged for key in m)  # the raw sums are consumed
    assert all(math.isfinite(v) for m in logged for v in m.values())
    first, second, off, fourth = logged
    assert first["gapo/is_adv_corr"] == pytest.approx(1.0) and first["gapo/is_adv_corr_levels"] == 2
    assert first["gapo/is_adv_corr_window"] == pytest.approx(1.0) and first["gapo/is_adv_corr_window_points"] == 2
    assert "gapo/is_adv_corr" not in second and second["gapo/is_adv_corr_levels"] == 1
    pooled = statistics.correlation([0.3, 0.1, 0.2], [0.75, 0.5, 0.25])  # steps 1 and 2
    assert second["gapo/is_adv_corr_window"] == pytest.approx(pooled)
    assert not any(key.startswith("gapo/") for key in off)
    # steps 2 and 4 (the off step did not count): step 1 has left the window of 2
    assert fourth["gapo/is_adv_corr"] == pytest.approx(1.0)
    assert fourth["gapo/is_adv_corr_window_points"] == 3
    pooled = statistics.correlation([0.2, 0.4, 0.1], [0.25, 0.75, 0.25])  # steps 2 and 4
    assert fourth["gapo/is_adv_corr_window"] == pytest.approx(pooled)

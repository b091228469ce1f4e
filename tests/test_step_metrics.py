"""gapo.step_metrics: the trainer's metrics besides GAPO's clip diagnostics (reward extra fields, validation pass@k)."""

import numpy as np
import pytest

from gapo.step_metrics import reward_extra_metrics


def test_reward_extra_metrics_average_numeric_fields_over_the_rollouts_that_have_them():
    rows = [
        {"reward_extra_info": {"acc": True, "timeout": 0, "format_ok": 1.0, "pred": "42"}},
        {"reward_extra_info": {"acc": False, "timeout": 1, "format_ok": np.float32(0.5)}},
        {"reward_extra_info": {"acc": True, "format_ok": 0.0}},  # no timeout field: not counted as 0
        {},  # a rollout without reward_extra_info
        "not a dict",
    ]
    out = reward_extra_metrics(rows)
    assert out == {
        "reward/acc/mean": pytest.approx(2 / 3),
        "reward/timeout/mean": pytest.approx(0.5),
        "reward/format_ok/mean": pytest.approx(0.5),
    }
    assert "reward/pred/mean" not in out  # strings are not averaged
    assert reward_extra_metrics([]) == {}

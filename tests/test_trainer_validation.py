"""The trainer's validation pass@k metrics (gapo/verl_plugin/trainer.py): the hook, the configured coverage
threshold, the mean and spread over the latest validations, and the start-up check of those knobs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_trainer_validation_hook_adds_passk_metrics():
    from gapo.step_metrics import val_passk_metrics
    from gapo.verl_plugin.trainer import GAPOTrainer

    assert "_val_metrics_update" in GAPOTrainer.__dict__
    infos = {"reward": [1.0, 0.0, 0.0, 1.0], "acc": [True, False, None, None]}
    m = val_passk_metrics(["s"] * 4, ["u", "u", "v", "v"], infos, {("s", "u"): 2, ("s", "v"): 2}, 0.5)
    assert m["val-passk/s/pass@1"] == pytest.approx(0.5)  # acc where given, else reward > 0.5
    assert m["val-passk/s/pass@2"] == pytest.approx(1.0)


def test_training_validation_uses_the_configured_coverage_threshold(monkeypatch):
    from types import SimpleNamespace

    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from gapo.step_metrics import val_passk_metrics
    from gapo.verl_plugin.trainer import GAPOTrainer

    infos = {"reward": [1.0] + [0.0] * 15 + [1.0] * 2 + [0.0] * 14, "acc": None}
    sources, uids = ["s"] * 32, ["u"] * 16 + ["v"] * 16
    default = val_passk_metrics(sources, uids, infos)
    assert default["val-passk/s/coverage@5%"] == 2.0  # 1/16 and 2/16 are both above 5%
    m = val_passk_metrics(sources, uids, infos, coverage_threshold=0.1)
    assert m["val-passk/s/coverage@10%"] == 1.0 and "val-passk/s/coverage@5%" not in m
    with pytest.raises(ValueError, match="val_coverage_threshold"):
        val_passk_metrics(sources, uids, infos, coverage_threshold=5)

    monkeypatch.setattr(PPOTrainerSync, "_val_metrics_update", lambda self, *a, **kw: {}, raising=False)
    trainer = GAPOTrainer.__new__(GAPOTrainer)
    trainer._gapo = SimpleNamespace(success_threshold=0.5)
    trainer.config = OmegaConf.create({"trainer": {"val_coverage_threshold": 0.1}})
    assert trainer._val_metrics_update(sources, uids, infos, None)["val-passk/s/coverage@10%"] == 1.0
    trainer.config = OmegaConf.create({"trainer": {}})
    assert trainer._val_metrics_update(sources, uids, infos, None)["val-passk/s/coverage@5%"] == 2.0


def test_training_validation_logs_the_mean_and_spread_over_its_latest_validations(monkeypatch):
    """val-passk-window/*: mean and sample std over the latest trainer.val_window validations, per source and
    metric; the oldest validation leaves the window."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from gapo.verl_plugin.trainer import GAPOTrainer

    monkeypatch.setattr(PPOTrainerSync, "_val_metrics_update", lambda self, *a, **kw: {}, raising=False)
    trainer = GAPOTrainer.__new__(GAPOTrainer)
    trainer._gapo = SimpleNamespace(success_threshold=0.5)
    trainer.config = OmegaConf.create({"trainer": {"val_coverage_threshold": 0.05, "val_window": 3}})

    def validation(successes: list[int]):  # one source, n = 4 samples per problem, successes per problem
        rewards = [float(i < c) for c in successes for i in range(4)]
        uids = [f"p{j}" for j, _ in enumerate(successes) for _ in range(4)]
        return trainer._val_metrics_update(["s"] * len(rewards), uids, {"reward": rewards}, None)

    covered = []
    for successes in ([0, 0, 1], [0, 2, 4], [1, 1, 0], [4, 4, 4]):  # coverage@5%: 1, 2, 2, 3
        m = validation(successes)
        covered.append(sum(c > 0 for c in successes))
    last3 = covered[-3:]  # [2, 2, 3]: the first validation (1) has left the window
    mean = sum(last3) / 3
    std = (sum((v - mean) ** 2 for v in last3) / 2) ** 0.5
    assert m["val-passk-window/size"] == 3
    assert m["val-passk-window/s/coverage@5%/mean"] == pytest.approx(mean)
    assert m["val-passk-window/s/coverage@5%/std"] == pytest.approx(std)
    # pass@1 per validation: mean over problems of c / 4
    p1 = [sum(c / 4 for c in s) / 3 for s in ([0, 2, 4], [1, 1, 0], [4, 4, 4])]
    assert m["val-passk-window/s/pass@1/mean"] == pytest.approx(sum(p1) / 3)
    assert not any(k.startswith("val-passk-window/") and "unsolved" in k for k in m)


@pytest.mark.parametrize("key, value, message", [
    ("val_coverage_threshold", 5, "trainer.val_coverage_threshold=5: a solve rate in"),
    ("val_coverage_threshold", "x", "trainer.val_coverage_threshold='x'"),
    ("val_window", 0, "trainer.val_window=0: the number of latest validations"),
    ("val_window", 2.5, "trainer.val_window=2.5"),
])
def test_validation_knobs_are_checked_at_start_up(key, value, message):
    from hydra import compose, initialize_config_dir

    from gapo.verl_plugin.validate import GAPOConfigError, validate_gapo_config

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose("gapo_trainer", overrides=[f"trainer.{key}={value}"])
    with pytest.raises(GAPOConfigError, match=re.escape(message)):
        validate_gapo_config(cfg)

"""End to end on CPU: verl's real trainer (Ray, FSDP2 actor, HF rollout groups, reward, GAPO loss) trains two
steps with a checkpoint each step, then a second run resumes from the checkpoint and trains step 3.
The same code path as `make smoke` (recipe/smoke.py), asserted in more detail."""

import pytest

from recipe.smoke import run_smoke


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    return run_smoke(tmp_path_factory.mktemp("smoke"), steps=2, resume_steps=1)


@pytest.mark.slow
def test_two_steps_checkpoint_then_resume(smoke):
    assert sorted(smoke["run1"]) == [1, 2] and sorted(smoke["run2"]) == [3]
    ckpt = smoke["ckpt_dir"]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    for step in (1, 2, 3):
        assert (ckpt / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt").exists()
    log = (ckpt.parent / "logs" / "run2.log").read_text()
    assert f"Resuming from {ckpt}/global_step_2, setting global step to 2" in log
    assert "Loaded model from" in log and "Loaded optimizer from" in log


@pytest.mark.slow
def test_per_rollout_thresholds_reached_the_loss(smoke):
    for step, m in {**smoke["run1"], **smoke["run2"]}.items():
        # The driver's thresholds for correct rollouts of mixed groups and the mean the loss used inside the
        # FSDP update (positive-advantage rollouts) are the same set: they must agree.
        assert m["gapo/loss_eps_high_mean"] == pytest.approx(m["gapo/eps_high/mean"], rel=1e-5), step
        assert 0.02 <= m["gapo/eps_high/min"] <= m["gapo/eps_high/mean"] <= m["gapo/eps_high/max"] <= 0.05 + 1e-7
        assert 0 < m["gapo/groups/mixed_frac"] <= 1 and m["gapo/groups/size_mean"] == 8
        # The reward's extra fields reach the training metrics (the smoke reward's acc equals its score).
        assert m["reward/acc/mean"] == pytest.approx(m["critic/score/mean"]), step
        # Weight sync to the HF rollout server is right: rollout and actor log-probs agree.
        assert m["training/rollout_probs_diff_max"] < 1e-4


@pytest.mark.slow
def test_clipping_binds_and_diagnostics_are_logged_per_success_count(smoke):
    metrics = {**smoke["run1"], **smoke["run2"]}
    clip = {k: v for m in metrics.values() for k, v in m.items() if k.startswith("gapo/clipfrac_pos/c")}
    dev = [k for m in metrics.values() for k in m if k.startswith("gapo/ratio_dev_pos/c")]
    assert clip and dev and any(v > 0 for v in clip.values())
    assert all(0 <= v <= 1 for v in clip.values())
    assert any(m["actor/pg_clipfrac"] > 0 for m in metrics.values())

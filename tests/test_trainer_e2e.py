"""End to end on CPU: verl's real trainer (Ray, FSDP2 actor at world size 2, HF rollout groups, reward, GAPO loss)
trains two steps with a checkpoint each step, then resumed runs train steps 3 and 4 from the checkpoints (the runs
before them are killed, inside a save and inside a step: tests/cluster_runs.py, checked in tests/test_cluster_e2e.py
and tests/test_kill_resume.py).
The same code path as `make smoke` (recipe/smoke.py), asserted in more detail.

The GAPO metrics are checked against an independent computation from verl's own rollout dump
(`trainer.rollout_data_dir`: one `{step}.jsonl` per step, written by verl's v1 trainer, not by GAPO code):
groups, success counts and thresholds are recomputed here in plain python from each rollout's TransferQueue
key and sequence score, so a bug in the trainer's grouping or row selection cannot pass unnoticed."""

import json
from collections import Counter
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.fixture(scope="module")
def smoke(smoke_run):
    """The session's smoke run (tests/conftest.py): 2 steps, a checkpoint each step, resumes to steps 3 and 4."""
    return smoke_run


@pytest.fixture(scope="module")
def clips():
    """(eps_low, eps_high_max, success_threshold) as the smoke preset configures them."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose("smoke_cpu")
    actor = cfg.actor_rollout_ref.actor
    loss = actor.policy_loss
    assert loss.loss_mode == "gapo" and loss.schedule == "linear"  # the formula below is the linear schedule
    assert actor.clip_ratio_low is not None and loss.eps_high_max is not None
    return float(actor.clip_ratio_low), float(loss.eps_high_max), float(loss.success_threshold)


def read_rollouts(path: Path) -> list[tuple[str, float]]:
    """(TransferQueue key `{uid}_{session}_{index}`, sequence score) per rollout of one step's dump."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(row["uid"], float(row["score"])) for row in rows]


def expected_metrics(rollouts: list[tuple[str, float]], eps_low: float, eps_high_max: float,
                     threshold: float) -> dict[str, float]:
    """The step's GAPO metrics recomputed from its rollouts (real ones only; verl's padding rows have uid pad...).

    Group metrics are per group (each prompt once, whatever its size): fractions of the groups, the mean group size
    and the mean success rate c / k over groups.
    Thresholds are over the successes of mixed groups: eps_low + (eps_high_max - eps_low) * (k - c) / (k - 1).
    """
    keys = [key for key, _ in rollouts]
    assert len(set(keys)) == len(keys), "duplicate rollout keys in the dump"
    real = [(key.rsplit("_", 2)[0], score) for key, score in rollouts if not key.startswith("pad")]
    k = Counter(uid for uid, _ in real)
    c = Counter(uid for uid, score in real if score > threshold)
    eps = [eps_low + (eps_high_max - eps_low) * (k[uid] - c[uid]) / (k[uid] - 1)
           for uid, score in real if score > threshold and 0 < c[uid] < k[uid]]
    assert eps, "no success in a mixed group: nothing to check the thresholds on"
    mean = sum(eps) / len(eps)
    groups = len(k)
    return {
        "gapo/groups/mixed_frac": sum(0 < c[uid] < k[uid] for uid in k) / groups,
        "gapo/groups/all_correct_frac": sum(c[uid] == k[uid] for uid in k) / groups,
        "gapo/groups/all_wrong_frac": sum(c[uid] == 0 for uid in k) / groups,
        "gapo/groups/success_rate_mean": sum(c[uid] / k[uid] for uid in k) / groups,
        "gapo/groups/size_mean": sum(k.values()) / groups,
        "gapo/eps_high/mean": mean,
        "gapo/eps_high/min": min(eps),
        "gapo/eps_high/max": max(eps),
        # the loss's mean over success rollouts with positive advantage (binary rewards: the same set)
        "gapo/loss_eps_high_mean": mean,
    }


@pytest.mark.slow
def test_two_steps_checkpoint_then_resume(smoke):
    assert sorted(smoke["run1"]) == [1, 2] and sorted(smoke["run2"]) == [3] and sorted(smoke["run3"]) == [4]
    ckpt = smoke["ckpt_dir"]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    world = smoke["world_size"]  # the session's run trains at the cluster shape (tests/cluster_runs.py)
    for step in (1, 2, 3, 4):
        for rank in range(world):
            assert (ckpt / f"global_step_{step}" / "actor" / f"model_world_size_{world}_rank_{rank}.pt").exists()
    for run, resumed in (("run2", 2), ("run3", 3)):
        log = (ckpt.parent / "logs" / f"{run}.log").read_text(errors="replace")
        assert f"Resuming from {ckpt}/global_step_{resumed}, setting global step to {resumed}" in log, run
        assert "Loaded model from" in log and "Loaded optimizer from" in log, run


@pytest.mark.slow
def test_per_rollout_thresholds_reached_the_loss(smoke, clips):
    eps_low, eps_high_max, threshold = clips
    metrics = smoke["metrics"]
    assert sorted(p.name for p in smoke["rollout_dir"].glob("*.jsonl")) == [f"{s}.jsonl" for s in sorted(metrics)]
    for step, m in metrics.items():
        rollouts = read_rollouts(smoke["rollout_dir"] / f"{step}.jsonl")
        expected = expected_metrics(rollouts, eps_low, eps_high_max, threshold)
        # The smoke preset: 8 prompts x k = 8 rollouts per step, binary scores.
        assert sum(not key.startswith("pad") for key, _ in rollouts) == 64, step
        assert {score for _, score in rollouts} <= {0.0, 1.0}, step
        # Mean score over the real rollouts is verl's critic/score/mean (dump and metrics are the same step).
        real_scores = [score for key, score in rollouts if not key.startswith("pad")]
        assert m["critic/score/mean"] == pytest.approx(sum(real_scores) / len(real_scores), rel=1e-5), step
        for name, value in expected.items():
            assert m[name] == pytest.approx(value, rel=1e-5, abs=1e-7), (step, name, m[name], value)
        assert 0 < m["gapo/groups/mixed_frac"] <= 1
        # The reward's extra fields reach the training metrics (the smoke reward's acc equals its score).
        assert m["reward/acc/mean"] == pytest.approx(m["critic/score/mean"]), step
        # Weight sync to the HF rollout server is right: rollout and actor log-probs agree.
        assert m["training/rollout_probs_diff_max"] < 1e-4


@pytest.mark.slow
def test_clipping_binds_and_diagnostics_are_logged_per_success_count(smoke):
    metrics = smoke["metrics"]
    clip = {k: v for m in metrics.values() for k, v in m.items() if k.startswith("gapo/clipfrac_pos/c")}
    dev = [k for m in metrics.values() for k in m if k.startswith("gapo/ratio_dev_pos/c")]
    assert clip and dev and any(v > 0 for v in clip.values())
    assert all(0 <= v <= 1 for v in clip.values())
    assert any(m["actor/pg_clipfrac"] > 0 for m in metrics.values())
    # The IS-deviation / advantage correlation reaches the logs: its counts every step, r in [-1, 1] where defined.
    for step, m in metrics.items():
        levels = sum(k.startswith("gapo/ratio_dev_pos/c") for k in m)
        assert m["gapo/is_adv_corr_levels"] == levels == sum(k.startswith("gapo/adv_pos/c") for k in m), step
        assert all(-1 <= m[k] <= 1 for k in ("gapo/is_adv_corr", "gapo/is_adv_corr_window") if k in m), step
    # The window (default 10 steps) pools steps 1 and 2, and restarts with each resumed process (steps 3 and 4).
    run1 = smoke["run1"]
    levels = [run1[step]["gapo/is_adv_corr_levels"] for step in (1, 2)]
    assert run1[2]["gapo/is_adv_corr_window_points"] == sum(levels)
    for run, step in (("run2", 3), ("run3", 4)):
        assert smoke[run][step]["gapo/is_adv_corr_window_points"] == smoke[run][step]["gapo/is_adv_corr_levels"]

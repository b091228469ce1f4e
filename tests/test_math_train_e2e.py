"""End to end on CPU: one step of the real trainer with the math reward, the tiny model and the repo's math
fixtures prepared by the real data pipeline, validation on two eval sets before training. The random model
scores 0; the point is that the reward path runs and its extra fields reach the logged metrics."""

import subprocess
import sys

import pytest

from gapo.smoke.tiny_model import build_tiny_model
from recipe.smoke import ROOT, read_metrics, train


@pytest.fixture(scope="module")
def math_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("math")
    build_tiny_model(out / "model")
    data = out / "data"
    subprocess.run([sys.executable, "-m", "gapo.data.prepare_math", "--dataset", "all",
                    "--source", str(ROOT / "tests/fixtures/math"), "--out", str(data)], check=True, cwd=ROOT)
    overrides = [
        f"data.train_files={data}/deepscaler.parquet",
        f"data.val_files=[{data}/aime24.parquet,{data}/math500.parquet]",
        "data.train_batch_size=2", "data.max_prompt_length=512", "data.max_response_length=16",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.val_kwargs.n=2", "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        "reward.custom_reward_function.path=pkg://gapo.rewards",
        "actor_rollout_ref.actor.policy_loss.mask_truncated=true",
        "trainer.val_before_train=true", "trainer.save_freq=-1", "trainer.project_name=gapo_math_cpu",
    ]
    return read_metrics(train(out, "math", 1, overrides)["metrics_file"])


@pytest.mark.slow
def test_math_reward_runs_in_the_trainer_and_logs_its_fields(math_run):
    train_step = math_run[1]
    assert train_step["critic/score/mean"] == 0.0  # a random char-level model never boxes a right answer
    for key in ("reward/acc/mean", "reward/format_error/mean", "reward/timeout/mean"):
        assert key in train_step, f"{key} missing: the math reward's extra fields did not reach the metrics"
    assert train_step["reward/timeout/mean"] == 0.0
    assert train_step["reward/format_error/mean"] > 0  # no \\boxed{} in random text: a format failure
    # overlong filtering found the truncated responses (data.max_response_length = 16 tokens). verl's
    # response_length/clip_ratio counts responses as long as the batch's padded width
    # (verl/trainer/ppo/metric_utils.py: responses.shape[-1]), which is the configured limit only when some
    # response reached it; otherwise it counts the longest responses, which were not cut.
    if train_step["response_length/max"] >= 16:
        assert train_step["gapo/truncated_frac"] == pytest.approx(train_step["response_length/clip_ratio"])
    else:
        assert train_step["gapo/truncated_frac"] == 0.0


@pytest.mark.slow
def test_validation_reports_per_benchmark_metrics(math_run):
    val = math_run[0]  # validation before training is logged at step 0
    for source in ("aime24", "math500"):
        assert any(k.startswith("val-") and f"/{source}/" in k for k in val), sorted(val)[:20]
        # the evaluator's metrics from the val_kwargs.n = 2 samples per prompt (GAPOTrainer._val_metrics_update)
        for name in ("pass@1", "pass@2", "coverage@5%", "problems"):
            assert f"val-passk/{source}/{name}" in val, sorted(k for k in val if k.startswith("val-passk"))
        assert val[f"val-passk/{source}/pass@2"] == 0.0  # the random model solves nothing

"""One verl step with the real pretrained model (CI's reduced check of `make learn`, docs/learn.md): SmolLM2-135M-
Instruct through verl's trainer on the CPU platform with the learning preset (configs/learn_cpu.yaml, GAPO at
sequence level, the batched hf rollout, packed sequences), rewards computed on the real model's own outputs.
A smaller batch than `make learn` (1 prompt x 2 rollouts of 8 tokens) and no checkpoint: mostly the trainer's
start-up, ~2 min on 2 cores."""

from __future__ import annotations

import pytest

from gapo.arithmetic import write_splits

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def one_step(real_model, tmp_path_factory):
    from recipe.learn import train_verl

    out = tmp_path_factory.mktemp("learn")
    write_splits(out / "data", seed=0, n_train=16, n_heldout_per_bucket=1, n_transfer_per_bucket=0)
    small = ["data.train_batch_size=1", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
             "data.max_response_length=8", "trainer.save_freq=-1"]
    metrics, _ = train_verl(out, real_model, 1, small, "hf", timeout_s=900)
    return metrics


def test_one_verl_step_of_the_real_model(one_step):
    from recipe.learn import MAX_ROLLOUT_PROBS_DIFF, check_training

    assert sorted(one_step) == [1]
    m = one_step[1]
    check_training(one_step, 1, "verl")  # the rollout sampled from the actor's weights
    assert 0 < m["training/rollout_probs_diff_max"] < MAX_ROLLOUT_PROBS_DIFF  # real sums round differently
    assert 0.0 <= m["critic/score/mean"] <= 1.0
    assert m["response_length/mean"] > 1  # the real model wrote text, which the arithmetic reward scored
    # GAPO's group statistics and instruments (a batch of 2 x 4 may hold no success, so no threshold is asserted)
    assert "gapo/groups/mixed_frac" in m and "gapo/explore/entrance_distinct" in m
    assert m["timing_s/update_actor"] > 0 and m["timing_s/gen"] > 0

"""The focal F-GRPO/F-GSPO baseline: hand-computed advantages through verl's estimator registry."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

from gapo.groups import focal_weight
from gapo.verl_plugin.advantage import FocalAlgoConfig


def _run(scores, uids, gamma, norm=False):
    rewards = torch.zeros(len(scores), 3)
    rewards[:, -1] = torch.tensor(scores)  # outcome reward on the last token
    mask = torch.ones(len(scores), 3)
    config = OmegaConf.create({"norm_adv_by_std_in_grpo": norm, "focal_gamma": gamma, "focal_success_threshold": 0.5})
    adv, ret = get_adv_estimator_fn("focal_grpo")(token_level_rewards=rewards, response_mask=mask,
                                                   index=np.array(uids, dtype=object), config=config)
    torch.testing.assert_close(adv, ret)
    return adv[:, 0]


def test_hand_computed_dr_grpo_times_focal_weight():
    # group a: 1 of 4 correct -> A = 0.75 / -0.25, weight (1 - 1/4)^2 = 0.5625
    # group b: 3 of 4 correct -> A = 0.25 / -0.75, weight (1 - 3/4)^2 = 0.0625
    adv = _run([1, 0, 0, 0, 1, 1, 1, 0], ["a"] * 4 + ["b"] * 4, gamma=2.0)
    expected = [0.75 * 0.5625] + [-0.25 * 0.5625] * 3 + [0.25 * 0.0625] * 3 + [-0.75 * 0.0625]
    torch.testing.assert_close(adv, torch.tensor(expected))


def test_gamma_zero_is_verls_grpo():
    scores, uids = [1, 0, 1, 1, 0, 0], ["a"] * 3 + ["b"] * 3
    for norm in (False, True):
        rewards = torch.zeros(6, 2)
        rewards[:, -1] = torch.tensor(scores, dtype=torch.float32)
        ref, _ = get_adv_estimator_fn("grpo")(token_level_rewards=rewards, response_mask=torch.ones(6, 2),
                                             index=np.array(uids, dtype=object), norm_adv_by_std_in_grpo=norm,
                                             config=OmegaConf.create({"norm_adv_by_std_in_grpo": norm}))
        torch.testing.assert_close(_run(scores, uids, 0.0, norm), ref[:, 0])


def test_all_correct_groups_get_zero_weight_and_bad_gamma_is_rejected():
    assert focal_weight(torch.tensor([4.0]), torch.tensor([4.0]), 1.0).item() == 0.0
    with pytest.raises(ValueError, match="gamma must be >= 0"):
        focal_weight(torch.tensor([1.0]), torch.tensor([4.0]), -1.0)
    with pytest.raises(ValueError, match="algorithm.focal_gamma must be >= 0"):
        FocalAlgoConfig(focal_gamma=-0.5)

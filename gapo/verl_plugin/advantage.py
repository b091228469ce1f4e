"""Advantage-shaping baseline registered in verl: focal GRPO (`algorithm.adv_estimator=focal_grpo`).

F-GRPO (Plyusov et al., arXiv 2602.06717) scales each group's GRPO advantages by (1 - c / k) ** gamma, so
prompts the policy already solves often move it less. With the GSPO loss (`policy_loss.loss_mode=gspo`) it
is the focal F-GSPO baseline of the GAPO paper. The settings live on `FocalAlgoConfig`
(`algorithm._target_`): `focal_gamma`, `focal_success_threshold`.
"""

from dataclasses import dataclass

from verl.trainer.config import AlgoConfig
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, register_adv_est

from gapo.config import GAPOConfig
from gapo.groups import focal_weight, group_success_counts

FOCAL_ESTIMATOR = "focal_grpo"


@dataclass
class FocalAlgoConfig(AlgoConfig):
    """verl's algorithm settings plus the focal weight's.

    Attributes:
        focal_gamma: exponent of (1 - c / k); 0 gives plain GRPO. 1.0 here is our default, not a value we
            could verify from the GAPO paper's text: set it explicitly when reproducing a published run.
        focal_success_threshold: a rollout is a success when its sequence reward is greater than this
            (same convention and default as GAPO's `success_threshold`).
    """

    focal_gamma: float = 1.0
    focal_success_threshold: float = GAPOConfig.success_threshold

    def __post_init__(self):
        if not self.focal_gamma >= 0:
            raise ValueError(f"algorithm.focal_gamma must be >= 0, got {self.focal_gamma}")


@register_adv_est(FOCAL_ESTIMATOR)
def compute_focal_grpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, config=None, **kwargs):
    """GRPO outcome advantages (verl's own, honouring norm_adv_by_std_in_grpo) times (1 - c / k) ** gamma.

    Args:
        token_level_rewards, response_mask: (B, T); index: (B,) uids; config: the `algorithm` node.
    Returns:
        (advantages, returns), both (B, T).
    """
    gamma = config.get("focal_gamma", FocalAlgoConfig.focal_gamma)
    threshold = config.get("focal_success_threshold", FocalAlgoConfig.focal_success_threshold)
    advantages, _ = compute_grpo_outcome_advantage(
        token_level_rewards, response_mask, index, epsilon,
        norm_adv_by_std_in_grpo=config.get("norm_adv_by_std_in_grpo", True), config=config,
    )
    num_correct, group_size = group_success_counts(list(index), token_level_rewards.sum(-1), threshold)
    advantages = advantages * focal_weight(num_correct, group_size, gamma).to(advantages).unsqueeze(-1)
    return advantages, advantages

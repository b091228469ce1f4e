"""GAPOPolicyLossConfig: verl's PolicyLossConfig extended by GAPO's fields, so verl's config system accepts them.

verl rejects unknown keys under `actor_rollout_ref.actor.policy_loss`; pointing that node's `_target_` at
this class (configs/gapo_trainer.yaml does) makes GAPO's fields (`eps_high_max`, `schedule`, `success_threshold`,
`diagnostics`, `mask_truncated`, `diag_corr_window`) and the ported peers' (BAPO's `bapo_*`) valid keys. Their
defaults and validation come from `gapo.config.GAPOConfig` and `gapo.peers.bapo.BAPOConfig` alone.
"""

from dataclasses import dataclass

from verl.workers.config import PolicyLossConfig

from gapo.config import GAPOConfig
from gapo.peers.bapo import BAPOConfig


@dataclass
class GAPOPolicyLossConfig(PolicyLossConfig, GAPOConfig, BAPOConfig):
    """verl's policy-loss settings plus GAPO's (`gapo.config.GAPOConfig`) and BAPO's (`gapo.peers.bapo.BAPOConfig`)."""

    def __post_init__(self):
        GAPOConfig.__post_init__(self)
        self.validate_bapo()


def resolve_gapo_clips(actor, settings: GAPOConfig) -> tuple[float, float]:
    """(eps_low, eps_high_max) from an actor config (ActorConfig or its DictConfig node) and GAPO's settings.

    eps_low is verl's clip_ratio_low (falling back to clip_ratio, as verl's own losses do); eps_high_max is
    policy_loss.eps_high_max, or clip_ratio_high when that is null.
    """
    low, high = actor.get("clip_ratio_low"), actor.get("clip_ratio_high")
    return settings.resolve_clips(
        low if low is not None else actor.clip_ratio, high if high is not None else actor.clip_ratio
    )

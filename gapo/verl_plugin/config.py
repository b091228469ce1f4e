"""GAPOPolicyLossConfig: verl's PolicyLossConfig extended by GAPO's fields, so verl's config system accepts them.

verl rejects unknown keys under `actor_rollout_ref.actor.policy_loss`; pointing that node's `_target_` at
this class (configs/gapo_trainer.yaml does) makes `eps_high_max`, `schedule`, `success_threshold` and
`diagnostics` valid keys. Their defaults and validation come from `gapo.config.GAPOConfig` alone.
"""

from dataclasses import dataclass

from verl.workers.config import PolicyLossConfig

from gapo.config import GAPOConfig


@dataclass
class GAPOPolicyLossConfig(PolicyLossConfig, GAPOConfig):
    """verl's policy-loss settings plus GAPO's (see `gapo.config.GAPOConfig` for the GAPO attributes)."""

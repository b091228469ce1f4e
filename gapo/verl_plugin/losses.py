"""GAPO's policy losses in verl's registry (`gapo`: sequence level, `gapo_token`: token level) and the
actor-side loss callable that hands them each rollout's group statistics.

verl calls a registered policy loss with a fixed set of tensors (no uid, no group statistic). The
GAPO trainer (`gapo.verl_plugin.trainer`) writes each rollout's group success count c and group size k
into the batch (fields `gapo_num_correct`, `gapo_group_size`) and installs `GAPOActorLoss` as the
actor's loss callable (verl's `set_loss_fn` hook). For each micro-batch, `GAPOActorLoss` puts those two
(B,) tensors in a context variable and runs verl's own `ppo_loss`, which calls the registered loss; the
loss turns (c, k) into thresholds with `gapo.adaptive_eps_high` inside the FSDP actor update. Without
the GAPO trainer the context is empty and the loss stops with an error that names the fix.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, NamedTuple, Optional

import torch
from verl.trainer.ppo.core_algos import agg_loss, register_policy_loss
from verl.workers.utils.losses import ppo_loss

from gapo.config import GAPOConfig
from gapo.surrogate import (
    masked_rollout_mean,
    per_success_count_sums,
    sequence_clipped_surrogate,
    token_clipped_surrogate,
)
from gapo.threshold import adaptive_eps_high
from gapo.verl_plugin.config import resolve_gapo_clips

NUM_CORRECT_KEY = "gapo_num_correct"
GROUP_SIZE_KEY = "gapo_group_size"
GAPO_LOSS_MODES = ("gapo", "gapo_token")
# Prefix of the raw per-c sums the loss reports; the trainer turns them into gapo/* metrics.
SUMS_PREFIX = "gapo_sums"

MISSING_STATS_HELP = (
    "GAPO loss '{mode}' got no per-rollout group statistics: it needs the GAPO trainer, which computes each "
    "rollout's group success count and size. Start training with `python -m recipe.main_gapo` (it sets "
    "trainer.v1.trainer_mode=gapo), or set trainer.v1.trainer_mode=gapo; to train without GAPO pick another "
    "actor_rollout_ref.actor.policy_loss.loss_mode (e.g. gspo)."
)


class GroupStats(NamedTuple):
    """Per-rollout group statistics of one micro-batch, both (B,)."""

    num_correct: torch.Tensor
    group_size: torch.Tensor


_GROUP_STATS: contextvars.ContextVar[Optional[GroupStats]] = contextvars.ContextVar("gapo_group_stats", default=None)


@contextlib.contextmanager
def group_stats_context(num_correct: torch.Tensor, group_size: torch.Tensor):
    """Make (B,) group statistics visible to the registered GAPO losses called inside the block."""
    token = _GROUP_STATS.set(GroupStats(num_correct.reshape(-1), group_size.reshape(-1)))
    try:
        yield
    finally:
        _GROUP_STATS.reset(token)


class GAPOActorLoss:
    """Actor loss callable (verl's `fn(model_output, data, dp_group)` contract) that runs verl's `ppo_loss`
    with this micro-batch's group statistics in context. Picklable: the trainer ships it to every worker."""

    def __init__(self, actor_config):
        self.config = actor_config

    def __call__(self, model_output, data, dp_group=None):
        if NUM_CORRECT_KEY not in data.keys() or GROUP_SIZE_KEY not in data.keys():
            raise RuntimeError(
                f"the actor's micro-batch has no '{NUM_CORRECT_KEY}'/'{GROUP_SIZE_KEY}' fields: the GAPO trainer did "
                "not write them at advantage time (is trainer.v1.trainer_mode=gapo?)"
            )
        with group_stats_context(data[NUM_CORRECT_KEY], data[GROUP_SIZE_KEY]):
            return ppo_loss(self.config, model_output, data, dp_group)


def _gapo_settings(config, mode: str) -> GAPOConfig:
    policy_loss = config.policy_loss
    if not isinstance(policy_loss, GAPOConfig):
        raise TypeError(
            f"loss_mode '{mode}' needs GAPO's policy-loss config: set actor_rollout_ref.actor.policy_loss._target_="
            "gapo.verl_plugin.config.GAPOPolicyLossConfig (configs/gapo_trainer.yaml does)"
        )
    return policy_loss


def _gapo_policy_loss(mode, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights):
    stats = _GROUP_STATS.get()
    if stats is None:
        raise RuntimeError(MISSING_STATS_HELP.format(mode=mode))
    if stats.num_correct.shape[0] != log_prob.shape[0]:
        raise RuntimeError(f"group statistics for {stats.num_correct.shape[0]} rollouts, micro-batch of {log_prob.shape[0]}")
    settings = _gapo_settings(config, mode)
    eps_low, eps_high_max = resolve_gapo_clips(config, settings)

    num_correct = stats.num_correct.to(log_prob.device)
    eps_high_c = adaptive_eps_high(num_correct, stats.group_size.to(log_prob.device), eps_low, eps_high_max, settings.schedule)
    # Only correct rollouts (A > 0) get the adaptive bound; for A <= 0 the upper clip never binds anyway.
    positive = masked_rollout_mean(advantages, response_mask) > 0
    eps_high = torch.where(positive, eps_high_c.to(log_prob.dtype), torch.full_like(eps_high_c, eps_low, dtype=log_prob.dtype))

    if mode == "gapo":
        terms = sequence_clipped_surrogate(log_prob, old_log_prob, advantages, response_mask, eps_low, eps_high)
    else:
        terms = token_clipped_surrogate(
            log_prob, old_log_prob, advantages, response_mask, eps_low, eps_high, clip_ratio_c=config.get("clip_ratio_c", 3.0)
        )
    pg_losses = terms.loss if rollout_is_weights is None else terms.loss * rollout_is_weights
    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **config.global_batch_info)

    mask = response_mask.to(terms.ratio.dtype)
    n_tokens = mask.sum().clamp(min=1)
    metrics: dict[str, Any] = {
        "actor/pg_clipfrac": ((terms.clipped.to(mask.dtype) * mask).sum() / n_tokens).item(),
        "actor/ppo_kl": (-(terms.log_ratio * mask).sum() / n_tokens).item(),
        "actor/pg_clipfrac_lower": ((terms.dual_clipped.to(mask.dtype) * mask).sum() / n_tokens).item(),
    }
    if settings.diagnostics:
        metrics.update(_diagnostic_sums(terms, advantages, response_mask, num_correct, positive, eps_high, config))
    return pg_loss, metrics


def _diagnostic_sums(terms, advantages, response_mask, num_correct, positive, eps_high, config) -> dict[str, float]:
    """Raw sums, reported identically by every micro-batch and rank (see `per_success_count_sums`)."""
    sums = {
        f"{SUMS_PREFIX}/eps_high_sum": float((eps_high * positive).sum()),
        f"{SUMS_PREFIX}/positive_rollouts": float(positive.sum()),
    }
    for c, row in per_success_count_sums(terms, advantages, response_mask, num_correct, config.rollout_n - 1).items():
        for name, value in row.items():
            sums[f"{SUMS_PREFIX}/c{c}/{name}"] = value
    return sums


@register_policy_loss("gapo")
def compute_policy_loss_gapo(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="seq-mean-token-mean", config=None, rollout_is_weights=None
):
    """GAPO at sequence level: GSPO's sequence-ratio surrogate with the upper clip eps_high(c, k) per rollout."""
    return _gapo_policy_loss("gapo", old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)


@register_policy_loss("gapo_token")
def compute_policy_loss_gapo_token(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """GAPO at token level: PPO's token-ratio surrogate (dual clip for A < 0) with eps_high(c, k) per rollout."""
    return _gapo_policy_loss(
        "gapo_token", old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
    )

"""GAPOTrainer: verl's synchronous v1 PPO trainer plus the two things GAPO needs, registered as trainer mode `gapo`.

1. At advantage time, each rollout's group success count c and group size k (by uid, from the sequence
   reward, padding rollouts excluded) are written into the batch as `gapo_num_correct` / `gapo_group_size`.
2. The actor's loss callable becomes `GAPOActorLoss`, which hands them to the registered GAPO loss inside
   the FSDP actor update (verl's `set_loss_fn` hook; verl's `ppo_loss` still does the rest).
After the actor update the loss's raw per-c sums become the paper's diagnostics (`gapo/*` metrics).
Besides (one hook, `_val_metrics_update`): validation also logs the evaluator's metrics from the val_kwargs.n
samples per prompt (`val_passk_metrics`): unbiased pass@k for k = 1, 2, 4, ... <= n and coverage, per
benchmark, as `val-passk/<data_source>/...`.

Trainer mode: verl switches to its asynchronous code paths (replay buffer, TransferQueue checkpointing)
for any `trainer.v1.trainer_mode` other than "sync". This trainer is selected by the name `gapo` and sets the
mode back to "sync" before verl's constructor reads it, so everything else runs exactly as verl's sync trainer.
"""

from __future__ import annotations

import logging
import numpy as np
import torch
import transfer_queue as tq
from omegaconf import open_dict
from tensordict import TensorDict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.config import omega_conf_to_dataclass

from eval.passk import passk_metrics
from gapo.groups import group_success_counts
from gapo.threshold import adaptive_eps_high
from gapo.verl_plugin.config import resolve_gapo_clips
from gapo.verl_plugin.losses import GAPO_LOSS_MODES, GROUP_SIZE_KEY, NUM_CORRECT_KEY, SUMS_PREFIX, GAPOActorLoss
from gapo.verl_plugin.validate import validate_gapo_config

logger = logging.getLogger(__name__)

TRAINER_MODE = "gapo"


@register_trainer(TRAINER_MODE)
class GAPOTrainer(PPOTrainerSync):
    """verl's sync trainer with GAPO's group statistics and actor loss (see the module docstring)."""

    def __init__(self, config):
        validate_gapo_config(config)
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"  # keep verl's sync semantics (see module docstring)
        super().__init__(config)
        self._gapo = omega_conf_to_dataclass(config.actor_rollout_ref.actor.policy_loss)

    def on_init_end(self):
        super().on_init_end()
        actor_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
        self.actor_rollout_wg.set_loss_fn(GAPOActorLoss(actor_config))

    def _compute_advantage(self, batch, metrics):
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["uid", "rm_scores", "extra_fields"]
        )
        real = np.array([not tag.get("is_padding", False) for tag in batch.tags], dtype=bool)
        uids = _as_list(data["uid"])
        # padding rollouts (verl's batch balancing) copy a real uid: give each its own group
        uids = [u if r else f"__padding_{i}" for i, (u, r) in enumerate(zip(uids, real))]
        scores = data["rm_scores"].to_padded_tensor(0.0).sum(-1)  # sequence reward (token scores are nested)
        num_correct, group_size = group_success_counts(uids, scores, self._gapo.success_threshold)
        fields = TensorDict({NUM_CORRECT_KEY: num_correct, GROUP_SIZE_KEY: group_size}, batch_size=len(batch))
        # kv_batch_put returns the handle that knows the new fields; the old one would silently lack them.
        batch = tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)
        metrics.update(self._group_metrics(num_correct[real], group_size[real], scores[real]))
        metrics.update(reward_extra_metrics([e for e, r in zip(_as_list(data["extra_fields"]), real) if r]))
        batch = super()._compute_advantage(batch, metrics)
        if self._gapo.mask_truncated:
            batch = self._mask_truncated(batch, data["rm_scores"], metrics)
        return batch

    def _mask_truncated(self, batch, token_scores, metrics):
        """Overlong filtering (DeepCoder): responses cut at data.max_response_length get zero advantage."""
        lengths = token_scores.offsets().diff() if token_scores.is_nested else torch.full(
            (len(batch),), token_scores.shape[-1])
        truncated = lengths >= self.config.data.max_response_length
        metrics["gapo/truncated_frac"] = truncated.float().mean().item()
        if not truncated.any():
            return batch
        advantages = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                     select_fields=["advantages"])["advantages"]
        fields = TensorDict({"advantages": zero_rows(advantages, truncated)}, batch_size=len(batch))
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)

    def _group_metrics(self, num_correct, group_size, scores) -> dict[str, float]:
        """Group mix and the thresholds the loss will use for correct rollouts of mixed groups (exact)."""
        success = scores > self._gapo.success_threshold
        mixed = (num_correct > 0) & (num_correct < group_size)
        out = {
            "gapo/groups/mixed_frac": mixed.float().mean().item(),
            "gapo/groups/all_correct_frac": (num_correct == group_size).float().mean().item(),
            "gapo/groups/all_wrong_frac": (num_correct == 0).float().mean().item(),
            "gapo/groups/size_mean": group_size.mean().item(),
        }
        used = success & mixed
        if used.any() and self._gapo.loss_mode in GAPO_LOSS_MODES:  # baselines use verl's fixed clips
            eps_low, eps_high_max = resolve_gapo_clips(self.config.actor_rollout_ref.actor, self._gapo)
            eps = adaptive_eps_high(num_correct[used], group_size[used], eps_low, eps_high_max, self._gapo.schedule)
            out.update({"gapo/eps_high/mean": eps.mean().item(), "gapo/eps_high/min": eps.min().item(),
                        "gapo/eps_high/max": eps.max().item()})
        return out

    def _update_actor(self, batch, metrics):
        batch = super()._update_actor(batch, metrics)
        metrics.update(diagnostics_from_sums(metrics))
        return batch

    def _val_metrics_update(self, data_sources, sample_uids, reward_extra_infos_dict, sample_turns,
                            expected_acc_counts=None):
        metrics = super()._val_metrics_update(data_sources, sample_uids, reward_extra_infos_dict, sample_turns,
                                              expected_acc_counts=expected_acc_counts)
        metrics.update(val_passk_metrics(data_sources, sample_uids, reward_extra_infos_dict, expected_acc_counts,
                                         self._gapo.success_threshold))
        return metrics


def zero_rows(nested: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """A jagged nested (B, *) tensor with the rows where `rows` is True set to zero."""
    parts = [t * 0 if drop else t for t, drop in zip(nested.unbind(), rows.tolist())]
    return torch.nested.as_nested_tensor(parts, layout=torch.jagged)


def _as_list(values) -> list:
    """A non-tensor TransferQueue field as a python list (a list, or a NonTensorStack in some versions)."""
    return values.tolist() if hasattr(values, "tolist") else list(values)


def reward_extra_metrics(extra_fields: list) -> dict[str, float]:
    """Means of the reward function's numeric extra fields over the step's rollouts, as `reward/<key>/mean`.

    verl 0.9.1's v1 trainer logs them only at validation; training needs them too (format failures, timeouts).
    """
    values: dict[str, list[float]] = {}
    for fields in extra_fields:
        info = fields.get("reward_extra_info", {}) if isinstance(fields, dict) else {}
        for key, value in info.items():
            if isinstance(value, (bool, int, float, np.number)) and not isinstance(value, str):
                values.setdefault(key, []).append(float(value))
    return {f"reward/{key}/mean": float(np.mean(vals)) for key, vals in values.items()}


def val_passk_metrics(data_sources, sample_uids, infos: dict, expected_counts: dict | None = None,
                      success_threshold: float = 0.5) -> dict[str, float]:
    """pass@k (k = 1, 2, 4, ... <= n) and coverage per data_source from validation's per-sample lists.

    A sample is correct when the reward's `acc` says so, else when its reward exceeds `success_threshold`.
    Prompts are grouped by uid; sessions that failed (in `expected_counts`, keyed (data_source, uid),
    but absent) count as incorrect, as verl's own `acc` metrics do. Names: `val-passk/<source>/pass@<k>`,
    `.../coverage@5%`, `.../coverage_frac@5%`, `.../unsolved_frac`, `.../all_solved_frac`, `.../problems`.
    """
    rewards = infos.get("reward", [])
    accs = infos.get("acc") or [None] * len(rewards)
    correct = [bool(a) if a is not None else float(r) > success_threshold for a, r in zip(accs, rewards, strict=True)]
    return passk_metrics(data_sources, sample_uids, correct, expected=expected_counts)


def diagnostics_from_sums(metrics: dict) -> dict[str, float]:
    """Pop the loss's raw sums out of `metrics` and return the paper's diagnostics as ratios.

    Every micro-batch and rank reports every sum, and verl averages them over the same entries, so
    numerator / denominator is the exact ratio over the step. Names (grouped under `gapo/` in W&B):
    gapo/clipfrac_pos/c{c}, gapo/ratio_dev_pos/c{c}, gapo/loss_eps_high_mean.
    """
    prefix = f"actor/{SUMS_PREFIX}/"
    sums = {key[len(prefix):]: metrics.pop(key) for key in list(metrics) if key.startswith(prefix)}
    out = {}
    if sums.get("positive_rollouts", 0) > 0:
        out["gapo/loss_eps_high_mean"] = sums["eps_high_sum"] / sums["positive_rollouts"]
    counts = sorted({int(key.split("/")[0][1:]) for key in sums if key.startswith("c")})
    for c in counts:
        tokens = sums[f"c{c}/tokens"]
        if tokens > 0:
            out[f"gapo/clipfrac_pos/c{c}"] = sums[f"c{c}/clipped"] / tokens
            out[f"gapo/ratio_dev_pos/c{c}"] = sums[f"c{c}/ratio_dev"] / tokens
    return out

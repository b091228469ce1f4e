"""GAPOTrainer: verl's synchronous v1 PPO trainer plus the two things GAPO needs, registered as trainer mode `gapo`.

1. At advantage time, each rollout's group success count c, group size k and own success flag (grouped
   as verl's GRPO advantage groups, `gapo.groups`; a success is a sequence reward above `success_threshold`,
   not truncated under `mask_truncated`) are written into the batch as `gapo_num_correct`,
   `gapo_group_size`, `gapo_success`.
2. The actor's loss callable becomes `GAPOActorLoss`, which hands them to the registered GAPO loss inside
   the FSDP actor update (verl's `set_loss_fn` hook; verl's `ppo_loss` still does the rest).
After the actor update the loss's raw per-c sums become the paper's diagnostics (`gapo/*` metrics), and the
step's per-c points join the window of `gapo/is_adv_corr_window` (`gapo.diagnostics`; kept by the trainer, so
it restarts with the process).
Besides (one hook, `_val_metrics_update`): validation also logs the evaluator's metrics from the val_kwargs.n
samples per prompt (`gapo.step_metrics.val_passk_metrics`): unbiased pass@k for k = 1, 2, 4, ... <= n and coverage, per
benchmark, as `val-passk/<data_source>/...`.

VIGOR (top-level `vigor` group, `vigor=enabled`; `gapo.verl_plugin.vigor`): `prepare_step` submits every prompt with
m0 rollouts, and the replay buffer built here is wrapped so that its training `sample` runs VIGOR's later rounds and
returns one merged group per prompt; the allocator's random state goes into each checkpoint (`_save_trainer_state`,
`_load_checkpoint`).

Trainer mode: verl switches to its asynchronous code paths (replay buffer, TransferQueue checkpointing)
for any `trainer.v1.trainer_mode` other than "sync". This trainer is selected by the name `gapo`; the config
keeps "gapo" (what is logged and saved), and the trainer's own `trainer_mode` attribute, which every one of
verl's sync/async switches reads, is set to "sync" in `_build_replay_buffer`, so everything else runs exactly
as verl's sync trainer.
"""

from __future__ import annotations

import logging
import os
from functools import partial

import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.config import omega_conf_to_dataclass

from gapo.clip_diagnostics import diagnostics_from_sums, is_adv_points
from gapo.diagnostics import IS_ADV_CORR_LEVELS, CorrelationWindow
from gapo.groups import group_metrics, rollout_group_statistics, zero_rows
from gapo.step_metrics import ValidationWindow, reward_extra_metrics, val_passk_metrics
from gapo.threshold import adaptive_eps_high
from gapo.verl_plugin.checkpoint import SYNC_MODE, CrashSafeCheckpointMixin
from gapo.verl_plugin.config import resolve_gapo_clips
from gapo.verl_plugin.losses import (
    DIAGNOSED_LOSS_MODES,
    GAPO_LOSS_MODES,
    GROUP_SIZE_KEY,
    NUM_CORRECT_KEY,
    ROWS_ENV,
    STEP_KEY,
    SUCCESS_KEY,
    GAPOActorLoss,
)
from gapo.verl_plugin.exploration import StepExploration
from gapo.verl_plugin.validate import (
    exploration_settings,
    sampler_poll_interval,
    validate_gapo_config,
    validation_settings,
)
from gapo.verl_plugin.vigor import VigorSampler, load_state, max_group_size, save_state, vigor_settings
from gapo.vigor import VigorAllocator

logger = logging.getLogger(__name__)

TRAINER_MODE = "gapo"
# trainer.val_coverage_threshold (configs/base/gapo.yaml, default 0.05): validation's coverage counts problems with
# solve rate above it, as `python -m eval --coverage-threshold`. With val_kwargs.n = 16 a 5% threshold counts any
# single success (docs/evaluation.md). trainer.val_window: val-passk-window/* averages the latest that many
# validations (gapo/verl_plugin/validate.py checks both at start-up).


@register_trainer(TRAINER_MODE)
class GAPOTrainer(CrashSafeCheckpointMixin, PPOTrainerSync):
    """verl's sync trainer with GAPO's group statistics and actor loss (see the module docstring)."""

    # VIGOR's sampler (set in _build_replay_buffer when vigor.enable); None also for a trainer built without it (tests
    # that call the checkpoint hooks on a bare instance)
    _vigor = None

    def __init__(self, config):
        """Validate the GAPO config (`validate_gapo_config`, before any worker starts), then build verl's trainer.

        Keeps the GAPO settings (`actor_rollout_ref.actor.policy_loss`) and the window of `gapo/is_adv_corr_window`.
        Raises RuntimeError when verl's `PPOTrainer.__init__` did not end in sync mode (a verl change this trainer
        relies on).
        """
        validate_gapo_config(config)
        # The config is left as the user wrote it (trainer.v1.trainer_mode=gapo: what verl logs and what a second
        # trainer built from it validates); verl's sync semantics come from `_build_replay_buffer` below.
        super().__init__(config)
        if self.trainer_mode != SYNC_MODE:  # verl changed the order in PPOTrainer.__init__: fail, not go async
            raise RuntimeError(
                f"GAPOTrainer runs verl's sync trainer, but verl's PPOTrainer.__init__ left trainer_mode="
                f"{self.trainer_mode!r}: GAPOTrainer._build_replay_buffer was not called after it read the mode"
            )
        self._gapo = omega_conf_to_dataclass(config.actor_rollout_ref.actor.policy_loss)
        # gapo/is_adv_corr_window's latest steps; restarts with the process (not checkpointed)
        self._is_adv_window = CorrelationWindow(self._gapo.diag_corr_window)
        # exploration instruments (top-level `exploration`, docs/metrics.md): entropy from the old-log-prob pass, which
        # verl skips in bypass mode (old log-probs = the rollout's)
        rollout_correction = config.algorithm.get("rollout_correction", None) or {}
        self._entropy_in_batch = not rollout_correction.get("bypass_mode", False)
        self._exploration = StepExploration(exploration_settings(config))

    def _build_replay_buffer(self):
        """verl's sync replay buffer, with the trainer's mode set to verl's "sync".

        verl's `PPOTrainer.__init__` reads `trainer.v1.trainer_mode` (here "gapo", the name that selected this
        class) once into `self.trainer_mode` and `self.parameter_sync_step`, then calls this; all of verl's
        sync/async switches after that read `self.trainer_mode` (replay buffer class, `data.gen_batch_size`,
        TransferQueue checkpointing and prompt persistence), never the config. Setting the attributes here, as
        verl would have for mode "sync", gives exactly verl's sync trainer without rewriting the config.
        ``trainer.v1.sampler.poll_interval``, when set, replaces the buffer's 2.0 s wait between polls for finished
        rollouts (see ``gapo.verl_plugin.validate.sampler_poll_interval``).
        """
        self.trainer_mode = SYNC_MODE
        self.parameter_sync_step = self.config.trainer.v1.get(SYNC_MODE, {}).get("parameter_sync_step", 1)
        replay_buffer = super()._build_replay_buffer()
        interval = sampler_poll_interval(self.config)  # verl passes none: its 2.0 s floor on every generation
        if interval is not None:
            replay_buffer.poll_interval = interval
        # VIGOR (top-level `vigor` group): the rounds run inside the buffer's sample (gapo/verl_plugin/vigor.py)
        vigor = vigor_settings(self.config)
        self._vigor = None
        if vigor is not None:
            n = self.config.actor_rollout_ref.rollout.n
            self._vigor = VigorSampler(replay_buffer, VigorAllocator(vigor, n), submit=self._submit_batch_to_rollout)
            replay_buffer = self._vigor
        return replay_buffer

    def prepare_step(self) -> dict:
        """verl's: submit one training batch for generation; with VIGOR, every prompt with m0 rollouts (round 0),
        the prompts kept by the sampler for the later rounds."""
        if self._vigor is None:
            return super().prepare_step()
        self._submit_batch_to_rollout(self._vigor.first_round(self._next_train_batch()))
        return {}

    def _load_checkpoint(self):
        """verl's resume, then (VIGOR) the allocator's random state from the resumed step's folder, when it has one."""
        super()._load_checkpoint()
        if self._vigor is None or self.global_steps == 0:
            return
        trainer_cfg = self.config.trainer
        folder = (trainer_cfg.resume_from_path if trainer_cfg.resume_mode == "resume_path"
                  else os.path.join(trainer_cfg.default_local_dir, f"global_step_{self.global_steps}"))
        path = load_state(os.path.abspath(folder), self._vigor.allocator)
        if path is not None:
            logger.warning(f"VIGOR: resumed the allocator's random state from {path}")

    def _save_trainer_state(self, folder: str) -> None:
        """The allocator's random state beside verl's checkpoint (written before the tracker names the step)."""
        if self._vigor is not None:
            save_state(folder, self._vigor.allocator)

    def on_init_end(self):
        """verl's hook after the workers start: installs GAPOActorLoss (with its per-c table's size) as the actor's
        loss for the GAPO loss modes; refuses VIGOR without in-loop rewards."""
        super().on_init_end()  # verl's sync trainer: push the (possibly resumed) actor weights to the rollout
        loss_mode = self.config.actor_rollout_ref.actor.policy_loss.get("loss_mode", "vanilla")
        if self._vigor is not None and self.reward_loop_manager.reward_loop_worker_handles is None:
            raise RuntimeError("vigor.enable=true needs rewards computed inside verl's agent loop (reward loop "
                               "workers), but verl scores this run's rollouts only after sampling (colocated reward "
                               "model): set reward.reward_model.enable_resource_pool=true or vigor.enable=false")
        self._loss_fn = None
        if loss_mode not in DIAGNOSED_LOSS_MODES:
            return  # baselines keep the loss verl installed (ppo_loss, or distillation_ppo_loss)
        # validate_gapo_config refused distillation with a GAPO loss: the loss replaced here is verl's ppo_loss
        actor_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
        # rows of the per-c diagnostic table: the largest group a step can hold (VIGOR's exceed rollout.n)
        max_count = actor_config.rollout_n
        if self._vigor is not None:
            max_count = max(max_count, max_group_size(self.config.data.train_batch_size, self._vigor.allocator.n,
                                                      self._vigor.allocator.cfg))
        self._loss_fn = GAPOActorLoss(actor_config, max_count=max_count)
        self.actor_rollout_wg.set_loss_fn(self._loss_fn)

    def _compute_advantage(self, batch, metrics):
        """verl's advantage step, with GAPO's group statistics written into the batch first.

        Writes each rollout's c, k and success flag (`gapo.groups.rollout_group_statistics`, grouped as verl's GRPO
        groups) as `gapo_num_correct`, `gapo_group_size`, `gapo_success` (and `gapo_step` for the debugging dump) into
        the TransferQueue batch, grows the loss's per-c table if a group is larger than it, runs verl's advantage
        estimator, zeroes truncated responses' advantages under `mask_truncated` (overlong filtering), and adds the
        `gapo/groups/*`, `gapo/eps_high/*` and reward metrics to `metrics`. Returns the batch handle that knows the
        new fields.
        """
        # one fetch for the group statistics and the exploration instruments (responses, prompts, the old-log-prob
        # pass's entropy)
        fields = ["uid", "rm_scores", "extra_fields", "responses", "prompts"]
        if self._entropy_in_batch:
            fields.append("entropy")
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        real = torch.tensor([not tag.get("is_padding", False) for tag in batch.tags], dtype=torch.bool)
        sessions = self.config.algorithm.adv_estimator == core_algos.AdvantageEstimator.GRPO
        uids = _as_list(data["uid"])
        stats, truncated = rollout_group_statistics(
            batch.keys, uids, data["rm_scores"], self._gapo,
            max_response_length=self.config.data.max_response_length, sessions=sessions,
        )
        columns = {NUM_CORRECT_KEY: stats.num_correct, GROUP_SIZE_KEY: stats.group_size,
                   SUCCESS_KEY: stats.success.float()}
        if os.environ.get(ROWS_ENV):  # the loss's per-row debugging dump names each row's step
            columns[STEP_KEY] = torch.full((len(batch),), float(self.global_steps))
        fields = TensorDict(columns, batch_size=len(batch))
        # kv_batch_put returns the handle that knows the new fields; the old one would silently lack them.
        batch = tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)
        self._cover_group_sizes(int(stats.group_size.max().item()) if len(batch) else 0)
        batch = super()._compute_advantage(batch, metrics)
        advantages = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                     select_fields=["advantages"])["advantages"]
        if self._gapo.mask_truncated:
            metrics["gapo/truncated_frac"] = truncated[real].float().mean().item()
            if truncated.any():
                advantages = zero_rows(advantages, truncated)
                fields = TensorDict({"advantages": advantages}, batch_size=len(batch))
                batch = tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)
        positive = torch.stack([row.sum() for row in advantages.unbind()]) > 0
        metrics.update(self._group_metrics(stats, positive, real))
        metrics.update(reward_extra_metrics([e for e, r in zip(_as_list(data["extra_fields"]), real.tolist()) if r]))
        metrics.update(self._exploration.step(batch.keys, uids, data, stats, real, sessions, self.global_steps,
                                              self.tokenizer))
        return batch

    def _cover_group_sizes(self, largest: int) -> None:
        """Grow the loss's per-c table to the step's largest group (rollout failures under VIGOR can exceed the
        schedule's bound); the loss is re-sent to the workers only then, never shrunk."""
        if self._loss_fn is not None and largest > self._loss_fn.max_count:
            logger.warning(f"groups of {largest} rollouts: growing the per-c diagnostic table from "
                           f"{self._loss_fn.max_count}")
            self._loss_fn = GAPOActorLoss(self._loss_fn.config, max_count=largest)
            self.actor_rollout_wg.set_loss_fn(self._loss_fn)

    def _group_metrics(self, stats, positive, real) -> dict[str, float]:
        """`gapo.groups.group_metrics` with this run's thresholds (the loss's own rule: exact); baselines, which use
        verl's fixed clips, log no `gapo/eps_high/*`."""
        thresholds = None
        if self._gapo.loss_mode in GAPO_LOSS_MODES:
            eps_low, eps_high_max = resolve_gapo_clips(self.config.actor_rollout_ref.actor, self._gapo)
            thresholds = partial(adaptive_eps_high, eps_low=eps_low, eps_high_max=eps_high_max,
                                 schedule=self._gapo.schedule)
        return group_metrics(stats, positive, real, thresholds)

    def _update_actor(self, batch, metrics):
        """verl's actor update, then the loss's raw per-c sums in `metrics` turned into the paper's diagnostics.

        When the diagnostics hold per-c points (a GAPO loss with `diagnostics` on), the step joins the window of
        `gapo/is_adv_corr_window`.
        """
        batch = super()._update_actor(batch, metrics)
        diagnostics = diagnostics_from_sums(metrics)
        metrics.update(diagnostics)
        if IS_ADV_CORR_LEVELS in diagnostics:  # a GAPO loss ran with diagnostics on: the step joins the window
            metrics.update(self._is_adv_window.add(is_adv_points(diagnostics)))
        return batch

    def _val_metrics_update(self, data_sources, sample_uids, reward_extra_infos_dict, sample_turns,
                            expected_acc_counts=None):
        """verl's validation metrics plus the evaluator's: `val-passk/<source>/...` pass@k and coverage from the
        val_kwargs.n samples per prompt, and their `val-passk-window/...` mean and std over the latest validations."""
        metrics = super()._val_metrics_update(data_sources, sample_uids, reward_extra_infos_dict, sample_turns,
                                              expected_acc_counts=expected_acc_counts)
        threshold, window = validation_settings(self.config)
        passk = val_passk_metrics(data_sources, sample_uids, reward_extra_infos_dict, expected_acc_counts,
                                  self._gapo.success_threshold, threshold)
        metrics.update(passk)
        if not hasattr(self, "_val_history"):  # the window restarts with the process (it is not checkpointed)
            self._val_history = ValidationWindow(window)
        metrics.update(self._val_history.add(passk))
        return metrics


def _as_list(values) -> list:
    """A non-tensor TransferQueue field as a python list (a list, or a NonTensorStack in some versions)."""
    return values.tolist() if hasattr(values, "tolist") else list(values)

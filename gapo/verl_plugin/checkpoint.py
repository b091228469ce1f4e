"""Crash-safe checkpoint saving for verl's sync v1 trainer (a mixin of `GAPOTrainer`).

A run killed at any moment (SIGKILL, OOM killer, lost node) resumes from its last complete checkpoint; see
`CrashSafeCheckpointMixin._save_checkpoint`. Tested in tests/test_kill_resume.py, including against verl's own
save (same files, same worker calls).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time

import torch
from verl.trainer.ppo.utils import Role

logger = logging.getLogger(__name__)

SYNC_MODE = "sync"  # verl's sync trainer mode (`self.trainer_mode`)


class CrashSafeCheckpointMixin:
    """Overrides verl's `PPOTrainer._save_checkpoint` (sync mode, synchronous save); everything else is verl's."""

    # Checkpoint files (verl 0.9.1 layout): <default_local_dir>/global_step_N/{actor/,data.pt} and the tracker.
    CHECKPOINT_TRACKER = "latest_checkpointed_iteration.txt"  # verl's get_checkpoint_tracker_filename
    # Test hook (fault injection), read only by `_save_checkpoint`: "<step>:<marker file>". When it saves that step,
    # the trainer writes the actor, then creates the marker file and waits CHECKPOINT_PAUSE_S before data.pt and the
    # tracker, so that a test can SIGKILL it at a known point inside a checkpoint write (tests/test_kill_resume.py).
    # Unset in every real run; costs one environment lookup per save.
    CHECKPOINT_PAUSE_ENV = "GAPO_TEST_CHECKPOINT_PAUSE"
    CHECKPOINT_PAUSE_S = 600.0

    def _save_checkpoint(self):
        """verl's checkpoint save, made crash-safe: a run killed at any moment resumes from its last complete save.

        verl 0.9.1 (`PPOTrainer._save_checkpoint`) writes global_step_N/actor (model, optimizer and extra-state
        shards, HF config), then global_step_N/data.pt (dataloader), then `latest_checkpointed_iteration.txt`,
        the only thing resume reads (`find_latest_ckpt_path`). Under a hard kill (SIGKILL, OOM killer, lost node)
        it has two holes:
        - the tracker is rewritten in place (`open("w")`, then `write`): a kill in between leaves it empty, and
          every later run dies at start-up in `int("")`;
        - retention (`trainer.max_actor_ckpt_to_keep`) runs inside the actor's save, before the new checkpoint is
          committed: with 1 kept, the previous step's actor folder is deleted while the tracker still names it,
          and a kill before the tracker moves leaves a tracker that names a checkpoint without weights.
        Here the same files are written in the same order by the same worker calls, but
        - the tracker is committed last and atomically (temp file, fsync, `os.replace`, fsync of the folder): it
          names the new step or the previous one, never a partial write;
        - retention runs after the commit: it removes whole `global_step_M` folders (verl left their data.pt
          behind), only below the committed step, kept ones counted as verl counts them, including folders of
          earlier runs (verl's in-memory list forgets them across a restart).
        The folder of a step whose save was interrupted is never read (the tracker does not name it) and is
        overwritten file by file when that step is saved again. Not covered, as in verl: re-saving the very step
        the tracker names (possible only after `resume_from_path` to an older step) overwrites it in place.
        verl's async save (`actor.checkpoint.async_save`: no tracker, its callback commits) and async trainer
        modes keep verl's own code.
        """
        trainer_cfg = self.config.trainer
        if self.trainer_mode != SYNC_MODE or self.config.actor_rollout_ref.actor.get("checkpoint", {}).get(
                "async_save", False):
            super()._save_checkpoint()
            # verl's own save committed already: the extra state follows it (not crash-safe on this path)
            self._save_trainer_state(os.path.join(trainer_cfg.default_local_dir, f"global_step_{self.global_steps}"))
            return
        step = self.global_steps
        root = trainer_cfg.default_local_dir
        folder = os.path.join(root, f"global_step_{step}")
        logger.info(f"Saving checkpoint to {folder}")
        hdfs = trainer_cfg.default_hdfs_dir

        def remote(role: str):
            return None if hdfs is None else os.path.join(hdfs, f"global_step_{step}", role)

        # the workers' own retention is off (max_ckpt_to_keep=None): it would delete before the commit
        self.actor_rollout_wg.save_checkpoint(os.path.join(folder, "actor"), remote("actor"), step,
                                              max_ckpt_to_keep=None)
        if self.use_critic:
            critic = str(Role.Critic)
            self.critic_wg.save_checkpoint(os.path.join(folder, critic), remote(critic), step, max_ckpt_to_keep=None)
        self._checkpoint_test_pause(step)
        os.makedirs(folder, exist_ok=True)
        torch.save(self.train_dataloader.state_dict(), os.path.join(folder, "data.pt"))
        self._save_trainer_state(folder)
        self._commit_checkpoint(root, step)
        self._prune_checkpoints(root, step, self._checkpoints_to_keep())
        self.checkpoint_callback.on_save(trainer=self, global_step=step, checkpoint_dir=folder, async_save=False)

    def _save_trainer_state(self, folder: str) -> None:
        """Hook: the trainer's own state (beyond verl's) into the step's folder, before the commit; none here."""

    def _checkpoints_to_keep(self) -> int | None:
        """How many step folders retention keeps (None: all), from verl's keys. Folders hold actor and critic
        together, so with a critic the larger of the two limits applies."""
        trainer_cfg = self.config.trainer
        if trainer_cfg.get("remove_previous_ckpt_in_save", False):
            logger.warning("remove_previous_ckpt_in_save is deprecated, set max_actor_ckpt_to_keep=1 and "
                           "max_critic_ckpt_to_keep=1 instead")
            return 1
        limits = [trainer_cfg.get("max_actor_ckpt_to_keep", None)]
        if self.use_critic:
            limits.append(trainer_cfg.get("max_critic_ckpt_to_keep", None))
        if any(not isinstance(limit, int) or limit <= 0 for limit in limits):
            return None  # verl's rule: only a positive int limits
        return max(limits)

    @classmethod
    def _commit_checkpoint(cls, root: str, step: int) -> None:
        """Point the tracker at `step`, atomically: readers see the old or the new content, never a partial one."""
        tracker = os.path.join(root, cls.CHECKPOINT_TRACKER)
        tmp = f"{tracker}.tmp"
        with open(tmp, "w") as f:
            f.write(str(step))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, tracker)
        folder_fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(folder_fd)  # the rename itself survives a crash of the machine
        finally:
            os.close(folder_fd)

    @staticmethod
    def _prune_checkpoints(root: str, committed: int, keep: int | None) -> None:
        """Remove `global_step_M` folders with M below the committed step, keeping the newest `keep - 1` of them
        (with the committed one, `keep` in all). Folders above the committed step are left alone."""
        if keep is None:
            return
        older = sorted(int(m.group(1)) for name in os.listdir(root)
                       if (m := re.fullmatch(r"global_step_(\d+)", name)) and int(m.group(1)) < committed
                       and os.path.isdir(os.path.join(root, name)))
        for old in older[:max(0, len(older) - (keep - 1))]:
            path = os.path.join(root, f"global_step_{old}")
            logger.info(f"Removing old checkpoint {path} (keeping {keep})")
            shutil.rmtree(path, ignore_errors=True)

    def _checkpoint_test_pause(self, step: int) -> None:
        """The test hook described at CHECKPOINT_PAUSE_ENV; does nothing unless that variable names this step."""
        spec = os.environ.get(self.CHECKPOINT_PAUSE_ENV, "")
        pause_step, _, marker = spec.partition(":")
        if not spec or int(pause_step) != step:
            return
        logger.warning(f"{self.CHECKPOINT_PAUSE_ENV}: pausing the save of step {step} before its commit")
        with open(marker, "w") as f:
            f.write(f"{os.getpid()} {step}\n")
        time.sleep(self.CHECKPOINT_PAUSE_S)

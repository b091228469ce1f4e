"""Start-up checks of a GAPO training config: each failure names the key and the fix, before any Ray work."""

from __future__ import annotations

from hydra.errors import InstantiationException
from omegaconf import DictConfig
from verl.trainer.distillation import is_distillation_enabled
from verl.utils.config import omega_conf_to_dataclass

from gapo.config import GAPOConfig
from gapo.step_metrics import VAL_COVERAGE_KEY
from gapo.verl_plugin.config import resolve_gapo_clips
from gapo.verl_plugin.losses import GAPO_LOSS_MODES
from gapo.verl_plugin.vigor import VigorConfigError, vigor_settings

GAPO_TRAINER_MODE = "gapo"
POLICY_LOSS_TARGET = "gapo.verl_plugin.config.GAPOPolicyLossConfig"


class GAPOConfigError(ValueError):
    """A training config that cannot work with GAPO."""


POLL_INTERVAL_KEY = "trainer.v1.sampler.poll_interval"


def sampler_poll_interval(config: DictConfig) -> float | None:
    """``trainer.v1.sampler.poll_interval`` (seconds), or None when unset (verl's replay buffer default, 2.0 s).

    verl's sync replay buffer waits for finished rollouts by polling TransferQueue and sleeping ``poll_interval``
    between polls (verl/trainer/ppo/v1/replay_buffer.py, ``ReplayBuffer._wait_for_next_poll``); verl passes no
    value, so every generation phase lasts a multiple of 2.0 s. On GPUs (generation takes tens of seconds) that
    costs ~1 s a step; on the CPU presets it was the whole of ``timing_s/gen``. GAPO's trainer sets it from this key.
    """
    value = config.trainer.v1.sampler.get("poll_interval", None)
    if value is None:
        return None
    try:
        interval = float(value)
    except (TypeError, ValueError):
        interval = float("nan")
    if not 0 < interval <= 60:  # also rejects nan
        raise GAPOConfigError(f"{POLL_INTERVAL_KEY}={value!r}: seconds between polls for finished rollouts, a number "
                              "in (0, 60]; e.g. 0.05 (the CPU presets) or leave it unset for verl's 2.0")
    return interval


VAL_WINDOW_KEY = "trainer.val_window"


def validation_settings(config: DictConfig) -> tuple[float, int]:
    """(coverage threshold, window) for validation's pass@k metrics: ``trainer.val_coverage_threshold`` (a solve
    rate in [0, 1); default 0.05, as ``python -m eval --coverage-threshold``) and ``trainer.val_window`` (how many
    of the latest validations ``val-passk-window/*`` averages, >= 1; default 4): the paper's coverage figures are
    averages late in training, not one validation's value."""
    from gapo.passk import DEFAULT_COVERAGE_THRESHOLD

    threshold = config.trainer.get("val_coverage_threshold", DEFAULT_COVERAGE_THRESHOLD)
    window = config.trainer.get("val_window", 4)
    try:
        ok = 0 <= float(threshold) < 1
    except (TypeError, ValueError):
        ok = False
    if not ok:  # also rejects nan
        raise GAPOConfigError(f"{VAL_COVERAGE_KEY}={threshold!r}: a solve rate in [0, 1) above which a validation "
                              "problem counts as covered; e.g. 0.05 (the paper's 5%)")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise GAPOConfigError(f"{VAL_WINDOW_KEY}={window!r}: the number of latest validations to average, an "
                              "integer >= 1; e.g. 4 (1 logs each validation alone)")
    return float(threshold), window


EXPLORATION_KEY = "exploration"


def exploration_settings(config: DictConfig):
    """The exploration instruments' settings from the top-level ``exploration`` group (configs/base/gapo.yaml;
    `gapo.exploration.ExplorationConfig`'s defaults where it is absent). ``coverage_threshold`` defaults to validation's
    ``trainer.val_coverage_threshold``, so training-time and validation coverage use one threshold.

    Raises GAPOConfigError naming the key, the bad value and the fix (an unknown key: the valid ones).
    """
    from dataclasses import fields

    from gapo.exploration import ExplorationConfig

    group = config.get(EXPLORATION_KEY, None)
    values = dict(group) if group is not None else {}
    known = [f.name for f in fields(ExplorationConfig)]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise GAPOConfigError(f"{EXPLORATION_KEY}.{unknown[0]} is not a key of the exploration instruments; the keys "
                              f"are {', '.join(f'{EXPLORATION_KEY}.{k}' for k in known)} (docs/metrics.md)")
    if "coverage_threshold" not in values:
        values["coverage_threshold"] = validation_settings(config)[0]
    try:
        return ExplorationConfig(**values)
    except ValueError as err:
        raise GAPOConfigError(str(err)) from None


def validate_gapo_config(config: DictConfig) -> None:
    """Raise GAPOConfigError for a config GAPO cannot train with. Baseline losses pass through unchecked, except
    for the trainer's own knobs (the replay buffer's poll interval, validation's coverage threshold and window,
    the `exploration` instruments, VIGOR's `vigor` group), which every run of GAPO's trainer reads."""
    sampler_poll_interval(config)
    validation_settings(config)
    exploration_settings(config)
    try:
        vigor_settings(config)  # VIGOR (top-level `vigor`): composes with every loss_mode, so checked for all
    except VigorConfigError as err:
        raise GAPOConfigError(str(err)) from None
    actor = config.actor_rollout_ref.actor
    loss_mode = actor.policy_loss.get("loss_mode", "vanilla")
    if loss_mode not in GAPO_LOSS_MODES:
        return
    trainer_mode = config.trainer.v1.get("trainer_mode", "sync")
    if not config.trainer.get("use_v1", True) or trainer_mode != GAPO_TRAINER_MODE:
        raise GAPOConfigError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} needs the GAPO trainer, but "
            f"trainer.v1.trainer_mode={trainer_mode} (trainer.use_v1={config.trainer.get('use_v1', True)}): set "
            f"trainer.use_v1=true trainer.v1.trainer_mode={GAPO_TRAINER_MODE} (configs/gapo_trainer.yaml does), "
            "or pick a non-GAPO loss_mode"
        )
    if is_distillation_enabled(config.get("distillation")):
        raise GAPOConfigError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} cannot be combined with on-policy distillation "
            "(distillation.enabled=true): GAPO's actor loss would replace verl's distillation loss, and verl's "
            "distillation loss cannot run a GAPO policy loss. Set distillation.enabled=false, or pick a non-GAPO "
            "loss_mode (e.g. actor_rollout_ref.actor.policy_loss.loss_mode=gspo) to distil"
        )
    target = actor.policy_loss.get("_target_", "")
    if target != POLICY_LOSS_TARGET:
        raise GAPOConfigError(
            f"actor_rollout_ref.actor.policy_loss._target_={target!r} has no GAPO fields: set it to {POLICY_LOSS_TARGET}"
        )
    n = config.actor_rollout_ref.rollout.n
    if n < 2:
        raise GAPOConfigError(
            f"actor_rollout_ref.rollout.n={n}: GAPO needs groups of at least 2 rollouts per prompt (the paper uses 8)"
        )
    try:
        settings: GAPOConfig = omega_conf_to_dataclass(actor.policy_loss)
        resolve_gapo_clips(actor, settings)
    except (ValueError, TypeError, InstantiationException) as err:
        cause = err.__cause__ if isinstance(err, InstantiationException) and err.__cause__ else err
        raise GAPOConfigError(f"invalid GAPO settings under actor_rollout_ref.actor: {cause}") from err

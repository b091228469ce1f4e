"""GAPOConfig: the single source of GAPO's knobs and their defaults (framework-agnostic)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from gapo.threshold import SCHEDULES, validate_clip_range

# The trainer's base config (a clone's configs/, beside this package: the project installs editable only). It holds the
# defaults that are verl's fields, not GAPOConfig's: eps_low (actor.clip_ratio_low), eps_high_max and k (rollout.n).
BASE_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "base" / "gapo.yaml"


def _is_number(value) -> bool:
    """An int or float, not a bool (a text value, e.g. from TRL's KEY=VALUE, gets the field's message, not math's)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass
class GAPOConfig:
    """GAPO's settings. In verl they live under `actor_rollout_ref.actor.policy_loss` (see
    `gapo.verl_plugin.config.GAPOPolicyLossConfig`); the lower clip eps_low is verl's own
    `actor_rollout_ref.actor.clip_ratio_low`, which GAPO never changes.

    Attributes:
        eps_high_max: the widest upper clip, given to rollouts whose group has one success (c = 1).
            None means "use actor.clip_ratio_high", so a fixed-clip config turns into GAPO by changing
            only the loss mode. Paper: 5e-3 (Qwen2.5-Math-1.5B, Llama-3.2-3B), 3e-4 (R1-Distill-1.5B),
            0.28 at token level (DeepCoder recipe).
        schedule: how eps_high falls from eps_high_max (c = 1) to eps_low (c = k): "linear" (the
            paper's Eq. 11), "exp" (exponential in the advantage, same end points) or "constant"
            (eps_high_max for everyone: the fixed asymmetric clip, as a baseline in the same code path).
        success_threshold: a rollout counts as a success when its sequence reward (sum of its token-level
            scores) is strictly greater than this. 0.5 splits binary {0, 1} rewards; for partial-credit code
            rewards set it just below full marks (e.g. 0.99). c counts successes; only a success with a
            positive advantage gets eps_high(c, k), every other rollout keeps eps_low (whatever its advantage).
        diagnostics: log the paper's per-c diagnostics (clip fraction and mean |ratio - 1| of
            positive-advantage rollouts, per group success count c) every step.
        mask_truncated: DeepCoder's overlong filtering: responses cut at data.max_response_length get zero
            advantage, so they add no gradient (they still count in the loss's token normalisation and,
            as failures, in their group's success count). Applied by the GAPO trainer for every loss mode.
        diag_corr_window: with diagnostics on, `gapo/is_adv_corr_window` is the Pearson correlation between
            per-c mean |ratio - 1| and per-c mean advantage over the pooled per-c points of the latest this many
            training steps (`gapo.diagnostics`); an integer >= 1 (1 repeats the per-step `gapo/is_adv_corr`).
            The window lives in the trainer process and restarts with it (not checkpointed).
    """

    eps_high_max: Optional[float] = None
    schedule: str = "linear"
    success_threshold: float = 0.5
    diagnostics: bool = True
    mask_truncated: bool = False
    diag_corr_window: int = 10

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"policy_loss.schedule={self.schedule!r} is not a GAPO schedule; choose one of {', '.join(SCHEDULES)}"
            )
        if self.eps_high_max is not None and not (_is_number(self.eps_high_max) and math.isfinite(self.eps_high_max)
                                                  and self.eps_high_max >= 0):
            raise ValueError(f"policy_loss.eps_high_max must be a finite number >= 0 or null, got {self.eps_high_max}")
        if not (_is_number(self.success_threshold) and math.isfinite(self.success_threshold)):
            raise ValueError(f"policy_loss.success_threshold must be finite, got {self.success_threshold}")
        window = self.diag_corr_window
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(
                f"policy_loss.diag_corr_window={window!r}: the number of latest training steps whose per-c points "
                "gapo/is_adv_corr_window pools, an integer >= 1; set e.g. "
                "actor_rollout_ref.actor.policy_loss.diag_corr_window=10 (1 logs each step alone)"
            )

    def resolve_clips(self, clip_ratio_low: float, clip_ratio_high: Optional[float]) -> tuple[float, float]:
        """(eps_low, eps_high_max) from verl's actor clip fields, validated together."""
        eps_high_max = self.eps_high_max if self.eps_high_max is not None else clip_ratio_high
        if eps_high_max is None:
            raise ValueError("set actor_rollout_ref.actor.policy_loss.eps_high_max (or actor.clip_ratio_high) for GAPO")
        validate_clip_range(clip_ratio_low, eps_high_max, self.schedule)
        return clip_ratio_low, eps_high_max


def training_defaults(base_config: Path | None = None) -> dict:
    """The default training run's k, eps_low, eps_high_max and schedule, read where they are set (no copy here):
    `actor_rollout_ref.rollout.n`, `.actor.clip_ratio_low` and `.actor.policy_loss.eps_high_max` from the base config
    (configs/base/gapo.yaml), the schedule from GAPOConfig. Keys as `python -m gapo.threshold`'s: group_size, eps_low,
    eps_high_max, schedule. Raises OSError (no such file) or ValueError (a key missing from it)."""
    import yaml

    base_config = Path(base_config or BASE_CONFIG)
    config = yaml.safe_load(base_config.read_text())
    try:
        ref = config["actor_rollout_ref"]
        return {"group_size": int(ref["rollout"]["n"]), "eps_low": float(ref["actor"]["clip_ratio_low"]),
                "eps_high_max": float(ref["actor"]["policy_loss"]["eps_high_max"]), "schedule": GAPOConfig().schedule}
    except (KeyError, TypeError) as err:
        raise ValueError(f"{base_config} lacks actor_rollout_ref.rollout.n, .actor.clip_ratio_low or "
                         f".actor.policy_loss.eps_high_max ({err!r})") from None

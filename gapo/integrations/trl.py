"""GAPO as a Hugging Face TRL `GRPOTrainer` loss (trl==1.16.0): `GAPOGRPOTrainer` and `GAPOTRLConfig`; and
`MetricsFileCallback`, which keeps a run's logs where `recipe.plot_run` reads them.

    from gapo import GAPOConfig
    from gapo.integrations.trl import GAPOGRPOTrainer, GAPOTRLConfig
    args = GAPOTRLConfig(output_dir="out", importance_sampling_level="sequence", loss_type="grpo",
                         epsilon=3e-3, gapo=GAPOConfig(eps_high_max=5e-3), steps_per_generation=8, ...)
    trainer = GAPOGRPOTrainer(model=..., reward_funcs=..., args=args, train_dataset=...)

Each completion's upper clip is Eq. 11 of its own group (`gapo.threshold`): the group is its prompt's
`num_generations` completions (TRL keeps them in contiguous blocks of the gathered generation batch), a success is a
completion whose weighted reward (TRL's sum over `reward_funcs` with `reward_weights`) exceeds
`gapo.success_threshold`, and a completion that no reward function scored counts as a failure. A success with a
positive advantage gets eps_high(c, k); every other completion keeps `epsilon` on both sides. The lower clip is
TRL's `epsilon`, unchanged.

How it plugs in (the smallest overrides; TRL's own loss code stays in charge):
1. `_calculate_rewards` keeps the rewards TRL gathers from every process; `_generate_and_score_completions` turns them
   into each completion's (c, k, success) (`gapo.groups.group_statistics`) and adds this process's rows to the
   generation batch as `gapo_num_correct`, `gapo_group_size`, `gapo_success`. TRL's shuffle and its
   `steps_per_generation` split move them with their completions.
2. `_compute_loss` sets TRL's `epsilon_high` to a (B, 1) tensor, one bound per completion (broadcast over its tokens at
   token level), and `epsilon_low` to a 0-d tensor (torch.clamp takes tensor bounds only in pairs), runs TRL's
   `_compute_loss`, and restores both. TRL's clamp, min, aggregation, KL and logging run as they are.
3. The diagnostics are the verl path's (`gapo.clip_diagnostics`): per micro-batch the per-c sums over this process's
   completions, summed over processes, accumulated until TRL logs, then logged as `gapo/*` (W&B when on).
   `gapo/is_adv_corr_window` pools the latest `diag_corr_window` logging intervals of training.
4. The exploration instruments (`gapo.exploration`, the verl trainer's code): per generation batch, over the gathered
   batch (one `accelerator.gather` of each completion's first `entrance_tokens` ids, its prompt's key and its
   advantage's sign), the entrance and coverage sums, the coverage window (one generation batch is one of its steps)
   and `gapo.groups.group_metrics`; per micro-batch, the entropy of TRL's loss forward pass by success and c, reduced
   in the diagnostics' collective. Every process computes the same numbers; all are sums, accumulated until TRL logs
   `gapo/explore/*`, `gapo/groups/*`, `gapo/eps_high/*` (docs/trl.md).

tests/trl_integration/test_trl_integration.py checks that TRL honours the per-completion bound (loss and gradients equal the verl
loss's on the same tensors); a TRL upgrade that stops reading `self.epsilon_high` fails it.
"""

from __future__ import annotations

import json
import math
import warnings
from collections import defaultdict
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from pathlib import Path

import torch
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from gapo.clip_diagnostics import diagnostic_sums, is_adv_points, metrics_from_sums, named_sums
from gapo.config import GAPOConfig
from gapo.diagnostics import IS_ADV_CORR_LEVELS, CorrelationWindow
from gapo.exploration import (
    CoverageWindow,
    ExplorationConfig,
    add_sums,
    entropy_sums,
    entropy_table,
    exploration_metrics,
    first_moves,
    newline_token_ids,
    prompt_key,
    rollout_sums,
    row_entropy_sums,
)
from gapo.groups import GroupStatistics, group_metrics, group_statistics
from gapo.peers.builtin import cut_fraction, cut_terms
from gapo.peers.bapo import BAPOConfig, bapo_bounds
from gapo.peers.dcpo import dcpo_ratio_bounds
from gapo.surrogate import bounded_token_surrogate, sequence_clipped_surrogate, token_clipped_surrogate
from gapo.threshold import adaptive_eps_high, rollout_eps_high

# TRL's losses that clip the ratio to [1 - epsilon, 1 + epsilon_high]: the ones whose upper clip GAPO can set.
CLIP_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
# Why the others are refused: epsilon means something else there, or there is no clip.
OTHER_LOSS_TYPES = {
    "cispo": "epsilon_high is a cap on the importance weight itself (e.g. 5.0), not 1 + a clip",
    "sapo": "a soft gate with temperatures, no clip; run it as a peer with its diagnostics: peer='sapo'",
    "vespo": "gamma-weighted importance weights, no clip",
}
# The ported peers (docs/peers.md) that can replace GAPO's bounds in TRL's clamp (GAPOTRLConfig.peer); token level
TRL_PEERS = ("dcpo", "bapo", "sapo")
NUM_CORRECT_KEY, GROUP_SIZE_KEY, SUCCESS_KEY = "gapo_num_correct", "gapo_group_size", "gapo_success"
STAT_KEYS = (NUM_CORRECT_KEY, GROUP_SIZE_KEY, SUCCESS_KEY)
_CAPTURE = object()  # marks "keep the next log-probs and entropies TRL computes" (the loss's own forward pass)
# `gapo.groups.group_metrics`' means over groups, and the eps_high statistics (over the adaptive rollouts)
GROUP_METRICS = ("mixed_frac", "all_correct_frac", "all_wrong_frac", "success_rate_mean", "size_mean")
EPS_HIGH_MEAN, EPS_HIGH_MIN, EPS_HIGH_MAX = "gapo/eps_high/mean", "gapo/eps_high/min", "gapo/eps_high/max"


def _settings(value, cls, key: str, qualname: str, example: str, what: str, prefix_errors: bool):
    """A `cls` from what a `GAPOTRLConfig.<key>` field may hold: a `cls`, a dict of its fields, a JSON string of one
    (what a command line gives), or None (its defaults). ValueError names the bad value, the valid keys or the fix."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        if hasattr(value, "validate"):
            value.validate()  # a dataclass can be changed after construction
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"GAPOTRLConfig.{key}={value!r} is not JSON ({err}); pass e.g. '{example}' or a "
                             f"{qualname}") from None
    if not isinstance(value, dict):
        raise ValueError(f"GAPOTRLConfig.{key}={value!r}: pass a {qualname}, a dict of its fields or a JSON string")
    known = [f.name for f in fields(cls)]
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ValueError(f"GAPOTRLConfig.{key} has unknown keys {unknown}; {what} are {known}")
    if not prefix_errors:
        return cls(**value)  # its ValueError names the key, the value and the fix
    try:
        return cls(**value)
    except ValueError as err:
        raise ValueError(f"GAPOTRLConfig.{key}: {err}") from None


def gapo_settings(value) -> GAPOConfig:
    """A GAPOConfig from what `GAPOTRLConfig.gapo` may hold (`_settings`)."""
    return _settings(value, GAPOConfig, "gapo", "gapo.GAPOConfig",
                     '{"eps_high_max": 0.28, "schedule": "linear"}', "GAPO's settings", prefix_errors=True)


def exploration_settings(value) -> ExplorationConfig:
    """An ExplorationConfig from what `GAPOTRLConfig.exploration` may hold (`_settings`; a bad value gets
    ExplorationConfig's message: `exploration.<key>=<value>` and the fix)."""
    return _settings(value, ExplorationConfig, "exploration", "gapo.exploration.ExplorationConfig",
                     '{"entrance_tokens": 8, "coverage_window": 20}', "the exploration settings", prefix_errors=False)


def bapo_settings(value) -> BAPOConfig:
    """A BAPOConfig from what `GAPOTRLConfig.bapo` may hold (`_settings`; BAPOConfig's message names the key)."""
    return _settings(value, BAPOConfig, "bapo", "gapo.peers.bapo.BAPOConfig", '{"bapo_rho": 0.5}', "BAPO's settings",
                     prefix_errors=False)


def resolve_trl_clips(args: GRPOConfig, settings: GAPOConfig) -> tuple[float, float]:
    """(eps_low, eps_high_max) from TRL's clip fields and GAPO's settings, validated with TRL's names.

    eps_low is TRL's `epsilon`; eps_high_max is `gapo.eps_high_max`, or TRL's `epsilon_high` when that is None (TRL's
    own default: `epsilon`).
    """
    eps_low = args.epsilon
    eps_high_max = settings.eps_high_max
    if eps_high_max is None:
        eps_high_max = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    if not (isinstance(eps_low, (int, float)) and math.isfinite(eps_low) and 0 <= eps_low < 1):
        raise ValueError(f"epsilon={eps_low!r} (GAPO's eps_low, the lower clip) must be a number in [0, 1)")
    if not (math.isfinite(eps_high_max) and eps_high_max >= eps_low):
        source = "gapo.eps_high_max" if settings.eps_high_max is not None else "epsilon_high"
        raise ValueError(
            f"{source}={eps_high_max!r} (GAPO's eps_high_max, the upper clip at c = 1) is below epsilon={eps_low!r} "
            f"(the lower clip): the widest upper clip cannot be narrower than the lower one; raise {source} or lower "
            "epsilon"
        )
    return float(eps_low), float(eps_high_max)


def on_cpu(args) -> bool:
    """True when TRL's arguments train on CPU: `use_cpu`, or no CUDA, XPU or MPS device to train on."""
    if getattr(args, "use_cpu", False):
        return True
    xpu = getattr(torch, "xpu", None)
    mps = getattr(torch.backends, "mps", None)
    return not (torch.cuda.is_available() or (xpu is not None and xpu.is_available())
                or (mps is not None and mps.is_available()))


@dataclass
class GAPOTRLConfig(GRPOConfig):
    """TRL's `GRPOConfig` plus `gapo`: GAPO's settings (`gapo.GAPOConfig`, the one source of their defaults), and
    `exploration`: the exploration instruments' (`gapo.exploration.ExplorationConfig`).

    Attributes:
        gapo: a `gapo.GAPOConfig`, a dict of its fields, or a JSON string of one (on a command line); None gives its
            defaults. Held as a GAPOConfig after construction. The knobs: `eps_high_max` (upper clip at c = 1; None:
            TRL's `epsilon_high`), `schedule` ("linear": Eq. 11; "exp"; "constant": the fixed clip baseline),
            `success_threshold` (a completion succeeds when its weighted reward is above it), `diagnostics`,
            `diag_corr_window` (logging intervals pooled by `gapo/is_adv_corr_window`). `mask_truncated` is verl's;
            here use TRL's own `mask_truncated_completions`.
        exploration: a `gapo.exploration.ExplorationConfig`, a dict of its fields, or a JSON string of one; None gives
            its defaults. Held as an ExplorationConfig after construction. The knobs: `entrance_tokens` (m, a first
            move's length), `entrance_until_newline`, `coverage_window` (W, in generation batches),
            `coverage_threshold` (a prompt is covered when its c / k is above it).
        peer: None (GAPO), or a peer run in GAPO's place with the same diagnostics (TRL_PEERS; docs/peers.md):
            "dcpo" (`gapo.peers.dcpo`'s bounds in TRL's clamp: eps_low = `epsilon`, eps_high = eps_high_max; token
            level; TRL has no dual clip, so DCPO's for A < 0 is not applied here), "bapo" (`gapo.peers.bapo`'s bounds
            for each micro-batch, its sums reduced over the processes, settings from `bapo`; token level; no dual
            clip either), or "sapo" (TRL's own
            `loss_type="sapo"`, unchanged; its diagnostics count the share of the gradient its gate removes,
            `gapo.peers.builtin`).

    Precision: TRL resolves an unset `bf16` to True (bf16 autocast). On CPU (`on_cpu`: `use_cpu`, or no CUDA, XPU or
    MPS device) an unset `bf16` is False here instead: CPU autocast runs every matmul in bf16, through a scalar GEMM on
    CPUs without native bf16 (SmolLM2-135M, 2 cores: 78-113 s an optimizer step of 8 completions in bf16; 12.6-24.7 s
    a step of 16 in float32), and rounds
    the logits to bf16, whose spacing near 1 (0.0078) is coarser than clips of 3e-3. An explicit `bf16=True` is kept.

    Validated at construction: `num_generations` >= 2 and `steps_per_generation` >= 1 (before TRL's checks divide by
    them), `loss_type` must be one of TRL's clipped losses (CLIP_LOSS_TYPES), eps_high_max >=
    epsilon, the exploration knobs (ExplorationConfig's message: the key, the value, the fix). Warned: an on-policy
    setup (TRL's ratio is then exactly 1 and no clip binds), eps_high_max == epsilon.
    """

    gapo: dict | str | None = field(
        default=None,
        metadata={"help": "GAPO's settings (gapo.GAPOConfig): a JSON object such as "
                          "'{\"eps_high_max\": 0.28, \"schedule\": \"linear\", \"success_threshold\": 0.5}'; "
                          "null for the defaults. The lower clip is `epsilon`; eps_high_max null uses `epsilon_high`."},
    )
    peer: str | None = field(
        default=None,
        metadata={"help": "a peer in GAPO's place (docs/peers.md): 'dcpo' (token ratio bounds from each token's old "
                          "probability, epsilon and eps_high_max its epsilons; token level) or 'sapo' (TRL's "
                          "loss_type='sapo'); null: GAPO. The per-c diagnostics are logged for it as for GAPO."},
    )
    bapo: dict | str | None = field(
        default=None,
        metadata={"help": "BAPO's settings for peer='bapo' (gapo.peers.bapo.BAPOConfig): a JSON object such as "
                          "'{\"bapo_rho\": 0.5, \"bapo_upper_max\": 3.0}'; null for BAPO's paper's values."},
    )
    exploration: dict | str | None = field(
        default=None,
        metadata={"help": "the exploration instruments' settings (gapo.exploration.ExplorationConfig): a JSON object "
                          "such as '{\"entrance_tokens\": 8, \"entrance_until_newline\": false, \"coverage_window\": "
                          "20, \"coverage_threshold\": 0.05}'; null for the defaults. The window counts generation "
                          "batches."},
    )

    def __post_init__(self):
        # before TRL's own checks, which divide by these first (ZeroDivisionError, TypeError for None)
        if self.num_generations is None or self.num_generations < 2:
            raise ValueError(f"num_generations must be >= 2 (GRPO and GAPO compare completions within a group), got "
                             f"{self.num_generations}")
        if self.steps_per_generation is not None and self.steps_per_generation < 1:
            raise ValueError(f"steps_per_generation must be >= 1 (or null: gradient_accumulation_steps), got "
                             f"{self.steps_per_generation}")
        if self.bf16 is None and not self.fp16 and on_cpu(self):
            self.bf16 = False  # TRL's default autocast is slow and coarse on CPU (class docstring)
        super().__post_init__()
        self.gapo = gapo_settings(self.gapo)
        self.exploration = exploration_settings(self.exploration)
        if self.peer == "sapo" and self.loss_type != "sapo":
            raise ValueError(f"peer='sapo' is TRL's own SAPO loss: set loss_type='sapo' (got {self.loss_type!r})")
        if self.loss_type not in CLIP_LOSS_TYPES and not (self.peer == "sapo" and self.loss_type == "sapo"):
            why = OTHER_LOSS_TYPES.get(self.loss_type, "not a clipped loss of TRL 1.16.0")
            raise ValueError(
                f"loss_type={self.loss_type!r} cannot carry GAPO's clip ({why}); use one of {', '.join(CLIP_LOSS_TYPES)}"
                ": 'grpo' with importance_sampling_level='sequence' is GSPO (verl's seq-mean-token-mean), 'dapo' at "
                "token level is verl's token-mean (docs/trl.md)"
            )
        if self.peer is not None and self.peer not in TRL_PEERS:
            raise ValueError(f"peer={self.peer!r} is not a peer this TRL loss can run; choose one of "
                             f"{', '.join(TRL_PEERS)}, or null for GAPO (docs/peers.md)")
        if self.peer in ("dcpo", "bapo") and self.importance_sampling_level != "token":
            raise ValueError(f"peer={self.peer!r} clips token ratios: set importance_sampling_level='token' (got "
                             f"{self.importance_sampling_level!r})")
        self.bapo = bapo_settings(self.bapo)
        if self.gapo.mask_truncated:
            raise ValueError("gapo.mask_truncated is the verl trainer's overlong filter; with TRL set "
                             "mask_truncated_completions=True instead (and leave gapo.mask_truncated False)")
        eps_low, eps_high_max = resolve_trl_clips(self, self.gapo)
        if eps_high_max == eps_low and self.gapo.schedule != "constant":
            warnings.warn(f"GAPO's eps_high_max equals epsilon ({eps_low:g}): every completion gets the same upper "
                          "clip; set gapo.eps_high_max (or epsilon_high) above epsilon", UserWarning, stacklevel=2)
        generate_every = self.steps_per_generation * self.num_iterations
        if self.gradient_accumulation_steps % generate_every == 0:
            warnings.warn(
                f"on-policy setup (gradient_accumulation_steps={self.gradient_accumulation_steps} is a multiple of "
                f"steps_per_generation={self.steps_per_generation} x num_iterations={self.num_iterations}): every "
                "completion is used before the first optimizer step after its generation, so TRL's ratio is exactly 1 "
                "and no clip, GAPO's included, can bind. Reuse each generation for several optimizer steps: e.g. "
                "steps_per_generation = 4 x gradient_accumulation_steps (the paper's four mini-batches per rollout "
                "batch) or num_iterations=2", UserWarning, stacklevel=2,
            )

    def to_dict(self):
        """TRL's dict of the arguments (what W&B records), with `gapo` as a plain dict so that it serialises."""
        out = super().to_dict()
        if isinstance(self.gapo, GAPOConfig):
            out["gapo"] = asdict(self.gapo)
        if isinstance(self.exploration, ExplorationConfig):
            out["exploration"] = asdict(self.exploration)
        if isinstance(self.bapo, BAPOConfig):
            out["bapo"] = asdict(self.bapo)
        return out


def completion_success(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor, threshold: float) -> torch.Tensor:
    """(N,) bool: each completion's weighted reward is above `threshold`.

    Args:
        rewards_per_func: (N, F) rewards of N completions from F reward functions, NaN where a function gave None.
        reward_weights: (F,) TRL's `reward_weights`.
    The weighted reward is TRL's: the NaN-skipping weighted sum over functions; a completion that no function scored
    (all NaN) is a failure.
    """
    weights = reward_weights.to(device=rewards_per_func.device, dtype=rewards_per_func.dtype)
    rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
    scored = ~torch.isnan(rewards_per_func).all(dim=1)
    return scored & (rewards > threshold)


def completion_group_statistics(success: torch.Tensor, num_generations: int) -> GroupStatistics:
    """(c, k, success) per completion of a gathered generation batch: TRL's groups are contiguous blocks of
    `num_generations` completions of one prompt.

    Raises:
        ValueError: the batch is not a whole number of groups.
    """
    n = success.shape[0]
    if num_generations < 1 or n % num_generations:
        raise ValueError(f"{n} completions do not form groups of num_generations={num_generations}")
    return group_statistics([i // num_generations for i in range(n)], success.cpu())


def token_advantages(advantages: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each completion's advantage per token (B, T) float32, and summed over its loss tokens (B,): the sum's sign
    decides who gets the adaptive bound.

    Args:
        advantages: TRL's (B,) per-completion advantages, or (B, T) per-token ones.
        mask: (B, T) the loss's tokens (TRL's completion_mask, times tool_mask when present).
    """
    per_token = (advantages.unsqueeze(1) if advantages.dim() == 1 else advantages).float().expand(mask.shape)
    return per_token, (per_token * mask).sum(-1)


def completion_heads(completion_ids: list, m: int) -> torch.Tensor:
    """(B, m) int64: each completion's first m token ids (of TRL's unpadded id lists), -1 past its end: the rows
    `gapo.exploration.first_moves` reads, as `leading_tokens` gives them from verl's responses."""
    heads = torch.full((len(completion_ids), m), -1, dtype=torch.long)
    for row, ids in enumerate(completion_ids):
        head = [int(t) for t in ids[:m]]
        heads[row, : len(head)] = torch.tensor(head, dtype=torch.long)
    return heads


class GroupMetricSums:
    """`gapo.groups.group_metrics` of several generation batches, exact over all of them: `gapo/groups/*` are means
    over groups (kept as value x groups, and groups), `gapo/eps_high/mean` a mean over the completions with the
    adaptive bound (value x count, and count), min and max the extremes."""

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        """Forget every batch (after a log)."""
        self.groups, self.sums, self.eps_count, self.eps_sum = 0, defaultdict(float), 0, 0.0
        self.eps_min, self.eps_max = math.inf, -math.inf

    def add(self, metrics: dict[str, float], groups: int, adaptive: int) -> None:
        """One batch's `group_metrics` output, its number of groups and of completions with the adaptive bound."""
        if not metrics:
            return
        self.groups += groups
        for name in GROUP_METRICS:
            self.sums[name] += metrics[f"gapo/groups/{name}"] * groups
        if EPS_HIGH_MEAN in metrics:
            self.eps_count += adaptive
            self.eps_sum += metrics[EPS_HIGH_MEAN] * adaptive
            self.eps_min = min(self.eps_min, metrics[EPS_HIGH_MIN])
            self.eps_max = max(self.eps_max, metrics[EPS_HIGH_MAX])

    def metrics(self) -> dict[str, float]:
        """The metrics over every batch added since the last clear (none when none was)."""
        out = {f"gapo/groups/{name}": self.sums[name] / self.groups for name in GROUP_METRICS} if self.groups else {}
        if self.eps_count:
            out.update({EPS_HIGH_MEAN: self.eps_sum / self.eps_count, EPS_HIGH_MIN: self.eps_min,
                        EPS_HIGH_MAX: self.eps_max})
        return out


class GAPOGRPOTrainer(GRPOTrainer):
    """TRL's `GRPOTrainer` with GAPO's per-completion upper clip and diagnostics (see the module docstring).

    Takes GRPOTrainer's arguments; `args` must be a `GAPOTRLConfig` (None: its defaults).
    """

    def __init__(self, model, reward_funcs=None, args: GAPOTRLConfig | None = None, *rest, **kwargs):
        """Build TRL's trainer from the same arguments (``model``, ``reward_funcs``, ``args`` and the rest).

        Raises:
            TypeError: ``args`` is not a ``GAPOTRLConfig``.
        """
        if args is None:
            args = GAPOTRLConfig()
        if not isinstance(args, GAPOTRLConfig):
            raise TypeError(f"GAPOGRPOTrainer needs args=GAPOTRLConfig(...) (TRL's GRPOConfig plus `gapo`), got "
                            f"{type(args).__name__}; build it as GAPOTRLConfig(<the same arguments>, gapo=GAPOConfig(...))")
        super().__init__(model, reward_funcs, args, *rest, **kwargs)
        self.gapo: GAPOConfig = args.gapo
        self.exploration: ExplorationConfig = args.exploration
        self.gapo_clips = resolve_trl_clips(args, self.gapo)
        self.peer = args.peer  # None: GAPO's bounds; "dcpo": DCPO's, set in the loss's forward (its old log-probs)
        self._gapo_peer = None  # while a peer's loss runs: {"old": (B, T) or None, then "lower"/"upper": (B, T)}
        self._gapo_rewards = None  # the latest generation batch's rewards, every process's rows (TRL gathers them)
        self._gapo_heads = None  # the latest generation batch's first completion tokens, this process's rows
        self._gapo_forward = None  # _CAPTURE while the loss runs, then (log-probs, entropies) of its forward pass
        self._gapo_sums = {"train": defaultdict(float), "eval": defaultdict(float)}
        self._gapo_window = CorrelationWindow(self.gapo.diag_corr_window)
        # exploration, per mode: the entropy, entrance and coverage sums of the interval; the coverage window (a
        # generation batch is a step) and its metrics after the interval's latest batch; the group metrics
        self._gapo_explore = {"train": defaultdict(float), "eval": defaultdict(float)}
        self._gapo_coverage = {mode: CoverageWindow(self.exploration.coverage_window) for mode in ("train", "eval")}
        self._gapo_coverage_latest = {"train": {}, "eval": {}}
        self._gapo_groups = {"train": GroupMetricSums(), "eval": GroupMetricSums()}
        self._gapo_newline_ids = newline_token_ids(self._tokenizer) if self.exploration.entrance_until_newline else None
        self._warn_low_precision()

    def _warn_low_precision(self) -> None:
        """Warn when the log-probs' dtype cannot resolve the clips (bf16's spacing near 1 is 0.0078)."""
        head = self.accelerator.unwrap_model(self.model).get_output_embeddings()
        dtype = head.weight.dtype if head is not None else next(self.model.parameters()).dtype
        if self.args.bf16 or self.args.fp16:  # autocast: the LM head's tiles are computed in its dtype
            dtype = torch.bfloat16 if self.args.bf16 else torch.float16
        if self.args.cast_lm_head_to_fp32 or dtype == torch.float32 or not dtype.is_floating_point:
            return
        eps_low, eps_high_max = self.gapo_clips
        step = (eps_high_max - eps_low) / max(self.num_generations - 1, 1)  # between adjacent c (linear schedule)
        finest = min(x for x in (eps_low, step, eps_high_max) if x > 0) if eps_high_max > 0 else 0.0
        spacing = torch.finfo(dtype).eps
        if finest < spacing:
            warnings.warn(
                f"the LM head computes log-probs in {dtype} (spacing {spacing:g} near 1), coarser than GAPO's clips "
                f"(epsilon={eps_low:g}, eps_high_max={eps_high_max:g}): set cast_lm_head_to_fp32=True, or train in "
                "float32 (a float32 model and bf16=False)", UserWarning, stacklevel=3,
            )

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """TRL's rewards, (B_all, number of reward functions) over every process's rows; kept for the success counts,
        with this process's completions' first `entrance_tokens` ids (their entrances)."""
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._gapo_rewards = rewards_per_func
        self._gapo_heads = completion_heads(completion_ids_list, self.exploration.entrance_tokens)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        """TRL's generation batch plus this process's (B,) `gapo_num_correct`, `gapo_group_size` and `gapo_success`.

        (c, k, success) are computed over the gathered batch (groups of `num_generations`, or `num_generations_eval`
        in evaluation), then sliced to this process's rows. Raises RuntimeError when TRL scored without
        `_calculate_rewards` (an unsupported TRL version). Also records the batch's exploration and group metrics
        (`_record_generation`).
        """
        self._gapo_rewards = self._gapo_heads = None
        output = super()._generate_and_score_completions(inputs)
        if self._gapo_rewards is None:
            raise RuntimeError("TRL scored this batch without GRPOTrainer._calculate_rewards, so GAPO has no group "
                               "success counts: this TRL version is not supported (pip install -e '.[trl]' pins it)")
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        success = completion_success(self._gapo_rewards, self.reward_weights, self.gapo.success_threshold)
        stats = completion_group_statistics(success, num_generations)
        local = output["completion_ids"].shape[0]
        rows = slice(self.accelerator.process_index * local, (self.accelerator.process_index + 1) * local)
        device = output["completion_ids"].device
        output[NUM_CORRECT_KEY] = stats.num_correct[rows].to(device)
        output[GROUP_SIZE_KEY] = stats.group_size[rows].to(device)
        output[SUCCESS_KEY] = stats.success[rows].to(device)
        self._record_generation(output, stats, mode, num_generations)
        self._gapo_rewards = self._gapo_heads = None
        return output

    def _record_generation(self, output, stats: GroupStatistics, mode: str, num_generations: int) -> None:
        """Add one generation batch's entrance and coverage sums and group metrics, over every process's rows, to
        the mode's interval; advance its coverage window by one step.

        One gather of a (B, m + 2) int64 tensor per process: each completion's first m ids (-1 past its end), its
        prompt's key (`prompt_key` of the prompt's token ids) and whether its advantage is positive. The rows are then
        in the gathered order, the one of `stats` (groups: contiguous blocks of `num_generations`), so every process
        computes the same numbers.
        """
        device = output["completion_ids"].device
        prompt_ids, prompt_mask = output["prompt_ids"].cpu(), output["prompt_mask"].cpu().bool()
        keys = torch.tensor([prompt_key(ids[real]) for ids, real in zip(prompt_ids, prompt_mask)], dtype=torch.long)
        mask = output["completion_mask"]
        if "tool_mask" in output:
            mask = mask * output["tool_mask"]
        positive = (token_advantages(output["advantages"], mask)[1] > 0).long().cpu()
        local = torch.cat([self._gapo_heads, keys.unsqueeze(1), positive.unsqueeze(1)], dim=1)
        rows = self.accelerator.gather(local.to(device)).cpu()
        m = self.exploration.entrance_tokens
        moves = first_moves(rows[:, :m], self._gapo_newline_ids)
        prompts, positive = rows[:, m].tolist(), rows[:, m + 1].bool()
        groups = [i // num_generations for i in range(rows.shape[0])]
        success, include = stats.success.tolist(), [True] * rows.shape[0]
        sums, seen, above = rollout_sums(groups, prompts, moves, success, include, self.exploration.coverage_threshold)
        add_sums(self._gapo_explore[mode], sums)
        self._gapo_coverage_latest[mode] = self._gapo_coverage[mode].add(seen, above)
        eps_low, eps_high_max = self.gapo_clips
        thresholds = partial(adaptive_eps_high, eps_low=eps_low, eps_high_max=eps_high_max, schedule=self.gapo.schedule)
        real = torch.ones(rows.shape[0], dtype=torch.bool)
        adaptive = int((stats.success & positive).sum())
        self._gapo_groups[mode].add(group_metrics(stats, positive, real, thresholds), len(set(groups)), adaptive)

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        """TRL's; while `_compute_loss` runs, also keeps its forward pass's (B, T) log-probs and entropies (None when
        TRL did not compute them) for the diagnostics and the entropy instruments."""
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._gapo_forward is _CAPTURE:
            self._gapo_forward = (out[0].detach(), None if out[1] is None else out[1].detach())
            if self._gapo_peer is not None and self.peer in ("dcpo", "bapo"):  # the peer's bounds, from this pass
                peer = self._gapo_peer
                old = out[0].detach() if peer["old"] is None else peer["old"]  # on-policy: TRL's old log-probs
                if self.peer == "dcpo":
                    lower, upper = dcpo_ratio_bounds(old, *self.gapo_clips)
                else:
                    ratio = torch.exp(out[0].detach() - old)

                    def reduce(t):
                        t.copy_(self.accelerator.reduce(t, reduction="sum"))

                    low, high, _ = bapo_bounds(ratio, peer["advantages"], peer["mask"], self.args.bapo, reduce)
                    lower, upper = low.expand_as(ratio), high.expand_as(ratio)
                peer.update(old=old, lower=lower, upper=upper)
                self.epsilon_low, self.epsilon_high = 1 - lower, upper - 1
        return out

    def _compute_loss(self, model, inputs):
        """TRL's loss with each completion's upper clip eps_high(c, k); records the diagnostic and entropy sums."""
        missing = [key for key in STAT_KEYS if key not in inputs]
        if missing:
            raise RuntimeError(f"the batch has no {missing}: it did not come from GAPOGRPOTrainer's "
                               "_generate_and_score_completions")
        mask = inputs["completion_mask"] if "tool_mask" not in inputs else inputs["completion_mask"] * inputs["tool_mask"]
        per_token_adv, advantage_sum = token_advantages(inputs["advantages"], mask)
        eps_low, eps_high_max = self.gapo_clips
        saved = self.epsilon_low, self.epsilon_high
        if self.peer is None:
            eps_high, adaptive = rollout_eps_high(inputs[NUM_CORRECT_KEY], inputs[GROUP_SIZE_KEY], inputs[SUCCESS_KEY],
                                                  advantage_sum > 0, eps_low, eps_high_max, self.gapo.schedule)
            self.epsilon_low = torch.tensor(eps_low, device=eps_high.device)
            self.epsilon_high = eps_high.unsqueeze(-1)  # (B, 1): one bound per completion, over its tokens
        else:  # the peer's bounds are set by the forward pass (`_get_per_token_logps_and_entropies`)
            adaptive = inputs[SUCCESS_KEY].to(torch.bool) & (advantage_sum > 0)
            self._gapo_peer = {"old": inputs.get("old_per_token_logps"), "advantages": per_token_adv, "mask": mask}
        self._gapo_forward = _CAPTURE
        try:
            loss = super()._compute_loss(model, inputs)
            forward, peer = self._gapo_forward, self._gapo_peer
        finally:
            self.epsilon_low, self.epsilon_high = saved
            self._gapo_forward, self._gapo_peer = None, None
        if isinstance(forward, tuple):
            logps, entropies = forward
            old = inputs.get("old_per_token_logps")
            old = logps if old is None else old
            if self.peer in ("dcpo", "bapo"):  # the diagnostics' headroom: the mean of upper - 1 over its tokens
                eps_high = ((peer["upper"] - 1) * mask).sum(-1) / mask.sum(-1).clamp_min(1)
            elif self.peer == "sapo":  # no bound: no headroom
                eps_high = torch.zeros_like(advantage_sum)
            self._record_sums(logps, old, entropies, per_token_adv, mask, inputs, adaptive, eps_high, advantage_sum,
                              peer)
        return loss

    def _record_sums(self, logps, old_logps, entropies, advantages, mask, inputs, adaptive, eps_high,
                     advantage_sum, peer=None) -> None:
        """Add this micro-batch's per-c diagnostic sums (with `gapo.diagnostics`) and its entropy sums by success and c
        (`gapo.exploration.entropy_table`), summed over processes in one collective, to the logging interval's."""
        mode = "train" if self.model.training else "eval"
        max_count = self.num_generations if mode == "train" else self.num_generations_eval
        with torch.no_grad():
            pieces = []
            if self.gapo.diagnostics:
                if self.peer == "sapo":  # the share of each token's gradient TRL's soft gate removed
                    cut = cut_fraction("sapo", logps, old_logps, advantages, 0.0, 0.0,
                                       self.args.sapo_temperature_pos, self.args.sapo_temperature_neg)
                    terms = cut_terms(cut, logps, old_logps, mask)
                elif peer is not None:  # the peer's per-token bounds; TRL has no dual clip
                    terms = bounded_token_surrogate(logps, old_logps, advantages, mask, peer["lower"], peer["upper"],
                                                    clip_ratio_c=float("inf"))
                else:
                    surrogate = (sequence_clipped_surrogate if self.importance_sampling_level == "sequence"
                                 else token_clipped_surrogate)
                    terms = surrogate(logps, old_logps, advantages, mask, self.gapo_clips[0], eps_high)
                pieces.append(diagnostic_sums(terms, inputs[NUM_CORRECT_KEY], inputs[GROUP_SIZE_KEY], adaptive,
                                              eps_high, advantage_sum, max_count).double())
            split = pieces[0].numel() if pieces else 0
            if entropies is not None:
                include = torch.ones(mask.shape[0], dtype=torch.bool, device=mask.device)
                pieces.append(entropy_table(*row_entropy_sums(entropies, mask), inputs[SUCCESS_KEY],
                                            inputs[NUM_CORRECT_KEY], include, max_count).reshape(-1))
            if not pieces:
                return
            # one collective and one host transfer per micro-batch (every process runs the loss in step); float64 so
            # that the entropy sums add exactly as the host's
            total = self.accelerator.reduce(torch.cat(pieces), reduction="sum").tolist()
        if split:
            sums = self._gapo_sums[mode]
            for name, value in named_sums(total[:split], max_count).items():
                sums[name] += value
        if entropies is not None:
            add_sums(self._gapo_explore[mode], entropy_sums(total[split:]))

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's log, plus the `gapo/*` diagnostics of the interval since the last log (`eval_gapo/*` in evaluation);
        a training interval also joins the `gapo/is_adv_corr_window` window. Also the interval's `gapo/explore/*`
        (with the coverage window as of its latest generation batch, when it had one), `gapo/groups/*` and
        `gapo/eps_high/*`."""
        mode = "train" if self.model.training else "eval"
        sums, metrics = self._gapo_sums[mode], {}
        if sums:
            metrics = metrics_from_sums(sums)
            if mode == "train" and IS_ADV_CORR_LEVELS in metrics:
                metrics.update(self._gapo_window.add(is_adv_points(metrics)))
            sums.clear()
        metrics.update(exploration_metrics(self._gapo_explore[mode]))
        metrics.update(self._gapo_coverage_latest[mode])
        metrics.update(self._gapo_groups[mode].metrics())
        self._gapo_explore[mode].clear()
        self._gapo_coverage_latest[mode] = {}
        self._gapo_groups[mode].clear()
        prefix = "eval_" if mode == "eval" else ""  # TRL's convention for evaluation metrics
        logs.update({f"{prefix}{name}": value for name, value in metrics.items()})
        super().log(logs, start_time)


class MetricsFileCallback(TrainerCallback):
    """Writes every log of the trainer (TRL's metrics and GAPO's `gapo/*`) to `path` in verl's file-logger format, one
    line `{"step": <optimizer step>, "data": {metric: value}}` per log, so that `recipe.plot_run` reads a TRL run as it
    reads a verl run (`python -m recipe.plot_run <path or its folder>`). Numbers only, NaN and inf written as null
    (as verl's writer does); the main process only. The file is started afresh at this callback's first log and
    appended to after it (a later `evaluate()` adds its `eval_*` lines).

        trainer = GAPOGRPOTrainer(..., callbacks=[MetricsFileCallback("runs/my-run/logs/metrics.jsonl")])
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._started = False

    def on_log(self, args, state, control, logs=None, **kwargs):
        """Append `logs` at `state.global_step` (TrainerCallback's hook, called at every log of every process)."""
        if not state.is_world_process_zero or not logs:
            return
        data = {key: value if math.isfinite(value) else None for key, value in logs.items()
                if isinstance(value, int | float) and not isinstance(value, bool)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a" if self._started else "w") as fp:
            fp.write(json.dumps({"step": state.global_step, "data": data}) + "\n")
        self._started = True

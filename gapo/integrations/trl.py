"""GAPO as a Hugging Face TRL `GRPOTrainer` loss (trl==1.16.0): `GAPOGRPOTrainer` and `GAPOTRLConfig`.

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

tests/trl_integration/test_trl_integration.py checks that TRL honours the per-completion bound (loss and gradients equal the verl
loss's on the same tensors); a TRL upgrade that stops reading `self.epsilon_high` fails it.
"""

from __future__ import annotations

import json
import math
import warnings
from collections import defaultdict
from dataclasses import asdict, dataclass, field, fields

import torch
from trl import GRPOConfig, GRPOTrainer

from gapo.clip_diagnostics import diagnostic_sums, is_adv_points, metrics_from_sums, named_sums
from gapo.config import GAPOConfig
from gapo.diagnostics import IS_ADV_CORR_LEVELS, CorrelationWindow
from gapo.groups import GroupStatistics, group_statistics
from gapo.surrogate import sequence_clipped_surrogate, token_clipped_surrogate
from gapo.threshold import rollout_eps_high

# TRL's losses that clip the ratio to [1 - epsilon, 1 + epsilon_high]: the ones whose upper clip GAPO can set.
CLIP_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
# Why the others are refused: epsilon means something else there, or there is no clip.
OTHER_LOSS_TYPES = {
    "cispo": "epsilon_high is a cap on the importance weight itself (e.g. 5.0), not 1 + a clip",
    "sapo": "a soft gate with temperatures, no clip",
    "vespo": "gamma-weighted importance weights, no clip",
}
NUM_CORRECT_KEY, GROUP_SIZE_KEY, SUCCESS_KEY = "gapo_num_correct", "gapo_group_size", "gapo_success"
STAT_KEYS = (NUM_CORRECT_KEY, GROUP_SIZE_KEY, SUCCESS_KEY)
_CAPTURE = object()  # marks "keep the next log-probs TRL computes" (the loss's own forward pass)


def gapo_settings(value) -> GAPOConfig:
    """A GAPOConfig from what `GAPOTRLConfig.gapo` may hold: a GAPOConfig, a dict of its fields, a JSON string of one
    (what a command line gives), or None (the defaults). Raises ValueError naming the bad value and the valid keys."""
    if isinstance(value, GAPOConfig):
        return value
    if value is None:
        return GAPOConfig()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"GAPOTRLConfig.gapo={value!r} is not JSON ({err}); pass e.g. "
                             "'{\"eps_high_max\": 0.28, \"schedule\": \"linear\"}' or a gapo.GAPOConfig") from None
    if not isinstance(value, dict):
        raise ValueError(f"GAPOTRLConfig.gapo={value!r}: pass a gapo.GAPOConfig, a dict of its fields or a JSON string")
    known = [f.name for f in fields(GAPOConfig)]
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ValueError(f"GAPOTRLConfig.gapo has unknown keys {unknown}; GAPO's settings are {known}")
    try:
        return GAPOConfig(**value)
    except ValueError as err:
        raise ValueError(f"GAPOTRLConfig.gapo: {err}") from None


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


@dataclass
class GAPOTRLConfig(GRPOConfig):
    """TRL's `GRPOConfig` plus `gapo`: GAPO's settings (`gapo.GAPOConfig`, the one source of their defaults).

    Attributes:
        gapo: a `gapo.GAPOConfig`, a dict of its fields, or a JSON string of one (on a command line); None gives its
            defaults. Held as a GAPOConfig after construction. The knobs: `eps_high_max` (upper clip at c = 1; None:
            TRL's `epsilon_high`), `schedule` ("linear": Eq. 11; "exp"; "constant": the fixed clip baseline),
            `success_threshold` (a completion succeeds when its weighted reward is above it), `diagnostics`,
            `diag_corr_window` (logging intervals pooled by `gapo/is_adv_corr_window`). `mask_truncated` is verl's;
            here use TRL's own `mask_truncated_completions`.

    Validated at construction: `loss_type` must be one of TRL's clipped losses (CLIP_LOSS_TYPES), eps_high_max >=
    epsilon. Warned: an on-policy setup (TRL's ratio is then exactly 1 and no clip binds), eps_high_max == epsilon.
    """

    gapo: dict | str | None = field(
        default=None,
        metadata={"help": "GAPO's settings (gapo.GAPOConfig): a JSON object such as "
                          "'{\"eps_high_max\": 0.28, \"schedule\": \"linear\", \"success_threshold\": 0.5}'; "
                          "null for the defaults. The lower clip is `epsilon`; eps_high_max null uses `epsilon_high`."},
    )

    def __post_init__(self):
        super().__post_init__()
        self.gapo = gapo_settings(self.gapo)
        if self.loss_type not in CLIP_LOSS_TYPES:
            why = OTHER_LOSS_TYPES.get(self.loss_type, "not a clipped loss of TRL 1.16.0")
            raise ValueError(
                f"loss_type={self.loss_type!r} cannot carry GAPO's clip ({why}); use one of {', '.join(CLIP_LOSS_TYPES)}"
                ": 'grpo' with importance_sampling_level='sequence' is GSPO (verl's seq-mean-token-mean), 'dapo' at "
                "token level is verl's token-mean (docs/trl.md)"
            )
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
        self.gapo_clips = resolve_trl_clips(args, self.gapo)
        self._gapo_rewards = None  # the latest generation batch's rewards, every process's rows (TRL gathers them)
        self._gapo_logps = None  # _CAPTURE while the loss runs, then the log-probs of its forward pass
        self._gapo_sums = {"train": defaultdict(float), "eval": defaultdict(float)}
        self._gapo_window = CorrelationWindow(self.gapo.diag_corr_window)
        self._warn_low_precision()

    def _warn_low_precision(self) -> None:
        """Warn when the log-probs' dtype cannot resolve the clips (bf16's spacing near 1 is 0.0078)."""
        head = self.accelerator.unwrap_model(self.model).get_output_embeddings()
        dtype = head.weight.dtype if head is not None else next(self.model.parameters()).dtype
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
                "float32", UserWarning, stacklevel=3,
            )

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """TRL's rewards, (B_all, number of reward functions) over every process's rows; kept for the success counts."""
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._gapo_rewards = rewards_per_func
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        """TRL's generation batch plus this process's (B,) `gapo_num_correct`, `gapo_group_size` and `gapo_success`.

        (c, k, success) are computed over the gathered batch (groups of `num_generations`, or `num_generations_eval`
        in evaluation), then sliced to this process's rows. Raises RuntimeError when TRL scored without
        `_calculate_rewards` (an unsupported TRL version).
        """
        self._gapo_rewards = None
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
        self._gapo_rewards = None
        return output

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        """TRL's; while `_compute_loss` runs, also keeps its forward pass's (B, T) log-probs for the diagnostics."""
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._gapo_logps is _CAPTURE:
            self._gapo_logps = out[0].detach()
        return out

    def _compute_loss(self, model, inputs):
        """TRL's loss with each completion's upper clip eps_high(c, k); records the diagnostic sums."""
        missing = [key for key in STAT_KEYS if key not in inputs]
        if missing:
            raise RuntimeError(f"the batch has no {missing}: it did not come from GAPOGRPOTrainer's "
                               "_generate_and_score_completions")
        mask = inputs["completion_mask"] if "tool_mask" not in inputs else inputs["completion_mask"] * inputs["tool_mask"]
        advantages = inputs["advantages"]
        per_token_adv = (advantages.unsqueeze(1) if advantages.dim() == 1 else advantages).float().expand(mask.shape)
        advantage_sum = (per_token_adv * mask).sum(-1)  # (B,): its sign decides who gets the adaptive bound
        eps_low, eps_high_max = self.gapo_clips
        eps_high, adaptive = rollout_eps_high(inputs[NUM_CORRECT_KEY], inputs[GROUP_SIZE_KEY], inputs[SUCCESS_KEY],
                                              advantage_sum > 0, eps_low, eps_high_max, self.gapo.schedule)
        saved = self.epsilon_low, self.epsilon_high
        self.epsilon_low = torch.tensor(eps_low, device=eps_high.device)
        self.epsilon_high = eps_high.unsqueeze(-1)  # (B, 1): one bound per completion, over its tokens at token level
        self._gapo_logps = _CAPTURE
        try:
            loss = super()._compute_loss(model, inputs)
            logps = self._gapo_logps
        finally:
            self.epsilon_low, self.epsilon_high = saved
            self._gapo_logps = None
        if self.gapo.diagnostics and isinstance(logps, torch.Tensor):
            old = inputs.get("old_per_token_logps")
            self._record_sums(logps, logps if old is None else old, per_token_adv, mask, inputs, adaptive, eps_high,
                              advantage_sum)
        return loss

    def _record_sums(self, logps, old_logps, advantages, mask, inputs, adaptive, eps_high, advantage_sum) -> None:
        """Add this micro-batch's per-c sums, summed over processes, to the current logging interval's."""
        surrogate = sequence_clipped_surrogate if self.importance_sampling_level == "sequence" else token_clipped_surrogate
        with torch.no_grad():
            terms = surrogate(logps, old_logps, advantages, mask, self.gapo_clips[0], eps_high)
            mode = "train" if self.model.training else "eval"
            max_count = self.num_generations if mode == "train" else self.num_generations_eval
            flat = diagnostic_sums(terms, inputs[NUM_CORRECT_KEY], inputs[GROUP_SIZE_KEY], adaptive, eps_high,
                                   advantage_sum, max_count)
            # one collective and one host transfer per micro-batch (every process runs the loss in step)
            total = self.accelerator.reduce(flat, reduction="sum")
        sums = self._gapo_sums[mode]
        for name, value in named_sums(total.tolist(), max_count).items():
            sums[name] += value

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's log, plus the `gapo/*` diagnostics of the interval since the last log (`eval_gapo/*` in evaluation);
        a training interval also joins the `gapo/is_adv_corr_window` window."""
        mode = "train" if self.model.training else "eval"
        sums = self._gapo_sums[mode]
        if sums:
            metrics = metrics_from_sums(sums)
            if mode == "train" and IS_ADV_CORR_LEVELS in metrics:
                metrics.update(self._gapo_window.add(is_adv_points(metrics)))
            sums.clear()
            prefix = "eval_" if mode == "eval" else ""  # TRL's convention for evaluation metrics
            logs.update({f"{prefix}{name}": value for name, value in metrics.items()})
        super().log(logs, start_time)

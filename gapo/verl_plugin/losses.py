"""GAPO's policy losses in verl's registry (`gapo`: sequence level, `gapo_token`: token level) and the
actor-side loss callable that hands them each rollout's group statistics.

verl calls a registered policy loss with a fixed set of tensors (no uid, no group statistic). The
GAPO trainer (`gapo.verl_plugin.trainer`) writes each rollout's group success count c, group size k and
success flag into the batch (fields `gapo_num_correct`, `gapo_group_size`, `gapo_success`) and installs
`GAPOActorLoss` as the actor's loss callable (verl's `set_loss_fn` hook). For each micro-batch,
`GAPOActorLoss` puts those (B,) tensors in a context variable and runs verl's own `ppo_loss`, which calls
the registered loss; the loss turns (c, k) into thresholds inside the FSDP actor update. Without the GAPO
trainer the context is empty and the loss stops with an error that names the fix.

Which rollout gets which bound (the paper's rule, for any reward): a rollout that is a success (its own
reward above `success_threshold`) AND has a positive advantage gets eps_high(c, k); every other rollout
keeps eps_low on both sides. The sign of the advantage alone is not enough: with partial credit, penalties
or reward-model scores a failing rollout can have A > 0 in a group with c = 0.

Numerics: the ratio, the bounds and the clip are computed in float32 whatever the dtype of the log-probs
(verl returns bf16 log-probs when flash-attn's cross-entropy is off; R1's clips 7e-5 / 3e-4 are far below
bf16's spacing of 0.0078 near 1).

Diagnostics: the per-c sums are reported as verl `Metric`s with SUM aggregation, so that verl's
micro-batch, data-parallel and mini-batch averaging scales numerator and denominator alike and their
ratio is exact over the step, whatever the (dynamic) micro-batching. All of a micro-batch's metrics leave
the device in one transfer (verl's gspo makes three).

Debugging aid (off by default): with ``GAPO_DEBUG_LOSS_ROWS=DIR`` in the environment of the run (Ray workers
inherit it), every rank appends what its loss computed per rollout to ``DIR/rank{r}.jsonl``: the step, the
rollout's c, k, success flag, whether it got the adaptive bound, its eps_high, and its real, clipped, |ratio - 1|
and advantage token sums. The per-c metrics are these rows summed over ranks and micro-batches
(tests/test_cluster_e2e.py recounts them at world size 2).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import struct
from dataclasses import dataclass, field
from typing import Optional

import torch
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, register_policy_loss
from verl.utils.metric import AggregationType, Metric

from gapo.clip_diagnostics import BATCH_FIELDS, SUMS_PREFIX, batch_sums, diagnostic_sums, named_sums
from gapo.config import GAPOConfig
from gapo.peers import PEER_LOSS_MODES
from gapo.peers.bapo import BAPO_METRICS, bapo_bounds, torch_all_reduce
from gapo.peers.builtin import BUILTIN_PEERS, DIAGNOSED_SUFFIX, builtin_clips, cut_fraction, cut_terms
from gapo.peers.dcpo import dcpo_ratio_bounds
from gapo.surrogate import bounded_token_surrogate, sequence_clipped_surrogate, token_clipped_surrogate
from gapo.threshold import rollout_eps_high
from gapo.verl_plugin.config import resolve_gapo_clips

NUM_CORRECT_KEY = "gapo_num_correct"
GROUP_SIZE_KEY = "gapo_group_size"
SUCCESS_KEY = "gapo_success"
STAT_KEYS = (NUM_CORRECT_KEY, GROUP_SIZE_KEY, SUCCESS_KEY)
# written by the trainer only under ROWS_ENV: the global step of each row, for the per-row debugging dump
STEP_KEY = "gapo_step"
ROWS_ENV = "GAPO_DEBUG_LOSS_ROWS"
GAPO_LOSS_MODES = ("gapo", "gapo_token")
# GAPO's and the ported peers' (gapo.peers; docs/peers.md): registered here, run by the GAPO trainer with the same
# group statistics, so that they log the same per-c diagnostics
DIAGNOSED_LOSS_MODES = GAPO_LOSS_MODES + PEER_LOSS_MODES

MISSING_STATS_HELP = (
    "GAPO loss '{mode}' got no per-rollout group statistics: it needs the GAPO trainer, which computes each "
    "rollout's group success count and size. Start training with `python -m recipe.main_gapo` (it sets "
    "trainer.v1.trainer_mode=gapo), or set trainer.v1.trainer_mode=gapo; to train without GAPO pick another "
    "actor_rollout_ref.actor.policy_loss.loss_mode (e.g. gspo)."
)


@dataclass
class GroupStats:
    """One micro-batch's per-rollout group statistics, all (B,), and the diagnostic sums the loss leaves."""

    num_correct: torch.Tensor
    group_size: torch.Tensor
    success: torch.Tensor
    sums: dict[str, float] = field(default_factory=dict)  # filled by the loss: f"{SUMS_PREFIX}/..." -> value
    # rows c = 1..max_count of the per-c diagnostic table; None: the actor's rollout_n (groups of rollout.n)
    max_count: Optional[int] = None
    # per-rollout values for the debugging dump (ROWS_ENV): filled by the loss when set to a dict
    rows: Optional[dict] = None
    # the data-parallel group the actor's loss was called with (BAPO all-reduces its sums over it)
    dp_group: Optional[object] = None


_GROUP_STATS: contextvars.ContextVar[Optional[GroupStats]] = contextvars.ContextVar("gapo_group_stats", default=None)


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """(B,) view of a per-rollout tensor; (B,) ones as they are (a no-op reshape still costs a dispatched op)."""
    return tensor if tensor.dim() == 1 else tensor.reshape(-1)


@contextlib.contextmanager
def group_stats_context(num_correct: torch.Tensor, group_size: torch.Tensor, success: torch.Tensor,
                        max_count: Optional[int] = None):
    """Make (B,) group statistics visible to the registered GAPO losses called inside the block.

    `max_count`: the largest group size of the step (the diagnostic table's rows c = 1..max_count; the same for every
    micro-batch of a step); None uses the actor's rollout_n. Yields the `GroupStats`; after the loss ran, its `sums`
    hold the micro-batch's diagnostic sums.
    """
    success = _flat(success)
    stats = GroupStats(_flat(num_correct), _flat(group_size),
                       success if success.dtype == torch.bool else success.to(torch.bool), max_count=max_count)
    token = _GROUP_STATS.set(stats)
    try:
        yield stats
    finally:
        _GROUP_STATS.reset(token)


def ppo_loss(config, model_output, data, dp_group=None):
    """verl's `ppo_loss` (verl.workers.utils.losses), imported at the first micro-batch, not with this module: that
    module imports verl's dataset utilities (HF datasets, pandas, pyarrow: ~0.8 CPU-s and ~540 modules), and this module
    is imported by `import verl` (the plug-in) in every process of a run, most of which never compute a loss."""
    from verl.workers.utils.losses import ppo_loss as verl_ppo_loss

    return verl_ppo_loss(config, model_output, data, dp_group)


class GAPOActorLoss:
    """Actor loss callable (verl's `fn(model_output, data, dp_group)` contract) that runs verl's `ppo_loss`
    with this micro-batch's group statistics in context, and adds the loss's diagnostic sums to its metrics
    as SUM-aggregated verl Metrics. Picklable: the trainer ships it to every worker."""

    def __init__(self, actor_config, max_count: Optional[int] = None):
        """`max_count`: rows of the per-c diagnostic table, at least the largest group a step holds (default the
        actor's rollout_n; VIGOR's groups are larger, GAPOTrainer passes its bound)."""
        self.config = actor_config
        self.max_count = int(max_count if max_count is not None else actor_config.rollout_n)

    def __call__(self, model_output, data, dp_group=None):
        """One micro-batch's loss: verl's `ppo_loss` with the batch's (B,) `gapo_*` fields in `group_stats_context`.

        Returns verl's (loss, metrics) with the GAPO loss's per-c sums added as SUM-aggregated `Metric`s. Raises
        RuntimeError when the micro-batch lacks the `gapo_*` fields (the trainer that writes them is not GAPOTrainer).
        """
        missing = [key for key in STAT_KEYS if key not in data.keys()]
        if missing:
            raise RuntimeError(
                f"the actor's micro-batch has no {missing} fields: the GAPO trainer did not write them at "
                "advantage time (is trainer.v1.trainer_mode=gapo?)"
            )
        rows_dir = os.environ.get(ROWS_ENV)
        with group_stats_context(*(data[key] for key in STAT_KEYS), max_count=self.max_count) as stats:
            stats.dp_group = dp_group
            if rows_dir:
                stats.rows = {}
            loss, metrics = ppo_loss(self.config, model_output, data, dp_group)
        metrics.update(Metric.from_dict(stats.sums, aggregation=AggregationType.SUM))
        if rows_dir and stats.rows:
            write_loss_rows(rows_dir, stats, data[STEP_KEY] if STEP_KEY in data.keys() else None)
        return loss, metrics


def write_loss_rows(folder: str, stats: GroupStats, step: Optional[torch.Tensor]) -> None:
    """Append one micro-batch's per-rollout loss values to folder/rank{r}.jsonl (see the module docstring)."""
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    columns = {"c": stats.num_correct, "k": stats.group_size, "success": stats.success,
               "step": step if step is not None else torch.zeros_like(stats.num_correct), **stats.rows}
    values = {name: column.detach().reshape(-1).cpu().tolist() for name, column in columns.items()}
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"rank{rank}.jsonl"), "a") as out:
        for i in range(len(values["c"])):
            out.write(json.dumps({name: column[i] for name, column in values.items()}) + "\n")


def _gapo_settings(config, mode: str) -> GAPOConfig:
    """The actor's policy-loss config, a `GAPOConfig`; TypeError naming the `_target_` to set if it is verl's."""
    policy_loss = config.policy_loss
    if not isinstance(policy_loss, GAPOConfig):
        raise TypeError(
            f"loss_mode '{mode}' needs GAPO's policy-loss config: set actor_rollout_ref.actor.policy_loss._target_="
            "gapo.verl_plugin.config.GAPOPolicyLossConfig (configs/gapo_trainer.yaml does)"
        )
    return policy_loss


def _stats_in_context(mode: str, log_prob: torch.Tensor) -> GroupStats:
    """The micro-batch's `GroupStats`; RuntimeError naming the fix when there are none, or not one per rollout."""
    stats = _GROUP_STATS.get()
    if stats is None:
        raise RuntimeError(MISSING_STATS_HELP.format(mode=mode))
    if stats.num_correct.shape[0] != log_prob.shape[0]:
        raise RuntimeError(f"group statistics for {stats.num_correct.shape[0]} rollouts, micro-batch of "
                           f"{log_prob.shape[0]}")
    return stats


def _float32_value(x: float) -> float:
    """x rounded to float32: the quotient of two float32 values computed in float64 and rounded so is the float32
    quotient (float64 has more than twice float32's precision), the value a float32 division on device gives."""
    return struct.unpack("f", struct.pack("f", x))[0]


def _gapo_policy_loss(mode, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights):
    """Body of every loss registered here (`mode` "gapo": sequence level; "gapo_token": token level, dual clip;
    "dcpo": DCPO's per-token bounds in place of GAPO's per-rollout ones, `gapo.peers.dcpo`; "bapo": BAPO's
    bounds for the micro-batch, `gapo.peers.bapo`).

    Per rollout i (module docstring): eps_high_i = eps_high(c_i, k_i) when it is a success with a positive
    advantage, else eps_low (`gapo.threshold.rollout_eps_high`, from the `group_stats_context` of the call); then
    the clipped surrogate of `gapo.surrogate`, times verl's rollout IS weights when given, aggregated by verl's
    `agg_loss`. eps_low is actor.clip_ratio_low, eps_high_max policy_loss.eps_high_max (`resolve_gapo_clips`).

    Args:
        mode: "gapo", "gapo_token", "dcpo" or "bapo" (names the loss in errors).
        old_log_prob, log_prob, advantages, response_mask: (B, T), verl's policy-loss tensors.
        loss_agg_mode: verl's aggregation ("seq-mean-token-mean", "token-mean", ...).
        config: verl's actor config; its `policy_loss` must be a `GAPOConfig` (`GAPOPolicyLossConfig`).
        rollout_is_weights: (B, T) verl's rollout importance-sampling weights, or None.

    Returns:
        (scalar loss, metrics): `actor/pg_clipfrac` (clipped / real tokens), `actor/ppo_kl` (mean over real tokens of
        log(pi_old / pi)), `actor/pg_clipfrac_lower` (dual-clipped / real tokens). With `diagnostics` on, the per-c
        and (k, rate) sums also go into the context's `GroupStats.sums` (all metrics leave the device in one copy).

    Raises:
        RuntimeError: no group statistics in context (not called through `GAPOActorLoss`), or a count that does not
            match the micro-batch.
    """
    stats = _stats_in_context(mode, log_prob)
    settings = _gapo_settings(config, mode)
    eps_low, eps_high_max = resolve_gapo_clips(config, settings)

    # The surrogates compute in float32 whatever the log-probs' dtype (bf16 cannot tell 1 + 3e-4 from 1). The mask
    # in float32 once: verl passes it as bool, which every product with it (here, in the surrogate, in agg_loss)
    # would convert again; 0.0 / 1.0 give the same values and counts.
    mask = response_mask.to(torch.float32)
    # (B,) sum of each rollout's advantage over its real tokens, in float32: its sign says whether the rollout's
    # advantage is positive, and the per-c diagnostics sum it (mean advantage per c, token-weighted)
    advantage_sum = (advantages.detach().float() * mask).sum(-1)
    clip_ratio_c = config.get("clip_ratio_c", 3.0)
    if mode == "dcpo":
        # DCPO's per-token bounds from the old probabilities; the diagnostics' rollouts are those GAPO would widen
        # (successes with a positive advantage) and their "eps_high" the mean of upper - 1 over their tokens
        lower, upper = dcpo_ratio_bounds(old_log_prob, eps_low, eps_high_max, clip_ratio_c)
        terms = bounded_token_surrogate(log_prob, old_log_prob, advantages, mask, lower, upper, clip_ratio_c)
        adaptive = stats.success & (advantage_sum > 0)
        eps_high = ((upper - 1) * mask).sum(-1) / terms.tokens.clamp_min(1)
    elif mode == "bapo":
        # BAPO's ratio bounds for the whole micro-batch, its sums all-reduced over the data-parallel ranks (verl gives
        # every rank the same micro-batch count, padding with empty ones); token ratios, the dual clip for A < 0
        ratio = torch.exp(torch.clamp(log_prob.detach().float() - old_log_prob.float(), min=-20.0, max=20.0))
        low, high, share = bapo_bounds(ratio, advantages, mask, settings, torch_all_reduce(stats.dp_group))
        terms = bounded_token_surrogate(log_prob, old_log_prob, advantages, mask, low.expand_as(mask),
                                        high.expand_as(mask), clip_ratio_c)
        adaptive = stats.success & (advantage_sum > 0)
        eps_high = (high - 1).expand_as(advantage_sum)
    else:
        eps_high, adaptive = rollout_eps_high(stats.num_correct, stats.group_size, stats.success, advantage_sum > 0,
                                              eps_low, eps_high_max, settings.schedule)
        if mode == "gapo":
            terms = sequence_clipped_surrogate(log_prob, old_log_prob, advantages, mask, eps_low, eps_high)
        else:
            terms = token_clipped_surrogate(log_prob, old_log_prob, advantages, mask, eps_low, eps_high,
                                            clip_ratio_c=clip_ratio_c)
    pg_losses = terms.loss if rollout_is_weights is None else terms.loss * rollout_is_weights.float()
    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=mask, loss_agg_mode=loss_agg_mode, **config.global_batch_info)

    with torch.no_grad():
        if settings.diagnostics:
            # rows c = 0..max_count + 1 (the step's largest group; rollout_n without VIGOR)
            max_count = stats.max_count if stats.max_count is not None else config.rollout_n
            sums = diagnostic_sums(terms, stats.num_correct, stats.group_size, adaptive, eps_high, advantage_sum,
                                   max_count)
        else:
            sums = batch_sums(terms)
        if mode == "bapo":  # BAPO's bounds and share travel in the same transfer, at its end
            sums = torch.cat([sums, torch.stack([low, high, share]).to(sums.dtype)])
        # one device-to-host transfer for every metric of the micro-batch
        flat, bapo_values = sums.tolist(), None
        if mode == "bapo":
            flat, bapo_values = flat[:-3], flat[-3:]
    if stats.rows is not None:  # the debugging dump (ROWS_ENV): the same per-rollout values the sums add up
        stats.rows.update(adaptive=adaptive, eps_high=eps_high, tokens=terms.tokens, clipped=terms.clipped_tokens,
                          ratio_dev=terms.ratio_dev_sum, advantage=advantage_sum)
    clipped, log_ratio, dual_clipped, tokens = flat[:len(BATCH_FIELDS)]
    tokens = max(tokens, 1.0)
    # float32 quotients, as verl's own losses compute them on device
    metrics = {"actor/pg_clipfrac": _float32_value(clipped / tokens),
               "actor/ppo_kl": _float32_value(-log_ratio / tokens),
               "actor/pg_clipfrac_lower": _float32_value(dual_clipped / tokens)}
    if bapo_values is not None:  # means over micro-batches, as verl logs its own per-micro-batch metrics
        metrics.update(zip(BAPO_METRICS, bapo_values))
    if settings.diagnostics:
        stats.sums.update({f"{SUMS_PREFIX}/{name}": value for name, value in named_sums(flat, max_count).items()})
    return pg_loss, metrics


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


@register_policy_loss("bapo")
def compute_policy_loss_bapo(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """BAPO's adaptive clip (`gapo.peers.bapo`): the micro-batch's ratio bounds walked until the positive tokens carry
    a share bapo_rho of the loss (sums all-reduced over the data-parallel ranks), the dual clip for A < 0; GAPO's
    per-c diagnostics of the same rollouts, plus `actor/bapo_*` (the bounds and the share)."""
    return _gapo_policy_loss(
        "bapo", old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
    )


def _diagnosed_builtin_loss(peer, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                            rollout_is_weights):
    """verl's own `peer` loss (its registry's function: value, gradient and metrics unchanged), plus GAPO's per-c
    diagnostics of it: the clipped-token sums count what plays the clip's part in `peer`
    (`gapo.peers.builtin.cut_fraction`), over the same rollouts as GAPO's (successes with A > 0); the per-rollout
    "eps_high" they report is the peer's configured clip_ratio_high (0 for sapo and kl_cov, which have none)."""
    mode = peer + DIAGNOSED_SUFFIX
    stats = _stats_in_context(mode, log_prob)
    settings = _gapo_settings(config, mode)
    pg_loss, metrics = get_policy_loss_fn(peer)(
        old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask,
        loss_agg_mode=loss_agg_mode, config=config, rollout_is_weights=rollout_is_weights)
    if not settings.diagnostics:
        return pg_loss, metrics
    with torch.no_grad():
        mask = response_mask.to(torch.float32)
        eps_low, eps_high = builtin_clips(config)
        kl_cov_ratio = config.policy_loss.get("kl_cov_ratio", None)
        cut = cut_fraction(peer, log_prob, old_log_prob, advantages, eps_low, eps_high,
                           config.get("tau_pos", 1.0), config.get("tau_neg", 1.05), mask,
                           kl_cov_ratio if kl_cov_ratio is not None else 0.0002)
        terms = cut_terms(cut, log_prob, old_log_prob, mask)
        advantage_sum = (advantages.float() * mask).sum(-1)
        adaptive = stats.success & (advantage_sum > 0)
        headroom = torch.full_like(advantage_sum, 0.0 if peer in ("sapo", "kl_cov") else float(eps_high))
        max_count = stats.max_count if stats.max_count is not None else config.rollout_n
        flat = diagnostic_sums(terms, stats.num_correct, stats.group_size, adaptive, headroom, advantage_sum,
                               max_count).tolist()
    if stats.rows is not None:
        stats.rows.update(adaptive=adaptive, eps_high=headroom, tokens=terms.tokens, clipped=terms.clipped_tokens,
                          ratio_dev=terms.ratio_dev_sum, advantage=advantage_sum)
    stats.sums.update({f"{SUMS_PREFIX}/{name}": value for name, value in named_sums(flat, max_count).items()})
    return pg_loss, metrics


def _register_diagnosed(peer: str) -> None:
    def loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
             rollout_is_weights=None):
        return _diagnosed_builtin_loss(peer, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
                                       config, rollout_is_weights)

    loss.__name__ = f"compute_policy_loss_{peer}{DIAGNOSED_SUFFIX}"
    loss.__doc__ = (f"verl's built-in `{peer}` loss with GAPO's per-c diagnostics "
                    f"({BUILTIN_PEERS[peer]}; `gapo.peers.builtin`).")
    register_policy_loss(peer + DIAGNOSED_SUFFIX)(loss)


for _peer in BUILTIN_PEERS:
    _register_diagnosed(_peer)


@register_policy_loss("dcpo")
def compute_policy_loss_dcpo(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """DCPO's dynamic clip (`gapo.peers.dcpo`): token ratio bounds from each token's old probability, eps_low and
    eps_high from actor.clip_ratio_low and policy_loss.eps_high_max (or clip_ratio_high), the dual clip for A < 0;
    GAPO's per-c diagnostics of the same rollouts."""
    return _gapo_policy_loss(
        "dcpo", old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
    )

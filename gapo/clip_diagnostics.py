"""GAPO's per-c diagnostics (pure torch): the sums a loss reports each micro-batch, and the `gapo/*` metrics from them.

Shared by the verl path (`gapo.verl_plugin.losses` reports the sums as SUM-aggregated verl Metrics, the trainer turns
them into metrics) and the TRL path (`gapo.integrations.trl` sums them over micro-batches and processes itself).

Over the rollouts that get the adaptive bound (successes with a positive advantage), per group success count c:

    gapo/clipfrac_pos/c{c}   = clipped tokens / tokens
    gapo/ratio_dev_pos/c{c}  = sum over tokens of |ratio - 1| / tokens          (the ratio in use: s_i at sequence level)
    gapo/adv_pos/c{c}        = sum over tokens of the advantage / tokens
    gapo/clipfrac_pos_kr/k{lo}-{hi}/rate{a}-{b}   the clip fraction per (group size, success rate) bucket
                                                  (`gapo.rate_buckets`)
    gapo/loss_eps_high_mean  = mean eps_high over those rollouts (as the loss applied it)
    gapo/is_adv_corr_levels and, where defined, gapo/is_adv_corr: Pearson r of the per-c points
                                                  (ratio_dev_pos, adv_pos) (`gapo.diagnostics`)

Sums rather than means travel from the loss, so that every ratio is exact over a whole step whatever the
micro-batching and however many ranks add their sums.
"""

from __future__ import annotations

import functools
from typing import Sequence

import torch

from gapo.diagnostics import step_correlation
from gapo.rate_buckets import CLIPFRAC_KR, bucket_ids, bucket_label, num_buckets
from gapo.surrogate import SurrogateTerms

# What `diagnostic_sums` adds up, per rollout: over its real tokens, the clipped tokens, the log-ratio, the dual-clipped
# tokens, the tokens, |ratio - 1| and the advantage; its upper clip; 1 when it got the adaptive bound. The first four
# are what verl's metrics need (`batch_sums`).
FIELDS = ("clipped", "log_ratio", "dual_clipped", "tokens", "ratio_dev", "advantage", "eps_high", "rollouts")
BATCH_FIELDS = FIELDS[:4]
# Reported per c, over the rollouts with the adaptive bound (`named_sums`)
SUM_NAMES = ("clipped", "ratio_dev", "tokens", "rollouts", "advantage")
# The same sums per (group size, success rate) bucket, the clip fraction's two columns only
KR_SUM_NAMES = ("clipped", "tokens")
# Prefix of the raw sums a loss reports (`named_sums`: f"{SUMS_PREFIX}/c{c}/{name}", f"{SUMS_PREFIX}/kr{id}/{name}",
# ...); verl's trainer logs the actor's metrics under "actor/", where `diagnostics_from_sums` takes them back out.
SUMS_PREFIX = "gapo_sums"

# per-c metric names (followed by c); RATIO_DEV_POS and ADV_POS are the points of gapo/is_adv_corr
CLIPFRAC_POS = "gapo/clipfrac_pos/c"
RATIO_DEV_POS = "gapo/ratio_dev_pos/c"
ADV_POS = "gapo/adv_pos/c"


def table_rows(max_count: int) -> int:
    """Rows of `diagnostic_sums`'s table: c = 0..max_count + 1, then (k, rate) bucket ids 0..num_buckets(max_count).

    Rows c = 0 and c = max_count + 1 collect the rollouts whose c is out of range, bucket 0 those whose (c, k) is
    (`gapo.rate_buckets.bucket_ids`); `named_sums` leaves the three out.
    """
    return max_count + 2 + num_buckets(max_count) + 1


@functools.cache
def _bucket_rows(max_count: int, device: torch.device) -> torch.Tensor:
    """(max_count + 2) ** 2 long: entry c * (max_count + 2) + k is the table row of (c, k)'s bucket, for c and k
    clamped to 0..max_count + 1 (`bucket_ids` of those, which is 0 wherever the unclamped pair's is). Built once per
    (max_count, device), so that a call does a lookup instead of ~50 small ops and a host-to-device copy."""
    with torch.inference_mode(False):  # an inference tensor could not be used outside inference mode later
        side = torch.arange(max_count + 2)
        c, k = side.repeat_interleave(max_count + 2), side.repeat(max_count + 2)
        return (bucket_ids(c, k, max_count) + (max_count + 2)).to(device)


def batch_sums(terms: SurrogateTerms) -> torch.Tensor:
    """(4,) float32 sums over every rollout of `BATCH_FIELDS` (clipped tokens, log-ratio, dual-clipped tokens,
    tokens): what verl's clip fractions and KL need. `diagnostic_sums` starts with the same four values."""
    with torch.no_grad():
        return torch.cat([terms.clipped_tokens, terms.log_ratio_sum, terms.dual_clipped_tokens, terms.tokens]).view(
            len(BATCH_FIELDS), -1).sum(1)


def diagnostic_sums(
    terms: SurrogateTerms,
    num_correct: torch.Tensor,
    group_size: torch.Tensor,
    adaptive: torch.Tensor,
    eps_high: torch.Tensor,
    advantage_sum: torch.Tensor,
    max_count: int,
) -> torch.Tensor:
    """One micro-batch's sums, on device, as one flat float32 vector (no host synchronisation; `named_sums` names it).

    Per rollout, the `FIELDS` (one (len(FIELDS), B) matrix, a single concatenation); then their sums over every
    rollout, their sums over the rollouts with the adaptive bound, and a table of the latter's sums by its c and by
    its (k, rate) bucket (`table_rows`; one zeroed buffer, two index_add_). Sums, so that every ratio is exact over a
    step however it is micro-batched. A few dozen small ops in all: on a GPU, where the loss is launch-bound, their
    number is their cost (`recipe.bench.loss`).

    Args:
        terms: the surrogate's terms (`gapo.surrogate`), for B rollouts.
        num_correct, group_size: (B,) c and k of each rollout's group.
        adaptive: (B,) bool, the rollouts that got the adaptive bound (`gapo.threshold.rollout_eps_high`).
        eps_high: (B,) float32 upper clip of each rollout.
        advantage_sum: (B,) sum of each rollout's advantage over its real tokens.
        max_count: the largest group size of the step (the per-c table's rows c = 1..max_count).

    Returns:
        float32 (len(FIELDS) * (2 + table_rows(max_count)),): the sums over every rollout (its first four are
        `batch_sums`), the sums over the adaptive rollouts, then the table, field by field (row-major
        (len(FIELDS), table_rows(max_count))).
    """
    with torch.no_grad():
        device, dtype = terms.tokens.device, terms.tokens.dtype
        adaptive = adaptive.to(device)
        per_rollout = torch.cat([
            terms.clipped_tokens, terms.log_ratio_sum, terms.dual_clipped_tokens, terms.tokens, terms.ratio_dev_sum,
            advantage_sum.to(device=device, dtype=dtype), eps_high.to(device=device, dtype=dtype), adaptive.to(dtype),
        ]).view(len(FIELDS), -1)
        # the adaptive rollouts' values, zero elsewhere (where rather than a product: another rollout's NaN stays out)
        selected = torch.where(adaptive, per_rollout, 0.0)
        totals = torch.cat([per_rollout, selected]).sum(1)
        # row of each rollout's c (0 or max_count + 1 when out of range) and of its (k, rate) bucket
        side = max_count + 1
        c = num_correct.to(device=device, dtype=torch.long).clamp(0, side)
        k = group_size.to(device=device, dtype=torch.long).clamp(0, side)
        buckets = _bucket_rows(max_count, device).take(torch.add(k, c, alpha=side + 1))
        table = torch.zeros(len(FIELDS), table_rows(max_count), dtype=dtype, device=device)
        table.index_add_(1, c, selected).index_add_(1, buckets, selected)
        return torch.cat([totals, table.view(-1)])


def named_sums(flat: Sequence[float], max_count: int) -> dict[str, float]:
    """Name the host values of `diagnostic_sums` (summed over micro-batches or processes, or not).

    Returns `eps_high_sum`, `positive_rollouts` (over the rollouts with the adaptive bound), f"c{c}/{name}" for
    c = 1..max_count and the names of SUM_NAMES, and f"kr{id}/{name}" for bucket ids 1..num_buckets(max_count) and
    KR_SUM_NAMES. Every key is present (zeros where a c or bucket is absent), so that sums from micro-batches and ranks
    add key by key.
    """
    width, rows = len(FIELDS), table_rows(max_count)
    if len(flat) != width * (2 + rows):
        raise ValueError(f"{len(flat)} values for the diagnostic sums of max_count={max_count} "
                         f"(expected {width * (2 + rows)})")
    selected, table = flat[width:2 * width], flat[2 * width:]

    def cell(name: str, row: int) -> float:
        return table[FIELDS.index(name) * rows + row]

    sums = {"eps_high_sum": selected[FIELDS.index("eps_high")], "positive_rollouts": selected[FIELDS.index("rollouts")]}
    for c in range(1, max_count + 1):
        sums.update({f"c{c}/{name}": cell(name, c) for name in SUM_NAMES})
    for bucket in range(1, num_buckets(max_count) + 1):
        sums.update({f"kr{bucket}/{name}": cell(name, max_count + 2 + bucket) for name in KR_SUM_NAMES})
    return sums


def metrics_from_sums(sums: dict[str, float]) -> dict[str, float]:
    """The `gapo/*` diagnostics (see the module docstring) from summed `named_sums` output.

    Only what is defined is returned: a c or bucket without tokens has no entry, nothing at all when no sums came.
    """
    out = {}
    if sums.get("positive_rollouts", 0) > 0:
        out["gapo/loss_eps_high_mean"] = sums["eps_high_sum"] / sums["positive_rollouts"]
    counts = sorted({int(key.split("/")[0][1:]) for key in sums if key.startswith("c")})
    for bucket in sorted({int(key.split("/")[0][2:]) for key in sums if key.startswith("kr")}):
        tokens = sums[f"kr{bucket}/tokens"]
        if tokens > 0:
            out[f"{CLIPFRAC_KR}{bucket_label(bucket)}"] = sums[f"kr{bucket}/clipped"] / tokens
    for c in counts:
        tokens = sums[f"c{c}/tokens"]
        if tokens > 0:
            out[f"{CLIPFRAC_POS}{c}"] = sums[f"c{c}/clipped"] / tokens
            out[f"{RATIO_DEV_POS}{c}"] = sums[f"c{c}/ratio_dev"] / tokens
            out[f"{ADV_POS}{c}"] = sums[f"c{c}/advantage"] / tokens
    if counts:
        out.update(step_correlation(is_adv_points(out)))
    return out


def is_adv_points(diagnostics: dict) -> list[tuple[float, float]]:
    """The step's per-c points (mean |ratio - 1|, mean advantage) from `metrics_from_sums`'s output, by c."""
    levels = sorted(int(key[len(RATIO_DEV_POS):]) for key in diagnostics if key.startswith(RATIO_DEV_POS))
    return [(diagnostics[f"{RATIO_DEV_POS}{c}"], diagnostics[f"{ADV_POS}{c}"]) for c in levels]


def diagnostics_from_sums(metrics: dict, prefix: str = f"actor/{SUMS_PREFIX}/") -> dict[str, float]:
    """Pop the loss's raw sums (keys starting with `prefix`, verl's `actor/gapo_sums/...`) out of `metrics` and
    return the paper's diagnostics.

    The loss reports them as SUM-aggregated verl Metrics: verl sums them over a mini-batch's micro-batches,
    averages over data-parallel ranks and then over mini-batches, which scales every sum by the same factor,
    so numerator / denominator is the exact ratio over the step whatever the (dynamic) micro-batching.
    The metrics (`metrics_from_sums`): per success count c present, over the successes with a
    positive advantage, gapo/clipfrac_pos/c{c}, gapo/ratio_dev_pos/c{c}, gapo/adv_pos/c{c}; the (k, rate) bucket
    clip fractions; gapo/loss_eps_high_mean; gapo/is_adv_corr(_levels). Nothing when the loss reported no sums
    (diagnostics off, baseline loss).
    """
    return metrics_from_sums({key[len(prefix):]: metrics.pop(key) for key in list(metrics) if key.startswith(prefix)})

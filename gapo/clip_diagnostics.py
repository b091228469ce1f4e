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

import itertools
from typing import Sequence

import torch

from gapo.diagnostics import step_correlation
from gapo.rate_buckets import CLIPFRAC_KR, bucket_ids, bucket_label, num_buckets
from gapo.surrogate import SurrogateTerms, per_success_count_table

# Columns of `gapo.surrogate.per_success_count_table`: per c, sums over the adaptive rollouts' real tokens of
# (clipped, |ratio - 1|, 1, advantage), and their count.
SUM_NAMES = ("clipped", "ratio_dev", "tokens", "rollouts", "advantage")
# The same sums per (group size, success rate) bucket, the clip fraction's two columns only
KR_SUM_NAMES = ("clipped", "tokens")
KR_COLUMNS = [SUM_NAMES.index(name) for name in KR_SUM_NAMES]
# Prefix of the raw sums a loss reports (`named_sums`: f"{SUMS_PREFIX}/c{c}/{name}", f"{SUMS_PREFIX}/kr{id}/{name}",
# ...); verl's trainer logs the actor's metrics under "actor/", where `diagnostics_from_sums` takes them back out.
SUMS_PREFIX = "gapo_sums"

# per-c metric names (followed by c); RATIO_DEV_POS and ADV_POS are the points of gapo/is_adv_corr
CLIPFRAC_POS = "gapo/clipfrac_pos/c"
RATIO_DEV_POS = "gapo/ratio_dev_pos/c"
ADV_POS = "gapo/adv_pos/c"


def diagnostic_sums(
    terms: SurrogateTerms,
    num_correct: torch.Tensor,
    group_size: torch.Tensor,
    adaptive: torch.Tensor,
    eps_high: torch.Tensor,
    advantage_sum: torch.Tensor,
    max_count: int,
) -> list[torch.Tensor]:
    """One micro-batch's diagnostic sums, on device, as three flat float32 parts (no host synchronisation).

    Args:
        terms: the surrogate's terms (`gapo.surrogate`), for B rollouts.
        num_correct, group_size: (B,) c and k of each rollout's group.
        adaptive: (B,) bool, the rollouts that got the adaptive bound (`gapo.threshold.rollout_eps_high`).
        eps_high: (B,) float32 upper clip of each rollout.
        advantage_sum: (B,) sum of each rollout's advantage over its real tokens.
        max_count: the largest group size of the step (the per-c table's rows c = 1..max_count).

    Returns:
        [(2,) (sum of eps_high over adaptive rollouts, their count), the per-c table (max_count + 1, 5) flattened,
        the (k, rate) bucket table (num_buckets(max_count) + 1, 2) flattened]; `named_sums` names them.
    """
    with torch.no_grad():
        device = terms.tokens.device
        c, k = num_correct.to(device), group_size.to(device)
        table = per_success_count_table(terms, c, adaptive, max_count, advantage_sum)
        # the same rollouts by (k, c / k) bucket: VIGOR's groups differ in size, so c alone mixes 1/2 with 1/47
        buckets = bucket_ids(c, k, max_count)
        kr_table = per_success_count_table(terms, buckets, adaptive, num_buckets(max_count), advantage_sum)[:, KR_COLUMNS]
        scalars = torch.stack([(eps_high * adaptive).sum(), adaptive.sum()]).float()
        return [scalars, table.reshape(-1), kr_table.reshape(-1)]


def named_sums(flat: Sequence[float], sizes: Sequence[int]) -> dict[str, float]:
    """Name the host values of `diagnostic_sums`'s parts, concatenated (`sizes`: each part's numel).

    Returns `eps_high_sum`, `positive_rollouts`, f"c{c}/{name}" for c >= 1 and the names of SUM_NAMES, and
    f"kr{id}/{name}" for bucket ids >= 1 and KR_SUM_NAMES. Every key is present (zeros where a c or bucket is absent),
    so that sums from micro-batches and ranks add key by key.
    """
    if len(sizes) != 3 or sum(sizes) != len(flat):
        raise ValueError(f"{len(flat)} values for diagnostic parts of sizes {list(sizes)}")
    start, table_end, _ = itertools.accumulate(sizes)
    sums = {"eps_high_sum": flat[0], "positive_rollouts": flat[1]}
    for prefix, names, values in (("c", SUM_NAMES, flat[start:table_end]), ("kr", KR_SUM_NAMES, flat[table_end:])):
        width = len(names)
        for row in range(1, len(values) // width):
            for j, name in enumerate(names):
                sums[f"{prefix}{row}/{name}"] = values[row * width + j]
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

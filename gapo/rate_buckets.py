"""(group size k, success rate c / k) buckets for GAPO's clip-fraction diagnostic (pure torch).

Under uniform sampling every group has k = rollout.n, and the per-c diagnostics (`gapo/clipfrac_pos/c{c}`) say
everything. Under VIGOR (gapo.vigor) group sizes differ from prompt to prompt (2, 5, 11, 23, 47 with the defaults
and 64 prompts), so c alone mixes a 1/2 group with a 1/47 one. The loss therefore also sums its clip counts per
(k bucket, success-rate bucket), over the same rollouts as the per-c table (successes with a positive advantage,
so c >= 1 and the rate is in (0, 1]):

    k bucket j = ceil(log2 k):      k = 1 | 2 | 3-4 | 5-8 | 9-16 | ...   (j = 0, 1, 2, 3, 4, ...)
    rate bucket r = ceil(4 c / k) - 1:  c / k in (0, 1/4] | (1/4, 1/2] | (1/2, 3/4] | (3/4, 1]   (r = 0..3)
    bucket id = 1 + j * RATE_BINS + r       (0: not counted, as row 0 of the per-c table)

The trainer logs `gapo/clipfrac_pos_kr/k{lo}-{hi}/rate{a}-{b}` = clipped tokens / tokens of the bucket (token
weighted, exact over a step like the per-c values), for the buckets with tokens in the step. Integer arithmetic
only (no log2 of floats), so a bucket edge never depends on rounding.
"""

from __future__ import annotations

import torch

RATE_BINS = 4
CLIPFRAC_KR = "gapo/clipfrac_pos_kr/"  # metric prefix; followed by a bucket label


def k_bins(max_count: int) -> int:
    """Number of k buckets covering group sizes 1..max_count: ceil(log2 max_count) + 1."""
    if max_count < 1:
        raise ValueError(f"max_count={max_count} must be >= 1 (the largest group size of a step)")
    return (max_count - 1).bit_length() + 1


def num_buckets(max_count: int) -> int:
    """Number of (k, rate) buckets for group sizes 1..max_count: k_bins(max_count) * RATE_BINS (ids 1..that)."""
    return k_bins(max_count) * RATE_BINS


def bucket_ids(num_correct: torch.Tensor, group_size: torch.Tensor, max_count: int) -> torch.Tensor:
    """(B,) long bucket id in 1..num_buckets(max_count) of each rollout's (c, k); 0 where c < 1, c > k or k is
    outside 1..max_count (such rollouts are not counted).

    Args:
        num_correct: (B,) group success count c; group_size: (B,) group size k (any integer dtype, same device).
    """
    c = num_correct.to(torch.long)
    k = group_size.to(torch.long)
    valid = (c >= 1) & (c <= k) & (k >= 1) & (k <= max_count)
    k_safe = torch.where(valid, k, torch.ones_like(k))
    powers = torch.tensor([1 << p for p in range(k_bins(max_count) - 1)], dtype=torch.long, device=k.device)
    j = (k_safe.unsqueeze(-1) > powers).sum(-1)  # ceil(log2 k): the number of powers 1, 2, 4, ... below k
    r = (RATE_BINS * c + k_safe - 1) // k_safe - 1  # ceil(4 c / k) - 1
    return torch.where(valid, 1 + j * RATE_BINS + r.clamp(0, RATE_BINS - 1), torch.zeros_like(c))


def bucket_label(bucket_id: int) -> str:
    """`k{lo}-{hi}/rate{a}-{b}` of a bucket id (k1 and k2 have a single size: `k1`, `k2`)."""
    if bucket_id < 1:
        raise ValueError(f"bucket id {bucket_id} must be >= 1 (0 collects the rollouts that are not counted)")
    j, r = divmod(bucket_id - 1, RATE_BINS)
    lo, hi = (1 << (j - 1)) + 1 if j >= 1 else 1, 1 << j
    k = f"k{hi}" if lo == hi else f"k{lo}-{hi}"
    return f"{k}/rate{r / RATE_BINS:g}-{(r + 1) / RATE_BINS:g}"

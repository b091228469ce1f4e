"""BAPO's adaptive clip (Xi et al. 2025, "BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced
Policy Optimization with Adaptive Clipping", arXiv 2510.18927; the rule of the policy loss in WooooDyy/BAPO's bapo
recipe): per batch, widen the ratio bounds until the positive-advantage tokens carry a share rho of the loss.

The bounds [c_low, c_high] are ratio bounds (not epsilons). The positive and the negative contribution of a batch at
bounds (l, h), over real tokens t:

    P(h) = sum_{A_t >= 0} A_t min(r_t, h)          N(l) = sum_{A_t < 0} |A_t| max(r_t, l)

both summed over the data-parallel ranks, so that every rank picks the same bounds. Starting at (l0, h0), c_low
rises by its step to its maximum, then c_high by its step to its maximum, and the walk stops at the first bounds
where P / (P + N) >= rho (rho 0.5 is BAPO's code's default P / N >= 1); when no bounds on the walk reach it, the
last ones (the maxima). BAPO's paper: rho 0.5, c_low in [0.6, 0.9], c_high in [1.2, 3.0], steps 0.05.

BAPO's code recomputes both sums over every token and all-reduces them once per step of the walk (up to ~40 passes,
~40 collectives, each a host synchronisation). Here P at every c_high of the walk and N at every c_low come from one
pass: a token's min(r, h) is r for the candidates h above r and h for the others, so bucketing each token's ratio
among the sorted candidates (`torch.bucketize`) and summing A r and A per bucket gives every candidate's sum by a
cumulative sum. One all-reduce of those (n_low + n_high) sums; the choice stays on the device (no host sync).
Candidates are l0 + i step (not an accumulated sum), the same walk to rounding.

Shapes: ratio, advantages, mask (B, T); the bounds 0-d float32 tensors (torch.clamp takes them as bounds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

# what the `bapo` loss logs per micro-batch: the bounds the walk stopped at and the positive share there
BAPO_METRICS = ("actor/bapo_clip_low", "actor/bapo_clip_high", "actor/bapo_pos_share")


@dataclass
class BAPOConfig:
    """BAPO's knobs and defaults (the paper's), the single source of them.

    Attributes:
        bapo_rho: target share P / (P + N) of the positive-advantage tokens in the loss, in (0, 1).
        bapo_lower_start, bapo_lower_max, bapo_lower_step: c_low's walk (ratio bounds, start <= max < 1, step > 0).
        bapo_upper_start, bapo_upper_max, bapo_upper_step: c_high's walk (1 < start <= max, step > 0).
    """

    bapo_rho: float = 0.5
    bapo_lower_start: float = 0.6
    bapo_lower_max: float = 0.9
    bapo_lower_step: float = 0.05
    bapo_upper_start: float = 1.2
    bapo_upper_max: float = 3.0
    bapo_upper_step: float = 0.05

    def __post_init__(self):
        self.validate_bapo()

    def validate_bapo(self) -> None:
        """ValueError naming the key and a valid value for a setting BAPO cannot use."""
        prefix = "actor_rollout_ref.actor.policy_loss."
        if not 0 < self.bapo_rho < 1:
            raise ValueError(f"{prefix}bapo_rho={self.bapo_rho}: the positive share to reach, in (0, 1) (BAPO: 0.5)")
        if not 0 < self.bapo_lower_start <= self.bapo_lower_max < 1:
            raise ValueError(f"{prefix}bapo_lower_start={self.bapo_lower_start}, bapo_lower_max={self.bapo_lower_max}: "
                             "c_low's walk needs 0 < start <= max < 1 (BAPO: 0.6 and 0.9)")
        if not 1 < self.bapo_upper_start <= self.bapo_upper_max:
            raise ValueError(f"{prefix}bapo_upper_start={self.bapo_upper_start}, bapo_upper_max={self.bapo_upper_max}: "
                             "c_high's walk needs 1 < start <= max (BAPO: 1.2 and 3.0)")
        for name in ("bapo_lower_step", "bapo_upper_step"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{prefix}{name}={getattr(self, name)}: a step > 0 (BAPO: 0.05)")


def walk(start: float, stop: float, step: float) -> list[float]:
    """start, start + step, ... capped at stop, ending at stop: the values one bound of BAPO's walk takes."""
    n = max(math.ceil((stop - start) / step - 1e-9), 0)
    return [min(start + i * step, stop) for i in range(n + 1)]


def _cumulative(values: torch.Tensor, bucket: torch.Tensor, n: int) -> torch.Tensor:
    """(n + 1,) inclusive cumulative sums of `values` grouped by `bucket` in 0..n."""
    return torch.zeros(n + 1, dtype=values.dtype, device=values.device).index_add_(0, bucket, values).cumsum(0)


def bapo_bounds(ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, config: BAPOConfig,
                all_reduce: Optional[Callable[[torch.Tensor], None]] = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(c_low, c_high, share): the bounds BAPO's walk stops at and the positive share P / (P + N) there (0-d float32).

    Args:
        ratio: (B, T) importance ratios (detached inside).
        advantages, mask: (B, T) advantages and the real-token mask.
        config: the walk (`BAPOConfig`).
        all_reduce: sums a tensor in place over the data-parallel ranks (None: one rank; `torch_all_reduce` wraps
            torch.distributed's when a process group is up).
    """
    lows = walk(config.bapo_lower_start, config.bapo_lower_max, config.bapo_lower_step)
    highs = walk(config.bapo_upper_start, config.bapo_upper_max, config.bapo_upper_step)
    with torch.no_grad():
        r, a, m = ratio.detach().float().reshape(-1), advantages.detach().float().reshape(-1), mask.float().reshape(-1)
        device = r.device
        pos_w, neg_w = torch.where(a >= 0, a * m, 0.0), torch.where(a < 0, -a * m, 0.0)
        high_t = torch.tensor(highs, device=device)
        low_t = torch.tensor(lows, device=device)
        # P(h_j) = sum_{r < h_j} A r + h_j sum_{r >= h_j} A; bucket i = #{j: h_j <= r}
        hb = torch.bucketize(r, high_t, right=True)
        below = _cumulative(pos_w * r, hb, len(highs))[: len(highs)]  # tokens with h_j > r, i.e. bucket <= j
        at_or_above = pos_w.sum() - _cumulative(pos_w, hb, len(highs))[: len(highs)]
        pos = below + high_t * at_or_above
        # N(l_j) = sum_{r > l_j} |A| r + l_j sum_{r <= l_j} |A|; bucket i = #{j: l_j < r}
        lb = torch.bucketize(r, low_t, right=False)
        at_or_below = _cumulative(neg_w, lb, len(lows))[: len(lows)]  # bucket <= j: r <= l_j
        above = (neg_w * r).sum() - _cumulative(neg_w * r, lb, len(lows))[: len(lows)]
        neg = above + low_t * at_or_below
        sums = torch.cat([pos, neg])
        if all_reduce is not None:
            all_reduce(sums)
        pos, neg = sums[: len(highs)], sums[len(highs):]
        # the walk: (l_0, h_0) .. (l_max, h_0), then (l_max, h_1) .. (l_max, h_max)
        walk_low = torch.cat([low_t, low_t[-1:].expand(len(highs) - 1)])
        walk_high = torch.cat([high_t[:1].expand(len(lows)), high_t[1:]])
        walk_pos = torch.cat([pos[:1].expand(len(lows)), pos[1:]])
        walk_neg = torch.cat([neg, neg[-1:].expand(len(highs) - 1)])
        reached = walk_pos * (1 - config.bapo_rho) >= config.bapo_rho * walk_neg
        reached[-1] = True  # no bounds reach rho: the maxima
        stop = torch.argmax(reached.to(torch.uint8))  # the first True
        share = walk_pos[stop] / (walk_pos[stop] + walk_neg[stop]).clamp_min(torch.finfo(torch.float32).tiny)
        return walk_low[stop], walk_high[stop], share


def torch_all_reduce(group=None) -> Optional[Callable[[torch.Tensor], None]]:
    """torch.distributed's SUM all-reduce over `group` when a process group is up, else None (one rank)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return lambda tensor: dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)

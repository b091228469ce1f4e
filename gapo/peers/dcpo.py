"""DCPO's dynamic clip (Yang et al. 2025, "DCPO: Dynamic Clipping Policy Optimization", arXiv 2509.02333; the
rule of lime-RL/DCPO's `get_clip_low_high`, clip_type "dynamic"): ratio bounds from each token's old probability.

With q = pi_old(token) = exp(old_log_prob), per token:

    lower = 1/2 + 1/2 sqrt(max(1 - 4 eps_low / q, 0))
    upper = min(1/2 + 1/2 sqrt(1 + 4 eps_high / q), max(clip_ratio_c, 10))

A likely token (q -> 1) gets nearly PPO's bounds, 1/2 + 1/2 sqrt(1 - 4 eps) ~ 1 - eps and ~ 1 + eps; a rare one a
wider band: for q <= 4 eps_low the lower bound is 1/2, and the upper grows as sqrt(eps_high / q) until the cap
(max(clip_ratio_c, 10), as DCPO's code caps it). The bounds bound the ratio itself, not an epsilon. A token whose q
underflowed to 0 gets the limits (1/2, the cap); DCPO's code gives it a lower bound of 1 there.
The surrogate between them is PPO's with the dual clip for A < 0 (`gapo.surrogate.bounded_token_surrogate`).
DCPO's paper runs use eps_low 0.2, eps_high 0.28 and clip_ratio_c 10.

Shapes: old_log_prob (B, T); the bounds (B, T) float32, no gradient.
"""

from __future__ import annotations

import torch

# DCPO's cap on the upper bound is max(clip_ratio_c, UPPER_CAP_FLOOR)
UPPER_CAP_FLOOR = 10.0


def dcpo_ratio_bounds(old_log_prob: torch.Tensor, eps_low: float, eps_high: float,
                      clip_ratio_c: float = 3.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(lower, upper) (B, T) float32 ratio bounds of DCPO's dynamic clip (formula: the module docstring).

    Args:
        old_log_prob: (B, T) log pi_old of the response tokens (verl's `old_log_prob`).
        eps_low, eps_high: DCPO's epsilons (verl's clip_ratio_low and clip_ratio_high), both > 0.
        clip_ratio_c: the dual clip's c; the upper bound is capped at max(clip_ratio_c, 10).

    Raises:
        ValueError: an epsilon that is not > 0.
    """
    if not (eps_low > 0 and eps_high > 0):
        raise ValueError(f"DCPO's clip epsilons must be > 0 (actor.clip_ratio_low, actor.clip_ratio_high), got "
                         f"{eps_low} and {eps_high}; its paper uses 0.2 and 0.28")
    with torch.no_grad():
        inv_q = torch.exp(-old_log_prob.float())  # 1 / q, inf where q underflowed
        lower = torch.sqrt(torch.clamp_min(1 - (4 * eps_low) * inv_q, 0.0)).mul_(0.5).add_(0.5)
        upper = torch.sqrt(1 + (4 * eps_high) * inv_q).mul_(0.5).add_(0.5)
        upper = torch.clamp_max(upper, max(float(clip_ratio_c), UPPER_CAP_FLOOR))
    return lower, upper

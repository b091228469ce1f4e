"""Clipped policy-gradient surrogates with a per-rollout upper clip, and GAPO's per-c diagnostics (pure torch).

Shapes: B rollouts (a micro-batch) by T response tokens; `response_mask` (B, T) marks real tokens;
`advantages` (B, T) (constant along a rollout for outcome rewards); `eps_high` a float or a (B,) tensor,
one upper clip per rollout (from `gapo.threshold.adaptive_eps_high`). The functions return the per-token
loss matrix before aggregation, so the caller aggregates it the way its trainer does (verl: `agg_loss`).

Sequence level (GSPO, Zheng et al. 2025, arXiv 2507.18071; the GAPO paper's main variant):
    s_i = exp(mean_t log(pi / pi_old))                      one ratio per rollout
    loss_i,t = max(-A_i * s_i,t, -A_i * clip(s_i,t, 1 - eps_low, 1 + eps_high_i))
with s_i,t = sg[s_i] * pi_t / sg[pi_t], so that every token gets the gradient of the sequence ratio.

Token level (PPO with dual clip, Ye et al. 2019, for A < 0):
    r_t = pi_t / pi_old,t
    loss_t = max(-A * r_t, -A * clip(r_t, 1 - eps_low, 1 + eps_high_i))     and, for A < 0, min(that, -A * c)

Both follow verl 0.9.1's `gspo` / `vanilla` losses term for term (same clamps of the log-ratio), so with a
constant eps_high they give the same values and gradients (tests/test_gapo_loss_verl_equivalence.py).
"""

from __future__ import annotations

from typing import NamedTuple, Union

import torch

FloatOrTensor = Union[float, torch.Tensor]


class SurrogateTerms(NamedTuple):
    """Per-token terms of a clipped surrogate, all (B, T)."""

    loss: torch.Tensor  # loss before aggregation (carries the gradient)
    ratio: torch.Tensor  # importance ratio in use, detached (the sequence ratio broadcast at sequence level)
    clipped: torch.Tensor  # bool: the clipped branch is active, so the token's gradient is cut
    log_ratio: torch.Tensor  # token log(pi / pi_old), detached, for KL estimates
    dual_clipped: torch.Tensor  # bool: the dual clip (A < 0, ratio beyond clip_ratio_c) is active


def _per_rollout(eps: FloatOrTensor, like: torch.Tensor) -> torch.Tensor:
    """A float or (B,) threshold as a (B, 1) or 0-d tensor that broadcasts over tokens."""
    eps = torch.as_tensor(eps, dtype=like.dtype, device=like.device)
    if eps.dim() == 1:
        if eps.shape[0] != like.shape[0]:
            raise ValueError(f"eps_high has {eps.shape[0]} entries for a batch of {like.shape[0]} rollouts")
        eps = eps.unsqueeze(-1)
    elif eps.dim() != 0:
        raise ValueError(f"eps_high must be a float or a (B,) tensor, got shape {tuple(eps.shape)}")
    return eps


def _clipped_objective(ratio, advantages, eps_low, eps_high):
    """max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)) per token, and whether the clipped branch is active."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, torch.full_like(ratio, 1 - eps_low), 1 + _per_rollout(eps_high, ratio))
    return torch.maximum(unclipped, clipped), clipped > unclipped


def sequence_clipped_surrogate(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    eps_low: float,
    eps_high: FloatOrTensor,
) -> SurrogateTerms:
    """GSPO's sequence-ratio clipped surrogate with one upper clip per rollout. See the module docstring."""
    log_ratio = log_prob - old_log_prob
    mask = response_mask.to(log_prob.dtype)
    seq_log_ratio = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    # Token-level handle on the sequence ratio: value s_i, gradient d log pi_t (GSPO-token); clamp as verl does.
    log_s = torch.clamp(log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1), max=10.0)
    ratio = torch.exp(log_s)
    loss, clipped = _clipped_objective(ratio, advantages, eps_low, eps_high)
    return SurrogateTerms(
        loss=loss,
        ratio=ratio.detach(),
        clipped=clipped,
        log_ratio=log_ratio.detach(),
        dual_clipped=torch.zeros_like(response_mask, dtype=torch.bool),
    )


def token_clipped_surrogate(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    eps_low: float,
    eps_high: FloatOrTensor,
    clip_ratio_c: float = 3.0,
) -> SurrogateTerms:
    """PPO's token-ratio clipped surrogate with one upper clip per rollout and dual clip for A < 0."""
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c (dual clip) must be > 1, got {clip_ratio_c}")
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    loss, clipped = _clipped_objective(ratio, advantages, eps_low, eps_high)
    # Dual clip: a negative-advantage token whose ratio exploded contributes at most -A * c.
    dual_bound = -advantages * clip_ratio_c
    dual_clipped = (advantages < 0) & (loss > dual_bound)
    return SurrogateTerms(
        loss=torch.where(advantages < 0, torch.minimum(loss, dual_bound), loss),
        ratio=ratio.detach(),
        clipped=clipped,
        log_ratio=log_ratio.detach(),
        dual_clipped=dual_clipped,
    )


def masked_rollout_mean(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B,): mean over each rollout's real tokens (0 for an empty rollout)."""
    mask = response_mask.to(values.dtype)
    return (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def per_success_count_sums(
    terms: SurrogateTerms,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    num_correct: torch.Tensor,
    max_count: int,
) -> dict[int, dict[str, float]]:
    """Sums behind the paper's diagnostics, for positive-advantage rollouts, by group success count c.

    Returns, for every c in 1..max_count (zeros where a c is absent, so that every micro-batch and every
    data-parallel rank reports the same keys), {"clipped": clipped tokens, "ratio_dev": sum of
    |ratio - 1| over tokens, "tokens": tokens, "rollouts": rollouts}. Sums rather than means, so that
    clip fraction = clipped / tokens and mean |ratio - 1| = ratio_dev / tokens are exact over a whole
    step whatever the micro-batching. Rollouts with c > max_count are left out.
    """
    with torch.no_grad():
        mask = response_mask.to(terms.ratio.dtype)
        positive = masked_rollout_mean(advantages, response_mask) > 0
        per_rollout = torch.stack(
            [(terms.clipped.to(mask.dtype) * mask).sum(-1), ((terms.ratio - 1).abs() * mask).sum(-1), mask.sum(-1),
             torch.ones_like(mask[:, 0])],
            dim=-1,
        )  # (B, 4): clipped tokens, sum |ratio - 1|, tokens, 1
        # Row c collects positive rollouts with success count c; row 0 takes everything else and is dropped.
        c_all = num_correct.to(torch.long)
        row = torch.where(positive & (c_all >= 1) & (c_all <= max_count), c_all, torch.zeros_like(c_all))
        table = torch.zeros(max_count + 1, 4, dtype=mask.dtype, device=mask.device).index_add_(0, row, per_rollout)
        names = ("clipped", "ratio_dev", "tokens", "rollouts")
        return {c: dict(zip(names, values)) for c, values in enumerate(table.tolist()) if c >= 1}

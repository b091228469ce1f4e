"""Clipped policy-gradient surrogates with a per-rollout upper clip (pure torch); GAPO's diagnostics sum their terms.

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

Token level between per-token ratio bounds (`bounded_token_surrogate`, for peers whose bounds differ token by token,
DCPO's: `gapo.peers.dcpo`):
    loss_t = max(-A * r_t, -A * clip(r_t, lower_t, upper_t))                and the same dual clip for A < 0

The first two follow verl 0.9.1's `gspo` / `vanilla` losses term for term (same clamps of the log-ratio), so with a
constant eps_high they give the same values and gradients (tests/test_gapo_loss.py). Both compute in float32
whatever the input dtype (`_float32`); their loss matrix is float32.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Union

import torch

FloatOrTensor = Union[float, torch.Tensor]


class SurrogateTerms(NamedTuple):
    """Terms of a clipped surrogate: per token (B, T), and per rollout (B,) sums over real tokens.

    The per-rollout sums are made where they are cheapest (at sequence level most are O(B)), so that the
    metrics and diagnostics add no further pass over the (B, T) tensors.
    """

    loss: torch.Tensor  # (B, T) loss before aggregation (carries the gradient), float32
    ratio: torch.Tensor  # (B, T) importance ratio in use, detached (the sequence ratio broadcast at sequence level)
    clipped: torch.Tensor  # (B, T) bool: the clipped branch is active, so the token's gradient is cut
    tokens: torch.Tensor  # (B,) real tokens
    clipped_tokens: torch.Tensor  # (B,) real tokens in the clipped branch
    dual_clipped_tokens: torch.Tensor  # (B,) real tokens under the dual clip
    log_ratio_sum: torch.Tensor  # (B,) sum of log(pi / pi_old) over real tokens
    ratio_dev_sum: torch.Tensor  # (B,) sum of |ratio - 1| over real tokens


def _float32(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Inputs in float32: bf16's spacing near 1 (0.0078) is coarser than the paper's clips (7e-5 to 5e-3), so a
    bf16 ratio of 1 + 2e-4 would read as 1 and a bound of 1 + 3e-4 as 1. The cast is differentiable (and free
    for float32 inputs)."""
    return tuple(t if t.dtype == torch.float32 else t.float() for t in tensors)


@functools.lru_cache(maxsize=64)
def _constant(value: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """0-d tensor of `value`, made once per (value, dtype, device): made per call, it would cost an allocation and, on
    a GPU, a host-to-device copy. Never an inference tensor, so that autograd can save it whoever asked first."""
    with torch.inference_mode(False):
        return torch.tensor(value, dtype=dtype, device=device)


def _upper_bound(eps_high: FloatOrTensor, like: torch.Tensor) -> Union[float, torch.Tensor]:
    """1 + eps_high as a float, or as a (B, 1) tensor from a (B,) one, that broadcasts over tokens."""
    if not isinstance(eps_high, torch.Tensor):
        return 1 + float(eps_high)
    if eps_high.dim() == 0:
        return 1 + eps_high.to(like.dtype)
    if eps_high.dim() != 1:
        raise ValueError(f"eps_high must be a float or a (B,) tensor, got shape {tuple(eps_high.shape)}")
    if eps_high.shape[0] != like.shape[0]:
        raise ValueError(f"eps_high has {eps_high.shape[0]} entries for a batch of {like.shape[0]} rollouts")
    return 1 + eps_high.to(device=like.device, dtype=like.dtype).unsqueeze(-1)


def _clipped_objective(ratio, advantages, eps_low, eps_high):
    """max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)) per token, and whether the clipped branch is active."""
    neg_adv = -advantages
    upper = _upper_bound(eps_high, ratio)
    if isinstance(upper, torch.Tensor):  # one bound per rollout; torch.clamp takes tensor bounds only in pairs
        bounded = torch.clamp(ratio, _constant(1 - eps_low, ratio.dtype, ratio.device), upper)
    else:
        bounded = torch.clamp(ratio, 1 - eps_low, upper)
    unclipped, clipped = neg_adv * ratio, neg_adv * bounded
    return torch.maximum(unclipped, clipped), clipped > unclipped


def sequence_clipped_surrogate(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    eps_low: float,
    eps_high: FloatOrTensor,
) -> SurrogateTerms:
    """GSPO's sequence-ratio clipped surrogate with one upper clip per rollout (formula: the module docstring).

    s_i = exp(mean over real tokens of log(pi / pi_old)), clamped at exp(10) as verl's `gspo` does; every token of
    rollout i carries s_i as its value and the gradient of log pi_t (GSPO-token), so `agg_loss` over tokens gives
    the sequence ratio's gradient.

    Args:
        log_prob: (B, T) log pi of the response tokens under the current policy (carries the gradient).
        old_log_prob: (B, T) log pi_old of the same tokens, the policy before this update (no gradient).
        advantages: (B, T) A_i,t; constant along a rollout for outcome rewards.
        response_mask: (B, T) 1 on real response tokens, 0 on padding.
        eps_low: lower clip, 1 - eps_low for every rollout.
        eps_high: upper clip, a float or a (B,) tensor (one per rollout, `gapo.threshold.rollout_eps_high`).

    Returns:
        `SurrogateTerms`: the (B, T) float32 loss before aggregation and the per-rollout (B,) sums for the metrics
        (no dual clip at sequence level: `dual_clipped_tokens` is 0).
    """
    log_prob, old_log_prob, advantages = _float32(log_prob, old_log_prob, advantages)
    log_ratio = log_prob - old_log_prob
    mask = response_mask.to(torch.float32)
    tokens = mask.sum(-1)
    log_ratio_sum = (log_ratio * mask).sum(-1).detach()
    seq_log_ratio = log_ratio_sum / tokens.clamp_min(1)
    # Token-level handle on the sequence ratio: value s_i, gradient d log pi_t (GSPO-token); clamp as verl does.
    log_s = torch.clamp_max(log_prob - log_prob.detach() + seq_log_ratio.unsqueeze(-1), 10.0)
    ratio = torch.exp(log_s)
    loss, clipped = _clipped_objective(ratio, advantages, eps_low, eps_high)
    seq_ratio = torch.exp(seq_log_ratio.clamp_max(10.0))  # the value of every token's ratio in rollout i
    no_tokens = torch.zeros_like(tokens)
    return SurrogateTerms(
        loss=loss,
        ratio=ratio.detach(),
        clipped=clipped,
        tokens=tokens,
        clipped_tokens=(clipped * mask).sum(-1),
        dual_clipped_tokens=no_tokens,
        log_ratio_sum=log_ratio_sum,
        ratio_dev_sum=(seq_ratio - 1).abs_() * tokens,
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
    """PPO's token-ratio clipped surrogate with one upper clip per rollout and dual clip for A < 0.

    r_t = exp(clamp(log pi_t - log pi_old,t, -20, 20)) (verl's `vanilla` clamp);
    loss_t = max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high_i)), and for A_t < 0 at most -A_t * clip_ratio_c
    (the dual clip of Ye et al. 2019 bounds what a token whose ratio exploded can contribute). The paper uses this
    form for its code runs (DeepCoder's 0.2 / 0.28).

    Args:
        log_prob, old_log_prob, advantages, response_mask: (B, T), as in `sequence_clipped_surrogate`.
        eps_low: lower clip, 1 - eps_low for every token.
        eps_high: upper clip, a float or a (B,) tensor broadcast over each rollout's tokens.
        clip_ratio_c: the dual clip's c (> 1; verl's `clip_ratio_c`, default 3).

    Returns:
        `SurrogateTerms`: the (B, T) float32 loss before aggregation and the per-rollout (B,) sums for the metrics.

    Raises:
        ValueError: clip_ratio_c <= 1.
    """
    _check_dual_clip(clip_ratio_c)
    log_prob, old_log_prob, advantages = _float32(log_prob, old_log_prob, advantages)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    loss, clipped = _clipped_objective(ratio, advantages, eps_low, eps_high)
    return _dual_clipped_terms(loss, clipped, ratio, log_ratio, advantages, response_mask, clip_ratio_c)


def bounded_token_surrogate(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    lower: torch.Tensor,
    upper: torch.Tensor,
    clip_ratio_c: float = 3.0,
) -> SurrogateTerms:
    """PPO's token-ratio surrogate between per-token ratio bounds, with the dual clip for A < 0.

    loss_t = max(-A_t r_t, -A_t clip(r_t, lower_t, upper_t)), and for A_t < 0 at most -A_t * clip_ratio_c; r_t as in
    `token_clipped_surrogate`, which this is with lower_t = 1 - eps_low and upper_t = 1 + eps_high_i. For rules whose
    bounds differ token by token (DCPO's, from each token's old probability: `gapo.peers.dcpo`).

    Args:
        log_prob, old_log_prob, advantages, response_mask: (B, T), as in `sequence_clipped_surrogate`.
        lower, upper: (B, T) bounds on the ratio itself (not epsilons), lower_t <= 1 <= upper_t; no gradient.
        clip_ratio_c: the dual clip's c (> 1).

    Returns:
        `SurrogateTerms`, as `token_clipped_surrogate`'s.

    Raises:
        ValueError: clip_ratio_c <= 1, or bounds whose shape is not the log-probs'.
    """
    _check_dual_clip(clip_ratio_c)
    if lower.shape != log_prob.shape or upper.shape != log_prob.shape:
        raise ValueError(f"ratio bounds of shapes {tuple(lower.shape)} and {tuple(upper.shape)} for log-probs of shape "
                         f"{tuple(log_prob.shape)}: one lower and one upper bound per token")
    log_prob, old_log_prob, advantages = _float32(log_prob, old_log_prob, advantages)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    neg_adv = -advantages
    unclipped, clipped = neg_adv * ratio, neg_adv * torch.clamp(ratio, lower.detach().float(), upper.detach().float())
    return _dual_clipped_terms(torch.maximum(unclipped, clipped), clipped > unclipped, ratio, log_ratio, advantages,
                               response_mask, clip_ratio_c)


def _check_dual_clip(clip_ratio_c: float) -> None:
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c (dual clip) must be > 1, got {clip_ratio_c}")


def _dual_clipped_terms(loss, clipped, ratio, log_ratio, advantages, response_mask, clip_ratio_c) -> SurrogateTerms:
    """A token-level clipped objective's terms after the dual clip of Ye et al. 2019 (at most -A * c for A < 0)."""
    # Dual clip: a negative-advantage token whose ratio exploded contributes at most -A * c.
    dual_bound = -advantages * clip_ratio_c
    negative = advantages < 0
    dual_clipped = negative & (loss > dual_bound)
    mask = response_mask.to(torch.float32)
    with torch.no_grad():
        ratio_dev_sum = ((ratio - 1).abs_() * mask).sum(-1)
    return SurrogateTerms(
        loss=torch.where(negative, torch.minimum(loss, dual_bound), loss),
        ratio=ratio.detach(),
        clipped=clipped,
        tokens=mask.sum(-1),
        clipped_tokens=(clipped * mask).sum(-1),
        dual_clipped_tokens=(dual_clipped * mask).sum(-1),
        log_ratio_sum=(log_ratio.detach() * mask).sum(-1),
        ratio_dev_sum=ratio_dev_sum,
    )


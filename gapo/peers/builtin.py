"""What plays the clip's part in the peers verl 0.9.1 has built in, per token, for GAPO's per-c diagnostics.

The losses themselves stay verl's (`verl.trainer.ppo.core_algos`, called through its registry by the `*_diagnosed`
loss modes of `gapo.verl_plugin.losses`); this module only measures, from the same tensors, how much of each token's
update the peer's rule takes away, as a number in [0, 1] that the diagnostics sum where GAPO's sum clipped tokens
(docs/peers.md). With r = exp(clamp(log pi - log pi_old, -20, 20)), p = pi and q = pi_old of the token:

    cispo     1 where r lies outside [1 - eps_low, 1 + eps_high]: the importance weight was clipped. CISPO keeps
              every token's gradient (the clipped weight multiplies log pi), so this is the weight's clip, not a cut.
    dppo_tv   1 where the token was masked out: p - q > eps_high for A > 0, p - q < -eps_low for A <= 0 (a band on
              the probability difference, eps the divergence bound; gradient cut).
    dppo_kl   1 where masked out: the binary KL q log(q/p) + (1-q) log((1-q)/(1-p)) above eps_high while p > q
              (A > 0), above eps_low while p < q (A <= 0) (gradient cut).
    sapo      1 - 4 s (1 - s), s = sigmoid(tau (r - 1)), tau = tau_pos for A > 0 and tau_neg otherwise: the share of
              the unclipped gradient -A r the soft gate removes (0 at r = 1, towards 1 far from it; no hard cut).
    kl_cov    1 on the tokens KL-Cov penalises: the max(1, int(n kl_cov_ratio)) real tokens of largest
              (A - mean A)(log pi - mean log pi) (torch.topk, as verl's), which get ppo_kl_coef |log r| added to their
              loss (no cut: a pull back towards pi_old).

eps_low and eps_high are verl's clip_ratio_low and clip_ratio_high (falling back to clip_ratio), as the losses read
them. Shapes: (B, T) in, (B, T) float32 out, no gradient.
"""

from __future__ import annotations

import torch

from gapo.surrogate import SurrogateTerms

# verl 0.9.1 loss mode -> what its cut fraction measures (docs/peers.md)
BUILTIN_PEERS = {
    "cispo": "importance weight clipped (gradient kept)",
    "dppo_tv": "masked out by the probability-difference band (gradient cut)",
    "dppo_kl": "masked out by the binary-KL band (gradient cut)",
    "sapo": "share of the gradient the soft gate removes",
    "kl_cov": "tokens given the KL penalty (largest log-prob / advantage covariance)",
}
DIAGNOSED_SUFFIX = "_diagnosed"


def builtin_clips(config) -> tuple[float, float]:
    """(eps_low, eps_high) as verl's built-in losses read them from the actor config."""
    low, high = config.get("clip_ratio_low"), config.get("clip_ratio_high")
    return (low if low is not None else config.clip_ratio), (high if high is not None else config.clip_ratio)


def cut_fraction(peer: str, log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor,
                 eps_low: float, eps_high: float, tau_pos: float = 1.0, tau_neg: float = 1.05,
                 mask: torch.Tensor | None = None, kl_cov_ratio: float = 0.0002) -> torch.Tensor:
    """(B, T) float32 in [0, 1]: how much of each token's update `peer`'s rule takes away (module docstring).
    `mask` (the real tokens) and `kl_cov_ratio` are kl_cov's only.

    Raises:
        ValueError: a peer not in BUILTIN_PEERS.
    """
    if peer not in BUILTIN_PEERS:
        raise ValueError(f"no cut fraction for loss mode {peer!r}; the built-in peers measured: "
                         f"{', '.join(BUILTIN_PEERS)}")
    with torch.no_grad():
        log_prob, old_log_prob, adv = log_prob.detach().float(), old_log_prob.float(), advantages.float()
        if peer == "kl_cov":
            return _kl_cov_tokens(log_prob, adv, mask if mask is not None else torch.ones_like(adv), kl_cov_ratio)
        if peer == "cispo" or peer == "sapo":
            ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
            if peer == "cispo":
                return ((ratio < 1 - eps_low) | (ratio > 1 + eps_high)).float()
            tau = torch.where(adv > 0, tau_pos, tau_neg)
            s = torch.sigmoid(tau * (ratio - 1))
            return 1 - 4 * s * (1 - s)
        p, q = torch.exp(log_prob), torch.exp(old_log_prob)
        if peer == "dppo_tv":
            valid = torch.where(adv > 0, p - q <= eps_high, p - q >= -eps_low)
        else:  # dppo_kl, with verl's 1e-8 in the second log
            kl = q * (old_log_prob - log_prob) + (1 - q) * torch.log((1 - q + 1e-8) / (1 - p + 1e-8))
            valid = torch.where(adv > 0, (kl <= eps_high) | (p <= q), (kl <= eps_low) | (p >= q))
        return (~valid).float()


def _kl_cov_tokens(log_prob: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, ratio: float) -> torch.Tensor:
    """(B, T) 1.0 on the tokens verl's kl_cov penalises (module docstring), 0 elsewhere."""
    out = torch.zeros_like(adv)
    valid = mask > 0
    a, lp = adv[valid], log_prob[valid]
    if a.numel() == 0:
        return out
    cov = (a - a.mean()) * (lp - lp.mean())
    top = torch.topk(cov, max(1, int(a.numel() * ratio)), largest=True).indices
    flat = out[valid]
    flat[top] = 1.0
    out[valid] = flat
    return out


def cut_terms(cut: torch.Tensor, log_prob: torch.Tensor, old_log_prob: torch.Tensor,
              mask: torch.Tensor) -> SurrogateTerms:
    """The `SurrogateTerms` GAPO's diagnostics read, for a loss computed elsewhere (verl's or TRL's): per rollout, the
    cut summed over real tokens where a clip's clipped tokens go, the log-ratio (clamped at +-20, as the losses clamp
    it) and |r - 1| summed, no dual clip. `loss` holds the cut (there is no loss matrix here); all detached."""
    with torch.no_grad():
        mask = mask.float()
        log_ratio = torch.clamp(log_prob.detach().float() - old_log_prob.float(), min=-20.0, max=20.0)
        ratio = torch.exp(log_ratio)
        tokens = mask.sum(-1)
        return SurrogateTerms(loss=cut, ratio=ratio, clipped=cut > 0, tokens=tokens,
                              clipped_tokens=(cut * mask).sum(-1), dual_clipped_tokens=torch.zeros_like(tokens),
                              log_ratio_sum=(log_ratio * mask).sum(-1),
                              ratio_dev_sum=((ratio - 1).abs() * mask).sum(-1))

"""verl's built-in peers run with GAPO's diagnostics (`<peer>_diagnosed`, gapo.peers.builtin): verl's loss, gradient
and metrics unchanged; the cut fraction agrees with verl's own clip fraction where verl reports one, and with verl's
gradient where the cut is soft (SAPO); hand-computed per-c sums."""

import pytest
import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.workers.config import FSDPActorConfig

from gapo.peers.builtin import BUILTIN_PEERS, cut_fraction
from gapo.verl_plugin.config import GAPOPolicyLossConfig
from gapo.verl_plugin.losses import SUMS_PREFIX, group_stats_context

CLIPS = {"cispo": (1.0, 4.0), "dppo_tv": (0.15, 0.15), "dppo_kl": (0.05, 0.05), "sapo": (0.2, 0.28),
         "kl_cov": (0.2, 0.28)}


def _config(peer, agg="token-mean", **policy_loss):
    lo, hi = CLIPS[peer]
    return FSDPActorConfig(strategy="fsdp2", rollout_n=4, ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2,
                           clip_ratio_low=lo, clip_ratio_high=hi, loss_agg_mode=agg,
                           policy_loss=GAPOPolicyLossConfig(loss_mode=f"{peer}_diagnosed", eps_high_max=hi,
                                                            **policy_loss))


def _batch(seed, b=6, t=9, spread=0.8):
    g = torch.Generator().manual_seed(seed)
    old = torch.log(torch.rand(b, t, generator=g) * 0.98 + 0.01)  # q in (0.01, 0.99): bands bind both ways
    new = old + torch.randn(b, t, generator=g) * spread
    new = torch.clamp(new, max=-1e-4)  # a probability stays below 1
    adv = torch.randn(b, 1, generator=g).expand(b, t).contiguous()
    mask = (torch.rand(b, t, generator=g) > 0.2).float()
    return old, new, adv, mask


def _call(loss_mode, config, old, new, adv, mask, c=None, k=None, success=None):
    log_prob = new.clone().requires_grad_(True)
    b = old.shape[0]
    c = torch.as_tensor(c if c is not None else [1] * b)
    k = torch.as_tensor(k if k is not None else [4] * b)
    success = torch.as_tensor(success if success is not None else (adv[:, 0] > 0).tolist())
    with group_stats_context(c, k, success) as stats:
        loss, metrics = get_policy_loss_fn(loss_mode)(old_log_prob=old, log_prob=log_prob, advantages=adv,
                                                      response_mask=mask, loss_agg_mode=config.loss_agg_mode,
                                                      config=config, rollout_is_weights=None)
    loss.backward()
    return loss.detach(), log_prob.grad, metrics, stats.sums


@pytest.mark.parametrize("peer", list(BUILTIN_PEERS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_diagnosed_loss_is_verls_loss_gradient_and_metrics(peer, seed):
    old, new, adv, mask = _batch(seed)
    config = _config(peer, "seq-mean-token-mean" if peer == "sapo" else "token-mean")
    ours = _call(f"{peer}_diagnosed", config, old, new, adv, mask)
    verls = _call(peer, config, old, new, adv, mask)
    assert ours[0] == verls[0] and torch.equal(ours[1], verls[1]) and ours[2] == verls[2]
    assert ours[3] and any(k.startswith(f"{SUMS_PREFIX}/c1/") for k in ours[3])  # the diagnostics came along


@pytest.mark.parametrize("peer", ["cispo", "dppo_tv", "dppo_kl"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_cut_fraction_is_verls_own_clip_fraction(peer, seed):
    old, new, adv, mask = _batch(seed, t=30, spread=3.0 if peer == "cispo" else 0.8)  # CISPO: weights in [0, 5]
    _, _, metrics, _ = _call(peer, _config(peer), old, new, adv, mask)
    cut = cut_fraction(peer, new, old, adv, *CLIPS[peer])
    assert 0 < (cut * mask).sum() < mask.sum()  # the batch has tokens on both sides
    assert (cut * mask).sum().item() / mask.sum().item() == pytest.approx(metrics["actor/pg_clipfrac"], rel=1e-6)


@pytest.mark.parametrize("peer", ["dppo_tv", "dppo_kl"])
def test_dppos_cut_tokens_are_exactly_those_without_a_gradient(peer):
    old, new, adv, mask = _batch(5)
    _, grad, _, _ = _call(peer, _config(peer), old, new, adv, torch.ones_like(mask))
    cut = cut_fraction(peer, new, old, adv, *CLIPS[peer])
    assert torch.equal(grad == 0, cut == 1)


def test_sapos_cut_is_the_share_of_the_gradient_its_gate_removes():
    # verl's sapo: loss -A * gate(r) aggregated seq-mean-token-mean, so d loss / d log pi_t = -A r gate'(r) / (B T_i)
    # with gate'(r) = 4 s (1 - s); the cut is 1 - gate'(r): the gradient is the unclipped one times (1 - cut)
    old, new, adv, mask = _batch(7)
    mask = torch.ones_like(mask)
    _, grad, metrics, _ = _call("sapo", _config("sapo", "seq-mean-token-mean"), old, new, adv, mask)
    ratio = torch.exp(new - old)
    unclipped = -adv * ratio / (mask.shape[0] * mask.sum(-1, keepdim=True))
    cut = cut_fraction("sapo", new, old, adv, 0.2, 0.28)
    torch.testing.assert_close(grad, unclipped * (1 - cut), rtol=1e-5, atol=1e-7)
    assert metrics["actor/pg_clipfrac"] == 0  # verl reports none for its soft gate
    assert cut_fraction("sapo", torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), 0.2, 0.28).item() == 0


def test_kl_covs_tokens_are_exactly_those_whose_gradient_carries_its_penalty():
    # verl's kl_cov: -A r on every token, plus ppo_kl_coef |log r| on the top kl_cov_ratio of tokens by covariance:
    # its gradient differs from the plain -A r / n exactly on the tokens the cut marks (10 of the 44 real tokens)
    old, new, adv, mask = _batch(9)
    config = _config("kl_cov", kl_cov_ratio=0.25, ppo_kl_coef=1.0)
    _, grad, _, _ = _call("kl_cov", config, old, new, adv, mask)
    plain = -adv * torch.exp(new - old) * mask / mask.sum()
    cut = cut_fraction("kl_cov", new, old, adv, 0.2, 0.28, mask=mask, kl_cov_ratio=0.25)
    assert cut.sum().item() == int(mask.sum().item() * 0.25) and (cut * (1 - mask)).sum() == 0
    differs = ~torch.isclose(grad, plain, rtol=1e-5, atol=1e-8)
    assert torch.equal(differs, cut == 1)


def test_cispo_per_c_sums_hand_computed():
    # a success of a c = 1 group at ratios 1.5 (inside CISPO's [0, 5]) and 6 (its weight clipped at 5); a success of a
    # c = 3 group at ratio 1; a failure whose clipped token counts nowhere in the per-c rows
    old = torch.zeros(3, 2)
    new = torch.log(torch.tensor([[1.5, 6.0], [1.0, 1.0], [8.0, 1.0]]))
    adv = torch.tensor([[0.75] * 2, [0.25] * 2, [-0.5] * 2])
    _, _, metrics, sums = _call("cispo_diagnosed", _config("cispo"), old, new, adv, torch.ones(3, 2), c=[1, 3, 1],
                                success=[True, True, False])
    assert sums[f"{SUMS_PREFIX}/c1/clipped"] == 1 and sums[f"{SUMS_PREFIX}/c1/tokens"] == 2
    assert sums[f"{SUMS_PREFIX}/c3/clipped"] == 0 and sums[f"{SUMS_PREFIX}/c3/rollouts"] == 1
    assert sums[f"{SUMS_PREFIX}/c1/ratio_dev"] == pytest.approx(0.5 + 5.0)
    assert sums[f"{SUMS_PREFIX}/eps_high_sum"] == pytest.approx(8.0)  # 4.0 for each of the two successes
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 6)  # verl's own: every clipped weight


def test_an_unmeasured_peer_and_a_missing_context_name_the_fix():
    with pytest.raises(ValueError, match="the built-in peers measured: cispo, dppo_tv, dppo_kl, sapo, kl_cov"):
        cut_fraction("gpg", torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), 0.2, 0.2)
    old = torch.zeros(1, 2)
    with pytest.raises(RuntimeError, match="GAPO loss 'sapo_diagnosed' got no per-rollout group statistics"):
        get_policy_loss_fn("sapo_diagnosed")(old_log_prob=old, log_prob=old, advantages=old,
                                             response_mask=torch.ones(1, 2), loss_agg_mode="token-mean",
                                             config=_config("sapo"))

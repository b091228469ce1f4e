"""The registered GAPO losses: hand-computed values and gradients, equivalence with verl's gspo / vanilla
under the `constant` schedule, diagnostics, and the errors a misconfigured run gets."""

import pytest
import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.workers.config import FSDPActorConfig, PolicyLossConfig

from gapo.verl_plugin.config import GAPOPolicyLossConfig
from gapo.verl_plugin.losses import SUMS_PREFIX, group_stats_context


def actor_config(loss_mode, lo=0.2, hi=0.28, agg="seq-mean-token-mean", rollout_n=4, **gapo):
    policy_loss = GAPOPolicyLossConfig(loss_mode=loss_mode, **gapo) if loss_mode.startswith("gapo") else PolicyLossConfig(loss_mode=loss_mode)
    return FSDPActorConfig(
        strategy="fsdp2", rollout_n=rollout_n, ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2,
        clip_ratio_low=lo, clip_ratio_high=hi, loss_agg_mode=agg, policy_loss=policy_loss,
    )


def call(loss_mode, config, old, new, adv, mask, num_correct=None, group_size=None):
    log_prob = new.clone().requires_grad_(True)
    fn = get_policy_loss_fn(loss_mode)
    kwargs = dict(old_log_prob=old, log_prob=log_prob, advantages=adv, response_mask=mask,
                  loss_agg_mode=config.loss_agg_mode, config=config, rollout_is_weights=None)
    if num_correct is None:
        loss, metrics = fn(**kwargs)
    else:
        with group_stats_context(torch.as_tensor(num_correct), torch.as_tensor(group_size)):
            loss, metrics = fn(**kwargs)
    loss.backward()
    return loss.detach(), log_prob.grad, metrics


def test_sequence_level_hand_computed_value_and_gradient():
    # Two correct rollouts with the same sequence ratio 1.25: one from a c = 1 group (A = 3/4, bound
    # 1.28: not clipped), one from a c = 3 group (A = 1/4, bound 1 + 0.2 + 0.08/3 = 1.22667: clipped).
    old = torch.zeros(2, 2)
    new = torch.full((2, 2), torch.log(torch.tensor(1.25)).item())
    adv = torch.tensor([[0.75, 0.75], [0.25, 0.25]])
    mask = torch.ones(2, 2)
    loss, grad, metrics = call("gapo", actor_config("gapo"), old, new, adv, mask, [1, 3], [4, 4])
    hi_c3 = 0.2 + 0.08 / 3
    assert loss.item() == pytest.approx((-0.75 * 1.25 + -0.25 * (1 + hi_c3)) / 2, rel=1e-6)
    # d/dlogp_t of 1/2 * 1/2 * sum_t(-A s): -A * s / 4 for the unclipped rollout, 0 for the clipped one
    torch.testing.assert_close(grad, torch.tensor([[-0.75 * 1.25 / 4] * 2, [0.0, 0.0]]))
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    # Diagnostics: c = 1 never clipped, c = 3 always; |ratio - 1| = 0.25 for both
    assert metrics[f"{SUMS_PREFIX}/c1/clipped"] == 0 and metrics[f"{SUMS_PREFIX}/c3/clipped"] == 2
    assert metrics[f"{SUMS_PREFIX}/c3/tokens"] == 2 and metrics[f"{SUMS_PREFIX}/c2/rollouts"] == 0
    assert metrics[f"{SUMS_PREFIX}/c1/ratio_dev"] == pytest.approx(0.5)
    assert metrics[f"{SUMS_PREFIX}/eps_high_sum"] == pytest.approx(0.28 + hi_c3)


def test_fixed_gspo_clips_the_rare_success_that_gapo_lets_through():
    old, new = torch.zeros(2, 2), torch.full((2, 2), torch.log(torch.tensor(1.25)).item())
    adv, mask = torch.tensor([[0.75, 0.75], [0.25, 0.25]]), torch.ones(2, 2)
    _, grad_gspo, m = call("gspo", actor_config("gspo", hi=0.2), old, new, adv, mask)
    assert m["actor/pg_clipfrac"] == 1.0 and torch.all(grad_gspo == 0)
    _, grad_gapo, _ = call("gapo", actor_config("gapo"), old, new, adv, mask, [1, 3], [4, 4])
    assert torch.all(grad_gapo[0] != 0) and torch.all(grad_gapo[1] == 0)


def test_token_level_hand_computed_with_dual_clip():
    # rollout 0: correct, c = 1 of 4 (bound 1.28), token ratios 1.25 (kept) and 1.5 (clipped at 1.28)
    # rollout 1: wrong, A = -1/4, token ratios 4.0 (dual clip at c = 3) and 0.5 (clipped at 1 - 0.2)
    old = torch.zeros(2, 2)
    new = torch.log(torch.tensor([[1.25, 1.5], [4.0, 0.5]]))
    adv = torch.tensor([[0.75, 0.75], [-0.25, -0.25]])
    mask = torch.ones(2, 2)
    cfg = actor_config("gapo_token", agg="token-mean")
    loss, grad, metrics = call("gapo_token", cfg, old, new, adv, mask, [1, 1], [4, 4])
    per_token = torch.tensor([[-0.75 * 1.25, -0.75 * 1.28], [0.25 * 3.0, 0.25 * 0.8]])
    assert loss.item() == pytest.approx(per_token.mean().item(), rel=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[-0.75 * 1.25 / 4, 0.0], [0.0, 0.0]]))
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)  # 1.5 above 1.28, 0.5 below 0.8
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(0.25)  # the dual-clipped token


def _random_batch(seed, b=6, t=7):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 3
    new = old + torch.randn(b, t, generator=g) * 0.3
    adv = torch.randn(b, 1, generator=g).expand(b, t).contiguous()
    mask = (torch.rand(b, t, generator=g) > 0.2).float()
    mask[:, 0] = 1
    return old, new, adv, mask


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("ours, verls", [("gapo", "gspo"), ("gapo_token", "vanilla")])
def test_constant_schedule_equals_verl_fixed_clip(ours, verls, agg, seed):
    old, new, adv, mask = _random_batch(seed)
    num_correct, group_size = torch.randint(0, 5, (6,)), torch.full((6,), 4)
    ref_loss, ref_grad, ref_m = call(verls, actor_config(verls, agg=agg), old, new, adv, mask)
    loss, grad, m = call(ours, actor_config(ours, agg=agg, schedule="constant", eps_high_max=0.28), old, new, adv, mask,
                         num_correct, group_size)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)
    for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert m[key] == pytest.approx(ref_m[key], abs=1e-6), key


def test_adaptive_schedule_differs_from_fixed_clip_when_clipping_binds():
    old, new, adv, mask = _random_batch(3)
    new = old + 0.5  # every ratio e^0.5 = 1.65: clipping binds for every correct rollout
    adv = torch.tensor([0.75, 0.5, 0.25, -0.25, -0.5, 0.0]).unsqueeze(-1).expand(6, 7).contiguous()
    c = torch.tensor([1, 2, 3, 1, 2, 0])
    l_const, _, _ = call("gapo", actor_config("gapo", schedule="constant"), old, new, adv, mask, c, torch.full((6,), 4))
    l_lin, _, _ = call("gapo", actor_config("gapo"), old, new, adv, mask, c, torch.full((6,), 4))
    assert l_lin.item() > l_const.item()  # narrower bounds for c = 2, 3 give less (negative) loss


def test_without_group_statistics_the_loss_stops_with_the_fix():
    old, new, adv, mask = _random_batch(0)
    with pytest.raises(RuntimeError, match="recipe.main_gapo"):
        call("gapo", actor_config("gapo"), old, new, adv, mask)
    with pytest.raises(RuntimeError, match="trainer_mode=gapo"):
        call("gapo_token", actor_config("gapo_token"), old, new, adv, mask)


def test_plain_policy_loss_config_is_rejected_with_the_target_to_set():
    old, new, adv, mask = _random_batch(0)
    cfg = FSDPActorConfig(strategy="fsdp2", rollout_n=4, ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2,
                          policy_loss=PolicyLossConfig(loss_mode="gapo"))
    with pytest.raises(TypeError, match="GAPOPolicyLossConfig"):
        call("gapo", cfg, old, new, adv, mask, torch.ones(6), torch.full((6,), 4))

"""DCPO's dynamic clip (gapo.peers.dcpo) and its registered loss `dcpo`: hand-computed bounds, values, gradients and
per-c diagnostics, on tokens where DCPO's band and the fixed ratio clip disagree in both directions."""

import math
from pathlib import Path

import pytest
import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.workers.config import FSDPActorConfig, PolicyLossConfig

from gapo.peers.dcpo import dcpo_ratio_bounds
from gapo.surrogate import bounded_token_surrogate, token_clipped_surrogate
from gapo.verl_plugin.config import GAPOPolicyLossConfig
from gapo.verl_plugin.losses import SUMS_PREFIX, group_stats_context


def _upper(q, eps_high):
    return 0.5 + 0.5 * math.sqrt(1 + 4 * eps_high / q)


def test_bounds_hand_computed_from_the_old_probability():
    q = torch.tensor([[1.0, 0.5, 0.01, 0.001]])
    lower, upper = dcpo_ratio_bounds(torch.log(q), 0.2, 0.28)
    # q = 1: 1/2 + 1/2 sqrt(1 - 0.8) and 1/2 + 1/2 sqrt(2.12), near PPO's 0.8 and 1.28; q <= 4 eps_low: lower 1/2
    torch.testing.assert_close(lower, torch.tensor([[0.5 + 0.5 * math.sqrt(0.2), 0.5, 0.5, 0.5]]))
    # q = 0.001: 1/2 + 1/2 sqrt(1121) = 17.24, capped at max(c = 3, 10)
    torch.testing.assert_close(upper, torch.tensor([[_upper(1.0, 0.28), 1.4, _upper(0.01, 0.28), 10.0]]))
    assert not lower.requires_grad and lower.dtype == upper.dtype == torch.float32


def test_the_cap_is_the_dual_clip_above_10_and_an_underflowed_probability_gets_the_limits():
    old = torch.tensor([[math.log(0.001), -200.0]])  # exp(-200) is 0 in float32
    _, upper = dcpo_ratio_bounds(old, 0.2, 0.28, clip_ratio_c=12.0)
    assert upper.tolist()[0] == [12.0, 12.0]  # 17.24 and inf, capped at c = 12
    lower, upper = dcpo_ratio_bounds(old, 0.2, 0.28, clip_ratio_c=20.0)
    assert upper.tolist()[0] == pytest.approx([_upper(0.001, 0.28), 20.0]) and lower[0, 1].item() == 0.5


@pytest.mark.parametrize("eps", [(0.0, 0.28), (0.2, -0.1)])
def test_an_epsilon_that_is_not_positive_is_refused_with_the_fields_to_set(eps):
    with pytest.raises(ValueError, match=r"clip_ratio_low, actor.clip_ratio_high.*0.2 and 0.28"):
        dcpo_ratio_bounds(torch.zeros(1, 2), *eps)


def test_bounded_surrogate_with_ppo_bounds_is_the_token_surrogate():
    torch.manual_seed(0)
    old, new = torch.randn(3, 5) * 0.3, torch.randn(3, 5) * 0.3
    adv, mask = torch.randn(3, 1).expand(3, 5), (torch.rand(3, 5) > 0.2).float()
    a = token_clipped_surrogate(new, old, adv, mask, 0.2, 0.28)
    b = bounded_token_surrogate(new, old, adv, mask, torch.full((3, 5), 0.8), torch.full((3, 5), 1.28))
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y)
    with pytest.raises(ValueError, match="one lower and one upper bound per token"):
        bounded_token_surrogate(new, old, adv, mask, torch.full((3, 1), 0.8), torch.full((3, 5), 1.28))


def _config(loss_mode, policy_loss):
    return FSDPActorConfig(strategy="fsdp2", rollout_n=4, ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2,
                           clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode="token-mean",
                           policy_loss=policy_loss)


# rollout 0: a success (A = +1/2) of a c = 1 group: a likely token (q = 1) at ratio 1.25, above DCPO's 1.2280 but
# inside the fixed 1.28; a rare one (q = 0.01) at ratio 3, inside DCPO's 5.815 but above 1.28.
# rollout 1: a failure (A = -1/2): q = 0.5 at ratio 0.6, inside DCPO's lower 1/2 but below the fixed 0.8; and ratio 4,
# dual-clipped at c = 3 by both.
Q = torch.tensor([[1.0, 0.01], [0.5, 0.5]])
R = torch.tensor([[1.25, 3.0], [0.6, 4.0]])
ADV = torch.tensor([[0.5, 0.5], [-0.5, -0.5]])


def _call(loss_mode, policy_loss):
    old = torch.log(Q)
    log_prob = (old + torch.log(R)).requires_grad_(True)
    with group_stats_context(torch.tensor([1, 1]), torch.tensor([4, 4]), torch.tensor([True, False])) as stats:
        loss, metrics = get_policy_loss_fn(loss_mode)(
            old_log_prob=old, log_prob=log_prob, advantages=ADV, response_mask=torch.ones(2, 2),
            loss_agg_mode="token-mean", config=_config(loss_mode, policy_loss), rollout_is_weights=None)
    loss.backward()
    return loss.item(), log_prob.grad, {**metrics, **stats.sums}


def test_dcpo_loss_value_gradient_and_diagnostics_hand_computed():
    loss, grad, m = _call("dcpo", GAPOPolicyLossConfig(loss_mode="dcpo"))
    up_likely = _upper(1.0, 0.28)
    # per token: -A clip(r) for the clipped likely token, -A r for the kept ones, -A c for the dual-clipped one
    assert loss == pytest.approx((-0.5 * up_likely - 0.5 * 3.0 + 0.5 * 0.6 + 0.5 * 3.0) / 4, rel=1e-6)
    # d loss / d log pi_t = -A r_t / 4 where the token is kept, 0 where clipped
    torch.testing.assert_close(grad, torch.tensor([[0.0, -0.5 * 3.0 / 4], [0.5 * 0.6 / 4, 0.0]]))
    assert m["actor/pg_clipfrac"] == pytest.approx(0.25) and m["actor/pg_clipfrac_lower"] == pytest.approx(0.25)
    # diagnostics over the success with A > 0 (rollout 0, c = 1): 1 of 2 tokens clipped, |r - 1| = 0.25 + 2,
    # its "eps_high" the mean of upper - 1 over its tokens
    assert m[f"{SUMS_PREFIX}/c1/clipped"] == 1 and m[f"{SUMS_PREFIX}/c1/tokens"] == 2
    assert m[f"{SUMS_PREFIX}/c1/ratio_dev"] == pytest.approx(2.25)
    assert m[f"{SUMS_PREFIX}/c1/rollouts"] == 1
    assert m[f"{SUMS_PREFIX}/eps_high_sum"] == pytest.approx((up_likely - 1 + _upper(0.01, 0.28) - 1) / 2, rel=1e-6)


def test_the_fixed_clip_cuts_the_tokens_dcpo_keeps_and_keeps_the_one_it_cuts():
    _, grad, m = _call("vanilla", PolicyLossConfig(loss_mode="vanilla"))
    torch.testing.assert_close(grad, torch.tensor([[-0.5 * 1.25 / 4, 0.0], [0.0, 0.0]]))
    assert m["actor/pg_clipfrac"] == pytest.approx(0.5)


def test_dcpo_without_the_gapo_trainer_stops_with_the_fix():
    old = torch.zeros(1, 2)
    with pytest.raises(RuntimeError, match="GAPO loss 'dcpo' got no per-rollout group statistics"):
        get_policy_loss_fn("dcpo")(old_log_prob=old, log_prob=old, advantages=old, response_mask=torch.ones(1, 2),
                                   loss_agg_mode="token-mean",
                                   config=_config("dcpo", GAPOPolicyLossConfig(loss_mode="dcpo")))


def test_a_dcpo_config_outside_the_gapo_trainer_is_refused_at_start_with_the_fix():
    from hydra import compose, initialize_config_dir

    from gapo.verl_plugin.validate import GAPOConfigError, validate_gapo_config

    def _compose(name, overrides=()):
        with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "configs"), version_base=None):
            return compose(name, overrides=list(overrides))

    validate_gapo_config(_compose("math/r1_1.5b_dcpo"))
    with pytest.raises(GAPOConfigError, match=r"loss_mode=dcpo needs the GAPO trainer.*trainer.v1.trainer_mode=gapo"):
        validate_gapo_config(_compose("math/r1_1.5b_dcpo", ["trainer.v1.trainer_mode=sync"]))
    with pytest.raises(GAPOConfigError, match="rollout.n=1"):
        validate_gapo_config(_compose("math/r1_1.5b_dcpo", ["actor_rollout_ref.rollout.n=1"]))

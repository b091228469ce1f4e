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


def call(loss_mode, config, old, new, adv, mask, num_correct=None, group_size=None, success=None):
    """Call the registered loss as ppo_loss does; returns (loss, grad of log_prob, metrics and diagnostic sums).

    `success` defaults to "positive advantage", which is what a success is with binary rewards.
    """
    log_prob = new.clone().requires_grad_(True)
    fn = get_policy_loss_fn(loss_mode)
    kwargs = dict(old_log_prob=old, log_prob=log_prob, advantages=adv, response_mask=mask,
                  loss_agg_mode=config.loss_agg_mode, config=config, rollout_is_weights=None)
    if num_correct is None:
        loss, metrics = fn(**kwargs)
    else:
        if success is None:
            success = adv.float().sum(-1) > 0
        with group_stats_context(torch.as_tensor(num_correct), torch.as_tensor(group_size),
                                 torch.as_tensor(success)) as stats:
            loss, metrics = fn(**kwargs)
        metrics = {**metrics, **stats.sums}
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
    # advantage summed over each rollout's tokens: 2 x 0.75 at c = 1, 2 x 0.25 at c = 3
    assert metrics[f"{SUMS_PREFIX}/c1/advantage"] == pytest.approx(1.5)
    assert metrics[f"{SUMS_PREFIX}/c3/advantage"] == pytest.approx(0.5)
    assert metrics[f"{SUMS_PREFIX}/c2/advantage"] == 0


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


# --- Which rollout gets which bound, with rewards that are not 0/1 ------------------------------------------
# Each group's advantages come from verl's own GRPO estimator (Dr.GRPO: score - group mean), its success
# flags from the rewards and the threshold, as the GAPO trainer computes them. Every rollout gets the same
# sequence ratio 1.1, between eps_low = 0.02 and every adaptive bound used here (>= 0.02 + 0.28 / 3), so a
# rollout's gradient is zero exactly when its upper bound is eps_low.

EPS_LOW, EPS_MAX, RATIO = 0.02, 0.3, 1.1


def _group_case(rewards, threshold):
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    from gapo.groups import group_statistics

    k, t = len(rewards), 3
    scores = torch.tensor(rewards, dtype=torch.float32)
    token_rewards = torch.zeros(k, t)
    token_rewards[:, -1] = scores
    mask = torch.ones(k, t)
    adv, _ = compute_grpo_outcome_advantage(token_rewards, mask, ["g"] * k, norm_adv_by_std_in_grpo=False)
    stats = group_statistics(["g"] * k, scores > threshold)
    return adv, mask, stats


def _bounds_and_grad(rewards, threshold, loss_mode="gapo"):
    from gapo.threshold import rollout_eps_high

    adv, mask, stats = _group_case(rewards, threshold)
    eps, _ = rollout_eps_high(stats.num_correct, stats.group_size, stats.success, adv.sum(-1) > 0, EPS_LOW, EPS_MAX,
                              "linear")
    old = torch.full_like(adv, -1.0)
    new = old + torch.log(torch.tensor(RATIO))
    cfg = actor_config(loss_mode, lo=EPS_LOW, hi=EPS_MAX, agg="token-mean" if loss_mode == "gapo_token" else
                       "seq-mean-token-mean", rollout_n=len(rewards))
    _, grad, metrics = call(loss_mode, cfg, old, new, adv, mask, stats.num_correct, stats.group_size, stats.success)
    return eps, grad, metrics


@pytest.mark.parametrize("loss_mode", ["gapo", "gapo_token"])
def test_failing_rollouts_with_positive_advantage_keep_eps_low(loss_mode):
    # rewards [0.3, 0, 0, -1]: c = 0 (nothing above 0.5), advantages [0.475, 0.175, 0.175, -0.825].
    # Three rollouts have A > 0 but none is a success: every bound is eps_low, all three are clipped.
    eps, grad, m = _bounds_and_grad([0.3, 0.0, 0.0, -1.0], 0.5, loss_mode)
    torch.testing.assert_close(eps, torch.full((4,), EPS_LOW))
    assert torch.all(grad[:3] == 0)
    assert m["gapo_sums/positive_rollouts"] == 0 and m["gapo_sums/eps_high_sum"] == 0
    assert all(m[f"gapo_sums/c{c}/tokens"] == 0 for c in range(1, 5))


def test_partial_credit_code_group_widens_only_the_full_pass():
    # fraction of tests passed [1.0, 0.6, 0.2, 0.0], a success = every test passed (threshold 0.99): c = 1.
    # advantages [0.55, 0.15, -0.25, -0.45]: the 0.6 rollout has A > 0 but failed, so it keeps eps_low.
    eps, grad, m = _bounds_and_grad([1.0, 0.6, 0.2, 0.0], 0.99)
    torch.testing.assert_close(eps, torch.tensor([EPS_MAX, EPS_LOW, EPS_LOW, EPS_LOW]))
    assert torch.all(grad[0] != 0) and torch.all(grad[1] == 0)
    assert m["gapo_sums/c1/rollouts"] == 1 and m["gapo_sums/c1/tokens"] == 3 and m["gapo_sums/c1/clipped"] == 0
    assert m["gapo_sums/positive_rollouts"] == 1 and m["gapo_sums/eps_high_sum"] == pytest.approx(EPS_MAX)
    # With a 0.5 threshold the 0.6 rollout is a success too: c = 2 of 4, both get 0.02 + 0.28 * 2 / 3.
    eps, _, _ = _bounds_and_grad([1.0, 0.6, 0.2, 0.0], 0.5)
    hi = EPS_LOW + (EPS_MAX - EPS_LOW) * 2 / 3
    torch.testing.assert_close(eps, torch.tensor([hi, hi, EPS_LOW, EPS_LOW]))


def test_format_penalty_group_and_a_success_with_negative_advantage():
    # Format penalty -0.5 on a malformed answer: rewards [1, 1, 0, -0.5], c = 2 of 4, A = [.625, .625, -.375, -.875].
    eps, grad, m = _bounds_and_grad([1.0, 1.0, 0.0, -0.5], 0.5)
    hi = EPS_LOW + (EPS_MAX - EPS_LOW) * 2 / 3
    torch.testing.assert_close(eps, torch.tensor([hi, hi, EPS_LOW, EPS_LOW]))
    assert torch.all(grad[:2] != 0)
    assert m["gapo_sums/c2/rollouts"] == 2 and m["gapo_sums/c2/tokens"] == 6
    # A success below its group's mean (rewards [0.6, 3, 0, 3], c = 3, A = [-1.05, 1.35, -1.65, 1.35]) keeps
    # eps_low; the two above it get eps_high(3, 4).
    eps, _, m = _bounds_and_grad([0.6, 3.0, 0.0, 3.0], 0.5)
    hi3 = EPS_LOW + (EPS_MAX - EPS_LOW) / 3
    torch.testing.assert_close(eps, torch.tensor([EPS_LOW, hi3, EPS_LOW, hi3]))
    assert m["gapo_sums/c3/rollouts"] == 2


# --- float32 numerics at R1's clips ---------------------------------------------------------------------------

@pytest.mark.parametrize("loss_mode", ["gapo", "gapo_token"])
def test_bf16_log_probs_at_r1_clips_clip_at_c_equal_k_and_not_at_c1(loss_mode):
    # R1-Distill's clips (7e-5, 3e-4). The log-probs are bf16 values whose difference is exact in bf16:
    # old = -2^-6, new = old + 3 * 2^-14, so the ratio is exp(1.831e-4) = 1 + 1.831e-4: inside c = 1's bound
    # (1 + 3e-4), outside c = k's (1 + 7e-5). In bf16 arithmetic the ratio would read 1 and nothing would clip.
    lo, hi = 7e-5, 3e-4
    old = torch.full((2, 4), -(2.0 ** -6), dtype=torch.bfloat16)
    new = old + torch.tensor(3 * 2.0 ** -14, dtype=torch.bfloat16)
    assert float((new.float() - old.float())[0, 0]) == pytest.approx(3 * 2.0 ** -14, rel=1e-6)
    adv = torch.tensor([[0.875] * 4, [0.01] * 4], dtype=torch.bfloat16)  # a c = 1 and a c = k = 8 success
    mask = torch.ones(2, 4)
    cfg = actor_config(loss_mode, lo=lo, hi=hi, rollout_n=8,
                       agg="token-mean" if loss_mode == "gapo_token" else "seq-mean-token-mean")
    loss, grad, m = call(loss_mode, cfg, old, new, adv, mask, [1, 8], [8, 8], [True, True])
    assert loss.dtype == torch.float32
    assert m["gapo_sums/c1/clipped"] == 0 and m["gapo_sums/c8/clipped"] == 4
    assert m["gapo_sums/c1/ratio_dev"] == pytest.approx(4 * 1.831e-4, rel=1e-3)
    assert torch.all(grad[0] != 0) and torch.all(grad[1] == 0)
    assert m["actor/pg_clipfrac"] == pytest.approx(0.5)


# --- diagnostics exact under verl's metric aggregation ---------------------------------------------------------

def test_diagnostic_sums_survive_verls_aggregation_with_unequal_micro_batch_counts():
    """verl 0.9.1's path for a loss callable's metrics: per micro-batch dicts (forward_backward_batch ->
    postprocess_batch_func: append_to_dict), per mini-batch aggregation (train_mini_batch: Metric.aggregate_dp
    over DP ranks), then the trainer's reduce_metrics over mini-batches. Mini-batch 1 has one micro-batch with
    10 of 100 tokens clipped; mini-batch 2 has four micro-batches with 0 of 100 each (dynamic batch sizes).
    The exact clip fraction is 10 / 500 = 0.02; averaging per-micro-batch sums as MEAN would report 0.05."""
    from verl.utils.metric import reduce_metrics
    from verl.utils.metric.utils import AggregationType, Metric
    from verl.utils.py_functional import append_to_dict

    from gapo.clip_diagnostics import diagnostics_from_sums

    def micro(clipped, tokens, aggregation):
        sums = {"gapo_sums/c1/clipped": clipped, "gapo_sums/c1/ratio_dev": 0.0, "gapo_sums/c1/tokens": tokens,
                "gapo_sums/c1/rollouts": 1.0, "gapo_sums/c1/advantage": tokens * 0.5, "gapo_sums/eps_high_sum": 0.3,
                "gapo_sums/positive_rollouts": 1.0}
        return Metric.from_dict(sums, aggregation=aggregation)

    def step(aggregation):
        per_mini = {}
        for micros in ([(10.0, 100.0)], [(0.0, 100.0)] * 4):
            collected = {}
            for clipped, tokens in micros:  # postprocess_batch_func
                append_to_dict(collected, micro(clipped, tokens, aggregation))
            # _postprocess_output all-gathers over DP (one rank here), train_mini_batch aggregates over ranks
            append_to_dict(per_mini, {key: Metric.aggregate_dp([val]) for key, val in collected.items()})
        return diagnostics_from_sums(reduce_metrics({f"actor/{k}": v for k, v in per_mini.items()}))

    assert step(AggregationType.MEAN)["gapo/clipfrac_pos/c1"] == pytest.approx(0.05)  # the bias
    assert step(AggregationType.SUM)["gapo/clipfrac_pos/c1"] == pytest.approx(0.02)


# Six rollouts of one step (k = 4) with partial-credit advantages, unequal lengths and their own sequence ratios.
# Successes with A > 0: rows 0, 1 (c = 1), 2 (c = 2), 4 (c = 3); row 3 is a failure with A > 0, row 5 has A < 0.
PACK_LENGTHS = [4, 2, 3, 1, 4, 2]
PACK_C = [1, 1, 2, 2, 3, 3]
PACK_SUCCESS = [True, True, True, False, True, False]
PACK_ADV = [0.9, 0.7, 0.4, 0.3, 0.2, -0.5]
PACK_RATIO = [1.3, 1.1, 1.2, 1.05, 1.02, 0.9]
# Token-weighted per c: mean A (c1: (0.9 * 4 + 0.7 * 2) / 6), mean |ratio - 1| (c1: (0.3 * 4 + 0.1 * 2) / 6)
PACK_ADV_POS = {1: 5 / 6, 2: 0.4, 3: 0.2}
PACK_DEV_POS = {1: 1.4 / 6, 2: 0.2, 3: 0.02}


def _pack_batch():
    t = max(PACK_LENGTHS)
    mask = torch.tensor([[1.0] * n + [0.0] * (t - n) for n in PACK_LENGTHS])
    old = torch.full((len(PACK_LENGTHS), t), -1.0)
    new = old + torch.log(torch.tensor(PACK_RATIO)).unsqueeze(-1)
    adv = torch.tensor(PACK_ADV).unsqueeze(-1).expand(-1, t).contiguous()  # padding too: the sums must mask it
    return old, new, adv, mask


def _step_through_verl(loss_mode, packing):
    """The loss on each micro-batch of `packing` (mini-batches of micro-batches of row indices), its sums through
    verl's aggregation (SUM Metrics summed per mini-batch, averaged over DP ranks and mini-batches), then the
    trainer's diagnostics_from_sums."""
    from verl.utils.metric import reduce_metrics
    from verl.utils.metric.utils import AggregationType, Metric
    from verl.utils.py_functional import append_to_dict

    from gapo.clip_diagnostics import diagnostics_from_sums

    old, new, adv, mask = _pack_batch()
    cfg = actor_config(loss_mode, agg="token-mean" if loss_mode == "gapo_token" else "seq-mean-token-mean")
    per_mini = {}
    for micros in packing:
        collected = {}
        for rows in micros:
            idx = torch.tensor(rows)
            _, _, m = call(loss_mode, cfg, old[idx], new[idx], adv[idx], mask[idx], torch.tensor(PACK_C)[idx],
                           torch.full((len(rows),), 4), torch.tensor(PACK_SUCCESS)[idx])
            sums = {k: v for k, v in m.items() if k.startswith(f"{SUMS_PREFIX}/")}
            append_to_dict(collected, Metric.from_dict(sums, aggregation=AggregationType.SUM))
        append_to_dict(per_mini, {key: Metric.aggregate_dp([val]) for key, val in collected.items()})
    return diagnostics_from_sums(reduce_metrics({f"actor/{k}": v for k, v in per_mini.items()}))


PACKINGS = {
    "one_micro_batch": [[[0, 1, 2, 3, 4, 5]]],
    "uneven_2_and_3": [[[0, 3], [1]], [[5], [2], [4]]],
    "reversed_halves": [[[5, 4, 3]], [[2, 1, 0]]],
}


@pytest.mark.parametrize("loss_mode", ["gapo", "gapo_token"])
def test_per_c_advantage_and_correlation_exact_under_any_packing(loss_mode):
    import statistics

    expected_r = statistics.correlation([PACK_DEV_POS[c] for c in (1, 2, 3)], [PACK_ADV_POS[c] for c in (1, 2, 3)])
    results = {name: _step_through_verl(loss_mode, packing) for name, packing in PACKINGS.items()}
    for name, out in results.items():
        for c in (1, 2, 3):
            assert out[f"gapo/adv_pos/c{c}"] == pytest.approx(PACK_ADV_POS[c], rel=1e-6), (name, c)
            assert out[f"gapo/ratio_dev_pos/c{c}"] == pytest.approx(PACK_DEV_POS[c], abs=1e-6), (name, c)
        assert "gapo/adv_pos/c4" not in out
        assert out["gapo/is_adv_corr_levels"] == 3
        assert out["gapo/is_adv_corr"] == pytest.approx(expected_r, abs=1e-5), name
    assert results["uneven_2_and_3"] == pytest.approx(results["one_micro_batch"], rel=1e-6)


def test_actor_loss_reports_sums_as_sum_metrics(monkeypatch):
    """GAPOActorLoss hands the loss's sums to verl as SUM-aggregated Metrics (what the tests above need)."""
    from verl.utils.metric.utils import AggregationType, Metric

    import gapo.verl_plugin.losses as losses

    seen = {}

    def fake_ppo_loss(config, model_output, data, dp_group=None):
        stats = losses._GROUP_STATS.get()
        seen["success"] = stats.success.tolist()
        stats.sums["gapo_sums/c1/tokens"] = 7.0
        return torch.tensor(0.0), {"actor/pg_clipfrac": Metric(AggregationType.MEAN, 0.5)}

    monkeypatch.setattr(losses, "ppo_loss", fake_ppo_loss)
    data = {losses.NUM_CORRECT_KEY: torch.tensor([1.0, 2.0]), losses.GROUP_SIZE_KEY: torch.tensor([4.0, 4.0]),
            losses.SUCCESS_KEY: torch.tensor([1.0, 0.0])}
    _, metrics = losses.GAPOActorLoss(actor_config("gapo"))({}, data)
    assert seen["success"] == [True, False]
    assert metrics["gapo_sums/c1/tokens"].aggregation == AggregationType.SUM
    assert metrics["gapo_sums/c1/tokens"].values == [7.0]
    with pytest.raises(RuntimeError, match="gapo_success"):
        losses.GAPOActorLoss(actor_config("gapo"))({}, {k: v for k, v in data.items() if k != losses.SUCCESS_KEY})


# --- cost: no host synchronisation beyond verl's gspo --------------------------------------------------------

_HOST_SYNCS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__float__,
               torch.Tensor.__int__, torch.Tensor.__index__, torch.Tensor.numpy}


class _CountHostSyncs(torch.overrides.TorchFunctionMode):
    """Records every tensor-to-python conversion (each one a device-to-host sync on a GPU)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _HOST_SYNCS:
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("loss_mode, diagnostics", [("gapo", True), ("gapo", False), ("gapo_token", True)])
def test_gapo_loss_syncs_with_the_host_no_more_than_verls_gspo(loss_mode, diagnostics):
    old, new, adv, mask = _random_batch(0)
    stats = (torch.tensor([1.0, 2, 3, 0, 4, 1]), torch.full((6,), 4.0), adv[:, 0] > 0)

    def count(mode, cfg):
        with group_stats_context(*stats), _CountHostSyncs() as counter:
            get_policy_loss_fn(mode)(old_log_prob=old, log_prob=new.clone().requires_grad_(True), advantages=adv,
                                     response_mask=mask.bool(), loss_agg_mode=cfg.loss_agg_mode, config=cfg,
                                     rollout_is_weights=None)
        return counter.calls

    gspo = count("gspo", actor_config("gspo"))
    ours = count(loss_mode, actor_config(loss_mode, diagnostics=diagnostics))
    assert len(gspo) == 3  # verl's three metric .item() calls: the premise
    assert len(ours) <= 1, ours  # every metric, diagnostics included, in one transfer

"""BAPO's bound walk (gapo.peers.bapo): hand-computed stops, agreement with a literal step-by-step walk as BAPO's code
runs it, one all-reduce shared by two real gloo ranks, and the settings it refuses."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gapo.peers.bapo import BAPOConfig, bapo_bounds, walk


def _literal_walk(ratio, adv, mask, cfg: BAPOConfig):
    """BAPO's code's loop, step by step: recompute both contributions at each bound until P / N >= rho / (1 - rho)."""
    def share_ok(low, high):
        eff = torch.where(adv >= 0, torch.minimum(ratio, torch.tensor(high)), torch.maximum(ratio, torch.tensor(low)))
        contrib = eff * adv * mask
        pos, neg = contrib.clamp(min=0).sum(), (-contrib.clamp(max=0)).sum()
        return bool(neg <= 0) or (pos / neg).item() >= cfg.bapo_rho / (1 - cfg.bapo_rho), pos, neg

    low, high = cfg.bapo_lower_start, cfg.bapo_upper_start
    ok, _, _ = share_ok(low, high)
    i = 0
    while not ok and low < cfg.bapo_lower_max:
        i += 1
        low = min(cfg.bapo_lower_start + i * cfg.bapo_lower_step, cfg.bapo_lower_max)
        ok, _, _ = share_ok(low, high)
    j = 0
    while not ok and high < cfg.bapo_upper_max:
        j += 1
        high = min(cfg.bapo_upper_start + j * cfg.bapo_upper_step, cfg.bapo_upper_max)
        ok, _, _ = share_ok(low, high)
    return low, high


def test_the_walk_of_one_bound_ends_at_its_maximum():
    assert walk(0.6, 0.9, 0.05) == pytest.approx([0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9])
    assert walk(1.2, 3.0, 0.05)[-1] == 3.0 and len(walk(1.2, 3.0, 0.05)) == 37
    assert walk(1.2, 1.3, 0.25) == [1.2, 1.3] and walk(0.7, 0.7, 0.05) == [0.7]


def test_both_bounds_move_hand_computed():
    # a success (A = 1.1) at ratio 2 and two failures (A = -1) at ratios 0.5 and 1:
    # P(h) = 1.1 min(2, h), N(l) = max(0.5, l) + 1. At (0.6, 1.2) the share is 1.32 / (1.32 + 1.6) < 1/2; raising
    # c_low only raises N (to 1.9 at 0.9), then c_high must reach 1.75 (P = 1.925 >= 1.9; at 1.7, P = 1.87 < 1.9)
    ratio = torch.tensor([[2.0, 0.5, 1.0]])
    adv = torch.tensor([[1.1, -1.0, -1.0]])
    low, high, share = bapo_bounds(ratio, adv, torch.ones(1, 3), BAPOConfig())
    assert (low.item(), high.item()) == pytest.approx((0.9, 1.75))
    assert share.item() == pytest.approx(1.925 / (1.925 + 1.9), rel=1e-6)
    assert _literal_walk(ratio, adv, torch.ones(1, 3), BAPOConfig()) == pytest.approx((0.9, 1.75))


def test_a_balanced_batch_keeps_the_start_and_padding_counts_nowhere():
    ratio = torch.tensor([[1.1, 0.9, 50.0]])
    adv = torch.tensor([[1.0, -1.0, -1.0]])  # the third token is padding: with it N would dwarf P
    low, high, share = bapo_bounds(ratio, adv, torch.tensor([[1.0, 1.0, 0.0]]), BAPOConfig())
    assert (low.item(), high.item()) == pytest.approx((0.6, 1.2))
    assert share.item() == pytest.approx(1.1 / (1.1 + 0.9), rel=1e-6)


def test_an_unreachable_share_ends_at_both_maxima():
    ratio, adv = torch.tensor([[1.0, 1.0]]), torch.tensor([[0.1, -5.0]])
    low, high, _ = bapo_bounds(ratio, adv, torch.ones(1, 2), BAPOConfig())
    assert (low.item(), high.item()) == pytest.approx((0.9, 3.0))


@pytest.mark.parametrize("seed", range(12))
def test_the_one_pass_walk_stops_where_the_literal_walk_stops(seed):
    g = torch.Generator().manual_seed(seed)
    b, t = 6, 9
    ratio = torch.exp(torch.randn(b, t, generator=g) * 0.6)
    adv = (torch.randn(b, 1, generator=g) + 0.3 * (seed % 3 - 1)).expand(b, t)
    mask = (torch.rand(b, t, generator=g) > 0.25).float()
    cfg = BAPOConfig(bapo_rho=(0.3, 0.5, 0.6)[seed % 3])
    low, high, _ = bapo_bounds(ratio, adv, mask, cfg)
    assert (low.item(), high.item()) == pytest.approx(_literal_walk(ratio, adv, mask, cfg), abs=1e-6)


@pytest.mark.parametrize("field, value", [("bapo_rho", 1.0), ("bapo_rho", 0.0), ("bapo_lower_max", 1.0),
                                          ("bapo_lower_start", 0.95), ("bapo_upper_start", 1.0),
                                          ("bapo_upper_max", 1.1), ("bapo_upper_step", 0.0), ("bapo_lower_step", -1)])
def test_a_setting_bapo_cannot_use_names_its_key(field, value):
    with pytest.raises(ValueError, match=rf"actor_rollout_ref\.actor\.policy_loss\..*{field}={value}"):
        BAPOConfig(**{field: value})


# ----------------------------------------------------------------------------------------- two ranks
def _ranks_batches():
    """Rank 0 holds mostly successes, rank 1 mostly failures: alone, rank 0 keeps the start (0.6, 1.2) and rank 1
    ends at the maxima (0.9, 3.0); together they stop at (0.9, 2.1)."""
    g = torch.Generator().manual_seed(7)
    ratio = torch.exp(torch.randn(2, 4, 8, generator=g) * 0.5)
    adv = torch.stack([torch.tensor([1.0, 1.0, 0.5, -0.4]), torch.tensor([-0.8, -0.7, -0.6, 0.2])])
    return ratio, adv[:, :, None].expand(2, 4, 8).contiguous()


def _rank_main(rank, port, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        from gapo.peers.bapo import torch_all_reduce

        ratio, adv = _ranks_batches()
        low, high, share = bapo_bounds(ratio[rank], adv[rank], torch.ones(4, 8), BAPOConfig(), torch_all_reduce())
        torch.save((low.item(), high.item(), share.item()), os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_two_ranks_all_reduce_their_sums_and_agree_on_the_whole_batchs_bounds(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank_main, args=(port, str(tmp_path)), nprocs=2, join=True)
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    ratio, adv = _ranks_batches()
    whole = bapo_bounds(ratio.reshape(8, 8), adv.reshape(8, 8), torch.ones(8, 8), BAPOConfig())
    alone = [bapo_bounds(ratio[r], adv[r], torch.ones(4, 8), BAPOConfig()) for r in (0, 1)]
    assert got[0] == got[1] == pytest.approx(tuple(x.item() for x in whole))
    literal = _literal_walk(ratio.reshape(8, 8), adv.reshape(8, 8), torch.ones(8, 8), BAPOConfig())
    assert got[0][:2] == pytest.approx((0.9, 2.1)) and literal == pytest.approx(got[0][:2])
    # the all-reduce matters: each rank alone would have stopped elsewhere
    assert all((a[0].item(), a[1].item()) != pytest.approx(got[0][:2]) for a in alone)


def test_the_walks_op_count_does_not_grow_with_its_length():
    # BAPO's code recomputes both sums (and, on several ranks, all-reduces them) at every step of the walk: ~40 passes
    # at its defaults. Here one pass serves any walk: a 10x finer step costs the same aten ops, fewer than the
    # literal walk on a batch that walks both bounds (to (0.9, 1.75), 17 steps)
    from recipe.bench.loss import count_aten_ops

    g = torch.Generator().manual_seed(3)
    ratio = torch.exp(torch.randn(16, 64, generator=g) * 0.3)
    adv = (torch.randn(16, 1, generator=g) + 0.16).expand(16, 64)
    mask = torch.ones(16, 64)
    low, high, _ = bapo_bounds(ratio, adv, mask, BAPOConfig())
    assert (low.item(), high.item()) == pytest.approx((0.9, 1.75))
    coarse = count_aten_ops(lambda: bapo_bounds(ratio, adv, mask, BAPOConfig()))
    fine = count_aten_ops(lambda: bapo_bounds(ratio, adv, mask, BAPOConfig(bapo_lower_step=0.005,
                                                                           bapo_upper_step=0.005)))
    literal = count_aten_ops(lambda: _literal_walk(ratio, adv, mask, BAPOConfig()))
    print(f"aten ops: one-pass walk {coarse} (finer step {fine}), literal walk {literal}")
    assert fine == coarse < literal / 3, (coarse, fine, literal)


# ----------------------------------------------------------------------------------------- the registered loss
def test_the_bapo_loss_clips_at_the_walks_bounds_hand_computed():
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config import FSDPActorConfig

    from gapo.verl_plugin.config import GAPOPolicyLossConfig
    from gapo.verl_plugin.losses import SUMS_PREFIX, group_stats_context

    # three rollouts of one token, the batch of test_both_bounds_move_hand_computed: bounds (0.9, 1.75)
    old = torch.zeros(3, 1)
    log_prob = torch.log(torch.tensor([[2.0], [0.5], [1.0]])).requires_grad_(True)
    adv = torch.tensor([[1.1], [-1.0], [-1.0]])
    config = FSDPActorConfig(strategy="fsdp2", rollout_n=3, ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2,
                             clip_ratio_low=7e-5, clip_ratio_high=3e-4, loss_agg_mode="token-mean",
                             policy_loss=GAPOPolicyLossConfig(loss_mode="bapo"))
    with group_stats_context(torch.tensor([1, 1, 1]), torch.tensor([3, 3, 3]),
                             torch.tensor([True, False, False])) as stats:
        loss, metrics = get_policy_loss_fn("bapo")(old_log_prob=old, log_prob=log_prob, advantages=adv,
                                                   response_mask=torch.ones(3, 1), loss_agg_mode="token-mean",
                                                   config=config, rollout_is_weights=None)
    loss.backward()
    # the success clipped at 1.75, the failure at ratio 0.5 clipped up to 0.9, the one at ratio 1 kept
    assert loss.item() == pytest.approx((-1.1 * 1.75 + 0.9 + 1.0) / 3, abs=1e-6)  # float32 sums of ~2
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.0], [0.0], [1.0 / 3]]))
    assert (metrics["actor/bapo_clip_low"], metrics["actor/bapo_clip_high"]) == pytest.approx((0.9, 1.75))
    assert metrics["actor/bapo_pos_share"] == pytest.approx(1.925 / (1.925 + 1.9), rel=1e-6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 3)
    assert stats.sums[f"{SUMS_PREFIX}/c1/clipped"] == 1 and stats.sums[f"{SUMS_PREFIX}/c1/rollouts"] == 1
    assert stats.sums[f"{SUMS_PREFIX}/eps_high_sum"] == pytest.approx(0.75, rel=1e-6)


def test_a_bapo_setting_in_the_yaml_is_validated_at_start():
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "configs"), version_base=None):
        cfg = compose("math/r1_1.5b_bapo", overrides=["actor_rollout_ref.actor.policy_loss.bapo_rho=1.5"])
    with pytest.raises(Exception, match=r"bapo_rho=1.5: the positive share to reach, in \(0, 1\)"):
        omega_conf_to_dataclass(cfg.actor_rollout_ref.actor.policy_loss)

"""GAPO's clip fraction per (group size k, success rate c / k) bucket (gapo.rate_buckets, the loss's second table,
the trainer's gapo/clipfrac_pos_kr/*), and the per-group weighting of gapo/groups/* (VIGOR's groups differ in size)."""

from types import SimpleNamespace

import pytest
import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn

from gapo.clip_diagnostics import diagnostics_from_sums
from gapo.rate_buckets import CLIPFRAC_KR, bucket_ids, bucket_label, k_bins, num_buckets
from gapo.verl_plugin.losses import SUMS_PREFIX, group_stats_context
from gapo.verl_plugin.trainer import GAPOTrainer

# (c, k) -> label, by hand: k buckets 1 | 2 | 3-4 | 5-8 | 9-16 | 17-32 | 33-64, rate buckets with upper edges included
CASES = [
    ((1, 1), "k1/rate0.75-1"), ((1, 2), "k2/rate0.25-0.5"), ((2, 2), "k2/rate0.75-1"),
    ((1, 4), "k3-4/rate0-0.25"), ((3, 4), "k3-4/rate0.5-0.75"), ((2, 3), "k3-4/rate0.5-0.75"),
    ((1, 5), "k5-8/rate0-0.25"), ((2, 8), "k5-8/rate0-0.25"), ((3, 8), "k5-8/rate0.25-0.5"),
    ((4, 8), "k5-8/rate0.25-0.5"), ((5, 8), "k5-8/rate0.5-0.75"), ((7, 8), "k5-8/rate0.75-1"),
    ((5, 11), "k9-16/rate0.25-0.5"), ((12, 16), "k9-16/rate0.5-0.75"), ((1, 17), "k17-32/rate0-0.25"),
    ((1, 47), "k33-64/rate0-0.25"), ((47, 47), "k33-64/rate0.75-1"),
]


def test_bucket_of_each_hand_computed_case():
    c = torch.tensor([cc for (cc, _), _ in CASES])
    k = torch.tensor([kk for (_, kk), _ in CASES])
    ids = bucket_ids(c, k, max_count=47)
    assert [bucket_label(int(i)) for i in ids] == [label for _, label in CASES]
    assert int(ids.max()) <= num_buckets(47) == 7 * 4


def test_rollouts_that_are_not_counted_get_bucket_zero():
    # c = 0 (no success), c > k, k above the table, k = 0
    ids = bucket_ids(torch.tensor([0, 5, 1, 1]), torch.tensor([4, 4, 9, 0]), max_count=8)
    assert ids.tolist() == [0, 0, 0, 0]


def test_table_sizes_and_bad_inputs():
    assert [k_bins(m) for m in (1, 2, 3, 4, 5, 8, 9, 47, 64, 65)] == [1, 2, 3, 3, 4, 4, 5, 7, 7, 8]
    with pytest.raises(ValueError, match="max_count=0"):
        k_bins(0)
    with pytest.raises(ValueError, match="bucket id 0"):
        bucket_label(0)


def test_loss_sums_per_bucket_equal_its_per_c_sums_regrouped():
    """Every rollout gets its own c, so the per-c table holds per-rollout sums; the buckets must be exactly those
    regrouped by (k, c / k) (a rollout in the wrong bucket, or counted twice, changes a clip fraction)."""
    from tests.test_gapo_loss import _random_batch, actor_config

    old, new, adv, mask = _random_batch(4, b=7, t=9)
    adv = adv.abs()  # every rollout a success with a positive advantage
    num_correct = torch.tensor([1.0, 2, 3, 5, 4, 7, 9])
    group_size = torch.tensor([2.0, 2, 16, 11, 12, 8, 40])
    cfg = actor_config("gapo_token", rollout_n=8)
    with group_stats_context(num_correct, group_size, num_correct > 0, max_count=40) as stats:
        get_policy_loss_fn("gapo_token")(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask.bool(),
                                         loss_agg_mode=cfg.loss_agg_mode, config=cfg, rollout_is_weights=None)
    sums = stats.sums
    per_rollout = {int(c): (sums[f"{SUMS_PREFIX}/c{int(c)}/clipped"], sums[f"{SUMS_PREFIX}/c{int(c)}/tokens"])
                   for c in num_correct}
    assert len({round(cl / tok, 6) for cl, tok in per_rollout.values()}) >= 4  # the rollouts' fractions differ
    expected: dict[str, list[float]] = {}
    for c, k in zip(num_correct.tolist(), group_size.tolist()):
        label = bucket_label(int(bucket_ids(torch.tensor([c]), torch.tensor([k]), 40)[0]))
        clipped, tokens = per_rollout[int(c)]
        expected.setdefault(label, [0.0, 0.0])
        expected[label][0] += clipped
        expected[label][1] += tokens
    # (1, 2) and (2, 2) are different rate buckets, (3, 16) and (5, 11) too; (5, 11) and (4, 12) share one;
    # (7, 8) and (9, 40) are other k buckets
    assert len(expected) == 6
    out = diagnostics_from_sums({f"actor/{k}": v for k, v in sums.items()})
    got = {key[len(CLIPFRAC_KR):]: v for key, v in out.items() if key.startswith(CLIPFRAC_KR)}
    assert got == pytest.approx({label: cl / tok for label, (cl, tok) in expected.items()})
    # every micro-batch reports every bucket (zeros elsewhere): verl aggregates key by key
    assert sum(key.startswith(f"{SUMS_PREFIX}/kr") for key in sums) == 2 * num_buckets(40)


def test_group_metrics_count_each_group_once_whatever_its_size():
    """Groups of 2 (0 right), 6 (3 right) and 8 (8 right) as VIGOR can give: per group, not per rollout."""
    trainer = GAPOTrainer.__new__(GAPOTrainer)
    trainer._gapo = SimpleNamespace(loss_mode="gspo")  # a baseline: no thresholds to log
    sizes, rights = [2, 6, 8], [0, 3, 8]
    num_correct = torch.tensor([c for c, k in zip(rights, sizes) for _ in range(k)])
    group_size = torch.tensor([k for k in sizes for _ in range(k)])
    real = torch.ones(18, dtype=torch.bool)
    real[16:] = False  # two of verl's padding rows: left out
    stats = SimpleNamespace(num_correct=torch.cat([num_correct, torch.tensor([0, 0])]),
                            group_size=torch.cat([group_size, torch.tensor([2, 2])]),
                            success=torch.zeros(18, dtype=torch.bool))
    out = trainer._group_metrics(stats, torch.zeros(18, dtype=torch.bool), real)
    assert out["gapo/groups/all_wrong_frac"] == pytest.approx(1 / 3)  # per rollout it would be 2/16
    assert out["gapo/groups/mixed_frac"] == pytest.approx(1 / 3)
    assert out["gapo/groups/all_correct_frac"] == pytest.approx(1 / 3)
    assert out["gapo/groups/success_rate_mean"] == pytest.approx((0 + 0.5 + 1) / 3)  # per rollout: 11/16
    assert out["gapo/groups/size_mean"] == pytest.approx(16 / 3)

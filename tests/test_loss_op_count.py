"""The GAPO loss's cost on a GPU, by a figure that does not depend on the machine: aten ops per forward + backward
call, counted as `make bench` counts them (`recipe.bench.loss.count_aten_ops`: torch.profiler, one thread, nested
ops included); and the diagnostic sums the cheaper loss reports, against a plain per-rollout recount.

On a GPU the loss is launch-bound (one kernel per op, microseconds of arithmetic each), so the op count is its cost
there. Counts on torch 2.13 (CPU), any shape (16 x 64 here, 64 x 4096 in `make bench`):

    variant                 before (a1f598e)     after
    verl gspo               248                  248
    gapo, diagnostics on    476 (1.92x)          268 (1.08x)
    gapo, diagnostics off   288 (1.16x)          227 (0.92x)
    gapo_token              517 (2.08x)          312 (1.26x)

Before, the per-c table and the (k, rate) table were two scatters, each behind a stack of five columns, casts and
masks, the bucket ids took ~50 small ops and a host-to-device copy, and verl's three metrics ~25 more. Now the
per-rollout columns are one concatenation, the tables one zeroed buffer with two index_add_, the bucket a lookup,
and the metrics' sums come in the same transfer.
"""

import math

import pytest
import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn

from gapo.clip_diagnostics import FIELDS, diagnostic_sums, named_sums, table_rows
from gapo.rate_buckets import bucket_ids, num_buckets
from gapo.surrogate import sequence_clipped_surrogate, token_clipped_surrogate
from gapo.threshold import rollout_eps_high
from gapo.verl_plugin.losses import SUMS_PREFIX, group_stats_context
from recipe.bench.loss import op_counts
from tests.test_gapo_loss import actor_config

MAX_OP_RATIO = 1.3  # the Makefile's `bench` target uses the same limit (--max-op-ratio-diag)


@pytest.fixture(scope="module")
def counts():
    return op_counts(batch=16, tokens=64)


def test_gapo_with_diagnostics_runs_at_most_1_3x_gspos_aten_ops(counts):
    # before the diagnostics were batched: 476 / 248 = 1.92x
    assert counts["gapo_diag"] <= MAX_OP_RATIO * counts["gspo"], counts


def test_gapo_without_diagnostics_and_gapo_token_are_cheap_too(counts):
    # before: 288 (1.16x gspo) and 517 (2.08x)
    assert counts["gapo_nodiag"] <= counts["gspo"], counts
    assert counts["gapo_token"] <= MAX_OP_RATIO * counts["gspo"], counts


def test_the_count_does_not_depend_on_the_shape_or_the_threads(counts):
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # count_aten_ops counts on one thread whatever the caller set
    try:
        assert op_counts(batch=64, tokens=2048) == counts
    finally:
        torch.set_num_threads(threads)


# --- the sums, against a plain recount -------------------------------------------------------------------------

def _case(seed, b=40, t=9, k_max=12):
    """Rollouts of every kind: groups of sizes 1..k_max (VIGOR-like), successes and failures with both signs of
    advantage, c = 0 successes, some with no real token, token ratios far apart so that both clips bind."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randint(1, k_max + 1, (b,), generator=g)
    c = (torch.rand(b, generator=g) * (k + 1)).floor().clamp(max=k)
    success = torch.rand(b, generator=g) < 0.7
    adv = torch.randn(b, 1, generator=g).expand(b, t).contiguous()
    mask = torch.arange(t) < torch.randint(0, t + 1, (b,), generator=g)[:, None]
    old = -torch.rand(b, t, generator=g) * 3
    new = old + torch.randn(b, 1, generator=g) * 0.3 + torch.randn(b, t, generator=g) * 0.3
    return old, new, adv, mask, c, k.float(), success


def _recount(terms, c, k, adaptive, eps_high, advantage_sum, max_count):
    """What `named_sums` must return, rollout by rollout in float64 (`gapo.clip_diagnostics` module docstring)."""
    sums = {"eps_high_sum": 0.0, "positive_rollouts": 0.0}
    sums.update({f"c{n}/{name}": 0.0 for n in range(1, max_count + 1)
                 for name in ("clipped", "ratio_dev", "tokens", "rollouts", "advantage")})
    sums.update({f"kr{n}/{name}": 0.0 for n in range(1, num_buckets(max_count) + 1) for name in ("clipped", "tokens")})
    for i in range(len(c)):
        if not adaptive[i]:
            continue
        sums["eps_high_sum"] += float(eps_high[i])
        sums["positive_rollouts"] += 1
        clipped, tokens = float(terms.clipped_tokens[i]), float(terms.tokens[i])
        if 1 <= int(c[i]) <= max_count:
            row = f"c{int(c[i])}/"
            sums[row + "clipped"] += clipped
            sums[row + "ratio_dev"] += float(terms.ratio_dev_sum[i])
            sums[row + "tokens"] += tokens
            sums[row + "rollouts"] += 1
            sums[row + "advantage"] += float(advantage_sum[i])
        bucket = int(bucket_ids(c[i:i + 1], k[i:i + 1], max_count)[0])
        if bucket:
            sums[f"kr{bucket}/clipped"] += clipped
            sums[f"kr{bucket}/tokens"] += tokens
    return sums


@pytest.mark.parametrize("max_count", [12, 8])  # 8: groups of 9..12 are beyond the table (not counted per c / k)
@pytest.mark.parametrize("loss_mode", ["gapo", "gapo_token"])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_reported_sum_equals_a_per_rollout_recount(seed, loss_mode, max_count):
    old, new, adv, mask, c, k, success = _case(seed)
    cfg = actor_config(loss_mode, rollout_n=max_count,
                       agg="token-mean" if loss_mode == "gapo_token" else "seq-mean-token-mean")
    with group_stats_context(c, k, success, max_count=max_count) as stats:
        _, metrics = get_policy_loss_fn(loss_mode)(old_log_prob=old, log_prob=new.clone().requires_grad_(True),
                                                   advantages=adv, response_mask=mask,
                                                   loss_agg_mode=cfg.loss_agg_mode, config=cfg, rollout_is_weights=None)
    # the per-rollout values as the loss computes them
    advantage_sum = (adv * mask).sum(-1)
    eps_high, adaptive = rollout_eps_high(c, k, success, advantage_sum > 0, 0.2, 0.28, "linear")
    surrogate = sequence_clipped_surrogate if loss_mode == "gapo" else token_clipped_surrogate
    terms = surrogate(new, old, adv, mask, 0.2, eps_high)
    assert 0 < int(adaptive.sum()) < len(c) and (terms.clipped_tokens[adaptive] > 0).any()  # the case is not trivial
    expected = _recount(terms, c, k, adaptive, eps_high, advantage_sum, max_count)
    got = {key[len(SUMS_PREFIX) + 1:]: value for key, value in stats.sums.items()}
    assert list(got) == list(expected)
    for key, value in expected.items():
        if key.endswith(("clipped", "tokens", "rollouts")):
            assert got[key] == value, key  # counts: exact
        else:
            assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key
    tokens = max(float(terms.tokens.sum()), 1.0)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(float(terms.clipped_tokens.sum()) / tokens, rel=1e-6)
    assert metrics["actor/ppo_kl"] == pytest.approx(-float(terms.log_ratio_sum.sum()) / tokens, rel=1e-6)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(float(terms.dual_clipped_tokens.sum()) / tokens,
                                                               rel=1e-6)


def test_a_nan_in_a_rollout_without_the_adaptive_bound_stays_out_of_the_sums():
    terms = sequence_clipped_surrogate(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2, 3), 0.2,
                                       0.28)
    terms = terms._replace(ratio_dev_sum=torch.tensor([0.0, math.nan]))
    flat = diagnostic_sums(terms, torch.tensor([1.0, 1.0]), torch.tensor([4.0, 4.0]), torch.tensor([True, False]),
                           torch.tensor([0.28, 0.2]), torch.tensor([3.0, 3.0]), 4)
    sums = named_sums(flat.tolist(), 4)
    assert sums["c1/ratio_dev"] == 0.0 and sums["c1/rollouts"] == 1.0 and sums["eps_high_sum"] == pytest.approx(0.28)


def test_named_sums_checks_the_layout():
    assert len(diagnostic_sums(*_unit_terms(), 4)) == len(FIELDS) * (2 + table_rows(4))
    with pytest.raises(ValueError, match="max_count=5"):
        named_sums(diagnostic_sums(*_unit_terms(), 4).tolist(), 5)


def _unit_terms():
    terms = sequence_clipped_surrogate(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), 0.2,
                                       0.28)
    return terms, torch.tensor([1.0]), torch.tensor([4.0]), torch.tensor([True]), torch.tensor([0.28]), torch.ones(1)

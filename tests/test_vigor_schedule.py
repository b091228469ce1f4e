"""VIGOR's allocation schedule (gapo/vigor.py): exact budget, variance order, tie-breaks, RNG state, starvation."""

import itertools
import json
import math

import numpy as np
import pytest

from gapo.vigor import (
    CONFIG_PREFIX,
    Allocation,
    VigorAllocator,
    VigorConfig,
    allocate,
    group_variance,
    kept_counts,
    plan_round,
    round_budgets,
)


class ScriptedSampler:
    """sample_fn for `allocate`: prompt p's rewards come from rewards_of(p, rng, count); logs every request."""

    def __init__(self, rewards_of, seed=0):
        self.rewards_of, self.rng, self.requests = rewards_of, np.random.default_rng(seed), []

    def __call__(self, counts):
        self.requests.append(dict(counts))
        return {p: self.rewards_of(p, self.rng, k) for p, k in counts.items()}


def bernoulli(rates, seed=0):
    """Binary rewards, prompt p succeeding with probability rates[p]."""
    return ScriptedSampler(lambda p, rng, k: list((rng.random(k) < rates[p]).astype(float)), seed)


def scripted(script):
    """Deterministic rewards: prompt p's rollouts get script[p]'s rewards in order."""
    served = {p: 0 for p in script}

    def rewards_of(p, rng, k):
        served[p] += k
        return script[p][served[p] - k : served[p]]

    return ScriptedSampler(rewards_of)


def first_round(rewards, cfg=VigorConfig(), seed=0, budget_left=None):
    """plan_round for round 1 on rewards already sampled (budget: n = 8 per prompt)."""
    left = (8 - len(rewards[0])) * len(rewards) if budget_left is None else budget_left
    return plan_round(rewards, range(len(rewards)), 1, left, cfg, np.random.default_rng(seed))


# --- the budget ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_prompts", [16, 64, 256])
def test_defaults_spend_n_per_prompt_in_equal_rounds_with_doubling_adds(num_prompts):
    """keep * growth = 1: each round spends 1.5 * P, a kept prompt's adds double (3, 6, 12, 24), mean size 8."""
    p = num_prompts
    assert round_budgets(p, 8, VigorConfig()) == [2 * p] + [3 * p // 2] * 4
    assert kept_counts(p, VigorConfig()) == [p // 2, p // 4, p // 8, p // 16]
    out = allocate(bernoulli(np.linspace(0.05, 0.95, p)), p, 8, VigorConfig(), 0)
    assert sum(out.group_sizes) == 8 * p and out.round_rollouts == round_budgets(p, 8, VigorConfig())
    # the four survivors of every round got 3, 6, 12 and 24 new rollouts: 2 + 3 + 6 + 12 + 24 = 47
    assert sorted(out.group_sizes, reverse=True)[: p // 16] == [47] * (p // 16)
    assert sorted(set(out.group_sizes)) == [2, 5, 11, 23, 47]


GRID = [
    (p, n, m0, rounds, keep, growth)
    for p, n, m0, rounds, keep, growth in itertools.product(
        [1, 2, 3, 7, 33], [2, 7, 8], [1, 2, 3], [1, 3, 4], [0.25, 0.3, 0.5, 1.0], [1.0, 1.5, 3.0]
    )
    if m0 <= n
]


def test_budget_is_spent_exactly_for_every_shape():
    """Uneven budgets (n = 7, keep = 0.3, P = 33), P = 1, m0 = n, one round, many rounds: always n * P, each prompt
    >= m0, each round's plan is the data-free `round_budgets`, and only kept prompts are sampled again."""
    for i, (p, n, m0, rounds, keep, growth) in enumerate(GRID):
        cfg = VigorConfig(m0=m0, rounds=rounds, keep=keep, growth=growth, tie_break=("random", "harder_first")[i % 2])
        sampler = bernoulli(np.random.default_rng(i).random(p), seed=i)
        out = allocate(sampler, p, n, cfg, i)
        case = f"P={p} n={n} m0={m0} T={rounds} keep={keep} growth={growth}"
        assert sum(out.group_sizes) == n * p and sum(out.round_rollouts) == n * p, case
        assert min(out.group_sizes) >= m0 and [len(r) for r in out.rewards] == out.group_sizes, case
        assert out.round_rollouts == round_budgets(p, n, cfg), case
        assert [len(k) for k in out.kept] == kept_counts(p, cfg)[: len(out.kept)], case
        assert len(out.kept) == (0 if m0 == n else rounds), case
        for kept, request in zip(out.kept, sampler.requests[1:]):
            assert set(request) <= set(kept) and min(request.values()) >= 1, case
        for earlier, later in zip(out.kept, out.kept[1:]):
            assert set(later) <= set(earlier), case


def test_m0_equal_to_n_is_uniform_sampling():
    out = allocate(bernoulli([0.5] * 5), 5, 4, VigorConfig(m0=4), 0)
    assert out.group_sizes == [4] * 5 and out.round_rollouts == [20] and out.kept == []


def test_a_round_never_overshoots_and_the_last_takes_the_rest():
    rewards = [[0.0, 1.0]] * 4 + [[1.0, 1.0]] * 4
    cfg = VigorConfig(rounds=1)
    last = first_round(rewards, cfg, budget_left=3)  # 3 rollouts for 4 kept prompts
    assert last.budget == 3 and sum(last.extra.values()) == 3 and len(last.extra) == 3 and len(last.kept) == 4
    assert first_round(rewards, cfg, budget_left=0).extra == {}
    early = first_round(rewards, VigorConfig(), budget_left=3)  # round 1 of 4: floor(3 * w_1 / sum w) = 0
    assert early.budget == 0 and early.extra == {}


def test_keep_is_read_as_the_decimal_it_prints_as():
    # 0.3 * 10 is 3.0000000000000004 in floats; its ceil would keep 4 of 10
    assert kept_counts(10, VigorConfig(keep=0.3, rounds=3)) == [3, 1, 1]
    assert kept_counts(1, VigorConfig(keep=0.25)) == [1, 1, 1, 1]


# --- the order ----------------------------------------------------------------------------------------------------

# Variances 0, .0025, .25, .04, .0225, .09: by variance 2 > 5 > 3 > 4 > 1 > 0. By mean ascending the top three would
# be {0, 3, 5}, descending {1, 4, 2}, by index {0, 1, 2}. Non-binary rewards: the variance is of the reward itself.
ORDERED = [[0.0, 0.0], [0.9, 1.0], [0.0, 1.0], [0.2, 0.6], [0.7, 1.0], [0.1, 0.7]]


@pytest.mark.parametrize("tie_break", ["random", "harder_first"])
def test_highest_variance_is_kept_first(tie_break):
    plan = first_round(ORDERED, VigorConfig(tie_break=tie_break))
    assert plan.kept == [2, 5, 3] and plan.ties_decided == 0
    assert plan.variances[3] == pytest.approx(0.04) and plan.variances[5] == pytest.approx(0.09)
    # 36 rollouts, weights 3, 2*2, 1*4, 1*8 -> b_1 = floor(36 * 3 / 19) = 5 over 3 kept: the highest variance gets 2
    assert plan.budget == 5 and plan.extra == {2: 2, 5: 2, 3: 1} and plan.remainder_ties == 0


def test_variance_is_of_all_rewards_merged_over_rounds():
    """Round 1 keeps 0 (var .25) and 1 (var .09) over 2 (var 0) and adds one rollout each. Merged, prompt 1 now has
    the higher variance (.56 vs .17) though its first round's was lower: round 2 keeps 1."""
    sampler = scripted({0: [0.0, 1.0, 0.5] + [0.0] * 30, 1: [0.2, 0.8, 2.0] + [0.0] * 30, 2: [1.0, 1.0]})
    out = allocate(sampler, 3, 8, VigorConfig(), 0)
    assert out.kept[0] == [0, 1] and sampler.requests[1] == {0: 1, 1: 1}
    assert group_variance(out.rewards[1][:3]) > group_variance(out.rewards[0][:3])
    assert out.kept[1] == [1] and out.ties_decided[:2] == [0, 0]
    assert out.round_rollouts == [6, 2, 2, 4, 10] and out.group_sizes == [3, 19, 2]


def test_equal_rewards_in_another_order_still_tie():
    """Float sums depend on order: these four groups' variances differ in the last bits, yet they are one tie."""
    rewards = [[0.6, 0.3, 0.0, 0.0], [0.3, 0.0, 0.6, 0.0], [0.0, 0.0, 0.6, 0.3], [0.0, 0.3, 0.0, 0.6]]
    assert len({group_variance(r) for r in rewards}) > 1
    assert first_round(rewards).ties_decided == 2


# --- ties ---------------------------------------------------------------------------------------------------------

UNIFORM = [[1.0, 1.0]] * 8 + [[0.0, 0.0]] * 8  # every variance 0: every selection is a tie


def test_random_tie_break_is_seeded():
    plans = {seed: first_round(UNIFORM, seed=seed) for seed in (0, 1)}
    assert first_round(UNIFORM, seed=0).kept == plans[0].kept
    assert set(plans[0].kept) != set(plans[1].kept)
    assert plans[0].ties_decided == plans[1].ties_decided == 8
    # both solved and unsolved prompts were drawn: random ignores the mean
    assert {UNIFORM[p][0] for p in plans[0].kept} == {0.0, 1.0}


def test_harder_first_keeps_lower_mean_among_ties_then_draws():
    plans = [first_round(UNIFORM, VigorConfig(tie_break="harder_first"), seed=s) for s in (0, 1)]
    for plan in plans:
        assert sorted(plan.kept) == list(range(8, 16)) and plan.ties_decided == 8
    assert plans[0].kept != plans[1].kept  # the unsolved prompts' order among themselves is the seeded draw
    # equal variance (3/16), different means: 1/4 is kept before 3/4; a higher variance still comes first
    rewards = [[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
    plan = first_round(rewards, VigorConfig(tie_break="harder_first", keep=0.5))
    assert plan.kept == [2, 1] and plan.ties_decided == 1
    kept_random = {tuple(first_round(rewards, seed=s).kept) for s in range(20)}
    assert kept_random == {(2, 1), (2, 0)}


def test_all_mixed_prompts_tie_only_when_their_variances_do():
    half = first_round([[0.0, 1.0]] * 6)
    assert len(half.kept) == 3 and half.ties_decided == 3
    distinct = first_round([[0.0, 1.0], [0.1, 0.9], [0.2, 0.8], [0.3, 0.7], [0.35, 0.65], [0.4, 0.6]])
    assert distinct.kept == [0, 1, 2] and distinct.ties_decided == 0


def test_remainder_goes_by_priority_and_its_ties_are_counted():
    rewards = [[0.0, 1.0], [0.3, 0.7], [0.4, 0.6], [0.0, 0.0]]
    plan = plan_round(rewards, [0, 1, 2, 3], 1, 8, VigorConfig(rounds=1, keep=0.75), np.random.default_rng(0))
    assert plan.kept == [0, 1, 2] and plan.extra == {0: 3, 1: 3, 2: 2} and plan.remainder_ties == 0
    tied = plan_round([[0.0, 1.0]] * 3, [0, 1, 2], 1, 4, VigorConfig(rounds=1, keep=1.0), np.random.default_rng(0))
    assert sorted(tied.extra.values()) == [1, 1, 2] and tied.ties_decided == 0 and tied.remainder_ties == 1


def test_batch_of_one_gets_the_whole_budget():
    out = allocate(bernoulli([0.5]), 1, 8, VigorConfig(), 0)
    assert out.group_sizes == [8] and out.kept == [[0]] * 4 and out.ties_decided == [0] * 4
    assert out.round_rollouts == round_budgets(1, 8, VigorConfig()) and sum(out.round_rollouts) == 8


# --- determinism and state ----------------------------------------------------------------------------------------


def test_allocation_is_deterministic_under_a_seed():
    def run(seed):
        return allocate(bernoulli([0.5] * 32, seed=7), 32, 8, VigorConfig(), seed)

    assert run(3) == run(3)
    assert run(3).kept != run(4).kept  # 32 coin-flip prompts at m0 = 2 tie a lot: the seed decides


def test_state_dict_round_trip_continues_the_stream():
    def batch(allocator):
        return allocator.allocate(bernoulli([0.5] * 16, seed=1), 16)

    original = VigorAllocator(VigorConfig(seed=5), 8)
    batch(original)
    saved = json.loads(json.dumps(original.state_dict()))
    expected = batch(original)
    resumed = VigorAllocator(VigorConfig(seed=99), 8)
    resumed.load_state_dict(saved)
    assert batch(resumed) == expected
    fresh = VigorAllocator(VigorConfig(seed=99), 8)
    assert batch(fresh).kept != expected.kept  # the loaded state, not the seed, decided


def test_load_state_dict_rejects_foreign_state():
    allocator = VigorAllocator(VigorConfig(), 8)
    with pytest.raises(ValueError, match="'rng'"):
        allocator.load_state_dict({"state": 1})
    with pytest.raises(ValueError, match="'MT19937'"):
        allocator.load_state_dict({"rng": np.random.Generator(np.random.MT19937(0)).bit_generator.state})


# --- bad input ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "knobs, n, needle",
    [
        ({"m0": 0}, 8, "m0=0"),
        ({"m0": 2.0}, 8, "m0=2.0"),
        ({"m0": 9}, 8, "m0=9 exceeds actor_rollout_ref.rollout.n=8"),
        ({"rounds": 0}, 8, "rounds=0"),
        ({"keep": 0.0}, 8, "keep=0.0"),
        ({"keep": 1.5}, 8, "keep=1.5"),
        ({"keep": float("nan")}, 8, "keep=nan"),
        ({"growth": 0.5}, 8, "growth=0.5"),
        ({"growth": float("inf")}, 8, "growth=inf"),
        ({"tie_break": "easier_first"}, 8, "tie_break='easier_first'"),
        ({"seed": -1}, 8, "seed=-1"),
        ({"enable": "yes"}, 8, "enable='yes'"),
        ({}, 0, "actor_rollout_ref.rollout.n=0"),
    ],
)
def test_bad_config_names_key_and_value(knobs, n, needle):
    with pytest.raises(ValueError) as err:
        VigorConfig(**knobs).validate(n)
    assert needle in str(err.value)
    if knobs:
        assert f"{CONFIG_PREFIX}.{next(iter(knobs))}" in str(err.value)


@pytest.mark.parametrize(
    "knobs, needle",
    [({"keep": 0}, "keep=0"), ({"m0": 0}, "m0=0"), ({"rounds": 1.5}, "rounds=1.5"), ({"growth": 0.5}, "growth=0.5"),
     ({"tie_break": "easy"}, "tie_break='easy'"), ({"seed": -1}, "seed=-1"), ({"enable": 1}, "enable=1")],
)
def test_a_bad_knob_raises_at_construction(knobs, needle):
    """No VigorConfig with a bad knob exists: construction checks every field, no validate() call needed."""
    with pytest.raises(ValueError, match=f"^{CONFIG_PREFIX}\\.{needle}") as err:
        VigorConfig(**knobs)
    assert f"{CONFIG_PREFIX}.{next(iter(knobs))}" in str(err.value)


def test_validate_rechecks_a_field_assigned_after_construction():
    cfg = VigorConfig()
    cfg.keep = 2.0
    with pytest.raises(ValueError, match=r"vigor\.keep=2\.0"):
        cfg.validate()


def test_bad_round_inputs_are_named():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="prompt 1 has rewards"):
        plan_round([[0.0, 1.0], []], [0, 1], 1, 4, VigorConfig(), rng)
    with pytest.raises(ValueError, match="prompt 0 has rewards"):
        plan_round([[0.0, float("nan")]], [0], 1, 4, VigorConfig(), rng)
    with pytest.raises(ValueError, match="active prompt 5"):
        plan_round([[0.0, 1.0]], [5], 1, 4, VigorConfig(), rng)
    with pytest.raises(ValueError, match="round_index=5"):
        plan_round([[0.0, 1.0]], [0], 5, 4, VigorConfig(), rng)
    with pytest.raises(ValueError, match="budget_left=-1"):
        plan_round([[0.0, 1.0]], [0], 1, -1, VigorConfig(), rng)
    short = ScriptedSampler(lambda p, rng, k: [1.0])
    with pytest.raises(ValueError, match="1 rewards for prompt 0, 2 were requested"):
        allocate(short, 2, 8, VigorConfig(), 0)


# --- starvation ---------------------------------------------------------------------------------------------------

TRIALS = 2000
HARD = 0.1  # the hard prompt's success rate


def dropped_after_round_one(others, tie_break):
    """Per trial: (was prompt 0, success rate HARD, dropped by round 1; its first m0 rewards; ties in round 1)."""
    rows = []
    for trial in range(TRIALS):
        coin = np.random.default_rng(10_000 + trial)

        def rewards_of(p, rng, k):
            return list((coin.random(k) < HARD).astype(float)) if p == 0 else [others[p - 1][i % 2] for i in range(k)]

        sampler = ScriptedSampler(rewards_of)
        out: Allocation = allocate(sampler, 1 + len(others), 8, VigorConfig(tie_break=tie_break), trial)
        rows.append((0 not in out.kept[0], out.rewards[0][: VigorConfig().m0], out.ties_decided[0]))
    return rows


def assert_rate(dropped, expected):
    sd = math.sqrt(expected * (1 - expected) / TRIALS)
    rate = float(np.mean(dropped))
    assert abs(rate - expected) <= 4 * max(sd, 1 / TRIALS), f"drop rate {rate:.4f}, expected {expected:.4f}"


def test_hard_prompt_among_mixed_ones_is_dropped_whenever_its_first_group_is_uniform():
    """The issue's starvation claim, from the schedule itself. Seven other prompts always show mixed rewards
    (0.5 -+ d, d = .05 .. .35: distinct variances d^2 in (0, .25)), so the 4 kept slots go to positive variances:
    prompt 0 (p = 0.1) is dropped exactly when its m0 = 2 rewards are equal, 0/2 (probability (1 - p)^2 = 0.81) or
    2/2 (p^2 = 0.01): 0.82 in all. harder_first changes nothing here: it orders equal variances only, and the hard
    prompt's 0 equals no mixed prompt's d^2 (at 1/2 its .25 beats them all); the decisions are identical trial by
    trial, and no selection is a tie."""
    m0 = VigorConfig().m0
    others = [[0.5 - d, 0.5 + d] for d in np.linspace(0.05, 0.35, 7)]
    rows = {tb: dropped_after_round_one(others, tb) for tb in ("random", "harder_first")}
    for dropped, first, ties in rows["random"]:
        assert dropped == (len(set(first)) == 1) and ties == 0
    assert [r[0] for r in rows["random"]] == [r[0] for r in rows["harder_first"]]
    all_fail = (1 - HARD) ** m0
    assert all_fail == pytest.approx(0.81)
    assert_rate([r[0] for r in rows["random"]], all_fail + HARD**m0)
    assert_rate([r[1] == [0.0] * m0 for r in rows["random"]], all_fail)


def test_harder_first_rescues_the_hard_prompt_only_from_solved_ones():
    """Four prompts, two kept: prompt 1 always mixed (.01), prompts 2 and 3 always solved (1, 1: variance 0, mean
    1). When prompt 0 shows 0/2 it ties at variance 0 with the two solved prompts for the last slot: "random" keeps
    it 1 time in 3, "harder_first" always (mean 0 < 1). At 2/2 (p^2) it is a solved prompt itself: 1 in 3 under both.
    So the drop rate is ((1 - p)^2 + p^2) * 2/3 = 0.547 under random and p^2 * 2/3 = 0.007 under harder_first, and
    exactly one selection per such round is counted as decided by the tie-break."""
    m0 = VigorConfig().m0
    others = [[0.4, 0.6], [1.0, 1.0], [1.0, 1.0]]
    tied_with, slots = 3, 1  # prompt 0 and the two solved prompts, for the one slot after prompt 1
    lose = 1 - slots / tied_with
    for tie_break, expected in [
        ("random", ((1 - HARD) ** m0 + HARD**m0) * lose),
        ("harder_first", HARD**m0 * lose),
    ]:
        rows = dropped_after_round_one(others, tie_break)
        assert_rate([r[0] for r in rows], expected)
        for dropped, first, ties in rows:
            assert ties == (1 if len(set(first)) == 1 else 0)
            if tie_break == "harder_first" and first == [0.0] * m0:
                assert not dropped

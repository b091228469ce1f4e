"""VIGOR's rollout allocation schedule (pure python/numpy): which prompts get more rollouts, round by round.

VIGOR (variance-guided online rollout allocation; Jiang, Liu, Mirzasoleiman, arXiv 2607.22002; no public code)
spends the rollout budget of uniform sampling, B = n * P for P prompts and n = rollout.n, but spends it on the
prompts whose rewards disagree. Every prompt first gets m0 rollouts. Then, in rounds t = 1..T, it keeps the
K_t active prompts with the highest variance of ALL the rewards each has so far (every round merged), gives each
kept prompt more rollouts, and the kept prompts become the next round's active set (all P before round 1):

    K_0 = P,  K_t = max(1, ceil(keep * K_{t-1}))                           prompts kept in round t
    w_t = K_t * growth ** (t - 1)                                           round t's weight
    L_1 = B - m0 * P,  L_{t+1} = L_t - b_t                                  budget left before round t
    b_t = floor(L_t * w_t / (w_t + w_{t+1} + ... + w_T)) for t < T,  b_T = L_T    rollouts of round t
    each kept prompt gets b_t // K_t new rollouts; the first b_t % K_t kept (in priority order) one more

So the new rollouts per kept prompt grow by `growth` from round to round (3, 6, 12, 24 with the defaults and
P = 64), and the total spent is m0 * P + b_1 + ... + b_T = B exactly for every P, n and config: the floors only
move rollouts to later rounds, the last round takes whatever is left, and b_t <= L_t, so no round overshoots
and nothing is left over. With the defaults (m0=2, T=4, keep=0.5, growth=2) keep * growth = 1: every round
spends 1.5 * P, and the mean group size is n = 8, exactly that of a uniform run.

Choices the paper's summaries leave open (each is also noted beside its knob in `VigorConfig`):
  * How much a round adds. The budget is split over the rounds in proportion to w_t, so the adds grow by
    `growth` and sum to B by construction. The literal alternatives, "round t adds m0 * growth ** (t - 1)" or
    "a kept prompt doubles its count", spend only m0 * P * (1 + sum_t (keep * growth) ** t / growth) = 6 * P of
    the defaults' 8 * P, and would hand a quarter of the budget to a leftover rule.
  * How many are kept: ceil, at least 1, so a batch of one keeps its prompt and never starves the budget;
    `keep` and `growth` are read as the decimals they print as (0.3 is 3/10), so ceil(0.3 * 10) is 3, not 4.
  * Variance: the population variance (ddof = 0) of the raw rewards, p(1 - p) for binary ones, with no prior.
    A group of one has variance 0 (not NaN), and the active prompts' sizes differ by at most one rollout per
    round (the remainder), so ddof = 1's k / (k - 1) correction would barely reorder them. Without a prior, a
    prompt that shows 0/m0 has variance 0 and is dropped behind every mixed prompt: with success rate p it
    happens with probability (1 - p) ** m0, 0.81 for p = 0.1 and m0 = 2 (VIGOR's starvation of hard prompts).
  * Ties: variances equal to 12 decimals tie. `tie_break` orders tied prompts ("random": a seeded uniform
    draw; "harder_first": lower mean reward first, then the draw). The draw is len(active) uniforms every
    round, whatever the rewards, so the random stream advances the same way for a batch of the same shape.
  * Counting ties: `RoundPlan.ties_decided` is the number of kept prompts whose keep/drop outcome the
    tie-break decided: the kept members of the variance-tie group that the keep cut splits (0 when the cut
    falls between two variances). A choice between a 0/2 and a 2/2 prompt under harder_first counts, since
    their variances (0) did not decide it. `remainder_ties` counts the same for the b_t % K_t extra rollouts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Callable, Mapping, NamedTuple, Optional, Sequence, Union

import numpy as np

# Where the knobs live in the trainer's config (a top-level group: configs/vigor/*.yaml, switched on by
# `vigor=enabled`); every error names the key under it.
CONFIG_PREFIX = "vigor"
ROLLOUT_N_KEY = "actor_rollout_ref.rollout.n"
TIE_BREAKS = ("random", "harder_first")
# Variances (and means, for harder_first) are compared after rounding to this many decimals, so that the same
# rewards in another order (float sums differ in the last bit) still tie.
TIE_DECIMALS = 12
# Population variance; see the module docstring.
VARIANCE_DDOF = 0

SampleFn = Callable[[Mapping[int, int]], Mapping[int, Sequence[float]]]


class FieldRule(NamedTuple):
    """One knob's check: `ok(value)` must hold, else ValueError(message.format(key=..., value=...))."""

    name: str
    ok: Callable[[object], bool]
    message: str


# VigorConfig's per-field rules, checked in this order at construction (and again by `validate`). `{key}` is
# the knob's full key (vigor.<name>), `{value}` its value; each message names the key, the value and the fix.
FIELD_RULES = (
    FieldRule("enable", lambda v: isinstance(v, bool), "{key}={value!r} must be true or false"),
    FieldRule(
        "m0",
        lambda v: _is_int(v) and v >= 1,
        "{key}={value!r}: the first round's rollouts per prompt must be an integer >= 1 "
        f"(2 is the smallest that shows a variance); set e.g. {CONFIG_PREFIX}.m0=2",
    ),
    FieldRule(
        "rounds",
        lambda v: _is_int(v) and v >= 1,
        "{key}={value!r} must be an integer >= 1 (the last round spends what is "
        f"left of the budget); set e.g. {CONFIG_PREFIX}.rounds=4, or {CONFIG_PREFIX}.enable=false",
    ),
    FieldRule(
        "keep",
        lambda v: _is_real(v) and 0 < v <= 1,
        "{key}={value!r}: the fraction of active prompts kept per round must lie in "
        f"(0, 1]; set e.g. {CONFIG_PREFIX}.keep=0.5",
    ),
    FieldRule(
        "growth",
        lambda v: _is_real(v) and v >= 1,
        "{key}={value!r}: the per-round growth of a kept prompt's new rollouts "
        f"must be a finite number >= 1 (1 = equal adds); set e.g. {CONFIG_PREFIX}.growth=2",
    ),
    FieldRule(
        "tie_break",
        lambda v: v in TIE_BREAKS,
        f"{{key}}={{value!r}} is not a tie-break; choose one of {', '.join(TIE_BREAKS)}",
    ),
    FieldRule("seed", lambda v: _is_int(v) and v >= 0, "{key}={value!r} must be an integer >= 0 (numpy seeds are)"),
)


@dataclass
class VigorConfig:
    """VIGOR's knobs; in the trainer they live under the top-level `vigor` key (CONFIG_PREFIX, configs/vigor/).

    A config validates itself: construction checks every knob against FIELD_RULES and raises ValueError naming
    the first bad key, its value and the fix. `validate(n)` checks them again (a field may have been assigned
    since) and, given rollout.n, that m0 <= n.

    Attributes:
        enable: allocate rollouts with VIGOR; False samples n per prompt uniformly (nothing here runs).
        m0: rollouts every prompt gets first, in [1, rollout.n]. m0 = n leaves no budget for the rounds:
            VIGOR is then uniform sampling.
        rounds: T >= 1, the rounds after the first; the last takes all the budget left (never leftover).
        keep: fraction of the active prompts kept per round, in (0, 1]; kept count ceil(keep * active), >= 1.
        growth: >= 1, the ratio of a kept prompt's new rollouts in round t + 1 to round t. The paper's
            summaries give "grows by 2x" but not the base: the base is whatever makes the rounds spend the
            budget exactly (see the module docstring), not m0.
        tie_break: how prompts of equal variance are ordered: "random" (seeded) or "harder_first" (lower mean
            reward first, then random). The summaries do not say; "random" is the neutral default.
        seed: seed of the allocator's numpy Generator (its state is checkpointed with `state_dict`).
    """

    enable: bool = False
    m0: int = 2
    rounds: int = 4
    keep: float = 0.5
    growth: float = 2.0
    tie_break: str = "random"
    seed: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, n: Optional[int] = None) -> None:
        """Raise ValueError naming the bad key, its value and the fix; `n` is rollout.n (m0 <= n is checked
        only when it is given)."""
        for rule in FIELD_RULES:
            value = getattr(self, rule.name)
            if not rule.ok(value):
                raise ValueError(rule.message.format(key=f"{CONFIG_PREFIX}.{rule.name}", value=value))
        if n is not None:
            if not _is_int(n) or n < 1:
                raise ValueError(f"{ROLLOUT_N_KEY}={n!r} must be an integer >= 1")
            if self.m0 > n:
                raise ValueError(
                    f"{CONFIG_PREFIX}.m0={self.m0} exceeds {ROLLOUT_N_KEY}={n}: the first round alone would spend "
                    f"more than the budget of n rollouts per prompt; lower {CONFIG_PREFIX}.m0 or raise rollout.n"
                )


@dataclass(frozen=True)
class RoundPlan:
    """One round's decision.

    Attributes:
        round_index: t, 1-based.
        budget: b_t, the new rollouts of this round, == sum(extra.values()).
        kept: the K_t kept prompts, in priority order (highest variance first); the next round's active set.
        extra: prompt -> new rollouts this round, kept prompts with at least one only.
        ties_decided: kept prompts whose keep/drop outcome the tie-break decided (module docstring).
        remainder_ties: of the budget % K_t prompts given one extra rollout, those the tie-break picked.
        variances: prompt -> the variance it was ranked by, every active prompt.
    """

    round_index: int
    budget: int
    kept: list[int]
    extra: dict[int, int]
    ties_decided: int
    remainder_ties: int
    variances: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Allocation:
    """What `allocate` did to one batch.

    Attributes:
        group_sizes: (P,) final rollouts per prompt; sum == n * P.
        rewards: (P,) each prompt's rewards, in sampling order (round 0 first).
        round_rollouts: rollouts per round, index 0 the first (m0 * P); sum == n * P.
        kept: each round's kept prompts, in priority order.
        ties_decided: per round t = 1..T, `RoundPlan.ties_decided`.
        remainder_ties: per round t = 1..T, `RoundPlan.remainder_ties`.
    """

    group_sizes: list[int]
    rewards: list[list[float]]
    round_rollouts: list[int]
    kept: list[list[int]]
    ties_decided: list[int]
    remainder_ties: list[int]


def kept_counts(num_active: int, cfg: VigorConfig, first_round: int = 1) -> list[int]:
    """K_t for rounds t = first_round..T, starting from `num_active` prompts active before `first_round`."""
    keep = Fraction(repr(float(cfg.keep)))  # the decimal it prints as: ceil(0.3 * 10) = 3, not 4
    counts, active = [], num_active
    for _ in range(first_round, cfg.rounds + 1):
        active = max(1, math.ceil(keep * active))
        counts.append(active)
    return counts


def round_budget(num_active: int, round_index: int, budget_left: int, cfg: VigorConfig) -> int:
    """b_t: the new rollouts of round t = `round_index` with `num_active` prompts active and `budget_left` left.

    Exact rational arithmetic (Fraction), so the floor never depends on float rounding.
    """
    if round_index == cfg.rounds:
        return budget_left
    growth = Fraction(repr(float(cfg.growth)))
    weights = [k * growth ** (t - 1) for t, k in enumerate(kept_counts(num_active, cfg, round_index), round_index)]
    return math.floor(budget_left * weights[0] / sum(weights))


def round_budgets(num_prompts: int, n: int, cfg: VigorConfig) -> list[int]:
    """The whole schedule's rollouts per round, index 0 the first round (m0 * P); it depends on P, n and the
    config only, and sums to n * P."""
    cfg.validate(n)
    _check_count("num_prompts", num_prompts)
    budgets, left = [cfg.m0 * num_prompts], (n - cfg.m0) * num_prompts
    active = num_prompts
    for t in range(1, cfg.rounds + 1):
        if left == 0:
            break
        b = round_budget(active, t, left, cfg)
        budgets.append(b)
        left -= b
        active = kept_counts(active, cfg, t)[0]
    return budgets


def group_variance(rewards: Sequence[float]) -> float:
    """Population variance (ddof = 0) of one prompt's rewards; 0.0 for a single reward."""
    return float(np.var(np.asarray(rewards, dtype=np.float64), ddof=VARIANCE_DDOF))


def plan_round(
    rewards_so_far: Sequence[Sequence[float]],
    active: Sequence[int],
    round_index: int,
    budget_left: int,
    cfg: VigorConfig,
    rng: np.random.Generator,
) -> RoundPlan:
    """Decide round t: keep the highest-variance active prompts and split b_t over them.

    Args:
        rewards_so_far: per prompt (indexed by prompt id), ALL its rewards so far, every round merged; only
            the active prompts' are read, and each must have at least one finite reward.
        active: the prompts active before this round (all of them before round 1, the previous `kept` after).
        round_index: t in 1..cfg.rounds.
        budget_left: rollouts not yet spent, n * P minus everything sampled so far (>= 0).
        cfg: the schedule; rng: draws len(active) uniforms for the tie-break, whatever the rewards.

    Returns:
        RoundPlan; sum(extra.values()) == budget <= budget_left, and == budget_left in the last round.
    """
    cfg.validate()
    active = list(active)
    if not active:
        raise ValueError("plan_round got no active prompts; round 1's active set is every prompt of the batch")
    if len(set(active)) != len(active):
        raise ValueError(f"active prompts repeat: {active}")
    if not _is_int(round_index) or not 1 <= round_index <= cfg.rounds:
        raise ValueError(f"round_index={round_index!r} must lie in 1..{CONFIG_PREFIX}.rounds={cfg.rounds}")
    _check_count("budget_left", budget_left, minimum=0)

    variances, means = {}, {}
    for p in active:
        if not _is_int(p) or not 0 <= p < len(rewards_so_far):
            raise ValueError(f"active prompt {p!r} is not an index into rewards_so_far ({len(rewards_so_far)})")
        r = np.asarray(rewards_so_far[p], dtype=np.float64)
        if r.size == 0 or not np.isfinite(r).all():
            raise ValueError(f"prompt {p} has rewards {list(rewards_so_far[p])!r}: need at least one, all finite")
        variances[p], means[p] = group_variance(r), float(r.mean())

    # Priority: higher variance first; ties by the configured rule. One draw per active prompt, always, so the
    # stream's position after a round depends on the batch's shape only (a resumed run replays it exactly).
    draw = rng.random(len(active))
    tie_var = {p: round(variances[p], TIE_DECIMALS) for p in active}
    if cfg.tie_break == "harder_first":
        key = {p: (-tie_var[p], round(means[p], TIE_DECIMALS), draw[i]) for i, p in enumerate(active)}
    else:
        key = {p: (-tie_var[p], draw[i]) for i, p in enumerate(active)}
    order = sorted(active, key=key.__getitem__)

    num_kept = kept_counts(len(active), cfg, round_index)[0]
    kept = order[:num_kept]
    budget = round_budget(len(active), round_index, budget_left, cfg)
    base, remainder = divmod(budget, num_kept)
    extra = {p: base + (i < remainder) for i, p in enumerate(kept) if base + (i < remainder) > 0}
    ranked = [tie_var[p] for p in order]
    return RoundPlan(
        round_index=round_index,
        budget=budget,
        kept=kept,
        extra=extra,
        ties_decided=_split_ties(ranked, num_kept),
        remainder_ties=_split_ties(ranked[:num_kept], remainder),
        variances=variances,
    )


def allocate(
    sample_fn: SampleFn, num_prompts: int, n: int, cfg: VigorConfig, rng: Union[np.random.Generator, int]
) -> Allocation:
    """Run the whole schedule on one batch.

    Args:
        sample_fn: {prompt: count} -> {prompt: `count` new rewards}, for the requested prompts (counts >= 1).
        num_prompts: P >= 1; n: rollout.n >= cfg.m0; the budget is n * P.
        rng: the tie-break's Generator (advanced in place), or an int seed for a fresh one.
    """
    cfg.validate(n)
    _check_count("num_prompts", num_prompts)
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(rng)
    rewards: list[list[float]] = [[] for _ in range(num_prompts)]
    _sample_into(rewards, sample_fn, {p: cfg.m0 for p in range(num_prompts)})
    round_rollouts, kept, ties, remainder_ties = [cfg.m0 * num_prompts], [], [], []
    active, left = list(range(num_prompts)), (n - cfg.m0) * num_prompts
    for t in range(1, cfg.rounds + 1):
        if left == 0:  # only when m0 == n: the last round always spends the rest, so none is left before it
            break
        plan = plan_round(rewards, active, t, left, cfg, rng)
        if plan.extra:
            _sample_into(rewards, sample_fn, plan.extra)
        left -= plan.budget
        active = plan.kept
        round_rollouts.append(plan.budget)
        kept.append(plan.kept)
        ties.append(plan.ties_decided)
        remainder_ties.append(plan.remainder_ties)
    assert left == 0 and sum(round_rollouts) == n * num_prompts, "VIGOR schedule spent a different budget"
    return Allocation(
        group_sizes=[len(r) for r in rewards],
        rewards=rewards,
        round_rollouts=round_rollouts,
        kept=kept,
        ties_decided=ties,
        remainder_ties=remainder_ties,
    )


class VigorAllocator:
    """The schedule with its random state, for a trainer that must checkpoint and resume it.

    `state_dict()` is JSON-serialisable (numpy's bit-generator state: a dict of str and int); loading it into
    an allocator continues the same tie-break stream.
    """

    def __init__(self, cfg: VigorConfig, n: int):
        """Validate ``cfg`` against rollout.n = ``n`` and seed the tie-break generator with ``cfg.seed``."""
        cfg.validate(n)
        self.cfg, self.n = cfg, n
        self.rng = np.random.default_rng(cfg.seed)

    def plan_round(
        self, rewards_so_far: Sequence[Sequence[float]], active: Sequence[int], round_index: int, budget_left: int
    ) -> RoundPlan:
        """`plan_round` with this allocator's config and random state (advances it)."""
        return plan_round(rewards_so_far, active, round_index, budget_left, self.cfg, self.rng)

    def allocate(self, sample_fn: SampleFn, num_prompts: int) -> Allocation:
        """`allocate` (the whole schedule on one batch) with this allocator's n, config and random state."""
        return allocate(sample_fn, num_prompts, self.n, self.cfg, self.rng)

    def state_dict(self) -> dict:
        """The tie-break generator's state (JSON-serialisable), with the config and n for reference."""
        return {"rng": self.rng.bit_generator.state, "config": asdict(self.cfg), "n": self.n}

    def load_state_dict(self, state: Mapping) -> None:
        """Continue the stream saved by `state_dict`. The config is this allocator's own (a resumed run may
        change its knobs on purpose); only the bit generator must match."""
        if not isinstance(state, Mapping) or not isinstance(state.get("rng"), Mapping):
            raise ValueError("VIGOR state has no 'rng' entry; pass what VigorAllocator.state_dict() returned")
        saved = state["rng"].get("bit_generator")
        ours = type(self.rng.bit_generator).__name__
        if saved != ours:
            raise ValueError(f"VIGOR state holds a {saved!r} bit generator, this allocator uses {ours!r}")
        self.rng.bit_generator.state = dict(state["rng"])


def _split_ties(ranked: Sequence[float], cut: int) -> int:
    """Of the first `cut` entries of a sorted key list, how many share their key with an entry past the cut."""
    if cut <= 0 or cut >= len(ranked) or ranked[cut - 1] != ranked[cut]:
        return 0
    return sum(1 for v in ranked[:cut] if v == ranked[cut - 1])


def _sample_into(rewards: list[list[float]], sample_fn: SampleFn, counts: Mapping[int, int]) -> None:
    got = sample_fn(dict(counts))
    for p, count in counts.items():
        new = list(got.get(p, ()))
        if len(new) != count:
            raise ValueError(f"sample_fn returned {len(new)} rewards for prompt {p}, {count} were requested")
        rewards[p].extend(float(r) for r in new)


def _check_count(name: str, value, minimum: int = 1) -> None:
    if not _is_int(value) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_real(value) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return False
    return math.isfinite(value)

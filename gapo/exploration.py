"""Exploration instruments of a training step (pure torch/python): entropy, entrance diversity, live coverage.

Shared by verl's trainer (`gapo.verl_plugin.trainer`, on the driver, from the step's TransferQueue fields) and the
TRL trainer (`gapo.integrations.trl`), so both log the same numbers for the same rollouts. Every value is a ratio of
sums (`entropy_sums` and `rollout_sums` -> `exploration_metrics`), so sums from micro-batches, processes and
generation batches add key by key and the ratio stays exact over whatever they cover. A row is one rollout; `include` leaves out verl's
padding rows (no entrance, no entropy, no prompt). Groups are the rollouts of one prompt (uid).

    gapo/explore/entropy_success          sum of per-token entropy / tokens, over the successes' real tokens
    gapo/explore/entropy_failure          the same over the failures (every real row that is not a success)
    gapo/explore/entropy_success/c{c}     the same over the successes whose group had c successes
    gapo/explore/entrance_distinct        mean over groups of (distinct first moves / group size)  (`gapo.entrance`)
    gapo/explore/entrance_distinct/c{c}   the same over the groups with c successes (c = 0 .. k)
    gapo/explore/entrance_unique_success  mean over groups with c >= 1 of (successes whose first move no other
                                          member took / c)
    gapo/explore/entrance_unique_success/c{c}   the same per c
    gapo/explore/coverage_frac            share of the step's prompts with solve rate c / k above the threshold
    gapo/explore/coverage_window          distinct prompts above the threshold at least once in the latest W steps
    gapo/explore/coverage_window_seen     distinct prompts seen in those steps (the count's denominator)
    gapo/explore/coverage_window_frac     coverage_window / coverage_window_seen
    gapo/explore/coverage_window_steps    steps the window holds (W once W steps have run)

Entropy is the policy's per-token entropy H_t = -sum_v p(v) log p(v) of the sampled positions' next-token
distribution, as the trainer already has it: verl's old-log-prob pass (the policy before this step's update),
TRL's loss forward pass. No instrument adds a forward pass or an op to the loss.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from gapo.entrance import DEFAULT_ENTRANCE_TOKENS, Move, first_move, group_entrances, newline_token_ids  # noqa: F401
from gapo.passk import DEFAULT_COVERAGE_THRESHOLD

PREFIX = "gapo/explore/"
ENTROPY_SUCCESS = PREFIX + "entropy_success"
ENTROPY_FAILURE = PREFIX + "entropy_failure"
ENTRANCE_DISTINCT = PREFIX + "entrance_distinct"
ENTRANCE_UNIQUE_SUCCESS = PREFIX + "entrance_unique_success"
COVERAGE_FRAC = PREFIX + "coverage_frac"
COVERAGE_WINDOW = PREFIX + "coverage_window"
COVERAGE_WINDOW_SEEN = PREFIX + "coverage_window_seen"
COVERAGE_WINDOW_FRAC = PREFIX + "coverage_window_frac"
COVERAGE_WINDOW_STEPS = PREFIX + "coverage_window_steps"
PER_C = "/c"  # per success count c: f"{ENTROPY_SUCCESS}{PER_C}{c}", ...

# W's default: 20 steps of the paper's 256 prompts are 5,120 prompts, an eighth of DeepScaleR's 40k: a window that
# holds enough prompts for a stable count and still follows training (docs/metrics.md).
DEFAULT_COVERAGE_WINDOW = 20


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class ExplorationConfig:
    """The exploration instruments' knobs (the single source of their defaults). In verl they live under the
    top-level `exploration` key (configs/base/gapo.yaml); in TRL under `GAPOTRLConfig.exploration`.

    Attributes:
        entrance_tokens: m, a first move's length in response tokens (an integer >= 1; `gapo.entrance`).
        entrance_until_newline: a first move ends at the first token whose text holds a newline (at most m tokens).
        coverage_window: W, the steps (TRL: generation batches) whose prompts `coverage_window` pools (>= 1).
        coverage_threshold: a prompt is covered when its solve rate c / k is above this, in [0, 1). verl's config
            takes it from `trainer.val_coverage_threshold` (validation's), default 0.05.

    Validated at construction: ValueError naming the key (`exploration.<name>`), the bad value and the fix.
    """

    entrance_tokens: int = DEFAULT_ENTRANCE_TOKENS
    entrance_until_newline: bool = False
    coverage_window: int = DEFAULT_COVERAGE_WINDOW
    coverage_threshold: float = DEFAULT_COVERAGE_THRESHOLD

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise ValueError for the first bad knob, naming `exploration.<name>`, its value and the fix."""
        prefix = "exploration"
        m = self.entrance_tokens
        if not _is_int(m) or m < 1:
            raise ValueError(f"{prefix}.entrance_tokens={m!r}: a first move's length in response tokens must be an "
                             f"integer >= 1; set e.g. {prefix}.entrance_tokens={DEFAULT_ENTRANCE_TOKENS}")
        if not isinstance(self.entrance_until_newline, bool):
            raise ValueError(f"{prefix}.entrance_until_newline={self.entrance_until_newline!r} must be true or false")
        w = self.coverage_window
        if not _is_int(w) or w < 1:
            raise ValueError(f"{prefix}.coverage_window={w!r}: the number of latest steps whose covered prompts are "
                             f"pooled must be an integer >= 1; set e.g. {prefix}.coverage_window="
                             f"{DEFAULT_COVERAGE_WINDOW} (1 counts each step alone)")
        t = self.coverage_threshold
        ok = isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and 0 <= t < 1
        if not ok:
            raise ValueError(f"{prefix}.coverage_threshold={t!r}: a solve rate in [0, 1) above which a prompt counts "
                             f"as covered; set e.g. {prefix}.coverage_threshold={DEFAULT_COVERAGE_THRESHOLD} "
                             "(the paper's 5%)")


def prompt_key(prompt) -> int:
    """A stable 63-bit key of a prompt (its token ids or its text), the same in every process and run
    (Python's `hash` of a str is salted per process)."""
    if isinstance(prompt, str):
        data = prompt.encode("utf-8", "surrogatepass")
    else:  # the ids as little-endian int64 bytes, whatever container holds them
        ids = prompt.detach().to("cpu", torch.int64) if isinstance(prompt, torch.Tensor) else \
            torch.tensor([int(t) for t in prompt], dtype=torch.int64)
        data = b"ids:" + ids.contiguous().numpy().astype("<i8").tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def leading_tokens(responses: torch.Tensor, m: int, lengths: torch.Tensor | None = None):
    """The first m token ids of every response, and each response's length.

    Args:
        responses: a jagged nested (B, *) tensor of real response tokens (TransferQueue's `responses`), or a padded
            (B, T) tensor whose real tokens are the first `lengths[i]` of row i.
        m: tokens to keep (>= 1).
        lengths: (B,) real lengths of a padded `responses`; ignored for a nested one.

    Returns:
        ((B, m) int64 ids, -1 past a row's length; (B,) int64 lengths). Touches B * m values, not the whole batch.
    """
    if responses.is_nested:
        values, offsets = responses.values(), responses.offsets()
        lengths = offsets.diff()
        starts = offsets[:-1]
        steps = torch.arange(m, device=values.device)
        valid = steps < lengths.unsqueeze(-1)
        index = (starts.unsqueeze(-1) + steps).clamp(max=max(values.numel() - 1, 0))
        lead = values[index] if values.numel() else torch.zeros(index.shape, dtype=torch.long)
    else:
        if lengths is None:
            raise ValueError("a padded responses tensor needs its (B,) lengths")
        lead = responses[:, :m]
        if lead.shape[1] < m:
            lead = torch.nn.functional.pad(lead, (0, m - lead.shape[1]))
        valid = torch.arange(m, device=lead.device) < lengths.to(lead.device).unsqueeze(-1)
    lead = torch.where(valid, lead.long(), torch.full_like(lead, -1, dtype=torch.long))
    return lead, lengths.long()


def first_moves(lead: torch.Tensor, newline_ids=None) -> list[Move]:
    """Each row's first move (`gapo.entrance.first_move`) from `leading_tokens`' (B, m) ids (-1 past the end)."""
    m = lead.shape[-1]
    cut = (lead >= 0).sum(-1)  # the -1s are a row's tail
    if newline_ids is not None and m:
        ids = torch.tensor(sorted(newline_ids), dtype=lead.dtype, device=lead.device)
        hit = torch.isin(lead, ids)
        first = torch.where(hit.any(-1), hit.float().argmax(-1) + 1, torch.full_like(cut, m))
        cut = torch.minimum(cut, first)  # = first_move(row, m, newline_ids), in torch
    return [tuple(row[:n]) for row, n in zip(lead.tolist(), cut.tolist())]


def row_entropy_sums(entropy: torch.Tensor, mask: torch.Tensor | None = None):
    """(B,) float64 sum of per-token entropy and (B,) float64 token count of each row.

    Args:
        entropy: a jagged nested (B, *) tensor over each row's response tokens (verl's TransferQueue `entropy`:
            real tokens only, `mask` unused), or a padded (B, T) one with its (B, T) `mask` of real tokens.
    """
    if entropy.is_nested:
        values, lengths = entropy.values().float(), entropy.offsets().diff()
        if not lengths.numel():
            return torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.float64)
        # one sum per row over a view of the values: 23 ms for 2,048 rows of 31M tokens on one core, against 49 ms
        # for torch.segment_reduce and 220 ms for an index_add (recipe/bench/exploration.py's batch)
        sums = torch.stack([part.sum() for part in torch.split(values, lengths.tolist())])
        return sums.double(), lengths.double()
    if mask is None:
        raise ValueError("a padded entropy tensor needs its (B, T) mask of real tokens")
    mask = mask.to(torch.float32)
    return (entropy.detach().float() * mask).sum(-1).double(), mask.sum(-1).double()


def entropy_table(entropy_sum: torch.Tensor, tokens: torch.Tensor, success: torch.Tensor, num_correct: torch.Tensor,
                  include: torch.Tensor, max_count: int) -> torch.Tensor:
    """(max_count + 1, 2) float64 sums (entropy, tokens): row 0 the included failures, row c the included successes
    whose group had c successes (c in 1..max_count; others are left out). One index_add, on the rows' device.

    All arguments but max_count are (B,): per-row entropy and token sums (`row_entropy_sums`), success flags, group
    success counts, and which rows count.
    """
    device = entropy_sum.device
    c = num_correct.to(device=device, dtype=torch.long)
    ok, keep = success.to(device=device, dtype=torch.bool), include.to(device=device, dtype=torch.bool)
    row = torch.where(ok, c, torch.zeros_like(c))
    row = torch.where(keep & (~ok | ((c >= 1) & (c <= max_count))), row, torch.full_like(c, max_count + 1))
    values = torch.stack([entropy_sum.double(), tokens.to(device).double()], dim=-1)
    return values.new_zeros(max_count + 2, 2).index_add_(0, row, values)[: max_count + 1]


def entropy_sums(table: torch.Tensor | Sequence) -> dict[str, float]:
    """Name an `entropy_table` (or its flat host values): `entropy/failure/{sum,tokens}`, `entropy/c{c}/{sum,tokens}`.
    Every key is present, so that tables of several micro-batches or processes add key by key."""
    flat = table.reshape(-1).tolist() if isinstance(table, torch.Tensor) else list(table)
    out = {"entropy/failure/sum": flat[0], "entropy/failure/tokens": flat[1]}
    for c in range(1, len(flat) // 2):
        out[f"entropy/c{c}/sum"], out[f"entropy/c{c}/tokens"] = flat[2 * c], flat[2 * c + 1]
    return out


def rollout_sums(groups: Sequence[Hashable], prompts: Sequence[Hashable], moves: Sequence[Move],
                 success: Sequence[bool], include: Sequence[bool], threshold: float):
    """One step's (or generation batch's) entrance and coverage sums, from each group of included rows.

    Per group (`gapo.entrance.group_entrances` of its members' first moves and success flags): its distinct_frac and,
    when it has successes, its unique_success_frac, added up overall and per c (the group's successes); and whether
    its solve rate c / k is above `threshold` (strictly, as `gapo.passk`'s coverage). A group is one prompt, keyed by
    `prompts` of its first included row (e.g. `prompt_key`).

    Returns:
        (sums, prompts seen, prompts covered). Sum keys: `entrance/groups`, `entrance/distinct_frac`,
        `entrance/success_groups`, `entrance/unique_success_frac`, the same under `entrance/c{c}/...`, and
        `coverage/prompts`, `coverage/above`.
    """
    ok = [bool(s) for s in success]
    members: dict = defaultdict(list)
    for row, (group, keep) in enumerate(zip(groups, include, strict=True)):
        if keep:
            members[group].append(row)
    sums: dict[str, float] = defaultdict(float)
    seen, above = set(), set()
    for rows in members.values():
        stats = group_entrances([moves[r] for r in rows], [ok[r] for r in rows])
        for scope in ("entrance", f"entrance/c{stats.successes}"):
            sums[f"{scope}/groups"] += 1
            sums[f"{scope}/distinct_frac"] += stats.distinct_frac
            if stats.successes:
                sums[f"{scope}/success_groups"] += 1
                sums[f"{scope}/unique_success_frac"] += stats.unique_success_frac
        key = prompts[rows[0]]
        seen.add(key)
        sums["coverage/prompts"] += 1
        covered = stats.successes / stats.size > threshold
        sums["coverage/above"] += covered  # present at 0 too: a step with no covered prompt logs coverage_frac 0
        if covered:
            above.add(key)
    return dict(sums), seen, above


def add_sums(total: dict, part: dict) -> dict:
    """Add `part`'s sums into `total` key by key (in place); returns `total`."""
    for key, value in part.items():
        total[key] = total.get(key, 0.0) + float(value)
    return total


def _ratio(sums: dict, num: str, den: str):
    d = sums.get(den, 0.0)
    return sums[num] / d if d > 0 and num in sums else None


def exploration_metrics(sums: dict) -> dict[str, float]:
    """The `gapo/explore/*` step metrics (module docstring) from summed `entropy_sums` and `rollout_sums` sums. Only what is defined is returned (no tokens, no group: no entry; never NaN)."""
    out: dict[str, float] = {}

    def put(name, value):
        if value is not None:
            out[name] = float(value)

    counts = sorted({int(k.split("/")[1][1:]) for k in sums if k.startswith("entropy/c")})
    success_sum = sum(sums.get(f"entropy/c{c}/sum", 0.0) for c in counts)
    success_tokens = sum(sums.get(f"entropy/c{c}/tokens", 0.0) for c in counts)
    put(ENTROPY_SUCCESS, success_sum / success_tokens if success_tokens > 0 else None)
    put(ENTROPY_FAILURE, _ratio(sums, "entropy/failure/sum", "entropy/failure/tokens"))
    for c in counts:
        put(f"{ENTROPY_SUCCESS}{PER_C}{c}", _ratio(sums, f"entropy/c{c}/sum", f"entropy/c{c}/tokens"))
    put(ENTRANCE_DISTINCT, _ratio(sums, "entrance/distinct_frac", "entrance/groups"))
    put(ENTRANCE_UNIQUE_SUCCESS, _ratio(sums, "entrance/unique_success_frac", "entrance/success_groups"))
    for c in sorted({int(k.split("/")[1][1:]) for k in sums if k.startswith("entrance/c")}):
        put(f"{ENTRANCE_DISTINCT}{PER_C}{c}", _ratio(sums, f"entrance/c{c}/distinct_frac", f"entrance/c{c}/groups"))
        put(f"{ENTRANCE_UNIQUE_SUCCESS}{PER_C}{c}",
            _ratio(sums, f"entrance/c{c}/unique_success_frac", f"entrance/c{c}/success_groups"))
    put(COVERAGE_FRAC, _ratio(sums, "coverage/above", "coverage/prompts"))
    return out


class CoverageWindow:
    """`gapo/explore/coverage_window*`: distinct prompts covered at least once over the latest `size` steps.

    `add(seen, above)` records one step's prompts (keys) and covered prompts and returns the window's metrics. A
    step without prompts still takes its place. Kept by the trainer process: it restarts with the process (not
    checkpointed), so after a resume it pools fewer steps until `size` more have run.
    """

    def __init__(self, size: int):
        if not _is_int(size) or size < 1:
            raise ValueError(f"the coverage window must be an integer >= 1 (steps), got {size!r}")
        self.steps: deque[tuple[frozenset, frozenset]] = deque(maxlen=size)

    def add(self, seen, above) -> dict[str, float]:
        """Record one step; returns coverage_window, coverage_window_seen, coverage_window_frac (when any prompt
        was seen) and coverage_window_steps."""
        self.steps.append((frozenset(seen), frozenset(above)))
        seen_all = frozenset().union(*(s for s, _ in self.steps))
        above_all = frozenset().union(*(a for _, a in self.steps))
        out = {COVERAGE_WINDOW: float(len(above_all)), COVERAGE_WINDOW_SEEN: float(len(seen_all)),
               COVERAGE_WINDOW_STEPS: float(len(self.steps))}
        if seen_all:
            out[COVERAGE_WINDOW_FRAC] = len(above_all) / len(seen_all)
        return out

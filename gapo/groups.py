"""Group statistics of a rollout batch (pure python/torch): success counts per group, and the focal weight.

A group is the set of rollouts of one prompt, identified by its uid. A rollout is a success when its
sequence reward exceeds a threshold (and, with overlong filtering, it was not truncated); c is its group's
success count, k the group's size. Groups are formed exactly as verl 0.9.1's GRPO advantage forms them
(`verl/trainer/ppo/v1/utils.py::compute_advantage_for_multi_trajectories`): with agent loops that return
several outputs per session (rows keyed `{uid}_{session}_{index}`), only the final output of each session
(highest index) is a member of its uid's group, and every output of the session takes that final output's
advantage, so it takes the final output's success flag here too.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Hashable, NamedTuple, Optional, Sequence

import torch


class GroupStatistics(NamedTuple):
    """Per rollout, all (B,): c and k of its group (float32), and its success flag (bool) as the loss sees it."""

    num_correct: torch.Tensor
    group_size: torch.Tensor
    success: torch.Tensor


def session_final_rows(keys: Sequence[str]) -> list[int]:
    """For each row, the row index of its session's final output, from verl's `{uid}_{session}_{index}` keys.

    Raises:
        ValueError: a key that is not `{uid}_{session}_{index}` with an integer index.
    """
    final: dict[str, tuple[int, int]] = {}
    sessions = []
    for row, key in enumerate(keys):
        parts = str(key).rsplit("_", 2)
        if len(parts) != 3 or not parts[2].lstrip("-").isdigit():
            raise ValueError(f"batch key {key!r} is not verl's '{{uid}}_{{session}}_{{index}}' format")
        session, index = f"{parts[0]}_{parts[1]}", int(parts[2])
        sessions.append(session)
        if session not in final or final[session][0] < index:
            final[session] = (index, row)
    return [final[session][1] for session in sessions]


def group_statistics(
    uids: Sequence[Hashable], success: torch.Tensor, final_rows: Optional[Sequence[int]] = None
) -> GroupStatistics:
    """Per rollout: (c, k, success) with verl's grouping.

    Args:
        uids: B group ids, one per rollout.
        success: (B,) bool, each row's own success.
        final_rows: for each row, the row that represents it in its group (its session's final output,
            `session_final_rows`); None when every row is its own member (single-output rollouts, and
            advantage estimators other than verl's GRPO, which group every row).
    Returns:
        GroupStatistics; c and k count member rows only, and each row's success is its member row's.
    """
    success = torch.as_tensor(success, dtype=torch.bool).reshape(-1)
    if len(uids) != success.shape[0]:
        raise ValueError(f"{len(uids)} uids for {success.shape[0]} success flags")
    rows = list(range(len(uids))) if final_rows is None else list(final_rows)
    if len(rows) != len(uids):
        raise ValueError(f"{len(rows)} final rows for {len(uids)} rollouts")
    ok = success.tolist()
    correct, size = defaultdict(int), defaultdict(int)
    for member in sorted(set(rows)):
        size[uids[member]] += 1
        correct[uids[member]] += int(ok[member])
    return GroupStatistics(
        num_correct=torch.tensor([correct[uids[r]] for r in rows], dtype=torch.float32),
        group_size=torch.tensor([size[uids[r]] for r in rows], dtype=torch.float32),
        success=torch.tensor([ok[r] for r in rows], dtype=torch.bool),
    )


def group_success_counts(
    uids: Sequence[Hashable], scores: torch.Tensor, success_threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per rollout: (c, k) = (successes in its uid group, size of that group), both float (B,); every row a member.

    Args:
        uids: B group ids, one per rollout.
        scores: (B,) sequence rewards; success means score > success_threshold.
    """
    if len(uids) != scores.shape[0]:
        raise ValueError(f"{len(uids)} uids for {scores.shape[0]} scores")
    stats = group_statistics(uids, scores > success_threshold)
    return stats.num_correct, stats.group_size


def focal_weight(num_correct: torch.Tensor, group_size: torch.Tensor, gamma: float) -> torch.Tensor:
    """F-GRPO's difficulty weight g = (1 - c / k) ** gamma (Plyusov et al., arXiv 2602.06717), per rollout.

    Down-weights the whole update of prompts the policy already solves often; gamma = 0 is plain GRPO.
    """
    if not gamma >= 0:
        raise ValueError(f"focal gamma must be >= 0, got {gamma}")
    return (1.0 - num_correct / group_size.clamp(min=1)).clamp(min=0.0) ** gamma


def rollout_group_statistics(keys, uids, token_scores, settings, max_response_length: int, sessions: bool):
    """Each rollout's (c, k, success) as the loss uses them, and which responses were truncated.

    Args:
        keys: verl's batch keys `{uid}_{session}_{index}`; uids: the rows' uids.
        token_scores: (B, *) token-level rewards, nested (jagged) as TransferQueue returns them, or padded.
        settings: GAPOConfig (success_threshold, mask_truncated).
        max_response_length: data.max_response_length; a response this long was cut.
        sessions: group as verl's GRPO advantage does (final output of each session); False for estimators
            that group every row.
    Returns:
        (GroupStatistics, truncated (B,) bool; all False unless settings.mask_truncated).

    A success is a sequence reward above `success_threshold` and, under overlong filtering, not truncated:
    a truncated response gets zero advantage, so it counts as a failure of its group (DeepCoder) and never
    gets the adaptive bound.
    """
    scores = token_scores.to_padded_tensor(0.0).sum(-1) if token_scores.is_nested else token_scores.sum(-1)
    if settings.mask_truncated:
        lengths = token_scores.offsets().diff() if token_scores.is_nested else torch.full(
            (len(keys),), token_scores.shape[-1])
        truncated = lengths >= max_response_length
    else:
        truncated = torch.zeros(len(keys), dtype=torch.bool)
    success = (scores > settings.success_threshold) & ~truncated
    return group_statistics(uids, success, session_final_rows(keys) if sessions else None), truncated


def zero_rows(nested: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """A jagged nested (B, *) tensor with the rows where `rows` is True set to zero."""
    parts = [t * 0 if drop else t for t, drop in zip(nested.unbind(), rows.tolist())]
    return torch.nested.as_nested_tensor(parts, layout=torch.jagged)


def group_metrics(stats: GroupStatistics, positive: torch.Tensor, real: torch.Tensor,
                  thresholds=None) -> dict[str, float]:
    """`gapo/groups/*` (group mix) and `gapo/eps_high/*` (the thresholds the loss gives) of a step; both trainers'.

    Args:
        stats: each rollout's (c, k, success) (`group_statistics`).
        positive: (B,) bool, the rollout's advantage is positive.
        real: (B,) bool, not a padding row (verl's batch balancing adds rows with fresh uids).
        thresholds: a callable (c, k) -> eps_high for the GAPO losses (e.g. `gapo.threshold.adaptive_eps_high` with
            the run's clips and schedule); None for a baseline (no `gapo/eps_high/*`).

    The `gapo/groups/*` values are means over groups (prompts), each counted once whatever its size: every real
    rollout is weighted 1 / k (its group's k real rollouts sum to 1). Under uniform sampling (all k = n) that is the
    plain mean over rollouts; under VIGOR a mean over rollouts would weight the large groups it grew.
    `gapo/groups/success_rate_mean` is the mean over groups of c / k, the batch's per-prompt pass rate.
    `gapo/eps_high/{mean,min,max}` covers the rollouts that get the adaptive bound: successes with a positive
    advantage; absent when there are none.
    """
    real = torch.as_tensor(real, dtype=torch.bool)
    num_correct, group_size = stats.num_correct[real].double(), stats.group_size[real].double()
    weight = 1.0 / group_size.clamp(min=1)

    def per_group(values: torch.Tensor) -> float:
        return ((values.double() * weight).sum() / weight.sum()).item()

    if not real.any():
        return {}
    out = {
        "gapo/groups/mixed_frac": per_group((num_correct > 0) & (num_correct < group_size)),
        "gapo/groups/all_correct_frac": per_group(num_correct == group_size),
        "gapo/groups/all_wrong_frac": per_group(num_correct == 0),
        "gapo/groups/success_rate_mean": per_group(num_correct / group_size.clamp(min=1)),
        "gapo/groups/size_mean": per_group(group_size),
    }
    used = stats.success.to(torch.bool) & torch.as_tensor(positive, dtype=torch.bool) & real
    if thresholds is not None and used.any():
        eps = thresholds(stats.num_correct[used], stats.group_size[used])
        out.update({"gapo/eps_high/mean": eps.mean().item(), "gapo/eps_high/min": eps.min().item(),
                    "gapo/eps_high/max": eps.max().item()})
    return out

"""Group statistics of a rollout batch (pure python/torch): success counts per uid, and the focal weight.

A group is the set of rollouts of one prompt, identified by its uid. With binary rewards a rollout is a
success when its sequence reward exceeds a threshold; c is the group's success count, k its size.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Hashable, Sequence

import torch


def group_success_counts(
    uids: Sequence[Hashable], scores: torch.Tensor, success_threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per rollout: (c, k) = (successes in its uid group, size of that group), both float (B,).

    Args:
        uids: B group ids, one per rollout.
        scores: (B,) sequence rewards; success means score > success_threshold.
    """
    if len(uids) != scores.shape[0]:
        raise ValueError(f"{len(uids)} uids for {scores.shape[0]} scores")
    success = (scores > success_threshold).tolist()
    correct, size = defaultdict(int), defaultdict(int)
    for uid, ok in zip(uids, success):
        size[uid] += 1
        correct[uid] += int(ok)
    return (
        torch.tensor([correct[u] for u in uids], dtype=torch.float32),
        torch.tensor([size[u] for u in uids], dtype=torch.float32),
    )


def focal_weight(num_correct: torch.Tensor, group_size: torch.Tensor, gamma: float) -> torch.Tensor:
    """F-GRPO's difficulty weight g = (1 - c / k) ** gamma (Plyusov et al., arXiv 2602.06717), per rollout.

    Down-weights the whole update of prompts the policy already solves often; gamma = 0 is plain GRPO.
    """
    if not gamma >= 0:
        raise ValueError(f"focal gamma must be >= 0, got {gamma}")
    return (1.0 - num_correct / group_size.clamp(min=1)).clamp(min=0.0) ** gamma

"""GAPO's per-rollout upper clip threshold eps_high(c, k): the schedules, and a CLI that prints the table.

In a group of k rollouts of one prompt with binary rewards, c of them correct, mean-centred (Dr.GRPO)
advantages are A = (k - c) / k for a correct rollout and -c / k for a wrong one. GAPO (Jia et al.,
arXiv 2609.00444, Eq. 11) widens the upper importance-ratio clip of correct rollouts as their group's
success count falls, so rare successes on hard prompts get the most update headroom:

    u(c, k)   = (k - c) / (k - 1) = A / A_max,  c clamped to [1, k],  A_max = (k - 1) / k
    linear:   eps_high = eps_low + (eps_high_max - eps_low) * u                      (the paper's Eq. 11)
    exp:      1 + eps_high = (1 + eps_low) * exp(beta * A),  beta = ln((1 + eps_high_max) / (1 + eps_low)) / A_max
              i.e. 1 + eps_high = (1 + eps_low) * ((1 + eps_high_max) / (1 + eps_low)) ** u
    constant: eps_high = eps_high_max                                   (the fixed asymmetric clip baseline)

Both adaptive schedules give eps_high_max at c = 1 and eps_low at c = k. `exp` is the un-linearised form
of the reverse-KL trust-region solution pi* ~ pi_old * exp(A / lambda), whose optimal ratio grows
exponentially in A; the linear schedule is its first-order version with the same end points. The clamp
of c to [1, k] keeps all-wrong groups (c = 0, A = 0 anyway) from overshooting eps_high_max. A group of
size 1 has no (k - 1) to divide by; it gets eps_high_max (its only rollout is a "rare" success).

Usage:
    python -m gapo.threshold [--group-size 8] [--eps-low 0.003] [--eps-high-max 0.005] [--schedule linear]

Each value left out is the training config's default (`gapo.config.training_defaults`: k, eps_low and eps_high_max from
configs/base/gapo.yaml, the schedule from GAPOConfig).
"""

from __future__ import annotations

import argparse
import math
from typing import Union

import torch

SCHEDULES = ("linear", "exp", "constant")

IntOrTensor = Union[int, torch.Tensor]


def validate_clip_range(eps_low: float, eps_high_max: float, schedule: str) -> None:
    """Raise ValueError naming the bad value and the fix; shared by the function, the config and the CLI."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown GAPO schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if not (math.isfinite(eps_low) and eps_low >= 0):
        raise ValueError(f"eps_low must be a finite number >= 0, got {eps_low!r} (actor.clip_ratio_low)")
    if not (math.isfinite(eps_high_max) and eps_high_max >= eps_low):
        raise ValueError(
            f"eps_high_max ({eps_high_max!r}) must be >= eps_low ({eps_low!r}): the widest upper clip cannot be "
            "narrower than the lower one; raise policy_loss.eps_high_max or lower actor.clip_ratio_low"
        )


def adaptive_eps_high(
    num_correct: IntOrTensor,
    group_size: IntOrTensor,
    eps_low: float,
    eps_high_max: float,
    schedule: str = "linear",
) -> torch.Tensor:
    """Upper clip threshold eps_high for a correct rollout of a group with `num_correct` successes.

    Args:
        num_correct: success count c of the rollout's group; int or integer/float tensor of any shape.
        group_size: size k of that group (the real count of its uid); int or tensor broadcastable to c.
        eps_low: the lower clip (actor.clip_ratio_low); also the upper clip when c = k.
        eps_high_max: the widest upper clip, reached at c = 1.
        schedule: "linear" (Eq. 11), "exp" or "constant"; see the module docstring.

    Returns:
        float32 tensor of the broadcast shape of (num_correct, group_size) (0-d for two ints).

    Raises:
        ValueError: unknown schedule, eps_high_max < eps_low, group_size < 1, c < 0 or c > k.
    """
    validate_clip_range(eps_low, eps_high_max, schedule)
    c = torch.as_tensor(num_correct, dtype=torch.float32)
    k = torch.as_tensor(group_size, dtype=torch.float32, device=c.device)
    if bool((k < 1).any()):
        raise ValueError(f"group_size must be >= 1, got {k.min().item():g}")
    if bool((c < 0).any()) or bool((c > k).any()):
        raise ValueError("num_correct must lie in [0, group_size]; got a success count outside its group")
    return eps_high_schedule(c, k, eps_low, eps_high_max, schedule)


def eps_high_schedule(
    num_correct: torch.Tensor, group_size: torch.Tensor, eps_low: float, eps_high_max: float, schedule: str
) -> torch.Tensor:
    """`adaptive_eps_high` without its checks, for the loss's hot path: no host synchronisation.

    The caller guarantees what `adaptive_eps_high` checks: a known schedule, eps_high_max >= eps_low, and
    0 <= c <= k with k >= 1 (true by construction for statistics from `gapo.groups.group_statistics`).
    Tensors of any float dtype and device; the result is float32 on their device.
    """
    c = num_correct.to(torch.float32)
    k = group_size.to(device=c.device, dtype=torch.float32)
    if schedule == "constant":
        return torch.full(torch.broadcast_shapes(c.shape, k.shape), eps_high_max, dtype=torch.float32, device=c.device)

    c = c.clamp_min(1.0)
    # u = A / A_max in [0, 1]; groups of one rollout have no k - 1 and take the c = 1 end (u = 1).
    u = torch.where(k > 1, (k - c) / (k - 1).clamp_min(1.0), 1.0)
    if schedule == "linear":
        return eps_low + (eps_high_max - eps_low) * u
    # exp: log(1 + eps_high) moves linearly in u; log1p/expm1 keep tiny clips (7e-5) exact in float32.
    log_low, log_max = math.log1p(eps_low), math.log1p(eps_high_max)
    return torch.expm1(log_low + (log_max - log_low) * u)


def rollout_eps_high(
    num_correct: torch.Tensor,
    group_size: torch.Tensor,
    success: torch.Tensor,
    positive: torch.Tensor,
    eps_low: float,
    eps_high_max: float,
    schedule: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each rollout's upper clip under GAPO's rule, and which rollouts get the adaptive one (no host sync).

    A rollout gets eps_high(c, k) when it is a success (its own reward above the success threshold) AND its
    advantage is positive; every other rollout keeps eps_low. The sign of the advantage alone is not enough:
    with partial credit, penalties or reward-model scores a failing rollout can have A > 0 in a group with
    c = 0. Shared by the verl loss (`gapo.verl_plugin.losses`) and the TRL trainer (`gapo.integrations.trl`).

    Args:
        num_correct, group_size: (B,) c and k of each rollout's group (any float/int dtype).
        success: (B,) bool, the rollout's own success; positive: (B,) bool, its advantage is > 0.
        eps_low, eps_high_max, schedule: as in `adaptive_eps_high` (validated by the caller's config).

    Returns:
        ((B,) float32 upper clips on `positive`'s device, (B,) bool mask of the rollouts with the adaptive one).
    """
    device = positive.device
    adaptive = success.to(device=device, dtype=torch.bool) & positive
    eps_c = eps_high_schedule(num_correct.to(device), group_size.to(device), eps_low, eps_high_max, schedule)
    return torch.where(adaptive, eps_c, eps_low), adaptive


def threshold_table(group_size: int, eps_low: float, eps_high_max: float, schedule: str = "linear") -> list[dict]:
    """Rows c = 1..k with the correct rollout's advantage (k - c) / k and its eps_high; c = 0 has no correct one."""
    counts = torch.arange(1, group_size + 1)
    eps = adaptive_eps_high(counts, group_size, eps_low, eps_high_max, schedule)
    return [
        {"c": int(c), "advantage": (group_size - int(c)) / group_size, "eps_high": float(e)}
        for c, e in zip(counts, eps)
    ]


def main(argv: list[str] | None = None) -> None:
    """CLI entry (``python -m gapo.threshold``): print the table of eps_high(c) for c = 1..k, one row per c. Values
    left out are the training config's defaults (`gapo.config.training_defaults`)."""
    parser = argparse.ArgumentParser(
        prog="python -m gapo.threshold", description="Print GAPO's upper clip per group success count c; values "
        "left out are the training config's defaults (configs/base/gapo.yaml, GAPOConfig)."
    )
    parser.add_argument("--group-size", "-k", type=int, help="rollouts per prompt (rollout.n; default: the config's)")
    parser.add_argument("--eps-low", type=float, help="lower clip (actor.clip_ratio_low; default: the config's)")
    parser.add_argument("--eps-high-max", type=float, help="upper clip at c = 1 (policy_loss.eps_high_max; default: "
                        "the config's)")
    parser.add_argument("--schedule", choices=SCHEDULES, help="default: the config's (GAPOConfig.schedule)")
    args = parser.parse_args(argv)
    if None in (args.group_size, args.eps_low, args.eps_high_max, args.schedule):
        from gapo.config import training_defaults  # gapo.config imports this module

        try:
            defaults = training_defaults()
        except (OSError, ValueError) as err:
            parser.error(f"{err}; pass --group-size, --eps-low, --eps-high-max and --schedule")
        for name, value in defaults.items():
            if getattr(args, name) is None:
                setattr(args, name, value)
    if args.group_size < 2:
        parser.error(f"--group-size must be >= 2 (a group needs a success and a failure), got {args.group_size}")
    try:
        rows = threshold_table(args.group_size, args.eps_low, args.eps_high_max, args.schedule)
    except ValueError as err:
        parser.error(str(err))
    print(f"GAPO thresholds: k={args.group_size} eps_low={args.eps_low:g} "
          f"eps_high_max={args.eps_high_max:g} schedule={args.schedule}")
    print(f"{'c':>3} {'A=(k-c)/k':>10} {'eps_high':>12} {'upper bound':>12}")
    for row in rows:
        print(f"{row['c']:>3} {row['advantage']:>10.4f} {row['eps_high']:>12.6g} {1 + row['eps_high']:>12.6g}")


if __name__ == "__main__":
    main()

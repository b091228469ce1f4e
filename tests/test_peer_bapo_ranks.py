"""BAPO's loss (`loss_mode=bapo`, docs/peers.md) in verl's real trainer at world size 2 (2 FSDP ranks, gloo, on CPU):
the smoke run (steps 1-2, then a resume for step 3) passes its checks, and both ranks walk every micro-batch to the
same bounds, which only the all-reduce of BAPO's sums over the ranks can give (each rank holds other rollouts)."""

from __future__ import annotations

import json
import math

import pytest

from recipe.smoke import run_smoke

LOSS_MODE = "actor_rollout_ref.actor.policy_loss.loss_mode=bapo"


@pytest.fixture(scope="module")
def bapo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bapo_ranks")
    rows = out / "rows"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GAPO_DEBUG_LOSS_ROWS", str(rows))  # each rank's per-row loss values (Ray workers inherit it)
        result = run_smoke(out / "smoke", steps=2, resume_steps=1, overrides=[LOSS_MODE], ranks=2)
    return result, rows


def _micro_batch_bounds(path) -> list[tuple[int, float]]:
    """(step, c_high - 1) of each micro-batch in order: the rows of one micro-batch share BAPO's bounds."""
    seq = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        key = (int(row["step"]), round(float(row["eps_high"]), 6))
        if not seq or seq[-1] != key:
            seq.append(key)
    return seq


def test_the_smoke_run_logs_bapos_bounds_every_step(bapo_run):
    result, _ = bapo_run
    steps = {**result["run1"], **result["run2"]}
    assert sorted(steps) == [1, 2, 3] and result["world_size"] == 2
    for m in steps.values():
        assert 0.6 <= m["actor/bapo_clip_low"] <= 0.9 and 1.2 <= m["actor/bapo_clip_high"] <= 3.0
        assert 0 <= m["actor/bapo_pos_share"] <= 1
        assert math.isfinite(m["gapo/loss_eps_high_mean"])


def test_both_ranks_walk_every_micro_batch_to_the_same_bounds(bapo_run):
    _, rows = bapo_run
    ranks = {r: _micro_batch_bounds(rows / f"rank{r}.jsonl") for r in (0, 1)}
    assert ranks[0] == ranks[1] and len(ranks[0]) >= 3
    # the walk moved somewhere (a bound other than the start 1.2), so agreement is not the start's by default
    assert any(eps != pytest.approx(0.2) for _, eps in ranks[0]), ranks[0]

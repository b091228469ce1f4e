"""verl's side of the exploration instruments (gapo/verl_plugin/exploration.py): TransferQueue-shaped fields in, the
step's gapo/explore/* out, with verl's session grouping, padding rows, no entropy in bypass mode, and the row dump."""

from __future__ import annotations

import json

import pytest
import torch

from gapo.exploration import ExplorationConfig
from gapo.groups import group_statistics, session_final_rows
from gapo.verl_plugin.exploration import ROWS_ENV, StepExploration


def _jagged(rows, dtype=torch.long):
    return torch.nested.as_nested_tensor([torch.tensor(r, dtype=dtype) for r in rows], layout=torch.jagged)


# uid a: 2 sessions; session 0 has two outputs (index 0 a draft, index 1 final), session 1 one. uid b: 2 sessions.
# One padding row. m = 2.
KEYS = ["a_0_0", "a_0_1", "a_1_0", "b_0_0", "b_1_0", "padX_0_0"]
UIDS = ["a", "a", "a", "b", "b", "padX"]
RESPONSES = [[9, 9, 9], [1, 2, 3], [1, 2], [4, 4], [5], [0, 0]]
SCORES = [0.0, 1.0, 0.0, 1.0, 1.0, 0.0]  # per row; a session's success is its final output's
ENTROPY = [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0], [3.0, 3.0], [0.5, 0.5], [4.0], [100.0, 100.0]]
PROMPTS = [[7, 7], [7, 7], [7, 7], [8], [8], [0]]


def _step(with_entropy=True, window=2):
    real = torch.tensor([not u.startswith("pad") for u in UIDS])
    stats = group_statistics(UIDS, torch.tensor(SCORES) > 0.5, session_final_rows(KEYS))
    fields = {"responses": _jagged(RESPONSES), "prompts": _jagged(PROMPTS)}
    if with_entropy:
        fields["entropy"] = _jagged(ENTROPY, torch.float32)
    instruments = StepExploration(ExplorationConfig(entrance_tokens=2, coverage_window=window))
    return instruments, instruments.step(KEYS, UIDS, fields, stats, real, sessions=True, step=7)


def test_sessions_padding_and_entropy():
    _, metrics = _step()
    # members: a_0_1 (success, move 12), a_1_0 (failure, move 12) -> distinct 1/2; b_0_0 (44), b_1_0 (5) both
    # succeed -> distinct 2/2, unique successes 2/2; a: its one success shares its move -> 0/1
    assert metrics["gapo/explore/entrance_distinct"] == pytest.approx((0.5 + 1.0) / 2)
    assert metrics["gapo/explore/entrance_unique_success"] == pytest.approx((0 + 1) / 2)
    # entropy over every real row with its session's success: a_0_0 takes a_0_1's (success, c = 1 in group a)
    # successes: a_0_0 3 + a_0_1 6 (c = 1); b 1 + 4 (c = 2) -> 14 / 9; failures: a_1_0 6 / 2
    assert metrics["gapo/explore/entropy_success"] == pytest.approx(14 / 9)
    assert metrics["gapo/explore/entropy_success/c1"] == pytest.approx(9 / 6)
    assert metrics["gapo/explore/entropy_success/c2"] == pytest.approx(5 / 3)
    assert metrics["gapo/explore/entropy_failure"] == pytest.approx(3.0)
    # coverage: a 1/2, b 2/2, both above 5%; the padding row is no prompt
    assert metrics["gapo/explore/coverage_frac"] == 1.0
    assert metrics["gapo/explore/coverage_window"] == 2.0 and metrics["gapo/explore/coverage_window_seen"] == 2.0


def test_no_entropy_in_bypass_mode_the_rest_still_logged():
    _, metrics = _step(with_entropy=False)
    assert not any("entropy" in key for key in metrics)
    assert metrics["gapo/explore/entrance_distinct"] == pytest.approx(0.75)


def test_the_window_holds_prompts_across_steps():
    instruments, _ = _step(window=2)
    real = torch.ones(2, dtype=torch.bool)
    fields = {"responses": _jagged([[1], [2]]), "prompts": _jagged([[9, 9], [9, 9]])}
    none = group_statistics(["c", "c"], torch.tensor([False, False]))
    out = instruments.step(["c_0_0", "c_1_0"], ["c", "c"], fields, none,
                           real, sessions=True, step=8)
    assert out["gapo/explore/coverage_frac"] == 0.0  # 0/2 is not above 5%
    assert out["gapo/explore/coverage_window"] == 2.0 and out["gapo/explore/coverage_window_seen"] == 3.0


def test_the_row_dump_holds_what_the_instruments_read(tmp_path, monkeypatch):
    monkeypatch.setenv(ROWS_ENV, str(tmp_path))
    _step()
    rows = [json.loads(line) for line in (tmp_path / "driver.jsonl").read_text().splitlines()]
    assert [r["key"] for r in rows] == KEYS
    assert [r["lead"] for r in rows] == [r[:2] for r in RESPONSES]
    assert [r["member"] for r in rows] == [False, True, True, True, True, False]
    assert [r["real"] for r in rows] == [True] * 5 + [False]
    assert [r["entropy_sum"] for r in rows] == pytest.approx([sum(e) for e in ENTROPY])
    assert rows[1]["prompt"] == rows[2]["prompt"] != rows[3]["prompt"] and rows[0]["prompt"] is None

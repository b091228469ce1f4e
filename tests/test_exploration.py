"""The exploration instruments (gapo/entrance.py, gapo/exploration.py) on a hand-built step whose answers are known.

The step (m = 3 tokens a first move), rows interleaved across groups so that grouping by position fails:
    group a, k = 4, all 4 succeed:   [1,2,3,9] [1,2,3,8] [1,2,4] [5]      moves 123 123 124 5   distinct 3/4
                                     unique successes: 124 and 5 -> 2/4
    group b, k = 4, none succeeds:   [7,7,7,7] [7,7,7] [7,7] [7,7,7,1]    moves 777 777 77 777  distinct 2/4
    group c, k = 4, 1 success (the last, an entrance of its own): [1,2,3] [1,2,3,5] [1,2,3] [6,6,6]
                                     moves 123 123 123 666 distinct 2/4; unique successes 1/1
    group d, k = 6 (VIGOR grew it), successes rows 0 and 4: [1] [1] [2] [2] [3] [1]
                                     moves 1 1 2 2 3 1 distinct 3/6; unique successes: 3 only -> 1/2
    two padding rows (fresh uids, as verl's batch balancing makes them), 2 tokens of entropy 100 each
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from gapo.entrance import first_move, group_entrances, majority_entrance
from gapo.exploration import (
    COVERAGE_FRAC,
    COVERAGE_WINDOW,
    COVERAGE_WINDOW_FRAC,
    COVERAGE_WINDOW_SEEN,
    COVERAGE_WINDOW_STEPS,
    ENTRANCE_DISTINCT,
    ENTRANCE_UNIQUE_SUCCESS,
    ENTROPY_FAILURE,
    ENTROPY_SUCCESS,
    PER_C,
    CoverageWindow,
    ExplorationConfig,
    add_sums,
    entropy_sums,
    entropy_table,
    exploration_metrics,
    first_moves,
    leading_tokens,
    prompt_key,
    rollout_sums,
    row_entropy_sums,
)

# (group, response, success, per-token entropy)
ROWS = [
    ("a", [1, 2, 3, 9], True, [1, 1, 1, 1]),
    ("a", [1, 2, 3, 8], True, [2, 2, 2, 2]),
    ("a", [1, 2, 4], True, [0.5, 0.5, 0.5]),
    ("a", [5], True, [3]),
    ("b", [7, 7, 7, 7], False, [1, 1, 1, 1]),
    ("b", [7, 7, 7], False, [2, 2, 2]),
    ("b", [7, 7], False, [3, 3]),
    ("b", [7, 7, 7, 1], False, [0.5] * 4),
    ("c", [1, 2, 3], False, [1, 1, 1]),
    ("c", [1, 2, 3, 5], False, [0, 0, 0, 0]),
    ("c", [1, 2, 3], False, [2, 2, 2]),
    ("c", [6, 6, 6], True, [0.1, 0.2, 0.3]),
    ("d", [1], True, [4]),
    ("d", [1], False, [1]),
    ("d", [2], False, [1]),
    ("d", [2], False, [1]),
    ("d", [3], True, [2]),
    ("d", [1], False, [1]),
    ("pad-1", [0, 0], False, [100, 100]),
    ("pad-2", [0, 0], False, [100, 100]),
]
M = 3
MAX_COUNT = 6

# entropy, token-weighted (hand sums): successes with c = 4: (4 + 8 + 1.5 + 3) / (4 + 4 + 3 + 1) = 16.5 / 12;
# c = 1: 0.6 / 3; c = 2: (4 + 2) / 2; failures: b (4 + 6 + 6 + 2) / 13, c (3 + 0 + 6) / 10, d 4 / 4 -> 31 / 27
EXPECTED = {
    ENTROPY_SUCCESS: (16.5 + 0.6 + 6) / 17,
    ENTROPY_FAILURE: 31 / 27,
    f"{ENTROPY_SUCCESS}{PER_C}4": 16.5 / 12,
    f"{ENTROPY_SUCCESS}{PER_C}1": 0.2,
    f"{ENTROPY_SUCCESS}{PER_C}2": 3.0,
    ENTRANCE_DISTINCT: (3 / 4 + 2 / 4 + 2 / 4 + 3 / 6) / 4,
    ENTRANCE_UNIQUE_SUCCESS: (2 / 4 + 1 + 1 / 2) / 3,
    f"{ENTRANCE_DISTINCT}{PER_C}0": 0.5,
    f"{ENTRANCE_DISTINCT}{PER_C}1": 0.5,
    f"{ENTRANCE_DISTINCT}{PER_C}2": 0.5,
    f"{ENTRANCE_DISTINCT}{PER_C}4": 0.75,
    f"{ENTRANCE_UNIQUE_SUCCESS}{PER_C}1": 1.0,
    f"{ENTRANCE_UNIQUE_SUCCESS}{PER_C}2": 0.5,
    f"{ENTRANCE_UNIQUE_SUCCESS}{PER_C}4": 0.5,
    COVERAGE_FRAC: 3 / 4,  # a 4/4, c 1/4, d 2/6 above 5%; b 0/4 not
}


def _step(rows, threshold=0.05, newline_ids=None):
    """What a trainer does with a step: tensors in, sums out (nested tensors, as TransferQueue returns them)."""
    groups = [r[0] for r in rows]
    responses = torch.nested.as_nested_tensor([torch.tensor(r[1]) for r in rows], layout=torch.jagged)
    entropy = torch.nested.as_nested_tensor([torch.tensor(r[3], dtype=torch.float32) for r in rows],
                                            layout=torch.jagged)
    success = torch.tensor([r[2] for r in rows])
    include = torch.tensor([not g.startswith("pad") for g in groups])
    num_correct = torch.tensor([sum(x[2] for x in rows if x[0] == g) for g in groups], dtype=torch.float32)
    lead, _ = leading_tokens(responses, M)
    moves = first_moves(lead, newline_ids)
    sums = entropy_sums(entropy_table(*row_entropy_sums(entropy), success, num_correct, include, MAX_COUNT))
    part, seen, above = rollout_sums(groups, [f"prompt-{g}" for g in groups], moves, success.tolist(),
                                     include.tolist(), threshold)
    return add_sums(sums, part), seen, above


def _interleaved(rows, seed=0):
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    return [rows[i] for i in order]


def test_the_hand_built_step_gives_the_hand_computed_metrics():
    sums, seen, above = _step(_interleaved(ROWS))
    metrics = exploration_metrics(sums)
    for name, value in EXPECTED.items():
        assert metrics[name] == pytest.approx(value, rel=1e-6), name
    # nothing else per c: no group has c = 3, 5 or 6, and no failure-only unique-success entry
    assert f"{ENTRANCE_DISTINCT}{PER_C}3" not in metrics and f"{ENTRANCE_UNIQUE_SUCCESS}{PER_C}0" not in metrics
    assert seen == {"prompt-a", "prompt-b", "prompt-c", "prompt-d"} and above == {"prompt-a", "prompt-c", "prompt-d"}


def test_row_order_does_not_matter_but_grouping_by_position_would():
    a = exploration_metrics(_step(ROWS)[0])
    b = exploration_metrics(_step(_interleaved(ROWS, seed=3))[0])
    assert a == pytest.approx(b)
    # the mistake this guards against: groups taken as consecutive blocks of rollout.n = 4 rows of a shuffled batch
    shuffled = _interleaved(ROWS, seed=3)
    blocks = [(f"block{i // 4}", *r[1:]) for i, r in enumerate(shuffled[:16])]
    wrong = exploration_metrics(_step(blocks)[0])
    assert wrong[ENTRANCE_DISTINCT] != pytest.approx(EXPECTED[ENTRANCE_DISTINCT])


def test_padding_rows_would_change_every_number_if_counted():
    counted = [(f"x{g}" if g.startswith("pad") else g, *rest) for g, *rest in ROWS]  # same rows, not padding
    wrong = exploration_metrics(_step(counted)[0])
    for name in (ENTROPY_FAILURE, ENTRANCE_DISTINCT, COVERAGE_FRAC):
        assert wrong[name] != pytest.approx(EXPECTED[name]), name


def test_token_weighting_not_row_weighting():
    row_weighted = (1 + 2 + 0.5 + 3 + 0.2 + 4 + 2) / 7  # mean of the successes' per-row means
    assert EXPECTED[ENTROPY_SUCCESS] != pytest.approx(row_weighted)


def test_sums_add_across_micro_batches_and_processes():
    """Two halves of the rows (as two ranks' micro-batches) give the whole step's entropy means when their sums are
    added; the entrance sums are a step's (the driver sees whole groups)."""
    rows = _interleaved(ROWS, seed=5)
    groups = [r[0] for r in rows]
    success = torch.tensor([r[2] for r in rows])
    include = torch.tensor([not g.startswith("pad") for g in groups])
    num_correct = torch.tensor([sum(x[2] for x in rows if x[0] == g) for g in groups], dtype=torch.float32)
    padded = torch.zeros(len(rows), 4)
    mask = torch.zeros(len(rows), 4)
    for i, r in enumerate(rows):
        padded[i, : len(r[3])] = torch.tensor(r[3])
        mask[i, : len(r[3])] = 1
    total: dict = {}
    for half in (slice(0, 7), slice(7, None)):
        ent, tok = row_entropy_sums(padded[half], mask[half])
        add_sums(total, entropy_sums(entropy_table(ent, tok, success[half], num_correct[half], include[half], MAX_COUNT)))
    metrics = exploration_metrics(total)
    for name in (ENTROPY_SUCCESS, ENTROPY_FAILURE, f"{ENTROPY_SUCCESS}{PER_C}2"):
        assert metrics[name] == pytest.approx(EXPECTED[name], rel=1e-6)


def test_responses_shorter_than_m_and_empty_ones():
    responses = torch.nested.as_nested_tensor(
        [torch.tensor([4, 5]), torch.tensor([], dtype=torch.long), torch.tensor([4, 5, 6, 7])], layout=torch.jagged)
    lead, lengths = leading_tokens(responses, 3)
    assert lengths.tolist() == [2, 0, 4]
    assert first_moves(lead) == [(4, 5), (), (4, 5, 6)]
    # a padded batch gives the same moves
    padded = torch.tensor([[4, 5, 0, 0], [0, 0, 0, 0], [4, 5, 6, 7]])
    assert first_moves(leading_tokens(padded, 3, lengths=torch.tensor([2, 0, 4]))[0]) == [(4, 5), (), (4, 5, 6)]
    # m longer than the padded width
    assert first_moves(leading_tokens(padded[:, :2], 3, lengths=torch.tensor([2, 0, 2]))[0]) == [(4, 5), (), (4, 5)]


def test_until_newline_cuts_after_the_first_newline_token():
    newline = {9}
    assert first_move([1, 9, 2, 3], 8, newline) == (1, 9)
    assert first_move([1, 2, 3, 4], 3, newline) == (1, 2, 3)  # no newline within m: m tokens
    assert first_move([9], 3, newline) == (9,)
    lead, _ = leading_tokens(torch.nested.as_nested_tensor([torch.tensor([1, 9, 2]), torch.tensor([1, 2, 9])],
                                                           layout=torch.jagged), 3)
    assert first_moves(lead, newline) == [(1, 9), (1, 2, 9)]
    # with the newline cut, group [1 9 2] [1 9 5] share a move; without it they do not
    assert group_entrances([first_move(r, 3, newline) for r in ([1, 9, 2], [1, 9, 5])], [True, False]).distinct == 1
    assert group_entrances([first_move(r, 3) for r in ([1, 9, 2], [1, 9, 5])], [True, False]).distinct == 2


def test_majority_entrance_ties_go_to_the_first_in_sample_order():
    assert majority_entrance([(2,), (1,), (1,), (2,)]) == [0, 3]
    assert majority_entrance([(1,), (2,), (2,)]) == [1, 2]
    assert majority_entrance([]) == []


def test_coverage_threshold_and_window():
    sums, seen, above = _step(ROWS, threshold=0.3)
    assert exploration_metrics(sums)[COVERAGE_FRAC] == 0.5  # a 4/4 and d 2/6 above 30%; c 1/4 is not
    window = CoverageWindow(2)
    first = window.add(seen, above)
    assert first == {COVERAGE_WINDOW: 2.0, COVERAGE_WINDOW_SEEN: 4.0, COVERAGE_WINDOW_FRAC: 0.5,
                     COVERAGE_WINDOW_STEPS: 1.0}
    second = window.add({"prompt-a", "prompt-e"}, {"prompt-e"})  # a again (not covered now: still counted once)
    assert second[COVERAGE_WINDOW] == 3.0 and second[COVERAGE_WINDOW_SEEN] == 5.0
    third = window.add(set(), set())  # step 1 leaves the window of 2
    assert third[COVERAGE_WINDOW] == 1.0 and third[COVERAGE_WINDOW_SEEN] == 2.0 and third[COVERAGE_WINDOW_STEPS] == 2


def test_nothing_defined_gives_no_entry_never_nan():
    assert exploration_metrics({}) == {}
    empty = entropy_sums(entropy_table(torch.zeros(0, dtype=torch.float64), torch.zeros(0), torch.zeros(0, dtype=torch.bool),
                                       torch.zeros(0), torch.zeros(0, dtype=torch.bool), 4))
    assert exploration_metrics(empty) == {}
    only_failures = exploration_metrics(_step([r for r in ROWS if r[0] == "b"])[0])
    assert ENTROPY_SUCCESS not in only_failures and ENTRANCE_UNIQUE_SUCCESS not in only_failures
    assert all(math.isfinite(v) for v in only_failures.values())


def test_prompt_key_is_stable_and_tells_prompts_apart():
    assert prompt_key([1, 2, 3]) == prompt_key(torch.tensor([1, 2, 3]))
    assert prompt_key([1, 2, 3]) != prompt_key([1, 2, 4]) and prompt_key([12, 3]) != prompt_key([1, 23])
    assert prompt_key("What is 2+2?") == prompt_key("What is 2+2?") != prompt_key("What is 2+3?")


@pytest.mark.parametrize("field,value,fix", [
    ("entrance_tokens", 0, "exploration.entrance_tokens=8"),
    ("entrance_tokens", 2.5, "exploration.entrance_tokens=8"),
    ("entrance_tokens", True, "exploration.entrance_tokens=8"),
    ("coverage_window", 0, "exploration.coverage_window=20"),
    ("coverage_threshold", 1.0, "exploration.coverage_threshold=0.05"),
    ("coverage_threshold", -0.1, "exploration.coverage_threshold=0.05"),
    ("coverage_threshold", float("nan"), "exploration.coverage_threshold=0.05"),
    ("entrance_until_newline", "yes", "true or false"),
])
def test_bad_knobs_name_the_key_the_value_and_the_fix(field, value, fix):
    with pytest.raises(ValueError) as err:
        ExplorationConfig(**{field: value})
    assert f"exploration.{field}={value!r}" in str(err.value) and fix in str(err.value)


def test_the_tensor_path_gives_the_pure_python_first_moves():
    """`first_moves` (torch, what the trainers run) against `first_move` (python, the definition), with and without
    the newline cut, on random rows of random lengths (some shorter than m, some empty)."""
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, 6, (int(n),), generator=gen).tolist() for n in torch.randint(0, 9, (200,), generator=gen)]
    nested = torch.nested.as_nested_tensor([torch.tensor(r, dtype=torch.long) for r in rows], layout=torch.jagged)
    for m in (1, 3, 5):
        lead, _ = leading_tokens(nested, m)
        for newline in (None, {2}, {2, 5}):
            assert first_moves(lead, newline) == [first_move(r, m, newline) for r in rows], (m, newline)

"""Group statistics as verl's GRPO advantage forms groups: multi-output sessions, uneven groups, bad keys."""

import numpy as np
import pytest
import torch
from verl.protocol import DataProto
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

from gapo.config import GAPOConfig
from gapo.groups import (
    group_statistics,
    group_success_counts,
    rollout_group_statistics,
    session_final_rows,
    zero_rows,
)

# Two prompts. Prompt "a": session 0 has three outputs (indices 0, 1, 2; only index 2 is final), session 1
# one output, session 2 two outputs. Prompt "b": sessions 0 and 1, one output each. Intermediate outputs
# carry rewards that differ from their session's final output, so counting them would change c and k.
KEYS = ["a_0_0", "a_0_1", "a_0_2", "a_1_0", "a_2_1", "a_2_0", "b_0_0", "b_1_0"]
UIDS = [key.split("_")[0] for key in KEYS]
SCORES = [1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0]


def test_final_rows_follow_the_highest_index_of_each_session():
    assert session_final_rows(KEYS) == [2, 2, 2, 3, 4, 4, 6, 7]


def test_counts_use_final_outputs_only_and_rows_take_their_sessions_success():
    stats = group_statistics(UIDS, torch.tensor(SCORES) > 0.5, session_final_rows(KEYS))
    # "a": finals a_0_2 (0), a_1_0 (1), a_2_1 (1) -> c = 2, k = 3 (counting every row would give c = 4, k = 6)
    assert stats.num_correct.tolist() == [2, 2, 2, 2, 2, 2, 1, 1]
    assert stats.group_size.tolist() == [3, 3, 3, 3, 3, 3, 2, 2]
    # a_0_0 and a_0_1 scored 1 but their session's final output failed: they are not successes
    assert stats.success.tolist() == [False, False, False, True, True, True, True, False]


def test_statistics_match_verls_own_grpo_advantage_row_for_row():
    """With binary rewards and Dr.GRPO, verl's advantage of every row is success - c / k with the same rows
    and groups that GAPO uses: (c, k, success) describe exactly the group verl normalised against."""
    n, t = len(KEYS), 3
    token_scores = torch.zeros(n, t)
    token_scores[:, -1] = torch.tensor(SCORES)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": token_scores, "response_mask": torch.ones(n, t)},
        non_tensors={"uid": np.array(UIDS, dtype=object)},
    )
    out = compute_advantage_for_multi_trajectories(data, batch_keys=KEYS, adv_estimator="grpo",
                                                   norm_adv_by_std_in_grpo=False)
    stats = group_statistics(UIDS, torch.tensor(SCORES) > 0.5, session_final_rows(KEYS))
    expected = stats.success.float() - stats.num_correct / stats.group_size
    torch.testing.assert_close(out.batch["advantages"][:, 0], expected)


def test_every_row_is_a_member_without_sessions():
    uids = ["a", "a", "a", "b", "b", "c"]
    stats = group_statistics(uids, torch.tensor([1, 0, 1, 0, 0, 1], dtype=torch.bool))
    assert stats.num_correct.tolist() == [2, 2, 2, 0, 0, 1] and stats.group_size.tolist() == [3, 3, 3, 2, 2, 1]
    c, k = group_success_counts(uids, torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0]), 1.0)  # strictly greater
    assert c.tolist() == [0] * 6 and k.tolist() == [3, 3, 3, 2, 2, 1]


@pytest.mark.parametrize("key", ["a_0", "a_0_x", "plain"])
def test_keys_not_in_verls_format_are_named(key):
    with pytest.raises(ValueError, match=repr(key)):
        session_final_rows(["a_0_0", key])


def test_mismatched_lengths_are_named():
    with pytest.raises(ValueError, match="3 uids for 2"):
        group_statistics(["a", "a", "b"], torch.tensor([True, False]))
    with pytest.raises(ValueError, match="1 final rows for 2"):
        group_statistics(["a", "a"], torch.tensor([True, False]), [0])


# --- rollout_group_statistics: TransferQueue-shaped inputs (nested token scores, verl keys); overlong filtering
# counts truncated responses as failures; sessions group as verl's GRPO does
MAX_LEN = 4


def nested_scores(lengths, rewards):
    """Token-level scores as the reward writes them: the sequence reward on the last response token."""
    rows = []
    for length, reward in zip(lengths, rewards):
        row = torch.zeros(length)
        row[-1] = reward
        rows.append(row)
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


# One prompt, four rollouts; rollout 1 scored 1 but was cut at max_response_length (4 tokens).
CUT_KEYS = ["p_0_0", "p_1_0", "p_2_0", "p_3_0"]
CUT_UIDS = ["p"] * 4
CUT_SCORES = nested_scores([2, MAX_LEN, 3, 1], [1.0, 1.0, 0.0, 0.0])


def test_truncated_success_counts_as_failure_under_overlong_filtering():
    stats, truncated = rollout_group_statistics(CUT_KEYS, CUT_UIDS, CUT_SCORES, GAPOConfig(mask_truncated=True),
                                                max_response_length=MAX_LEN, sessions=True)
    assert truncated.tolist() == [False, True, False, False]
    assert stats.success.tolist() == [True, False, False, False]
    assert stats.num_correct.tolist() == [1] * 4 and stats.group_size.tolist() == [4] * 4


def test_without_overlong_filtering_a_truncated_success_counts():
    stats, truncated = rollout_group_statistics(CUT_KEYS, CUT_UIDS, CUT_SCORES, GAPOConfig(mask_truncated=False),
                                                max_response_length=MAX_LEN, sessions=True)
    assert not truncated.any()
    assert stats.success.tolist() == [True, True, False, False] and stats.num_correct.tolist() == [2] * 4


def test_sessions_only_for_verls_grpo():
    keys = ["p_0_0", "p_0_1", "p_1_0"]  # session 0 has two outputs; the first scored 1, the final one 0
    scores = nested_scores([2, 2, 2], [1.0, 0.0, 1.0])
    stats, _ = rollout_group_statistics(keys, ["p"] * 3, scores, GAPOConfig(), MAX_LEN, sessions=True)
    assert stats.num_correct.tolist() == [1, 1, 1] and stats.group_size.tolist() == [2, 2, 2]
    assert stats.success.tolist() == [False, False, True]
    stats, _ = rollout_group_statistics(keys, ["p"] * 3, scores, GAPOConfig(), MAX_LEN, sessions=False)
    assert stats.num_correct.tolist() == [2, 2, 2] and stats.group_size.tolist() == [3, 3, 3]
    assert stats.success.tolist() == [True, False, True]


def test_zero_rows_zeroes_only_the_truncated_rollouts():
    nested = torch.nested.as_nested_tensor([torch.ones(3), torch.full((5,), 2.0), torch.ones(2)], layout=torch.jagged)
    out = zero_rows(nested, torch.tensor([False, True, False])).unbind()
    assert [t.tolist() for t in out] == [[1.0] * 3, [0.0] * 5, [1.0] * 2]

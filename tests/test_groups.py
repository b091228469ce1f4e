"""Group statistics as verl's GRPO advantage forms groups: multi-output sessions, uneven groups, bad keys."""

import numpy as np
import pytest
import torch
from verl.protocol import DataProto
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

from gapo.groups import group_statistics, group_success_counts, session_final_rows

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

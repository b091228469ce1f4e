"""The GAPO trainer's per-rollout statistics from TransferQueue-shaped inputs (nested token scores, verl keys):
overlong filtering counts truncated responses as failures; sessions group as verl's GRPO does."""

import torch

from gapo.config import GAPOConfig
from gapo.verl_plugin.trainer import rollout_group_statistics

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
KEYS = ["p_0_0", "p_1_0", "p_2_0", "p_3_0"]
UIDS = ["p"] * 4
SCORES = nested_scores([2, MAX_LEN, 3, 1], [1.0, 1.0, 0.0, 0.0])


def test_truncated_success_counts_as_failure_under_overlong_filtering():
    stats, truncated = rollout_group_statistics(KEYS, UIDS, SCORES, GAPOConfig(mask_truncated=True),
                                                max_response_length=MAX_LEN, sessions=True)
    assert truncated.tolist() == [False, True, False, False]
    assert stats.success.tolist() == [True, False, False, False]
    assert stats.num_correct.tolist() == [1] * 4 and stats.group_size.tolist() == [4] * 4


def test_without_overlong_filtering_a_truncated_success_counts():
    stats, truncated = rollout_group_statistics(KEYS, UIDS, SCORES, GAPOConfig(mask_truncated=False),
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

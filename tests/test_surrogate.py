"""The pure-torch surrogates directly (no verl): per-rollout bounds broadcast over tokens, bad shapes."""

import pytest
import torch

from gapo import sequence_clipped_surrogate, token_clipped_surrogate


def test_per_rollout_bound_applies_to_every_token_of_its_rollout():
    old = torch.zeros(2, 3)
    new = torch.full((2, 3), 0.2)  # ratio e^0.2 = 1.2214 everywhere
    adv = torch.ones(2, 3)
    mask = torch.ones(2, 3)
    eps_high = torch.tensor([0.3, 0.1])  # bound 1.3 (not binding) vs 1.1 (binding)
    for fn in (sequence_clipped_surrogate, token_clipped_surrogate):
        terms = fn(new, old, adv, mask, 0.2, eps_high)
        assert terms.clipped.tolist() == [[False] * 3, [True] * 3]
        torch.testing.assert_close(terms.loss[1], torch.full((3,), -1.1))
        torch.testing.assert_close(terms.ratio, torch.full((2, 3), torch.exp(torch.tensor(0.2)).item()))


def test_sequence_ratio_is_the_masked_mean_of_token_log_ratios():
    old = torch.zeros(1, 3)
    new = torch.tensor([[0.3, 0.1, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the padded token must not count
    terms = sequence_clipped_surrogate(new, old, torch.ones(1, 3), mask, 0.2, 0.5)
    torch.testing.assert_close(terms.ratio, torch.full((1, 3), torch.exp(torch.tensor(0.2)).item()))


@pytest.mark.parametrize("eps_high, match", [(torch.ones(3), "3 entries for a batch of 2"),
                                             (torch.ones(2, 1), "float or a \\(B,\\) tensor")])
def test_bad_threshold_shapes(eps_high, match):
    with pytest.raises(ValueError, match=match):
        sequence_clipped_surrogate(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2, 3), 0.2, eps_high)


def test_dual_clip_must_exceed_one():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        token_clipped_surrogate(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), 0.2, 0.2, 1.0)

"""A ported peer's clip through TRL (GAPOTRLConfig.peer; docs/peers.md): DCPO's per-token bounds in TRL's clamp give
the loss, gradient and per-c diagnostic sums of the verl plugin's `dcpo` loss on the same tensors."""

import pytest
import torch

pytest.importorskip("trl", reason="trl is not installed: tests/trl_integration run in .venv-trl (make install-trl)")

from verl.workers.config import FSDPActorConfig  # noqa: E402

from gapo.integrations.trl import GROUP_SIZE_KEY, NUM_CORRECT_KEY, SUCCESS_KEY  # noqa: E402
from gapo.verl_plugin.config import GAPOPolicyLossConfig  # noqa: E402
from tests.test_gapo_loss import actor_config, call  # noqa: E402
from tests.trl_integration.test_trl_integration import (  # noqa: E402,F401 (fixtures: loss_trainer, tiny_model)
    EPS_LOW,
    EPS_MAX,
    K,
    loss_trainer,
    tiny_model,
    trl_args,
    trl_loss,
)


def _case():
    # 3 completions x 4 tokens, old probabilities from likely (0.9) to rare (0.02): DCPO's bounds differ token by
    # token; ratios 0.45-2.4 (below its dual clip's reach for A < 0); completion 2 has one padding token
    q = torch.tensor([[0.9, 0.02, 0.5, 0.1], [0.8, 0.05, 0.3, 0.6], [0.9, 0.5, 0.04, 0.7]])
    r = torch.tensor([[1.25, 2.4, 1.1, 0.9], [0.45, 1.8, 0.7, 1.3], [1.3, 0.6, 2.0, 1.0]])
    old = torch.log(q)
    new = old + torch.log(r)
    adv = torch.tensor([0.75, -0.25, -0.25])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.float32)
    stats = {NUM_CORRECT_KEY: torch.tensor([1.0, 1.0, 1.0]), GROUP_SIZE_KEY: torch.full((3,), float(K)),
             SUCCESS_KEY: torch.tensor([True, False, False])}
    return old, new, adv, mask, stats


def _as_peer(trainer, monkeypatch, peer, loss_type):
    """The module's trainer, token level, running `peer` with TRL's `loss_type`; its diagnostic sums cleared."""
    monkeypatch.setattr(trainer, "importance_sampling_level", "token")
    monkeypatch.setattr(trainer, "loss_type", loss_type)
    monkeypatch.setattr(trainer, "peer", peer)
    trainer._gapo_sums["train"].clear()
    return trainer


def _verl(loss_mode, agg, old, new, adv, mask, stats):
    """The verl plug-in's `loss_mode` on the same tensors (tests.test_gapo_loss.call): (loss, grad, its gapo_sums)."""
    config = FSDPActorConfig(strategy="fsdp2", rollout_n=K, ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2,
                             clip_ratio_low=EPS_LOW, clip_ratio_high=EPS_MAX, loss_agg_mode=agg,
                             policy_loss=GAPOPolicyLossConfig(loss_mode=loss_mode, eps_high_max=EPS_MAX))
    loss, grad, metrics = call(loss_mode, config, old, new, adv.unsqueeze(-1).expand_as(mask).contiguous(), mask,
                               stats[NUM_CORRECT_KEY], stats[GROUP_SIZE_KEY], stats[SUCCESS_KEY])
    sums = {key.split("/", 1)[1]: value for key, value in metrics.items() if key.startswith("gapo_sums/")}
    return loss, grad, metrics, sums


def _same_sums(trainer, verl_sums):
    for key, value in verl_sums.items():
        if not key.startswith("dual"):  # TRL has no dual clip
            assert trainer._gapo_sums["train"][key] == pytest.approx(value, abs=1e-5), key


def test_dcpo_through_trl_equals_the_verl_plugins_dcpo(loss_trainer, monkeypatch):  # noqa: F811
    trainer = _as_peer(loss_trainer, monkeypatch, "dcpo", "bnpo")  # TRL's bnpo == verl's token-mean
    old, new, adv, mask, stats = _case()
    loss, grad, _ = trl_loss(trainer, monkeypatch, old, new, adv, mask, stats)
    assert trainer.epsilon_high == EPS_MAX and trainer.epsilon_low == EPS_LOW  # restored after the loss
    ref_loss, ref_grad, ref, verl_sums = _verl("dcpo", "token-mean", old, new, adv, mask, stats)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)
    assert ref["actor/pg_clipfrac"] > 0 and (grad == 0).any() and (grad != 0).any()  # DCPO's bounds bind
    # and they are not the fixed clip's: verl's vanilla (0.2, 0.28) on the same tensors cuts other tokens
    _, fixed_grad, _ = call("vanilla", actor_config("vanilla", lo=EPS_LOW, hi=EPS_MAX, agg="token-mean", rollout_n=K),
                            old, new, adv.unsqueeze(-1).expand_as(mask).contiguous(), mask)
    assert not torch.equal(fixed_grad == 0, grad == 0)
    _same_sums(trainer, verl_sums)


def test_a_peer_trl_cannot_run_or_at_sequence_level_is_refused(tmp_path):
    with pytest.raises(ValueError, match="peer='cispo' is not a peer this TRL loss can run; choose one of dcpo, bapo"):
        trl_args(tmp_path, peer="cispo")
    with pytest.raises(ValueError, match="set importance_sampling_level='token'"):
        trl_args(tmp_path, peer="dcpo", importance_sampling_level="sequence")


def test_trls_own_sapo_as_a_peer_reports_the_diagnosed_verl_sums(loss_trainer, monkeypatch):  # noqa: F811
    # TRL's loss_type='sapo' and verl's sapo are the same rule at the same temperatures (1.0, 1.05) and aggregation
    # (per-sequence token means, then their mean): the loss, the gradient and verl's sapo_diagnosed sums agree
    trainer = _as_peer(loss_trainer, monkeypatch, "sapo", "sapo")
    old, new, adv, mask, stats = _case()
    loss, grad, _ = trl_loss(trainer, monkeypatch, old, new, adv, mask, stats)
    ref_loss, ref_grad, _, verl_sums = _verl("sapo_diagnosed", "seq-mean-token-mean", old, new, adv, mask, stats)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)
    assert verl_sums["c1/clipped"] > 0  # the gate removed some of the success's gradient
    _same_sums(trainer, verl_sums)


def test_sapo_needs_trls_sapo_loss_and_trls_sapo_needs_the_peer(tmp_path):
    with pytest.raises(ValueError, match="peer='sapo' is TRL's own SAPO loss: set loss_type='sapo'"):
        trl_args(tmp_path, peer="sapo")
    with pytest.raises(ValueError, match="run it as a peer with its diagnostics: peer='sapo'"):
        trl_args(tmp_path, loss_type="sapo")
    assert trl_args(tmp_path, peer="sapo", loss_type="sapo").peer == "sapo"


def test_bapo_through_trl_equals_the_verl_plugins_bapo(loss_trainer, monkeypatch):  # noqa: F811
    from gapo.peers.bapo import BAPOConfig, bapo_bounds

    trainer = _as_peer(loss_trainer, monkeypatch, "bapo", "bnpo")
    old, new, _, mask, stats = _case()
    adv = torch.tensor([0.75, -0.45, -0.45])  # failures weigh more: the walk moves, to (0.9, 2.25)
    per_token = adv.unsqueeze(-1).expand_as(mask).contiguous()
    low, high, _ = bapo_bounds(torch.exp(new - old), per_token, mask, BAPOConfig())
    assert (low.item(), high.item()) == pytest.approx((0.9, 2.25))
    loss, grad, _ = trl_loss(trainer, monkeypatch, old, new, adv, mask, stats)
    ref_loss, ref_grad, _, verl_sums = _verl("bapo", "token-mean", old, new, adv, mask, stats)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)
    _same_sums(trainer, verl_sums)


def test_bapo_settings_come_from_the_bapo_field_and_bad_ones_name_the_key(tmp_path):
    args = trl_args(tmp_path, peer="bapo", importance_sampling_level="token", bapo='{"bapo_rho": 0.6}')
    assert args.bapo.bapo_rho == 0.6 and args.to_dict()["bapo"]["bapo_upper_max"] == 3.0
    with pytest.raises(ValueError, match=r"bapo_rho=1.5: the positive share to reach"):
        trl_args(tmp_path, peer="bapo", importance_sampling_level="token", bapo={"bapo_rho": 1.5})
    with pytest.raises(ValueError, match=r"GAPOTRLConfig.bapo has unknown keys \['rho'\]; BAPO's settings are"):
        trl_args(tmp_path, peer="bapo", importance_sampling_level="token", bapo={"rho": 0.5})

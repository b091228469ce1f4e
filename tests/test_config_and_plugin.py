"""Config composition, start-up validation (bad configs fail with the key and the fix), plug-in registration."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from verl.utils.config import omega_conf_to_dataclass

from gapo.clip_diagnostics import diagnostics_from_sums
from gapo.verl_plugin.config import GAPOPolicyLossConfig
from gapo.verl_plugin.validate import GAPOConfigError, validate_gapo_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = str(ROOT / "configs")


def compose_cfg(name="gapo_trainer", overrides=()):
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        return compose(name, overrides=list(overrides))


def test_gapo_trainer_config_defaults():
    cfg = compose_cfg()
    actor = cfg.actor_rollout_ref.actor
    assert actor.policy_loss.loss_mode == "gapo" and cfg.trainer.v1.trainer_mode == "gapo"
    assert actor.loss_agg_mode == "seq-mean-token-mean" and cfg.algorithm.norm_adv_by_std_in_grpo is False
    assert cfg.data.train_batch_size // actor.ppo_mini_batch_size == 4  # several updates per rollout batch
    assert actor.clip_ratio_high == actor.policy_loss.eps_high_max  # fixed-clip baselines share the bound
    settings = omega_conf_to_dataclass(actor.policy_loss)
    assert isinstance(settings, GAPOPolicyLossConfig) and settings.schedule == "linear"
    validate_gapo_config(cfg)


def test_overrides_reach_the_dataclass():
    cfg = compose_cfg(overrides=["actor_rollout_ref.actor.policy_loss.schedule=exp",
                                 "actor_rollout_ref.actor.policy_loss.eps_high_max=0.01",
                                 "actor_rollout_ref.actor.policy_loss.success_threshold=0.9"])
    settings = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor.policy_loss)
    assert (settings.schedule, settings.eps_high_max, settings.success_threshold) == ("exp", 0.01, 0.9)
    assert cfg.actor_rollout_ref.actor.clip_ratio_high == 0.01


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["actor_rollout_ref.actor.policy_loss.eps_high_max=0.001"], r"eps_high_max \(0.001\) must be >= eps_low \(0.003\)"),
        (["actor_rollout_ref.actor.policy_loss.schedule=cosine"], "schedule='cosine' is not a GAPO schedule"),
        (["actor_rollout_ref.rollout.n=1"], r"rollout.n=1: GAPO needs groups of at least 2"),
        (["trainer.v1.trainer_mode=sync"], "needs the GAPO trainer.*trainer.v1.trainer_mode=gapo"),
        (["trainer.use_v1=false"], "needs the GAPO trainer"),
        (["actor_rollout_ref.actor.policy_loss._target_=verl.workers.config.PolicyLossConfig"], "GAPOPolicyLossConfig"),
    ],
)
def test_bad_configs_fail_naming_key_and_fix(overrides, match):
    with pytest.raises(GAPOConfigError, match=match):
        validate_gapo_config(compose_cfg(overrides=overrides))


def test_baseline_loss_modes_pass_through():
    validate_gapo_config(compose_cfg(overrides=["actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
                                                "trainer.v1.trainer_mode=sync"]))


def test_entry_point_rejects_bad_config_before_starting_ray():
    proc = subprocess.run(
        [sys.executable, "-m", "recipe.main_gapo", "actor_rollout_ref.actor.policy_loss.eps_high_max=0.001"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0
    assert "GAPO config error" in proc.stderr and "eps_high_max (0.001) must be >= eps_low" in proc.stderr
    assert "ray init kwargs" not in proc.stdout


def test_import_verl_alone_registers_the_losses_in_a_fresh_process():
    code = ("import verl\nfrom verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY as R\n"
            "import sys\nprint(R['gapo'].__module__, R['gapo_token'].__module__, 'datasets' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr
    # every process of a run imports verl, so the plug-in leaves verl's dataset stack (HF datasets, pandas: ~0.8 s)
    # to the first loss call (gapo.verl_plugin.losses.ppo_loss)
    assert proc.stdout.split() == ["gapo.verl_plugin.losses", "gapo.verl_plugin.losses", "False"]


def test_diagnostics_from_sums_are_exact_ratios_and_consume_the_sums():
    metrics = {"actor/gapo_sums/eps_high_sum": 0.5, "actor/gapo_sums/positive_rollouts": 2.0,
               "actor/gapo_sums/c1/clipped": 1.0, "actor/gapo_sums/c1/ratio_dev": 0.3, "actor/gapo_sums/c1/tokens": 4.0,
               "actor/gapo_sums/c1/rollouts": 1.0, "actor/gapo_sums/c1/advantage": 3.0,
               "actor/gapo_sums/c2/clipped": 0.0, "actor/gapo_sums/c2/ratio_dev": 0.0,
               "actor/gapo_sums/c2/tokens": 0.0, "actor/gapo_sums/c2/rollouts": 0.0,
               "actor/gapo_sums/c2/advantage": 0.0,
               "actor/pg_clipfrac": 0.1}
    out = diagnostics_from_sums(metrics)
    # one c present: the correlation is undefined, so only its level count is logged
    assert out == pytest.approx({"gapo/loss_eps_high_mean": 0.25, "gapo/clipfrac_pos/c1": 0.25,
                                 "gapo/ratio_dev_pos/c1": 0.075, "gapo/adv_pos/c1": 0.75, "gapo/is_adv_corr_levels": 1})
    assert metrics == {"actor/pg_clipfrac": 0.1}


@pytest.mark.parametrize("window", [0, -3, 2.5, True, "10"])
def test_bad_correlation_window_is_rejected_naming_key_and_fix(window):
    from gapo.config import GAPOConfig

    fix = r"policy_loss.diag_corr_window=.*integer >= 1.*actor_rollout_ref.actor.policy_loss.diag_corr_window=10"
    with pytest.raises(ValueError, match=fix):
        GAPOConfig(diag_corr_window=window)
    assert GAPOConfig().diag_corr_window == 10 and GAPOConfig(diag_corr_window=1).diag_corr_window == 1


def test_bad_correlation_window_in_the_training_config_fails_at_start_up():
    cfg = compose_cfg(overrides=["actor_rollout_ref.actor.policy_loss.diag_corr_window=0"])
    with pytest.raises(GAPOConfigError, match=r"diag_corr_window=0.*an integer >= 1"):
        validate_gapo_config(cfg)
    settings = omega_conf_to_dataclass(compose_cfg(overrides=["actor_rollout_ref.actor.policy_loss.diag_corr_window=3"])
                                       .actor_rollout_ref.actor.policy_loss)
    assert settings.diag_corr_window == 3


def test_gapo_trainer_keeps_verls_sync_semantics():
    """Any trainer mode but "sync" silently switches verl 0.9.1 to its async paths; GAPOTrainer must not."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

    from gapo.verl_plugin.trainer import GAPOTrainer

    cfg = compose_cfg("smoke_cpu")
    trainer = GAPOTrainer(cfg)  # builds the replay buffer, no Ray needed
    assert trainer.trainer_mode == "sync" and cfg.trainer.v1.trainer_mode == "gapo"  # the config is not rewritten
    assert type(trainer.replay_buffer) is ReplayBuffer and not isinstance(trainer.replay_buffer, ReplayBufferAsync)
    assert trainer.replay_buffer.gen_batch_size == cfg.data.train_batch_size  # not forced to 1
    # the is_adv_corr window is the trainer's, sized by the config
    assert trainer._is_adv_window.size == cfg.actor_rollout_ref.actor.policy_loss.diag_corr_window


def test_gapo_trainer_refuses_a_bad_config_before_building_anything():
    from gapo.verl_plugin.trainer import GAPOTrainer

    with pytest.raises(GAPOConfigError, match="rollout.n=1"):
        GAPOTrainer(compose_cfg("smoke_cpu", ["actor_rollout_ref.rollout.n=1"]))


def test_yaml_lists_every_gapo_knob_with_the_dataclass_default():
    """base/gapo.yaml repeats GAPOConfig's fields so that overrides need no '+'; the values must not drift."""
    import dataclasses

    from gapo.config import GAPOConfig

    node = compose_cfg().actor_rollout_ref.actor.policy_loss
    from gapo.peers.bapo import BAPOConfig

    for f in (*dataclasses.fields(GAPOConfig), *dataclasses.fields(BAPOConfig)):
        assert f.name in node, f"configs/base/gapo.yaml lacks policy_loss.{f.name}"
        if f.name != "eps_high_max":  # the paper's value for the default config, on purpose
            assert node[f.name] == f.default, f.name


def test_yaml_lists_every_exploration_knob_with_the_dataclass_default():
    """base/gapo.yaml's `exploration` group repeats ExplorationConfig's fields (overrides need no '+'); the coverage
    threshold is validation's, so moving one moves both."""
    import dataclasses

    from gapo.exploration import ExplorationConfig
    from gapo.verl_plugin.validate import exploration_settings

    cfg = compose_cfg()
    for f in dataclasses.fields(ExplorationConfig):
        assert f.name in cfg.exploration, f"configs/base/gapo.yaml lacks exploration.{f.name}"
        assert cfg.exploration[f.name] == f.default, f.name
    assert exploration_settings(cfg) == ExplorationConfig()
    moved = exploration_settings(compose_cfg(overrides=["trainer.val_coverage_threshold=0.2"]))
    assert moved.coverage_threshold == 0.2
    assert exploration_settings(compose_cfg("smoke_cpu")).entrance_tokens >= 1


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["exploration.entrance_tokens=0"], r"exploration.entrance_tokens=0: .*integer >= 1; set e.g. "
                                            r"exploration.entrance_tokens=8"),
        (["exploration.coverage_window=0"], r"exploration.coverage_window=0: .*set e.g. exploration.coverage_window=20"),
        (["exploration.coverage_threshold=1.0"], r"exploration.coverage_threshold=1.0: a solve rate in \[0, 1\)"),
        (["exploration.coverage_threshold=-0.5"], r"exploration.coverage_threshold=-0.5"),
        (["+exploration.entrance_tokns=4"], r"exploration.entrance_tokns is not a key.*exploration.entrance_tokens"),
        (["actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "exploration.coverage_window=-1"],
         r"exploration.coverage_window=-1"),  # baselines log the instruments too: checked for every loss mode
    ],
)
def test_bad_exploration_knobs_fail_at_start_naming_key_and_fix(overrides, match):
    with pytest.raises(GAPOConfigError, match=match):
        validate_gapo_config(compose_cfg(overrides=overrides))

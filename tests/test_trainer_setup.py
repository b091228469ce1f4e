"""GAPOTrainer's construction and start-up hook, against verl's real code (no Ray cluster).

- The config stays as the user wrote it (trainer.v1.trainer_mode=gapo, what verl logs), a second trainer can be
  built from it, and the trainer still runs verl's sync code paths (same replay buffer, gen_batch_size and
  TransferQueue behaviour as verl's own "sync" trainer built from the same config).
- `on_init_end` swaps in GAPO's actor loss only for GAPO loss modes; baselines keep the loss verl installed
  (which is verl's distillation loss when distillation is on). GAPO loss modes with distillation are refused.
"""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from gapo.verl_plugin.losses import GAPOActorLoss
from gapo.verl_plugin.trainer import GAPOTrainer
from gapo.verl_plugin.validate import GAPOConfigError, validate_gapo_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = str(ROOT / "configs")


def compose_cfg(name="smoke_cpu", overrides=()):
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        return compose(name, overrides=list(overrides))


@pytest.fixture(scope="module")
def smoke_files(tmp_path_factory):
    """The smoke preset's tiny model and a small task data set, for verl's tokenizer and dataloader setup."""
    from gapo.smoke.task import make_dataset
    from gapo.smoke.tiny_model import build_tiny_model

    out = tmp_path_factory.mktemp("smoke")
    model = build_tiny_model(out / "model")
    data = make_dataset(out / "data", n_train=32, n_val=8)
    return [f"actor_rollout_ref.model.path={model}", f"data.train_files={data['train']}",
            f"data.val_files={data['val']}", f"trainer.default_local_dir={out / 'checkpoints'}"]


def replay_buffer_settings(buffer) -> dict:
    """What a replay buffer was built with (its refill callback is bound to its own trainer)."""
    settings = {k: v for k, v in vars(buffer).items() if k != "refill_fn"}
    settings["trainer_config"] = OmegaConf.to_container(settings["trainer_config"]) \
        if OmegaConf.is_config(settings["trainer_config"]) else settings["trainer_config"]
    return settings


# --- 1. the live config is not rewritten ---------------------------------------------------------------------


def test_trainer_built_twice_from_one_config_leaves_it_as_the_user_wrote_it(smoke_files):
    cfg = compose_cfg(overrides=smoke_files)
    before = OmegaConf.to_container(cfg)
    trainers = [GAPOTrainer(cfg), GAPOTrainer(cfg)]  # the second one validates the config the first one saw
    assert OmegaConf.to_container(cfg) == before
    for trainer in trainers:
        assert trainer.config is cfg
        # what verl hands to its Tracking backends in fit() (wandb / mlflow / ... config)
        assert OmegaConf.to_container(trainer.config, resolve=True)["trainer"]["v1"]["trainer_mode"] == "gapo"
        assert trainer.trainer_mode == "sync" and trainer.replay_buffer.trainer_mode == "sync"


def test_trainer_runs_verls_sync_code_paths_exactly(smoke_files):
    """Same attributes, replay buffer and dataloader as verl's own sync trainer built from the same config."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    gapo_cfg = compose_cfg(overrides=smoke_files)
    sync_cfg = compose_cfg(overrides=[*smoke_files, "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
                                      "trainer.v1.trainer_mode=sync"])
    ours, verls = GAPOTrainer(gapo_cfg), PPOTrainerSync(sync_cfg)

    assert type(ours.replay_buffer) is ReplayBuffer is type(verls.replay_buffer)
    assert (ours.trainer_mode, ours.parameter_sync_step) == (verls.trainer_mode, verls.parameter_sync_step) == ("sync", 1)
    # the same, except the poll interval the CPU preset sets (trainer.v1.sampler.poll_interval; verl passes none)
    assert (ours.replay_buffer.poll_interval, verls.replay_buffer.poll_interval) == (0.05, 2.0)
    ours_settings = replay_buffer_settings(ours.replay_buffer)
    ours_settings["poll_interval"] = verls.replay_buffer.poll_interval
    assert ours_settings == replay_buffer_settings(verls.replay_buffer)
    assert ours.replay_buffer.gen_batch_size == gapo_cfg.data.train_batch_size  # not forced to 1

    # verl's own start-up steps that branch on the mode (init() -> _setup), run for real
    for trainer in (ours, verls):
        trainer._init_tokenizer()
        trainer._init_dataloader()
    assert gapo_cfg.data.get("gen_batch_size") is None  # async modes force data.gen_batch_size=1 here
    assert ours.train_dataloader.batch_size == verls.train_dataloader.batch_size == gapo_cfg.data.train_batch_size
    assert ours._reissue_inflight_prompts() == 0  # sync: no TransferQueue prompt recovery (TQ is not even up)
    assert OmegaConf.to_container(gapo_cfg, resolve=True)["trainer"]["v1"]["trainer_mode"] == "gapo"
    GAPOTrainer(gapo_cfg)  # still a valid GAPO config after verl's setup touched it


def test_rollout_skip_reads_the_same_parameter_sync_step(smoke_files, monkeypatch):
    """fit() hands the config to SkipManager, which reads trainer.v1.<config's mode>.parameter_sync_step."""
    from verl.utils.skip import SkipManager

    for name in ("config", "step", "skip_instances"):  # SkipManager keeps class-level state: restore it
        monkeypatch.setattr(SkipManager, name, getattr(SkipManager, name))
    cfg = compose_cfg(overrides=smoke_files)
    trainer = GAPOTrainer(cfg)
    SkipManager.init(trainer.config)
    assert SkipManager.skip_instances["rollout_tq"].parameter_sync_step == trainer.parameter_sync_step == 1


# --- 2. distillation keeps its loss; GAPO + distillation is refused ----------------------------------------


class Recorder:
    """Stands in for a Ray worker group / checkpoint manager: records the calls it gets."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args, **kwargs: self.calls.append((name, args, kwargs))


def run_on_init_end(cfg):
    trainer = GAPOTrainer(cfg)
    trainer.global_steps = 3
    trainer.actor_rollout_wg, trainer.checkpoint_manager = Recorder(), Recorder()
    trainer.on_init_end()
    # verl's sync hook still runs: the (resumed) weights go to the rollout replicas
    assert trainer.checkpoint_manager.calls == [("update_weights", (3,), {})]
    return trainer.actor_rollout_wg.calls


@pytest.mark.parametrize("loss_mode", ["gspo", "vanilla"])
@pytest.mark.parametrize("distillation", [False, True])
def test_baselines_keep_the_loss_verl_installed(smoke_files, loss_mode, distillation):
    cfg = compose_cfg(overrides=[*smoke_files, f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}",
                                 f"distillation.enabled={str(distillation).lower()}"])
    assert run_on_init_end(cfg) == []


@pytest.mark.parametrize("loss_mode", ["gapo", "gapo_token"])
def test_gapo_loss_modes_get_gapos_actor_loss(smoke_files, loss_mode):
    cfg = compose_cfg(overrides=[*smoke_files, f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}"])
    calls = run_on_init_end(cfg)
    assert [name for name, _, _ in calls] == ["set_loss_fn"]
    (loss_fn,), _ = calls[0][1], calls[0][2]
    assert isinstance(loss_fn, GAPOActorLoss) and loss_fn.config.policy_loss.loss_mode == loss_mode


@pytest.mark.parametrize("config_name", ["gapo_trainer", "smoke_cpu"])
@pytest.mark.parametrize("loss_mode", ["gapo", "gapo_token"])
def test_gapo_loss_with_distillation_is_refused_naming_keys_and_fix(config_name, loss_mode):
    cfg = compose_cfg(config_name, [f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}",
                                    "distillation.enabled=true"])
    for build in (validate_gapo_config, GAPOTrainer):
        with pytest.raises(GAPOConfigError) as err:
            build(cfg)
        message = str(err.value)
        assert f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}" in message
        assert "distillation.enabled=true" in message and "Set distillation.enabled=false" in message
        assert "non-GAPO loss_mode" in message


def test_baseline_with_distillation_passes_validation():
    validate_gapo_config(compose_cfg("gapo_trainer", ["actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
                                                      "distillation.enabled=true"]))


# --- the replay buffer's poll interval ------------------------------------------------------------------------


def test_poll_interval_unset_keeps_verls_and_set_replaces_it(smoke_files):
    unset = GAPOTrainer(compose_cfg(overrides=[*smoke_files, "~trainer.v1.sampler.poll_interval"]))
    assert unset.replay_buffer.poll_interval == 2.0  # verl's ReplayBuffer default, untouched
    assert GAPOTrainer(compose_cfg(overrides=[*smoke_files, "trainer.v1.sampler.poll_interval=0.3"])
                       ).replay_buffer.poll_interval == 0.3


@pytest.mark.parametrize("value", ["0", "-1", "nan", "100", "soon"])
@pytest.mark.parametrize("loss_mode", ["gapo", "gspo"])  # the trainer's knob: baselines are checked too
def test_bad_poll_intervals_are_refused_naming_the_key(value, loss_mode):
    cfg = compose_cfg("gapo_trainer", [f"trainer.v1.sampler.poll_interval={value}",
                                       f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}"])
    with pytest.raises(GAPOConfigError, match=r"trainer\.v1\.sampler\.poll_interval=.* a number in \(0, 60\]"):
        validate_gapo_config(cfg)

"""Every math and code experiment and baseline config composes with hydra and builds verl's config dataclasses."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import omega_conf_to_dataclass, validate_config

from gapo.verl_plugin.advantage import FocalAlgoConfig
from gapo.verl_plugin.config import GAPOPolicyLossConfig
from gapo.verl_plugin.validate import validate_gapo_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
EXPERIMENTS = sorted(f"{group}/{p.stem}" for group in ("math", "code") for p in (CONFIGS / group).glob("*.yaml"))
# later stages start from the previous stage's exported model: a mandatory value
NEEDS_MODEL = {"math/r1_1.5b_gapo_stage2_16k", "math/r1_1.5b_gapo_stage3_24k", "code/r1_1.5b_deepcoder_32k",
               "code/r1_1.5b_gapo_token_32k"}

# name -> (loss_mode, clip_ratio_low, clip_ratio_high, loss_agg_mode, adv_estimator, max_response_length)
EXPECTED = {
    "math/r1_1.5b_gapo": ("gapo", 7e-5, 3e-4, "seq-mean-token-mean", "grpo", 24576),
    "math/r1_1.5b_gapo_stage1_8k": ("gapo", 7e-5, 3e-4, "seq-mean-token-mean", "grpo", 8192),
    "math/r1_1.5b_gapo_stage2_16k": ("gapo", 7e-5, 3e-4, "seq-mean-token-mean", "grpo", 16384),
    "math/r1_1.5b_gapo_stage3_24k": ("gapo", 7e-5, 3e-4, "seq-mean-token-mean", "grpo", 24576),
    "math/r1_1.5b_gspo": ("gspo", 7e-5, 3e-4, "seq-mean-token-mean", "grpo", 24576),
    "math/r1_1.5b_gapo_constant": ("gapo", 7e-5, 3e-4, "seq-mean-token-mean", "grpo", 24576),
    "math/r1_1.5b_grpo": ("vanilla", 0.2, 0.2, "token-mean", "grpo", 24576),
    "math/r1_1.5b_dapo": ("vanilla", 0.2, 0.28, "token-mean", "grpo", 24576),
    "math/r1_1.5b_focal_gspo": ("gspo", 7e-5, 3e-4, "seq-mean-token-mean", "focal_grpo", 24576),
    "math/qwen_math_1.5b_gapo": ("gapo", 3e-3, 5e-3, "seq-mean-token-mean", "grpo", 3072),
    "math/qwen_math_1.5b_gspo": ("gspo", 3e-3, 5e-3, "seq-mean-token-mean", "grpo", 3072),
    "math/qwen_math_1.5b_gapo_token": ("gapo_token", 0.2, 0.28, "token-mean", "grpo", 3072),
    "math/llama3.2_3b_gapo": ("gapo", 3e-3, 5e-3, "seq-mean-token-mean", "grpo", 4096),
    "math/llama3.2_3b_gspo": ("gspo", 3e-3, 5e-3, "seq-mean-token-mean", "grpo", 4096),
    "code/r1_1.5b_deepcoder": ("vanilla", 0.2, 0.28, "token-mean", "grpo", 16384),
    "code/r1_1.5b_deepcoder_32k": ("vanilla", 0.2, 0.28, "token-mean", "grpo", 32768),
    "code/r1_1.5b_gapo_token": ("gapo_token", 0.2, 0.28, "token-mean", "grpo", 16384),
    "code/r1_1.5b_gapo_token_32k": ("gapo_token", 0.2, 0.28, "token-mean", "grpo", 32768),
}


def _compose(name, overrides=()):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose(name, overrides=list(overrides))


def test_every_config_file_is_covered():
    assert set(EXPERIMENTS) == set(EXPECTED)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_config_composes_and_builds_verl_dataclasses(name):
    cfg = _compose(name, ["actor_rollout_ref.model.path=/models/prev"] if name in NEEDS_MODEL else [])
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    algorithm = omega_conf_to_dataclass(cfg.algorithm)
    validate_gapo_config(cfg)
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))

    loss, lo, hi, agg, adv, resp = EXPECTED[name]
    assert isinstance(actor.policy_loss, GAPOPolicyLossConfig)
    assert (actor.policy_loss.loss_mode, actor.loss_agg_mode, algorithm.adv_estimator) == (loss, agg, adv)
    assert actor.clip_ratio_low == pytest.approx(lo) and actor.clip_ratio_high == pytest.approx(hi)
    assert cfg.data.max_response_length == resp
    # the paper's settings: k = 8, 256 prompts per rollout batch in mini-batches of 64, lr 1e-6,
    # no KL, no entropy bonus, no std normalisation, DeepScaleR's sampling temperature
    assert cfg.actor_rollout_ref.rollout.n == 8
    assert (cfg.data.train_batch_size, actor.ppo_mini_batch_size) == (256, 64)
    assert actor.optim.lr == 1e-6 and not actor.use_kl_loss and actor.entropy_coeff == 0
    assert not cfg.algorithm.use_kl_in_reward and cfg.algorithm.norm_adv_by_std_in_grpo is False
    assert cfg.actor_rollout_ref.rollout.temperature == 0.6
    assert cfg.reward.custom_reward_function.path == "pkg://gapo.rewards"
    assert cfg.trainer.experiment_name == name.split("/")[1] and cfg.trainer.v1.trainer_mode == "gapo"
    # dynamic batching packs by tokens: the longest sequence must fit one micro-batch
    assert actor.ppo_max_token_len_per_gpu >= cfg.data.max_prompt_length + cfg.data.max_response_length
    # DeepCoder's recipe: truncated responses masked (overlong filtering); R1-Distill needs </think>
    assert actor.policy_loss.mask_truncated is name.startswith("code/")
    if name.startswith("code/") or "/r1_" in name:
        assert cfg.reward.custom_reward_function.reward_kwargs.require_think is True
    if adv == "focal_grpo":
        assert isinstance(algorithm, FocalAlgoConfig) and algorithm.focal_gamma >= 0


@pytest.mark.parametrize("name", sorted(NEEDS_MODEL))
def test_later_stages_demand_the_previous_stage_model(name, monkeypatch):
    from omegaconf.errors import InterpolationResolutionError

    monkeypatch.delenv("GAPO_STAGE_INIT_MODEL", raising=False)
    with pytest.raises(InterpolationResolutionError, match="GAPO_STAGE_INIT_MODEL"):
        _ = _compose(name).actor_rollout_ref.model.path
    monkeypatch.setenv("GAPO_STAGE_INIT_MODEL", "/models/stage_prev")
    assert _compose(name).actor_rollout_ref.model.path == "/models/stage_prev"


# The README's GPU command and cluster shapes (1 x 8 and 4 x 8) with the default preset, and the CPU presets.
README_COMMAND = ["data.train_files=/data/train.parquet", "data.val_files=/data/val.parquet",
                  "actor_rollout_ref.model.path=/models/base"]


@pytest.mark.parametrize("nnodes", [1, 4])
@pytest.mark.parametrize("name", ["gapo_trainer", *EXPERIMENTS])
def test_gpu_presets_pass_verls_startup_validation_at_the_readme_cluster_shape(name, nnodes):
    cfg = _compose(name, [*README_COMMAND, "trainer.n_gpus_per_node=8", f"trainer.nnodes={nnodes}"])
    validate_gapo_config(cfg)
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert actor.use_dynamic_bsz  # the GPU path packs micro-batches by tokens
    assert actor.ppo_max_token_len_per_gpu >= cfg.data.max_prompt_length + cfg.data.max_response_length


def test_cpu_smoke_preset_passes_verls_startup_validation_with_dynamic_batches():
    cfg = _compose("smoke_cpu")
    validate_gapo_config(cfg)
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    # several micro-batches per mini-batch of 16 rollouts, as on GPUs
    assert actor.use_dynamic_bsz and actor.ppo_max_token_len_per_gpu < 16 * (cfg.data.max_prompt_length + 8)

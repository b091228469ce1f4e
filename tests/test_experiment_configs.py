"""Every math and code experiment and baseline config composes with hydra and builds verl's config dataclasses."""

import math
from pathlib import Path

import pytest
import torch
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
    "math/r1_1.5b_dcpo": ("dcpo", 0.2, 0.28, "token-mean", "grpo", 24576),
    "math/r1_1.5b_bapo": ("bapo", 7e-5, 3e-4, "token-mean", "grpo", 24576),
    "math/r1_1.5b_sapo": ("sapo_diagnosed", 7e-5, 3e-4, "seq-mean-token-mean", "grpo", 24576),
    "math/r1_1.5b_dppo_tv": ("dppo_tv_diagnosed", 0.15, 0.15, "token-mean", "grpo", 24576),
    "math/r1_1.5b_dppo_kl": ("dppo_kl_diagnosed", 0.05, 0.05, "token-mean", "grpo", 24576),
    "math/r1_1.5b_cispo": ("cispo_diagnosed", 1.0, 4.0, "token-mean", "grpo", 24576),
    "math/r1_1.5b_kl_cov": ("kl_cov_diagnosed", 7e-5, 3e-4, "token-mean", "grpo", 24576),
    "math/r1_1.5b_focal_gspo": ("gspo", 7e-5, 3e-4, "seq-mean-token-mean", "focal_grpo", 24576),
    "math/qwen_math_1.5b_gapo": ("gapo", 3e-3, 5e-3, "seq-mean-token-mean", "grpo", 3072),
    "math/qwen_math_1.5b_gspo": ("gspo", 3e-3, 5e-3, "seq-mean-token-mean", "grpo", 3072),
    "math/qwen_math_1.5b_gapo_token": ("gapo_token", 0.2, 0.28, "token-mean", "grpo", 3072),
    "math/qwen_math_1.5b_gapo_ehmax_3e-3": ("gapo", 3e-3, 3e-3, "seq-mean-token-mean", "grpo", 3072),
    "math/qwen_math_1.5b_gapo_ehmax_5.25e-3": ("gapo", 3e-3, 5.25e-3, "seq-mean-token-mean", "grpo", 3072),
    "math/qwen_math_1.5b_gapo_ehmax_7e-3": ("gapo", 3e-3, 7e-3, "seq-mean-token-mean", "grpo", 3072),
    "math/r1_1.5b_gspo_symmetric": ("gspo", 7e-5, 7e-5, "seq-mean-token-mean", "grpo", 24576),
    "math/r1_1.5b_drgrpo": ("vanilla", 0.2, 0.2, "seq-mean-token-sum-norm", "grpo", 24576),
    "math/r1_1.5b_focal_grpo": ("vanilla", 0.2, 0.2, "token-mean", "focal_grpo", 24576),
    "math/r1_1.5b_gapo_k4": ("gapo", 7e-5, 3e-4, "seq-mean-token-mean", "grpo", 24576),
    "math/r1_1.5b_gapo_k16": ("gapo", 7e-5, 3e-4, "seq-mean-token-mean", "grpo", 24576),
    "math/llama3.2_3b_gapo": ("gapo", 3e-3, 5e-3, "seq-mean-token-mean", "grpo", 4096),
    "math/llama3.2_3b_gspo": ("gspo", 3e-3, 5e-3, "seq-mean-token-mean", "grpo", 4096),
    "code/r1_1.5b_deepcoder": ("vanilla", 0.2, 0.28, "token-mean", "grpo", 16384),
    "code/r1_1.5b_deepcoder_32k": ("vanilla", 0.2, 0.28, "token-mean", "grpo", 32768),
    "code/r1_1.5b_gapo_token": ("gapo_token", 0.2, 0.28, "token-mean", "grpo", 16384),
    "code/r1_1.5b_gapo_token_32k": ("gapo_token", 0.2, 0.28, "token-mean", "grpo", 32768),
}
# (k, prompts per rollout batch, prompts per mini-batch) where not the paper's (8, 256, 64): the group-size
# ablation keeps 2048 rollouts per step in 4 mini-batches; the code runs use DeepCoder's layout (configs/deepcoder/)
LAYOUT = {
    "math/r1_1.5b_gapo_k4": (4, 512, 128),
    "math/r1_1.5b_gapo_k16": (16, 128, 32),
    "code/r1_1.5b_deepcoder": (8, 32, 16),
    "code/r1_1.5b_gapo_token": (8, 32, 16),
    "code/r1_1.5b_deepcoder_32k": (8, 128, 64),
    "code/r1_1.5b_gapo_token_32k": (8, 128, 64),
}


def _compose(name, overrides=()):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose(name, overrides=list(overrides))


def validate_for_verl(cfg):
    """GAPO's and verl's start-up validation of a composed config, and verl's actor and rollout dataclasses."""
    validate_gapo_config(cfg)
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    return omega_conf_to_dataclass(cfg.actor_rollout_ref.actor), omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)


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
    # no KL, no entropy bonus, no std normalisation (DeepCoder's recipe: std normalisation, its own batches),
    # DeepScaleR's sampling temperature
    k, prompts, mini = LAYOUT.get(name, (8, 256, 64))
    assert (cfg.actor_rollout_ref.rollout.n, cfg.data.train_batch_size, actor.ppo_mini_batch_size) == (k, prompts, mini)
    if name.startswith("math/"):  # every math run: 2048 rollouts per step, 4 updates per rollout batch
        assert (k * prompts, prompts // mini) == (2048, 4)
    assert actor.optim.lr == 1e-6 and not actor.use_kl_loss and actor.entropy_coeff == 0
    assert not cfg.algorithm.use_kl_in_reward
    assert cfg.algorithm.norm_adv_by_std_in_grpo is name.startswith("code/")
    assert cfg.actor_rollout_ref.rollout.temperature == 0.6
    assert cfg.reward.custom_reward_function.path == "pkg://gapo.rewards"
    assert cfg.trainer.experiment_name == name.split("/")[1] and cfg.trainer.v1.trainer_mode == "gapo"
    # dynamic batching packs by tokens: the longest sequence must fit one micro-batch
    assert actor.ppo_max_token_len_per_gpu >= cfg.data.max_prompt_length + cfg.data.max_response_length
    # DeepCoder's recipe: truncated responses masked (overlong filtering); R1-Distill needs </think>
    assert actor.policy_loss.mask_truncated is name.startswith("code/")
    if name.startswith("code/") or "/r1_" in name:
        assert cfg.reward.custom_reward_function.reward_kwargs.require_think is True
    if agg == "seq-mean-token-sum-norm":  # Dr.GRPO: one constant normaliser, the generation budget
        assert actor.loss_scale_factor == cfg.data.max_response_length
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


# Item: the token-level GAPO code runs are the DeepCoder baseline with GAPO's clip and nothing else.
CLIP_KEYS = {"actor_rollout_ref.actor.policy_loss.loss_mode"}  # vanilla (fixed clip) -> gapo_token (eps_high(c))
PREV = "actor_rollout_ref.model.path=/models/prev"


def _flat(node, prefix=""):
    if isinstance(node, dict):
        return {k: v for key, value in node.items() for k, v in _flat(value, f"{prefix}{key}.").items()}
    return {prefix[:-1]: node}


def _resolved(name, overrides):
    from omegaconf import OmegaConf

    return _flat(OmegaConf.to_container(_compose(name, overrides), resolve=True))


@pytest.mark.parametrize(("baseline", "gapo", "overrides"), [
    ("code/r1_1.5b_deepcoder", "code/r1_1.5b_gapo_token", []),
    ("code/r1_1.5b_deepcoder", "code/r1_1.5b_gapo_token", ["deepcoder=rllm_16k"]),
    ("code/r1_1.5b_deepcoder_32k", "code/r1_1.5b_gapo_token_32k", [PREV]),
    ("code/r1_1.5b_deepcoder_32k", "code/r1_1.5b_gapo_token_32k", [PREV, "deepcoder=rllm_32k"]),
])
def test_token_level_gapo_differs_from_the_deepcoder_baseline_only_in_the_clip(baseline, gapo, overrides):
    # under the same run name (the name also sets the checkpoint folder and the trace name)
    base = _resolved(baseline, overrides)
    ours = _resolved(gapo, [*overrides, f"trainer.experiment_name={base['trainer.experiment_name']}"])
    differ = {key for key in base.keys() | ours.keys() if base.get(key, "<absent>") != ours.get(key, "<absent>")}
    assert differ == CLIP_KEYS
    loss_mode = "actor_rollout_ref.actor.policy_loss.loss_mode"
    assert (base[loss_mode], ours[loss_mode]) == ("vanilla", "gapo_token")
    # the clip's numbers are shared: verl's fixed (0.2, 0.28) is GAPO's eps_high at c = 1 down to 0.2 at c = k
    for cfg in (base, ours):
        assert cfg["actor_rollout_ref.actor.clip_ratio_low"] == 0.2
        assert cfg["actor_rollout_ref.actor.clip_ratio_high"] == 0.28
        assert cfg["actor_rollout_ref.actor.policy_loss.eps_high_max"] == 0.28
    # DeepCoder's recipe: std-normalised group advantages, overlong filtering (not at rllm's later 32k stage)
    assert base["algorithm.norm_adv_by_std_in_grpo"] is True
    assert base["actor_rollout_ref.actor.policy_loss.mask_truncated"] is ("deepcoder=rllm_32k" not in overrides)


@pytest.mark.parametrize("name", ["code/r1_1.5b_deepcoder", "code/r1_1.5b_gapo_token"])
def test_deepcoder_runs_have_no_dual_clip_in_either_loss(name):
    """DeepCoder's released policy loss has no dual clip; verl's vanilla and gapo_token always apply one
    (clip_ratio_c): the resolved setting must leave a negative-advantage token at the largest ratio either loss
    can form (exp(20)) unclipped."""
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    from gapo.surrogate import token_clipped_surrogate

    actor = omega_conf_to_dataclass(_compose(name).actor_rollout_ref.actor)
    log_prob, old_log_prob = torch.tensor([[25.0]]), torch.tensor([[0.0]])  # log-ratio 25, clamped to 20
    advantages, mask = torch.tensor([[-1.0]]), torch.ones(1, 1)
    loss, metrics = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, mask, "token-mean", actor)
    torch.testing.assert_close(loss, torch.tensor(math.exp(20)))
    assert metrics["actor/pg_clipfrac_lower"] == 0
    terms = token_clipped_surrogate(log_prob, old_log_prob, advantages, mask, 0.2, 0.28, actor.clip_ratio_c)
    torch.testing.assert_close(terms.loss, torch.tensor([[math.exp(20)]]))
    assert terms.dual_clipped_tokens.sum() == 0
    # with verl's default the same token is capped at -A * 3: the setting is what turns the dual clip off
    default = token_clipped_surrogate(log_prob, old_log_prob, advantages, mask, 0.2, 0.28, 3.0)
    torch.testing.assert_close(default.loss, torch.tensor([[3.0]]))


PEERS = sorted(p.stem for p in (CONFIGS / "peer").glob("*.yaml"))


@pytest.mark.parametrize("base", ["learn_cpu", "smoke_cpu"])
@pytest.mark.parametrize("peer", PEERS)
def test_every_peer_goes_onto_the_cpu_tasks_and_validates(peer, base):
    # `make learn LEARN_ARGS="+peer=NAME"` (the real-model task) and `make smoke SMOKE_ARGS="+peer=NAME"`
    cfg = _compose(base, [f"+peer={peer}"])
    validate_gapo_config(cfg)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    math = omega_conf_to_dataclass(_compose(f"math/r1_1.5b_{peer}").actor_rollout_ref.actor)
    # the peer's own settings wherever it goes: those of its math row
    assert actor.policy_loss.loss_mode == math.policy_loss.loss_mode
    assert actor.loss_agg_mode == math.loss_agg_mode
    if peer not in ("bapo", "sapo", "kl_cov"):  # these use no clip_ratio_*: the base config's stay
        assert (actor.clip_ratio_low, actor.clip_ratio_high) == (math.clip_ratio_low, math.clip_ratio_high)


def test_each_peer_has_its_math_row_built_from_its_group_file_and_a_diagnosed_loss_mode():
    from gapo.peers import PEER_LOSS_MODES

    assert len(PEERS) == 7
    for peer in PEERS:
        row = CONFIGS / "math" / f"r1_1.5b_{peer}.yaml"
        assert f"- /peer/{peer} " in row.read_text(), row  # the math row takes the group's deltas, not a copy
        actor = omega_conf_to_dataclass(_compose(f"math/r1_1.5b_{peer}").actor_rollout_ref.actor)
        assert actor.policy_loss.loss_mode in PEER_LOSS_MODES, (peer, actor.policy_loss.loss_mode)

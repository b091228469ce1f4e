"""GPU readiness checked here by composition: the one-GPU and 8-GPU-per-node presets and `make gpu-check`'s runs pass
verl's own config validation, the preflight accepts the cluster shapes they ask for (and refuses smaller ones), and
the gpu-check report computes what it prints from a run's metrics."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from gapo.verl_plugin.preflight import PreflightError, check_cluster_gpus
from recipe import gpu_check
from tests.test_experiment_configs import CONFIGS, validate_for_verl


def _compose(name, overrides=()):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose(name, overrides=list(overrides))


def _nodes(count, gpus):
    return [{"Alive": True, "Resources": {"GPU": float(gpus)}} for _ in range(count)]


@pytest.mark.parametrize("experiment, preset, nnodes", [
    ("math/r1_1.5b_gapo", "gpu_8", 1),
    ("math/r1_1.5b_gapo", "gpu_8", 4),
    ("math/r1_1.5b_gspo", "gpu_8", 2),
    ("code/r1_1.5b_gapo_token", "gpu_8", 2),
    ("math/qwen_math_1.5b_gapo", "gpu_1", 1),
    ("code/r1_1.5b_gapo_token", "gpu_1", 1),
])
def test_gpu_presets_pass_verls_validation_at_their_shape(experiment, preset, nnodes):
    overrides = [f"platform={preset}", f"trainer.nnodes={nnodes}"]
    cfg = _compose(experiment, overrides)
    per_node = 8 if preset == "gpu_8" else 1
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node, cfg.trainer.device) == (nnodes, per_node, "cuda")
    assert cfg.actor_rollout_ref.rollout.name == "vllm"
    actor, rollout = validate_for_verl(cfg)
    assert rollout.tensor_model_parallel_size == 1 and 0 < rollout.gpu_memory_utilization < 1
    # verl splits every mini-batch over the ranks: it must divide (the validation above checked it; say it here)
    world = nnodes * per_node
    assert actor.ppo_mini_batch_size * cfg.actor_rollout_ref.rollout.n % world == 0
    check_cluster_gpus(cfg, nodes=_nodes(nnodes, per_node), available={"GPU": float(world)}, resource="GPU")
    short = _nodes(nnodes - 1, per_node) + _nodes(1, per_node - 1)  # one GPU missing on the last node
    with pytest.raises(PreflightError, match=f"{world} GPUs requested, but the Ray cluster has {world - 1}"):
        check_cluster_gpus(cfg, nodes=short, available={"GPU": float(world - 1)}, resource="GPU")


def test_the_one_gpu_preset_offloads_the_optimizer_and_shares_less_with_vllm():
    one, eight = (_compose("math/qwen_math_1.5b_gapo", [f"platform={p}"]) for p in ("gpu_1", "gpu_8"))
    assert one.actor_rollout_ref.actor.fsdp_config.optimizer_offload is True
    assert eight.actor_rollout_ref.actor.fsdp_config.optimizer_offload is False
    assert one.actor_rollout_ref.rollout.gpu_memory_utilization < eight.actor_rollout_ref.rollout.gpu_memory_utilization


@pytest.mark.parametrize("method", list(gpu_check.METHODS))
def test_gpu_check_runs_pass_verls_validation(method):
    cfg = _compose("smoke_cpu", [*gpu_check.GPU_OVERRIDES, *gpu_check.METHODS[method]])
    actor, rollout = validate_for_verl(cfg)
    assert actor.policy_loss.loss_mode == method and rollout.name == "vllm"
    assert cfg.trainer.device == "cuda" and cfg.trainer.n_gpus_per_node == 1
    assert cfg.actor_rollout_ref.model.override_config.get("attn_implementation") is None  # flash-attention, not eager
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs is True  # the log-prob gap it prints


def test_gpu_check_refuses_to_start_without_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "gpu_names", lambda: [])
    with pytest.raises(SystemExit) as err:
        gpu_check.main(["--steps", "3"])
    assert "no NVIDIA GPU here" in str(err.value) and "make smoke" in str(err.value)
    with pytest.raises(SystemExit):
        gpu_check.main(["--steps", "1"])
    assert "--steps must be at least 2" in capsys.readouterr().err


def _metrics(step_times, gap=1e-3, per_c=True):
    return {s: {"timing_s/step": t, "training/rollout_probs_diff_max": gap * s, "training/rollout_probs_diff_mean": gap,
                **({"gapo/clipfrac_pos/c2": 0.1} if per_c else {})}
            for s, t in enumerate(step_times, start=1)}


def test_gpu_check_report_leaves_the_first_step_out_and_compares_the_methods():
    gapo = gpu_check.method_report(_metrics([90.0, 2.0, 4.0]), peak_mib=40960)
    gspo = gpu_check.method_report(_metrics([80.0, 2.0, 2.0], per_c=False), peak_mib=39000)
    assert gapo["step_s_after_first"] == 3.0 and gapo["first_step_s"] == 90.0
    assert gapo["logp_gap_max"] == pytest.approx([1e-3, 2e-3, 3e-3])
    verdict = gpu_check.compare({"gapo": gapo, "gspo": gspo})
    assert verdict == {"step_time_ratio_gapo_over_gspo": 1.5, "problems": []}
    text = gpu_check.format_report({"gapo": gapo, "gspo": gspo}, verdict)
    assert "GAPO / GSPO step time: 1.500" in text and "40.0" in text
    # GAPO without its per-c diagnostics, and a run without the log-prob gap, are problems
    broken = gpu_check.method_report({s: {"timing_s/step": 1.0} for s in (1, 2)}, peak_mib=0)
    problems = gpu_check.compare({"gapo": broken, "gspo": gspo})["problems"]
    assert any("gapo/clipfrac_pos" in p for p in problems) and any("rollout_probs_diff_max" in p for p in problems)
    with pytest.raises(gpu_check.SmokeCheckError, match="at least 2 logged steps"):
        gpu_check.method_report(_metrics([1.0]), peak_mib=0)

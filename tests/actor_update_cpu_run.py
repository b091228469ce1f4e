"""Helper of tests/test_actor_update_on_cpu.py: GAPO inside verl's real FSDP actor update on CPU, without Ray.

Run in a fresh process with the CPU platform's env vars (VERL_PLATFORM=cpu, VERL_ENGINE_DEVICE=cuda) and a
world of one (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): ``python tests/actor_update_cpu_run.py MODEL_DIR``.

It builds verl's actor exactly as the trainer's workers do (``ActorRolloutRefWorker(role="actor").init_model()``:
TrainingWorker + FSDP2 engine + optimizer), installs ``GAPOActorLoss`` with ``set_loss_fn`` as the GAPO trainer
does, and runs single-mini-batch actor updates (``update_actor`` -> ``train_mini_batch`` -> ``train_batch``) on a
hand-built batch in the legacy trainer's format (left/right padded, turned into no-padding by verl's
``left_right_2_no_padding``). Each case:

1. scores the batch with the actor (``compute_log_prob``) and sets old_log_probs = current - DELTA on every
   response token, so every rollout has the same (sequence and token) ratio exp(DELTA) in the update;
2. gives every rollout a positive advantage; half come from c = 1 groups, half from c = k - 1 groups (k = 8);
3. runs one actor update and scores the batch again, to see whether the weights moved.

Prints one line ``RESULT <json>`` with, per case, the worker's output metrics, the per-c clip fractions and
whether the log-probs moved; then the error raised by updates that lack GAPO's per-rollout fields.
"""

from __future__ import annotations

import json
import math
import sys
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

K = 8  # group size (rollout.n)
EPS_LOW = 0.02  # actor.clip_ratio_low
EPS_HIGH_MAX = 0.3  # upper clip at c = 1; linear schedule gives 0.02 + 0.28 / 7 = 0.06 at c = k - 1 = 7
DELTA = math.log(1.15)  # ratio 1.15: inside c = 1's bound (1.3), outside c = 7's (1.06)
BATCH = 8  # 4 rollouts with c = 1, 4 with c = 7
MICRO = 4  # two micro-batches per mini-batch: the per-c sums must survive verl's metric aggregation
LR = 1e-3


def compose_config(model_dir: str, overrides=()):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        return compose(
            "smoke_cpu",
            overrides=[
                f"actor_rollout_ref.model.path={model_dir}",
                f"actor_rollout_ref.rollout.n={K}",
                f"actor_rollout_ref.actor.clip_ratio_low={EPS_LOW}",
                f"actor_rollout_ref.actor.policy_loss.eps_high_max={EPS_HIGH_MAX}",
                "actor_rollout_ref.actor.entropy_coeff=0",
                # prompts per mini-batch: 1 x k rollouts = BATCH, so the whole batch is one optimizer step
                f"actor_rollout_ref.actor.ppo_mini_batch_size={BATCH // K}",
                f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
                f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={BATCH}",
                f"actor_rollout_ref.actor.optim.lr={LR}",
                # No weight decay: a step whose gradient is exactly zero (everything clipped) leaves weights as they are.
                "actor_rollout_ref.actor.optim.weight_decay=0",
                "actor_rollout_ref.actor.optim.total_training_steps=100",
                *overrides,
            ],
        )


def make_batch(vocab_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Left-padded prompts, right-padded responses of varying lengths (the rollout's padded layout)."""
    g = torch.Generator().manual_seed(seed)
    prompt_len, response_len = 6, 5
    p_lens = torch.tensor([6, 3, 5, 4, 6, 4, 3, 5])
    r_lens = torch.tensor([5, 4, 3, 5, 2, 5, 4, 3])
    prompts = torch.zeros(BATCH, prompt_len, dtype=torch.long)
    responses = torch.zeros(BATCH, response_len, dtype=torch.long)
    p_mask = torch.zeros(BATCH, prompt_len, dtype=torch.long)
    r_mask = torch.zeros(BATCH, response_len, dtype=torch.long)
    for i in range(BATCH):
        prompts[i, prompt_len - p_lens[i]:] = torch.randint(4, vocab_size, (int(p_lens[i]),), generator=g)
        p_mask[i, prompt_len - p_lens[i]:] = 1
        responses[i, : r_lens[i]] = torch.randint(4, vocab_size, (int(r_lens[i]),), generator=g)
        r_mask[i, : r_lens[i]] = 1
    attention_mask = torch.cat([p_mask, r_mask], dim=1)
    position_ids = torch.clamp(attention_mask.cumsum(-1) - 1, min=0)
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": r_mask,
    }


def to_worker_input(fields: dict[str, torch.Tensor], **meta):
    """verl's legacy trainer path: padded TensorDict -> no-padding (nested) TensorDict plus meta info."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    td = tu.get_tensordict({k: v.clone() for k, v in fields.items()})
    td = left_right_2_no_padding(td)
    tu.assign_non_tensor(td, **meta)
    return td


def current_log_probs(worker, fields) -> torch.Tensor:
    """(B, R) log-probs of the responses under the actor now, via the worker's compute_log_prob."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    td = to_worker_input(fields, calculate_entropy=False, compute_loss=False, temperature=1.0)
    out = worker.compute_log_prob(td)
    return no_padding_2_padding(tu.get(out, "log_probs"), td).float() * fields["response_mask"]


def update(worker, fields, num_correct=None):
    """One actor update (one mini-batch, two micro-batches) on `fields`; returns the worker's metrics."""
    from verl.utils import tensordict_utils as tu

    batch = dict(fields)
    if num_correct is not None:
        batch["gapo_num_correct"] = num_correct
        batch["gapo_group_size"] = torch.full((BATCH,), float(K))
    td = to_worker_input(
        batch, calculate_entropy=False, distillation_use_topk=False, distillation_only=False,
        global_batch_size=BATCH, mini_batch_size=BATCH, epochs=1, seed=0,
        dataloader_kwargs={"shuffle": True}, compute_loss=True, temperature=1.0,
    )
    return tu.get(worker.update_actor(td), "metrics")


def plain(value):
    """A metric value as a float (verl returns lists of per-mini-batch values)."""
    if isinstance(value, list):
        assert len(value) == 1, value
        value = value[0]
    return float(value.item() if hasattr(value, "item") else value)


def run_case(worker, model_dir, fields, num_correct, loss_overrides) -> dict:
    """Install GAPOActorLoss for these policy-loss settings, shift the ratios, update, report."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.py_functional import rename_dict

    from gapo.verl_plugin.losses import GAPOActorLoss
    from gapo.verl_plugin.trainer import diagnostics_from_sums

    cfg = compose_config(model_dir, [f"actor_rollout_ref.actor.policy_loss.{k}={v}" for k, v in loss_overrides.items()])
    actor_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)  # as GAPOTrainer.on_init_end builds it
    worker.set_loss_fn(GAPOActorLoss(actor_config))

    mask = fields["response_mask"]
    before = current_log_probs(worker, fields)
    case_fields = dict(fields)
    case_fields["old_log_probs"] = (before - DELTA) * mask
    case_fields["advantages"] = 0.875 * mask.float()  # (k - c) / k of a correct rollout; positive for all
    metrics = {k: plain(v) for k, v in update(worker, case_fields, num_correct).items()}
    after = current_log_probs(worker, fields)

    # What the trainer does with the worker's metrics: verl's "actor/" prefix, then GAPO's per-c ratios.
    diagnostics = diagnostics_from_sums(rename_dict(dict(metrics), "actor/"))
    c1, c7 = num_correct == 1, num_correct == K - 1
    return {
        "metrics": metrics,
        "diagnostics": diagnostics,
        "config": {"loss_mode": actor_config.policy_loss.loss_mode, "schedule": actor_config.policy_loss.schedule,
                   "eps_high_max": actor_config.policy_loss.eps_high_max, "clip_ratio_low": actor_config.clip_ratio_low,
                   "rollout_n": actor_config.rollout_n},
        "max_abs_logprob_change": {
            "c1": float((after - before)[c1].abs().max()),
            "c7": float((after - before)[c7].abs().max()),
        },
    }


def expect_error(fn) -> dict:
    try:
        fn()
    except Exception as err:  # noqa: BLE001  the test asserts on the type and message
        chain, e = [], err
        while e is not None:  # the loss's error, possibly wrapped by verl
            chain.append({"type": type(e).__name__, "message": str(e)})
            e = e.__cause__ or e.__context__
        return {"raised": True, "chain": chain, "traceback": traceback.format_exc()[-3000:]}
    return {"raised": False}


def main(model_dir: str) -> None:
    import torch.distributed as dist
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.engine_workers import ActorRolloutRefWorker

    from gapo.smoke.tiny_model import VOCAB_SIZE
    from gapo.verl_plugin.losses import GAPOActorLoss

    torch.manual_seed(0)
    cfg = compose_config(model_dir)
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor")
    worker.init_model()  # TrainingWorker -> FSDP2 engine; installs verl's default ppo_loss
    assert dist.get_backend() == "gloo" and dist.get_world_size() == 1
    engine = worker.actor.engine

    fields = make_batch(VOCAB_SIZE)
    num_correct = torch.tensor([1.0, 7.0] * (BATCH // 2))  # interleaved: both kinds in every micro-batch
    result = {
        "engine": f"{type(engine).__module__}.{type(engine).__name__}",
        "module": type(engine.module).__name__,
        "delta_ratio": math.exp(DELTA),
        "cases": {},
    }
    # Order matters for the "weights did not move" check: the all-clipped case runs first, on a fresh
    # optimizer (Adam's moments are still zero, so a zero gradient is an exact no-op step).
    result["cases"]["constant_narrow"] = run_case(
        worker, model_dir, fields, num_correct, {"schedule": "constant", "eps_high_max": 0.06})
    result["cases"]["gapo_linear"] = run_case(worker, model_dir, fields, num_correct, {"schedule": "linear"})
    result["cases"]["gapo_token_linear"] = run_case(
        worker, model_dir, fields, num_correct, {"schedule": "linear", "loss_mode": "gapo_token"})
    result["cases"]["constant_wide"] = run_case(worker, model_dir, fields, num_correct, {"schedule": "constant"})

    # Updates without GAPO's per-rollout fields.
    shifted = dict(fields, old_log_probs=current_log_probs(worker, fields) - DELTA,
                   advantages=fields["response_mask"].float())
    worker.set_loss_fn(GAPOActorLoss(omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)))
    result["missing_fields_gapo_loss_fn"] = expect_error(lambda: update(worker, shifted))
    # verl's own loss fn (what init_model installs when the GAPO trainer does not replace it), loss_mode=gapo.
    worker.actor.set_loss_fn(worker.loss_fn)
    result["missing_fields_verl_loss_fn"] = expect_error(lambda: update(worker, shifted))
    print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])

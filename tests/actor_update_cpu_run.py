"""Helper of tests/test_actor_update_on_cpu.py: GAPO inside verl's real FSDP actor update on CPU, without Ray.

Run in a fresh process with the CPU platform's env vars (VERL_PLATFORM=cpu, VERL_ENGINE_DEVICE=cuda) and a
world of one (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): ``python tests/actor_update_cpu_run.py MODEL_DIR``.

It builds verl's actor exactly as the trainer's workers do (``ActorRolloutRefWorker(role="actor").init_model()``:
TrainingWorker + FSDP2 engine + optimizer), installs ``GAPOActorLoss`` with ``set_loss_fn`` as the GAPO trainer
does, and runs real actor updates (``update_actor`` -> ``train_mini_batch`` -> ``train_batch``) on hand-built
batches in the legacy trainer's format (left/right padded, turned into no-padding by verl's
``left_right_2_no_padding``). The worker's metrics go through what the trainer does with them (verl's
``rename_dict(..., "actor/")`` and ``reduce_metrics``, then GAPO's ``diagnostics_from_sums``).

Two kinds of cases:

* Behaviour (one worker, lr 1e-3, one mini-batch of 8 rollouts in two micro-batches): every rollout has the
  same ratio 1.15 (old_log_probs = current - DELTA) and a positive advantage; half come from c = 1 groups, half
  from c = 7 groups (k = 8). Reports the metrics and whether the weights moved. Then updates that lack GAPO's
  per-rollout fields, which must fail.
* Exact diagnostics (``ROWS``: distinct c, success, advantage, ratio and lengths per rollout; lr = 0 so no
  update can move a ratio; two mini-batches of 4 rollouts, in order): one worker per micro-batching
  variant (``VARIANTS``: fixed micro-batches, dynamic batch size with 1 and 4 micro-batches, remove-padding),
  each with loss modes gapo and gapo_token. The loss callable is wrapped to record each micro-batch's rows
  and the raw values it returned, so the test can compare verl's aggregation with a hand computation.

Prints one line ``RESULT <json>``.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import traceback
from pathlib import Path
from typing import NamedTuple

import torch

ROOT = Path(__file__).resolve().parents[1]

K = 8  # group size (rollout.n)
EPS_LOW = 0.02  # actor.clip_ratio_low
EPS_HIGH_MAX = 0.3  # upper clip at c = 1; linear schedule gives 0.02 + 0.28 / 7 = 0.06 at c = k - 1 = 7

# --- behaviour cases ---------------------------------------------------------------------------------------
DELTA = math.log(1.15)  # ratio 1.15: inside c = 1's bound (1.3), outside c = 7's (1.06)
BATCH = 8  # 4 rollouts with c = 1, 4 with c = 7
MICRO = 4  # two micro-batches per mini-batch
LR = 1e-3


# --- exact-diagnostics cases -------------------------------------------------------------------------------
class Row(NamedTuple):
    prompt_len: int
    response_len: int
    num_correct: int  # c of the rollout's group
    success: bool
    advantage: float
    ratio: float  # the update sees exactly this (sequence and token) ratio: lr = 0


ROWS = (
    # mini-batch 1: short rollouts, 3 tokens each (one dynamic micro-batch of 12 tokens)
    Row(2, 1, 1, True, 0.875, 1.25),  # c = 1 bound 1.30: not clipped
    Row(1, 2, 3, True, 0.625, 1.25),  # c = 3 bound 1.22: clipped
    Row(2, 1, 5, True, 0.375, 1.10),  # c = 5 bound 1.14: not clipped
    Row(1, 2, 3, False, -0.375, 1.30),  # failure, A < 0: eps_low; ratio above 1 is not clipped for A < 0
    # mini-batch 2: long rollouts, 10 tokens each (four dynamic micro-batches)
    Row(4, 6, 1, True, 0.875, 1.35),  # c = 1 bound 1.30: clipped
    Row(3, 7, 7, True, 0.125, 1.10),  # c = 7 bound 1.06: clipped
    Row(5, 5, 5, True, 0.375, 1.20),  # c = 5 bound 1.14: clipped
    Row(2, 8, 2, False, 0.1, 1.10),  # failure with A > 0 (partial credit): eps_low (1.02), clipped; c = 2's 1.26 would not
)
EXACT_MINI_BATCH = 4  # rollouts per mini-batch: ROWS make two, in order (dataloader shuffle off)
EXACT_MICRO = 2  # fixed micro-batch size
EXACT_MAX_TOKENS = 12  # dynamic: mini-batch 1 (4 x 3 tokens) fits one micro-batch, mini-batch 2 (4 x 10) needs four
VARIANTS = {
    "fixed": ["actor_rollout_ref.actor.use_dynamic_bsz=false",
              f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={EXACT_MICRO}"],
    "dynamic": ["actor_rollout_ref.actor.use_dynamic_bsz=true",
                f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={EXACT_MAX_TOKENS}"],
    # packed sequences (no attention mask, position ids restart per sequence), with dynamic batch sizes
    "remove_padding": ["actor_rollout_ref.model.use_remove_padding=true",
                       "actor_rollout_ref.actor.use_dynamic_bsz=true",
                       f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={EXACT_MAX_TOKENS}"],
}
EXACT_LOSS_MODES = ("gapo", "gapo_token")


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


def build_worker(model_dir: str, overrides=()):
    """verl's actor worker as the trainer builds it: TrainingWorker -> FSDP2 engine; installs verl's ppo_loss."""
    from verl.workers.engine_workers import ActorRolloutRefWorker

    cfg = compose_config(model_dir, overrides)
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor")
    worker.init_model()
    return worker, cfg


def padded_batch(prompt_lens, response_lens, vocab_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Left-padded prompts, right-padded responses of the given lengths (the rollout's padded layout)."""
    g = torch.Generator().manual_seed(seed)
    n, prompt_len, response_len = len(prompt_lens), max(prompt_lens), max(response_lens)
    prompts = torch.zeros(n, prompt_len, dtype=torch.long)
    responses = torch.zeros(n, response_len, dtype=torch.long)
    p_mask = torch.zeros(n, prompt_len, dtype=torch.long)
    r_mask = torch.zeros(n, response_len, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        prompts[i, prompt_len - p:] = torch.randint(4, vocab_size, (p,), generator=g)
        p_mask[i, prompt_len - p:] = 1
        responses[i, :r] = torch.randint(4, vocab_size, (r,), generator=g)
        r_mask[i, :r] = 1
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


def make_batch(vocab_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """The behaviour cases' batch: 8 rollouts of assorted lengths."""
    return padded_batch([6, 3, 5, 4, 6, 4, 3, 5], [5, 4, 3, 5, 2, 5, 4, 3], vocab_size, seed)


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


def update(worker, fields, mini_batch_size=BATCH) -> dict:
    """One actor update of `fields` in mini-batches of `mini_batch_size` rollouts, taken in order (as
    `_update_actor` with actor.shuffle=false); returns the worker's raw metrics (per-mini-batch lists)."""
    from verl.utils import tensordict_utils as tu

    td = to_worker_input(
        fields, calculate_entropy=False, distillation_use_topk=False, distillation_only=False,
        global_batch_size=mini_batch_size, mini_batch_size=mini_batch_size, epochs=1, seed=0,
        dataloader_kwargs={"shuffle": False}, compute_loss=True, temperature=1.0,
    )
    return tu.get(worker.update_actor(td), "metrics")


def _floats(value):
    if isinstance(value, list):
        return [_floats(v) for v in value]
    return float(value.item() if hasattr(value, "item") else value)


def trainer_view(worker_metrics: dict) -> tuple[dict, dict]:
    """What GAPOTrainer._update_actor does with the worker's metrics (verl's trainer_base._update_actor, then
    diagnostics_from_sums): returns (reduced metrics with the raw sums still in, diagnostics)."""
    from verl.utils.metric import reduce_metrics
    from verl.utils.py_functional import rename_dict

    from gapo.clip_diagnostics import diagnostics_from_sums

    output = rename_dict(dict(worker_metrics), "actor/")
    if "actor/mfu" in output:
        output["perf/mfu/actor"] = output.pop("actor/mfu")
    reduced = {k: float(v) for k, v in reduce_metrics(output).items()}
    return reduced, diagnostics_from_sums(dict(reduced))


class RecordingLoss:
    """Wraps the actor's loss callable; records each call (one per micro-batch) and what it returned."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = []

    def __call__(self, model_output, data, dp_group=None):
        loss, metrics = self.inner(model_output, data, dp_group)
        values = {k: (v.values if hasattr(v, "values") else v) for k, v in metrics.items()}
        self.calls.append({
            "rows": [int(r) for r in data["test_row_id"].tolist()],
            "metrics": {k: _floats(v[0] if isinstance(v, list) and len(v) == 1 else v) for k, v in values.items()
                        if k.startswith("gapo_sums/") or k in ("actor/pg_clipfrac", "actor/ppo_kl")},
            "aggregation": {k: str(getattr(v, "aggregation", None)) for k, v in metrics.items()},
        })
        return loss, metrics


def run_case(worker, model_dir, fields, num_correct, loss_overrides) -> dict:
    """Behaviour case: install GAPOActorLoss for these policy-loss settings, shift the ratios, update, report."""
    from verl.utils.config import omega_conf_to_dataclass

    from gapo.verl_plugin.losses import GAPOActorLoss

    cfg = compose_config(model_dir, [f"actor_rollout_ref.actor.policy_loss.{k}={v}" for k, v in loss_overrides.items()])
    actor_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)  # as GAPOTrainer.on_init_end builds it
    worker.set_loss_fn(GAPOActorLoss(actor_config))

    mask = fields["response_mask"]
    before = current_log_probs(worker, fields)
    case_fields = dict(fields)
    case_fields["old_log_probs"] = (before - DELTA) * mask
    case_fields["advantages"] = 0.875 * mask.float()  # (k - c) / k of a correct rollout; positive for all
    case_fields["gapo_num_correct"] = num_correct
    case_fields["gapo_group_size"] = torch.full((BATCH,), float(K))
    case_fields["gapo_success"] = torch.ones(BATCH)  # every rollout is a success with A > 0
    worker_metrics = update(worker, case_fields)
    after = current_log_probs(worker, fields)

    metrics, diagnostics = trainer_view(worker_metrics)
    c1, c7 = num_correct == 1, num_correct == K - 1
    return {
        "worker_metrics": {k: _floats(v) for k, v in worker_metrics.items()},
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


def exact_fields(vocab_size: int) -> dict[str, torch.Tensor]:
    """ROWS as a padded batch plus each rollout's advantage, group statistics and row id (no ratios yet)."""
    fields = padded_batch([r.prompt_len for r in ROWS], [r.response_len for r in ROWS], vocab_size, seed=1)
    mask = fields["response_mask"].float()
    fields["advantages"] = torch.tensor([r.advantage for r in ROWS]).unsqueeze(-1) * mask
    fields["gapo_num_correct"] = torch.tensor([float(r.num_correct) for r in ROWS])
    fields["gapo_group_size"] = torch.full((len(ROWS),), float(K))
    fields["gapo_success"] = torch.tensor([float(r.success) for r in ROWS])
    fields["test_row_id"] = torch.arange(len(ROWS), dtype=torch.float32)  # lets the recorder name the rows
    return fields


def run_exact(worker, cfg, fields, loss_mode) -> dict:
    """Exact case: ratios set per row, lr = 0; two mini-batches; records every loss call."""
    from verl.utils.config import omega_conf_to_dataclass

    from gapo.verl_plugin.losses import GAPOActorLoss

    actor_cfg = copy.deepcopy(cfg.actor_rollout_ref.actor)  # the worker keeps its own config untouched
    actor_cfg.policy_loss.loss_mode = loss_mode
    actor_config = omega_conf_to_dataclass(actor_cfg)
    recorder = RecordingLoss(GAPOActorLoss(actor_config))
    worker.set_loss_fn(recorder)

    mask = fields["response_mask"]
    before = current_log_probs(worker, fields)
    deltas = torch.tensor([math.log(r.ratio) for r in ROWS]).unsqueeze(-1)
    case_fields = dict(fields, old_log_probs=(before - deltas) * mask)
    worker_metrics = update(worker, case_fields, mini_batch_size=EXACT_MINI_BATCH)
    after = current_log_probs(worker, fields)
    metrics, diagnostics = trainer_view(worker_metrics)
    return {
        "worker_metrics": {k: _floats(v) for k, v in worker_metrics.items()},
        "metrics": metrics,
        "diagnostics": diagnostics,
        "calls": recorder.calls,
        "config": {"loss_mode": actor_config.policy_loss.loss_mode, "schedule": actor_config.policy_loss.schedule,
                   "eps_high_max": actor_config.policy_loss.eps_high_max, "clip_ratio_low": actor_config.clip_ratio_low,
                   "rollout_n": actor_config.rollout_n, "lr": actor_config.optim.lr,
                   "use_dynamic_bsz": actor_config.use_dynamic_bsz,
                   "ppo_max_token_len_per_gpu": actor_config.ppo_max_token_len_per_gpu,
                   "ppo_micro_batch_size_per_gpu": actor_config.ppo_micro_batch_size_per_gpu,
                   "use_remove_padding": bool(cfg.actor_rollout_ref.model.use_remove_padding)},
        "max_abs_logprob_change": float((after - before).abs().max()),
        "log_probs": before.tolist(),
    }


def run_variant(model_dir, name, fields) -> dict:
    """One worker (lr = 0) per micro-batching variant, both loss modes; errors are reported, not raised."""
    try:
        worker, cfg = build_worker(model_dir, ["actor_rollout_ref.actor.optim.lr=0", *VARIANTS[name]])
        engine = worker.actor.engine
        out = {"engine_use_remove_padding": bool(getattr(engine, "use_remove_padding", False)), "modes": {}}
        for mode in EXACT_LOSS_MODES:
            out["modes"][mode] = run_exact(worker, cfg, fields, mode)
        return out
    except Exception as err:  # noqa: BLE001  the test fails on it, with the traceback
        return {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:]}


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

    from gapo.smoke.tiny_model import VOCAB_SIZE
    from gapo.verl_plugin.losses import GAPOActorLoss

    torch.manual_seed(0)
    worker, cfg = build_worker(model_dir)
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

    # Updates without (some of) GAPO's per-rollout fields.
    shifted = dict(fields, old_log_probs=current_log_probs(worker, fields) - DELTA,
                   advantages=fields["response_mask"].float())
    worker.set_loss_fn(GAPOActorLoss(omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)))
    result["missing_fields_gapo_loss_fn"] = expect_error(lambda: update(worker, shifted))
    no_success = dict(shifted, gapo_num_correct=num_correct, gapo_group_size=torch.full((BATCH,), float(K)))
    result["missing_success_gapo_loss_fn"] = expect_error(lambda: update(worker, no_success))
    # verl's own loss fn (what init_model installs when the GAPO trainer does not replace it), loss_mode=gapo.
    worker.actor.set_loss_fn(worker.loss_fn)
    result["missing_fields_verl_loss_fn"] = expect_error(lambda: update(worker, shifted))

    # Exact diagnostics over two mini-batches, per micro-batching variant.
    exact = exact_fields(VOCAB_SIZE)
    result["exact"] = {name: run_variant(model_dir, name, exact) for name in VARIANTS}
    print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])

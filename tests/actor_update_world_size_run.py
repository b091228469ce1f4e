"""Helper of tests/test_world_size.py: one optimizer step of verl's real FSDP actor at world size 1 or 2, no Ray.

Run once per rank, in fresh processes with the CPU platform's env vars and a torch.distributed world
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): ``python tests/actor_update_world_size_run.py MODEL_DIR OUT_DIR``.

Every rank builds verl's actor as the trainer's workers do (``ActorRolloutRefWorker(role="actor").init_model()``,
FSDP2 over gloo) with plain SGD (the weight change is -lr * gradient, so a gradient scaled or weighted wrongly
shows in the weights; AdamW's first step would hide a uniform scale) and no gradient clipping, and runs one
``update_actor`` over its shard of the batch as verl's dispatch gives it: rank r holds rows
[r * B / W, (r + 1) * B / W) of the batch, and the mini-batch is the whole batch (``mini_batch_size`` = B, the
global count, as verl's trainer passes it), so the step is one optimizer step over all B rows.
Dynamic batch sizes are on with a small token budget: the ranks hold different numbers of tokens (rank 0 the
short rollouts, rank 1 the long ones); rank 0's would fit one micro-batch, rank 1's need several, and verl gives
both ranks the same count (an all-reduce MAX).

Batches (``VARIANTS``): ``full`` (the 16 rows of ``ROWS``), ``real14`` (rows 7 and 15 left out) and ``padded``
(the same 14 rows with a padding row in the place of each, built as verl's padding_utils builds one: a single
response token with an empty response mask, zero advantage, its own group of c = 0). Loss modes (``MODES``): GAPO
at sequence level (seq-mean-token-mean), at token level (token-mean), and verl's own gspo loss (the fixed-clip
baseline; verl's loss callable, not GAPO's).

Writes OUT_DIR/rank{r}.json (the trainer's view of the worker's metrics, the loss calls' row ids and raw sums) and,
on rank 0, OUT_DIR/{mode}-{variant}.pt with the full weights before and after the step.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.actor_update_cpu_run import (  # noqa: E402  (the same builders as the world-size-1 harness)
    EPS_HIGH_MAX,
    EPS_LOW,
    K,
    RecordingLoss,
    Row,
    compose_config,
    current_log_probs,
    padded_batch,
    to_worker_input,
    trainer_view,
)

ROWS = (
    # rank 0's half at world size 2: short responses (1-3 tokens)
    Row(3, 2, 1, True, 0.875, 1.20),  # c = 1 bound 1.30: not clipped
    Row(2, 3, 2, True, 0.750, 1.30),  # c = 2 bound 1.26: clipped
    Row(4, 1, 3, True, 0.625, 1.15),  # c = 3 bound 1.22: not clipped
    Row(2, 2, 3, False, -0.375, 0.90),  # failure, A < 0: lower bound 0.98, clipped
    Row(3, 3, 5, True, 0.375, 1.18),  # c = 5 bound 1.14: clipped
    Row(1, 2, 6, True, 0.250, 1.05),  # c = 6 bound 1.10: not clipped
    Row(2, 1, 7, False, -0.875, 1.10),  # failure, A < 0, ratio above 1: not clipped
    Row(3, 2, 1, True, 0.875, 1.35),  # c = 1 bound 1.30: clipped
    # rank 1's half: long responses (7-12 tokens)
    Row(5, 9, 2, True, 0.750, 1.10),  # c = 2 bound 1.26: not clipped
    Row(4, 10, 5, True, 0.375, 1.12),  # c = 5 bound 1.14: not clipped
    Row(6, 8, 7, True, 0.125, 1.08),  # c = 7 bound 1.06: clipped
    Row(3, 11, 4, False, -0.500, 0.95),  # failure, A < 0: clipped below 0.98
    Row(5, 7, 3, True, 0.625, 1.25),  # c = 3 bound 1.22: clipped
    Row(2, 12, 6, True, 0.250, 1.02),  # c = 6 bound 1.10: not clipped
    Row(4, 9, 1, False, 0.100, 1.05),  # failure with A > 0 (partial credit): eps_low, clipped above 1.02
    Row(6, 10, 4, True, 0.500, 1.16),  # c = 4 bound 1.18: not clipped
)
LEFT_OUT = (7, 15)  # the real14 / padded variants drop these (one per half, so the halves stay equal)
PAD = -1  # row id of a padding row
VARIANTS = {
    "full": list(range(len(ROWS))),
    "real14": [i for i in range(len(ROWS)) if i not in LEFT_OUT],
    "padded": [PAD if i in LEFT_OUT else i for i in range(len(ROWS))],
}
MODES = {  # loss mode -> its aggregation (the recipe's: configs/base/gapo.yaml, configs/code/*)
    "gapo": "seq-mean-token-mean",
    "gapo_token": "token-mean",
    "gspo": "seq-mean-token-mean",
}
LR = 1.0  # SGD: the weight change is the gradient itself (the tiny model's gradients are ~1e-3)
MAX_TOKENS = 40  # dynamic batch size budget per micro-batch (prompt + response tokens): rank 0's 36 fit one, rank 1's
# 111 need several, and verl splits rank 0's into as many (at world size 2)
OVERRIDES = [
    "actor_rollout_ref.actor.optim.optimizer=SGD",
    f"actor_rollout_ref.actor.optim.lr={LR}",
    "actor_rollout_ref.actor.optim.weight_decay=0",
    "actor_rollout_ref.actor.optim.clip_grad=1e9",  # a clipped gradient norm would hide a wrongly scaled gradient
    "actor_rollout_ref.actor.use_dynamic_bsz=true",
    f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={MAX_TOKENS}",
]


def batch_fields(row_ids: list[int], vocab_size: int) -> dict[str, torch.Tensor]:
    """The rows (padding rows where PAD) as a padded batch with advantages, GAPO's group fields and row ids.
    Tokens depend on the row only (its own generator), so a row is the same in every variant and on every rank."""
    parts = []
    for i in row_ids:
        row = ROWS[i] if i != PAD else Row(4, 1, 0, False, 0.0, 1.0)
        part = padded_batch([row.prompt_len], [row.response_len], vocab_size, seed=100 + i)
        mask = part["response_mask"].float()
        if i == PAD:  # verl's padding row: a response token that takes no part in the loss
            part["response_mask"] = torch.zeros_like(part["response_mask"])
            mask = mask * 0
        part["advantages"] = row.advantage * mask
        part["gapo_num_correct"] = torch.tensor([float(row.num_correct)])
        part["gapo_group_size"] = torch.tensor([float(K if i != PAD else len(LEFT_OUT))])
        part["gapo_success"] = torch.tensor([float(row.success)])
        part["test_row_id"] = torch.tensor([float(i)])
        parts.append(part)
    return _stack(parts)


def _stack(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Concatenate single-row batches: prompts left-padded, responses right-padded to the longest."""
    prompt_len = max(p["prompts"].shape[1] for p in parts)
    response_len = max(p["responses"].shape[1] for p in parts)

    def left(t, width):
        return torch.nn.functional.pad(t, (width - t.shape[1], 0))

    def right(t, width):
        return torch.nn.functional.pad(t, (0, width - t.shape[1]))

    out = {}
    for key in parts[0]:
        if key == "prompts":
            out[key] = torch.cat([left(p[key], prompt_len) for p in parts])
        elif key in ("responses", "response_mask", "advantages"):
            out[key] = torch.cat([right(p[key], response_len) for p in parts])
        elif key in ("input_ids", "attention_mask"):  # prompt part left-padded, response part right-padded
            out[key] = torch.cat([torch.cat([left(p[key][:, :p["prompts"].shape[1]], prompt_len),
                                             right(p[key][:, p["prompts"].shape[1]:], response_len)], 1)
                                  for p in parts])
        elif key == "position_ids":
            continue
        else:
            out[key] = torch.cat([p[key] for p in parts])
    out["position_ids"] = torch.clamp(out["attention_mask"].cumsum(-1) - 1, min=0)
    return out


class GlobalInfoRecorder(RecordingLoss):
    """RecordingLoss that also keeps the global batch information verl hands each micro-batch's loss."""

    def __call__(self, model_output, data, dp_group=None):
        out = super().__call__(model_output, data, dp_group)
        self.calls[-1]["global"] = {key: _plain(data[key]) for key in ("dp_size", "batch_num_tokens",
                                                                       "global_batch_size")}
        return out


def _plain(value):
    value = getattr(value, "data", value)  # NonTensorData
    return value.item() if hasattr(value, "item") else value


def full_weights(worker) -> dict[str, torch.Tensor]:
    """The actor's full (unsharded) parameters; a collective: every rank calls it."""
    state = worker.actor.engine.module.state_dict()
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone().float() for k, v in state.items()}


def run_case(model_dir: str, mode: str, variant: str, rank: int, world: int, out_dir: Path) -> dict:
    from omegaconf import open_dict
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl.workers.utils.losses import ppo_loss

    from gapo.smoke.tiny_model import VOCAB_SIZE
    from gapo.verl_plugin.losses import GAPOActorLoss

    cfg = compose_config(model_dir, [*OVERRIDES, f"actor_rollout_ref.actor.policy_loss.loss_mode={mode}",
                                     f"actor_rollout_ref.actor.loss_agg_mode={MODES[mode]}"])
    with open_dict(cfg):
        cfg.actor_rollout_ref.actor.optim.total_training_steps = 10
    torch.manual_seed(0)
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor")
    worker.init_model()
    actor_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    if mode.startswith("gapo"):
        inner = GAPOActorLoss(actor_config)
    else:  # the baseline: verl's own ppo_loss (what init_model installs), called as GAPOActorLoss calls it
        def inner(model_output, data, dp_group=None):
            return ppo_loss(actor_config, model_output, data, dp_group)
    recorder = GlobalInfoRecorder(inner)
    worker.set_loss_fn(recorder)

    rows = VARIANTS[variant]
    per_rank = len(rows) // world
    local = rows[rank * per_rank:(rank + 1) * per_rank]  # verl's dispatch: contiguous chunks per dp rank
    fields = batch_fields(local, VOCAB_SIZE)
    mask = fields["response_mask"]
    before_lp = current_log_probs(worker, fields)
    deltas = torch.tensor([math.log(ROWS[i].ratio) if i != PAD else 0.0 for i in local]).unsqueeze(-1)
    fields["old_log_probs"] = (before_lp - deltas) * mask
    weights_before = full_weights(worker)
    td = to_worker_input(
        fields, calculate_entropy=False, distillation_use_topk=False, distillation_only=False,
        global_batch_size=len(rows), mini_batch_size=len(rows), epochs=1, seed=0,
        dataloader_kwargs={"shuffle": False}, compute_loss=True, temperature=1.0,
    )
    output = worker.update_actor(td)
    worker_metrics = tu.get(output, "metrics") if output is not None else None
    weights_after = full_weights(worker)
    if rank == 0:
        torch.save({"before": weights_before, "after": weights_after}, out_dir / f"{mode}-{variant}.pt")
    result = {"rows": local, "calls": recorder.calls}
    if worker_metrics is not None:
        metrics, diagnostics = trainer_view(worker_metrics)
        result.update(metrics=metrics, diagnostics=diagnostics)
    del worker
    return result


def main(model_dir: str, out_dir: str) -> None:
    import torch.distributed as dist

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    results = {f"{mode}-{variant}": run_case(model_dir, mode, variant, rank, world, out)
               for mode in MODES for variant in VARIANTS}
    assert dist.get_backend() == "gloo" and dist.get_world_size() == world
    (out / f"rank{rank}.json").write_text(json.dumps({"world_size": world, "cases": results}))
    print(f"RESULT rank {rank} of {world}: {len(results)} cases", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

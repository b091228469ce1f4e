"""VIGOR inside verl's sync v1 trainer: the start-up checks, and the replay-buffer wrapper that runs the rounds.

Switched on by the top-level `vigor` config group (`vigor=enabled`; knobs in configs/vigor/disabled.yaml, defaults
in `gapo.vigor.VigorConfig`), read only by `GAPOTrainer`. A step then runs as verl's sync step, except inside
`replay_buffer.sample(partition_id="train")` (verl's "gen" timer):

  round 0   GAPOTrainer.prepare_step submitted the batch's P prompts with `__rollout_n__ = m0` each (verl's agent
            loop reads a per-prompt rollout count from that field); verl's buffer returns their m0 * P rollouts.
  round t   `gapo.vigor.plan_round` ranks the active prompts by the variance of all their rewards so far (`rm_scores`,
            computed by verl's reward loop workers inside the agent loop, so they exist before the buffer returns)
            and gives the kept ones `extra` more rollouts: they are submitted again under the prompt uid
            `{uid}.r{t}` (a new TransferQueue prompt key: the same uid would overwrite the earlier sessions' keys
            `{uid}_{session}_{index}`, and verl groups keys by the part before the first "_") with
            `__rollout_n__ = extra`, and verl's buffer returns them.
  merge     every round's keys and tags form one batch, ordered by prompt (verl's mini-batches cut it in order:
            `VigorSampler._merge` says why); the per-sample `uid` field of the later rounds' rollouts
            is rewritten to the prompt's own uid, so verl's GRPO advantage (groups by the `uid` field) and GAPO's
            group statistics see one group per prompt of its real size k (m0 + its extras), not rollout.n.
The schedule spends exactly n * P rollouts per step (`gapo.vigor`), so verl's mini-batch arithmetic
(ppo_mini_batch_size * rollout.n samples) holds. Validation (partition "val") is verl's, untouched.

Refused at start-up (`vigor_settings`), each naming its key: VIGOR outside GAPO's trainer; DAPO group filtering
(`algorithm.filter_groups.enable`) and `trainer.v1.sampler.sync_refill_failed_groups` (verl's buffer would refill
evicted or failed groups of ANY round with NEW dataloader prompts through `refill_fn`, which breaks the schedule's
budget and its prompt set); a custom sampler; `trainer.v1.sync.parameter_sync_step` != 1 (later rounds of a second
sub-batch would sample from updated weights); verl's rollout skip (`skip.rollout_tq.enable`); a colocated reward
model (`reward.reward_model.enable` without `enable_resource_pool`: rewards exist only after sampling, so rounds
could not rank prompts). Rollout failures: a prompt whose round-0 sessions all failed has no reward and is left
out of the ranking (it keeps what it got); the rounds still spend exactly the budget over the other prompts.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from collections import Counter, defaultdict
from typing import Callable, Optional, Sequence

import torch
import transfer_queue as tq
from omegaconf import DictConfig, OmegaConf
from transfer_queue import KVBatchMeta
from verl.utils import tensordict_utils as tu
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from gapo.config_names import unknown_key
from gapo.groups import session_final_rows
from gapo.vigor import (
    CONFIG_PREFIX,
    ROLLOUT_N_KEY,
    TIE_DECIMALS,
    VigorAllocator,
    VigorConfig,
    group_variance,
    kept_counts,
    round_budgets,
)

logger = logging.getLogger(__name__)

ROLLOUT_N_FIELD = "__rollout_n__"  # verl's agent loop: per-prompt rollout count (agent_loop_tq.py, _run_prompt)
ROUND_UID_SEP = ".r"  # round t's prompt uid: f"{uid}.r{t}"; no "_" (verl splits TransferQueue keys on it)
STATE_FILE = "vigor_state.json"  # global_step_N/vigor_state.json: the allocator's random state
TRAIN_PARTITION = "train"


class VigorConfigError(ValueError):
    """A config VIGOR cannot run with; the message names the key and the fix."""


def vigor_settings(config: DictConfig) -> Optional[VigorConfig]:
    """The `vigor` group as a validated VigorConfig when VIGOR is on, else None.

    Raises VigorConfigError naming the key for an unknown or bad knob, m0 > rollout.n, or a setting VIGOR cannot
    compose with (module docstring)."""
    node = config.get(CONFIG_PREFIX, None)
    if node is None:
        return None
    knobs = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
    if not isinstance(knobs, dict):
        raise VigorConfigError(f"{CONFIG_PREFIX}={knobs!r} must be a mapping of VIGOR's knobs (configs/vigor/)")
    known = [f.name for f in dataclasses.fields(VigorConfig)]
    unknown = sorted(set(knobs) - set(known))
    if unknown:
        raise VigorConfigError(unknown_key(f"{CONFIG_PREFIX}.{unknown[0]}", known, "a VIGOR knob"))
    n = config.actor_rollout_ref.rollout.n
    try:
        cfg = VigorConfig(**knobs)  # checks every knob (gapo.vigor.FIELD_RULES), off or on
        if cfg.enable:
            cfg.validate(n)  # and m0 <= rollout.n, which matters only when VIGOR runs
    except ValueError as err:
        raise VigorConfigError(str(err)) from None
    if not cfg.enable:
        return None
    on = f"{CONFIG_PREFIX}.enable=true"
    trainer_mode = config.trainer.v1.get("trainer_mode", "sync")
    if not config.trainer.get("use_v1", True) or trainer_mode != "gapo":
        raise VigorConfigError(f"{on} runs inside GAPO's trainer, but trainer.v1.trainer_mode={trainer_mode} "
                               f"(trainer.use_v1={config.trainer.get('use_v1', True)}): set trainer.use_v1=true "
                               "trainer.v1.trainer_mode=gapo (any loss_mode works), or vigor.enable=false")
    filter_groups = config.algorithm.get("filter_groups", None) or {}
    if filter_groups.get("enable", False):
        raise VigorConfigError(f"{on} cannot be combined with DAPO group filtering (algorithm.filter_groups.enable="
                               "true): verl's replay buffer would evict groups of any round and refill them with new "
                               "prompts, breaking VIGOR's budget; set algorithm.filter_groups.enable=false")
    sampler = config.trainer.v1.get("sampler", None) or {}
    if sampler.get("sync_refill_failed_groups", False):
        raise VigorConfigError(f"{on} cannot be combined with trainer.v1.sampler.sync_refill_failed_groups=true: "
                               "verl would replace a failed group of any round with a new dataloader prompt; set it "
                               "to false (failed sessions are then left out, as verl does by default)")
    custom = sampler.get("custom_sampler", None) or {}
    if custom.get("path") and custom.get("name"):
        raise VigorConfigError(f"{on} wraps verl's own sync replay buffer; trainer.v1.sampler.custom_sampler is set "
                               f"({custom.get('path')}:{custom.get('name')}): unset it or vigor.enable=false")
    sync_step = (config.trainer.v1.get("sync", None) or {}).get("parameter_sync_step", 1)
    if sync_step != 1:
        raise VigorConfigError(f"{on} needs trainer.v1.sync.parameter_sync_step=1 (got {sync_step}): with several "
                               "updates per batch, later rounds would sample from weights updated in between")
    skip = (config.get("skip", None) or {}).get("rollout_tq", None) or {}
    if skip.get("enable", False):
        raise VigorConfigError(f"{on} cannot replay dumped rollouts (skip.rollout_tq.enable=true): the rounds "
                               "depend on fresh rewards; set skip.rollout_tq.enable=false")
    reward_model = config.reward.get("reward_model", None) or {}
    if reward_model.get("enable", False) and not reward_model.get("enable_resource_pool", False):
        raise VigorConfigError(
            f"{on} needs rewards while rolling out, but the reward model is colocated (reward.reward_model.enable="
            "true, reward.reward_model.enable_resource_pool=false): verl then scores rollouts only after sampling. "
            "Set reward.reward_model.enable_resource_pool=true, use a rule-based reward, or vigor.enable=false")
    return cfg


def max_group_size(num_prompts: int, n: int, cfg: VigorConfig) -> int:
    """The largest group the schedule can give when every prompt is ranked: m0 + sum_t ceil(b_t / K_t).

    Rollout failures can exceed it (fewer prompts ranked); the trainer grows the loss's table then."""
    budgets = round_budgets(num_prompts, n, cfg)
    kept = kept_counts(num_prompts, cfg)
    return cfg.m0 + sum(math.ceil(b / k) for b, k in zip(budgets[1:], kept))


def round_uid(uid: str, round_index: int) -> str:
    """The TransferQueue prompt uid of round t's extra rollouts, `{uid}.r{t}` (inverse: `base_uid`)."""
    return f"{uid}{ROUND_UID_SEP}{round_index}"


def base_uid(prompt_key: str) -> str:
    """The prompt's own uid from a round uid `{uid}.r{t}` (or the uid itself)."""
    head, sep, tail = prompt_key.rpartition(ROUND_UID_SEP)
    return head if sep and tail.isdigit() else prompt_key


def session_rewards(keys: Sequence[str], scores: Sequence[float]) -> dict[str, list[float]]:
    """{prompt key: sequence rewards of its sessions' final outputs, by session id} from verl's
    `{prompt}_{session}_{index}` keys (the outputs verl's GRPO advantage groups)."""
    final = session_final_rows(keys)
    by_prompt: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for row, key in enumerate(keys):
        if final[row] == row:
            prompt, session, _ = str(key).rsplit("_", 2)
            by_prompt[prompt].append((int(session), float(scores[row])))
    return {p: [s for _, s in sorted(v)] for p, v in by_prompt.items()}


def allocation_metrics(group_sizes: Sequence[int], rounds: Sequence[dict]) -> dict[str, float]:
    """`vigor/*` metrics of one step: final group sizes (histogram `vigor/group_size/k{k}` = prompts with k rollouts,
    min/mean/max) and per round t (0 = the m0 round) what `rounds[t]` holds (prompts, rollouts, gen_s, ties...)."""
    sizes = list(group_sizes)
    out = {"vigor/prompts": float(len(sizes))}
    if sizes:
        out.update({"vigor/group_size/min": float(min(sizes)), "vigor/group_size/max": float(max(sizes)),
                    "vigor/group_size/mean": sum(sizes) / len(sizes)})
        out.update({f"vigor/group_size/k{k}": float(c) for k, c in sorted(Counter(sizes).items())})
    out["vigor/rollouts"] = float(sum(r["rollouts"] for r in rounds))
    for t, r in enumerate(rounds):
        out.update({f"vigor/round{t}/{name}": float(value) for name, value in r.items()})
    return out


def source_metrics(sources: Sequence[str], round0: Sequence[Sequence[float]], final: Sequence[Sequence[float]],
                   kept_round1: Optional[set[int]]) -> dict[str, float]:
    """Per data_source counts of one step, `vigor/source/{source}/{name}` (counts, so that a report can sum them
    over steps and divide; a per-step fraction of 1-3 prompts would be noise):

        prompts, rollouts (their final group sizes summed),
        dropped_round1      prompts not kept in round 1 (they end with m0 rollouts),
        flat_round0         prompts whose m0 first rewards are all equal (variance 0: 0/2 or 2/2 for binary ones),
        flat_round0_dropped of those, the ones dropped in round 1 (for a hard prompt, VIGOR's starvation),
        flat_final          prompts whose final rewards are all equal (no group-relative advantage, no gradient).

    `kept_round1`: the prompts kept in round 1 (None: round 1 did not run, every prompt kept its m0 rollouts).
    """
    def flat(rewards: Sequence[float]) -> bool:  # all equal, as the schedule's ties compare variances
        return bool(rewards) and round(group_variance(rewards), TIE_DECIMALS) == 0

    out: Counter = Counter()
    for p, source in enumerate(sources):
        flat0 = flat(round0[p])
        dropped = kept_round1 is None or p not in kept_round1
        prefix = f"vigor/source/{source}/"
        out[prefix + "prompts"] += 1
        out[prefix + "rollouts"] += len(final[p])
        out[prefix + "dropped_round1"] += int(dropped)
        out[prefix + "flat_round0"] += int(flat0)
        out[prefix + "flat_round0_dropped"] += int(flat0 and dropped)
        out[prefix + "flat_final"] += int(flat(final[p]))
    return {key: float(value) for key, value in out.items()}


class VigorSampler:
    """verl's sync replay buffer with VIGOR's rounds in `sample` for the training partition (module docstring).

    Everything else (validation's sampling, attributes) is the wrapped buffer's."""

    def __init__(self, inner, allocator: VigorAllocator, submit: Callable):
        """Wrap verl's buffer; nothing is pending until `first_round`.

        Args:
            inner: verl's sync replay buffer (every attribute not defined here is its).
            allocator: VIGOR's schedule and its random state.
            submit: sends prompts to generation (`GAPOTrainer._submit_batch_to_rollout`).
        """
        self.inner = inner
        self.allocator = allocator
        self.submit = submit  # GAPOTrainer._submit_batch_to_rollout: registers the prompts in TQ and generates
        self.pending = None  # the step's prompt TensorDict, set by GAPOTrainer.prepare_step

    def __getattr__(self, name):
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def first_round(self, prompts):
        """Round 0: every prompt gets m0 rollouts. Returns the prompts to submit (the sampler keeps them)."""
        tu.assign_non_tensor_stack(prompts, ROLLOUT_N_FIELD, [self.allocator.cfg.m0] * len(prompts))
        self.pending = prompts
        return prompts

    def sample(self, global_steps: int, partition_id: str, batch_size: int):
        """verl's `sample`; for the training partition after `first_round`, VIGOR's rounds, returned as one batch.

        Round 0's m0 * P rollouts come from the wrapped buffer; each later round ranks the active prompts by reward
        variance (`VigorAllocator.plan_round`), submits the kept ones' extra rollouts under `{uid}.r{t}` and samples
        them. Returns (`KVBatchMeta` of every round's rollouts ordered by prompt, see `_merge`; the buffer's aux dict
        plus `vigor/*` metrics). Validation, and training without a pending batch, are the wrapped buffer's.

        Raises:
            RuntimeError: verl asks for a batch size other than the prompts submitted in round 0.
        """
        if partition_id != TRAIN_PARTITION or self.pending is None:
            return self.inner.sample(global_steps=global_steps, partition_id=partition_id, batch_size=batch_size)
        prompts, self.pending = self.pending, None
        uids = [str(u) for u in prompts["uid"]]
        if batch_size != len(uids):
            raise RuntimeError(f"VIGOR submitted {len(uids)} prompts but verl samples {batch_size}")
        cfg, n = self.allocator.cfg, self.allocator.n
        start = time.perf_counter()
        meta, aux = self.inner.sample(global_steps=global_steps, partition_id=partition_id, batch_size=batch_size)
        metas = [meta]
        rewards: list[list[float]] = [[] for _ in uids]
        index = {uid: p for p, uid in enumerate(uids)}
        self._add_rewards(rewards, meta, index)
        rounds = [{"prompts": len(uids), "rollouts": cfg.m0 * len(uids), "gen_s": time.perf_counter() - start}]
        left = (n - cfg.m0) * len(uids)
        round0 = [list(r) for r in rewards]
        kept_round1 = None
        active = [p for p, r in enumerate(rewards) if r]
        if len(active) < len(uids):
            logger.warning(f"VIGOR: {len(uids) - len(active)} prompts have no finished rollout after round 0; "
                           "they are left out of the ranking")
        for t in range(1, cfg.rounds + 1):
            if left == 0 or not active:
                break
            start = time.perf_counter()
            plan = self.allocator.plan_round(rewards, active, t, left)
            if plan.extra:
                chosen = list(plan.extra)
                sub = tu.index_select_tensor_dict(prompts, torch.tensor(chosen, dtype=torch.long))
                tu.assign_non_tensor_stack(sub, "uid", [round_uid(uids[p], t) for p in chosen])
                tu.assign_non_tensor_stack(sub, ROLLOUT_N_FIELD, [plan.extra[p] for p in chosen])
                self.submit(sub)
                meta, more = self.inner.sample(global_steps=global_steps, partition_id=partition_id,
                                               batch_size=len(chosen))
                for key, value in more.items():  # the sync buffer's eviction counts (none without DAPO/refill)
                    aux[key] = aux.get(key, 0) + value if isinstance(value, (int, float)) else value
                metas.append(meta)
                self._add_rewards(rewards, meta, index)
            left -= plan.budget
            active = plan.kept
            kept_round1 = set(plan.kept) if t == 1 else kept_round1
            rounds.append({"prompts": len(plan.extra), "rollouts": plan.budget, "kept": len(plan.kept),
                           "ties_decided": plan.ties_decided, "remainder_ties": plan.remainder_ties,
                           "gen_s": time.perf_counter() - start})
        merged = self._merge(metas, index)
        aux.update(allocation_metrics([len(r) for r in rewards], rounds))
        if "data_source" in prompts.keys():  # verl's datasets carry it (the study's difficulty buckets)
            aux.update(source_metrics([str(x) for x in prompts["data_source"]], round0, rewards, kept_round1))
        return merged, aux

    @staticmethod
    def _add_rewards(rewards: list[list[float]], meta: KVBatchMeta, index: dict[str, int]) -> None:
        """Append the sequence rewards (`rm_scores` summed over tokens) of `meta`'s sessions to their prompts' lists."""
        if not meta.keys:
            return
        data = tq.kv_batch_get(keys=meta.keys, partition_id=meta.partition_id, select_fields=["rm_scores"])
        scores = data["rm_scores"]
        sums = scores.to_padded_tensor(0.0).sum(-1) if scores.is_nested else scores.sum(-1)
        for prompt, values in session_rewards(meta.keys, sums.tolist()).items():
            rewards[index[base_uid(prompt)]].extend(values)

    @staticmethod
    def _merge(metas: list[KVBatchMeta], index: dict[str, int]) -> KVBatchMeta:
        """One batch of every round's rollouts, ordered by prompt (`index`: uid -> position; each prompt's rollouts
        contiguous, round by round); later rounds' `uid` field set back to the prompt's uid.

        The order matters: verl cuts the batch into mini-batches in order (actor.shuffle=false by default). Round by
        round, the first mini-batch would hold every round-0 rollout, always updated on-policy (ratio 1, never
        clipped), and a dropped prompt's whole group with it. By prompt, as in a uniform batch, every group lands
        in one or two neighbouring mini-batches whatever its round."""
        rows = [(index[base_uid(k.rsplit("_", 2)[0])], r, i, k, t)
                for r, m in enumerate(metas) for i, (k, t) in enumerate(zip(m.keys, m.tags))]
        rows.sort(key=lambda row: row[:3])
        keys = [row[3] for row in rows]
        tags = [row[4] for row in rows]
        later = [k for m in metas[1:] for k in m.keys]
        if later:
            fields = list_of_dict_to_tensordict([{"uid": base_uid(k.rsplit("_", 2)[0])} for k in later])
            tq.kv_batch_put(keys=later, partition_id=TRAIN_PARTITION, fields=fields)
        # the same form as verl's own sample returns (fields=None: every stored field)
        return KVBatchMeta(partition_id=TRAIN_PARTITION, keys=keys, tags=tags)


def save_state(folder: str, allocator: VigorAllocator) -> str:
    """Write the allocator's state to folder/STATE_FILE (temp file, then rename). Returns the path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, STATE_FILE)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(allocator.state_dict(), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def load_state(folder: str, allocator: VigorAllocator) -> Optional[str]:
    """Continue the allocator's random stream from folder/STATE_FILE; the path, or None when the checkpoint has none
    (saved without VIGOR: the stream then starts from vigor.seed, with a warning)."""
    path = os.path.join(folder, STATE_FILE)
    if not os.path.exists(path):
        logger.warning(f"VIGOR: {path} does not exist (checkpoint saved without VIGOR?); the tie-break stream "
                       f"starts from {CONFIG_PREFIX}.seed")
        return None
    with open(path) as f:
        allocator.load_state_dict(json.load(f))
    return path


__all__ = ["VigorConfigError", "VigorSampler", "vigor_settings", "max_group_size", "session_rewards",
           "allocation_metrics", "source_metrics", "save_state", "load_state", "round_uid", "base_uid", "ROLLOUT_N_KEY"]

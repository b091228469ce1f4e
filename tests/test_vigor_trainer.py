"""VIGOR's wiring into GAPO's trainer, fast (no Ray): config group and start-up refusals, the replay-buffer wrapper's
rounds against a fake rollout engine and TransferQueue, the merged groups, metrics, checkpoint state, and the loss's
per-c diagnostics for groups larger than rollout.n. The real trainer runs it in tests/test_vigor_e2e.py."""

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.utils import tensordict_utils as tu

import gapo.verl_plugin.vigor as vigor_plugin
from gapo.verl_plugin.losses import SUMS_PREFIX, GAPOActorLoss, group_stats_context
from gapo.verl_plugin.validate import GAPOConfigError, validate_gapo_config
from gapo.verl_plugin.vigor import (
    ROLLOUT_N_FIELD,
    VigorSampler,
    allocation_metrics,
    base_uid,
    load_state,
    max_group_size,
    round_uid,
    save_state,
    session_rewards,
    source_metrics,
    vigor_settings,
)
from gapo.vigor import CONFIG_PREFIX, VigorAllocator, VigorConfig, allocate, round_budgets

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def compose_cfg(name="smoke_cpu", overrides=()):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose(name, overrides=list(overrides))


# --- config ---------------------------------------------------------------------------------------------------------

def test_config_group_lists_every_knob_with_the_dataclass_default_and_is_off_by_default():
    assert CONFIG_PREFIX == "vigor"  # where configs/vigor/*.yaml put the knobs
    node = compose_cfg().vigor
    for f in dataclasses.fields(VigorConfig):
        assert node[f.name] == f.default, f"configs/vigor/disabled.yaml: vigor.{f.name} differs from VigorConfig"
    assert set(node) == {f.name for f in dataclasses.fields(VigorConfig)}
    assert vigor_settings(compose_cfg()) is None
    # every experiment config inherits the group (through base/gapo.yaml)
    assert vigor_settings(compose_cfg("math/r1_1.5b_gapo")) is None


@pytest.mark.parametrize("name", ["smoke_cpu", "gapo_trainer", "math/r1_1.5b_gspo", "math/r1_1.5b_grpo"])
def test_switched_on_by_the_group_with_any_loss(name):
    cfg = compose_cfg(name, ["vigor=enabled", "vigor.m0=3", "vigor.tie_break=harder_first"])
    settings = vigor_settings(cfg)
    assert settings == VigorConfig(enable=True, m0=3, tie_break="harder_first")
    validate_gapo_config(cfg)  # passes for GAPO and the baselines alike


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["algorithm.filter_groups.enable=true"], r"algorithm\.filter_groups\.enable"),
        (["vigor.m0=9"], r"vigor\.m0=9 exceeds actor_rollout_ref\.rollout\.n=8"),
        (["reward.reward_model.enable=true"], r"reward\.reward_model\.enable_resource_pool"),
        (["trainer.v1.sampler.sync_refill_failed_groups=true"], r"trainer\.v1\.sampler\.sync_refill_failed_groups"),
        (["+trainer.v1.sync.parameter_sync_step=2"], r"trainer\.v1\.sync\.parameter_sync_step=1 \(got 2\)"),
        (["trainer.v1.trainer_mode=sync", "actor_rollout_ref.actor.policy_loss.loss_mode=gspo"],
         r"trainer\.v1\.trainer_mode=gapo"),
        (["trainer.v1.sampler.custom_sampler.path=x.py", "trainer.v1.sampler.custom_sampler.name=X"],
         r"trainer\.v1\.sampler\.custom_sampler"),
        (["+vigor.budget=3"], r"vigor\.budget"),
        (["vigor.keep=0"], r"vigor\.keep=0"),
        (["vigor.tie_break=easy"], r"vigor\.tie_break='easy'"),
    ],
)
def test_bad_configs_refused_at_start_up_naming_the_key(overrides, match):
    cfg = compose_cfg(overrides=["vigor=enabled", *overrides])
    with pytest.raises(GAPOConfigError, match=match):
        validate_gapo_config(cfg)


def test_a_bad_knob_is_refused_even_when_off():
    with pytest.raises(GAPOConfigError, match=r"vigor\.rounds=0"):
        validate_gapo_config(compose_cfg(overrides=["vigor.rounds=0"]))


def test_trainer_refuses_rewards_scored_after_sampling(monkeypatch):
    """The run-time twin of the config check: verl's reward loop has no workers (colocated reward model)."""
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from gapo.verl_plugin.trainer import GAPOTrainer

    monkeypatch.setattr(PPOTrainerSync, "on_init_end", lambda self: None)
    trainer = GAPOTrainer.__new__(GAPOTrainer)
    trainer.config = compose_cfg(overrides=["vigor=enabled"])
    trainer._vigor = object()
    trainer.reward_loop_manager = SimpleNamespace(reward_loop_worker_handles=None)
    with pytest.raises(RuntimeError, match=r"vigor\.enable=true needs rewards.*enable_resource_pool=true"):
        trainer.on_init_end()


# --- pure helpers ---------------------------------------------------------------------------------------------------

def test_round_uids_have_no_underscore_and_map_back():
    uid = "5f1c2a9e-0b7d-4c1e-9a51-3c2d1e0f9a8b"
    assert "_" not in round_uid(uid, 3) and base_uid(round_uid(uid, 3)) == uid and base_uid(uid) == uid
    assert base_uid("a.rx") == "a.rx"  # only a numeric round suffix is stripped


def test_session_rewards_use_each_sessions_final_output():
    keys = ["u_0_0", "u_1_0", "u_1_1", "u.r1_0_0", "v_0_0"]
    assert session_rewards(keys, [1.0, 0.0, 1.0, 0.0, 0.5]) == {"u": [1.0, 1.0], "u.r1": [0.0], "v": [0.5]}


def test_max_group_size_bounds_every_allocation_and_is_reached():
    cfg = VigorConfig(enable=True)
    assert max_group_size(64, 8, cfg) == 47 and max_group_size(8, 8, cfg) == 2 + 3 + 5 + 10 + 20
    rng = np.random.default_rng(0)
    for p_count in (1, 3, 8, 64):
        bound = max_group_size(p_count, 8, cfg)
        sizes = []
        for seed in range(5):
            probs = rng.random(p_count)
            alloc = allocate(lambda req: {p: list(rng.random(c) < probs[p]) for p, c in req.items()},
                             p_count, 8, cfg, seed)
            sizes.append(max(alloc.group_sizes))
        assert max(sizes) <= bound and max(sizes) == bound, (p_count, sizes, bound)


def test_allocation_metrics_names():
    m = allocation_metrics([2, 2, 4, 8], [{"prompts": 4, "rollouts": 8, "gen_s": 1.0},
                                          {"prompts": 2, "rollouts": 8, "kept": 2, "ties_decided": 1}])
    assert m["vigor/group_size/k2"] == 2 and m["vigor/group_size/k8"] == 1 and m["vigor/group_size/max"] == 8
    assert m["vigor/rollouts"] == 16 and m["vigor/round1/ties_decided"] == 1 and m["vigor/round0/gen_s"] == 1.0


# --- the sampler against a fake rollout engine and TransferQueue ------------------------------------------------------

class FakeEngine:
    """verl's sync buffer + agent loop + TransferQueue, reduced to what the sampler touches: `submit` stores each
    prompt's rollouts (rewards Bernoulli(prob of the prompt)) under `{prompt uid}_{session}_0`; `sample` returns the
    last submission's keys as verl's `_materialize_batch` does; kv_batch_get / kv_batch_put read and write fields."""

    def __init__(self, probs: dict[str, float], seed=0):
        self.probs, self.rng = probs, np.random.default_rng(seed)
        self.store: dict[str, dict] = {}
        self.submitted: list[list[tuple[str, int]]] = []

    def submit(self, batch):
        rows = list(zip([str(u) for u in batch["uid"]], [int(n) for n in batch[ROLLOUT_N_FIELD]]))
        self.submitted.append(rows)
        for uid, n in rows:
            for s in range(n):
                score = float(self.rng.random() < self.probs[base_uid(uid)])
                self.store[f"{uid}_{s}_0"] = {"uid": uid, "rm_scores": torch.tensor([0.0, score])}
        return len(rows)

    def sample(self, global_steps, partition_id, batch_size):
        rows = self.submitted[-1]
        assert batch_size == len(rows)
        keys = [f"{uid}_{s}_0" for uid, n in rows for s in range(n)]
        return KVBatchMeta(partition_id=partition_id, keys=keys, tags=[{"status": "success"}] * len(keys)), {}

    def kv_batch_get(self, keys, partition_id, select_fields):
        assert select_fields == ["rm_scores"]
        return TensorDict({"rm_scores": torch.stack([self.store[k]["rm_scores"] for k in keys])},
                          batch_size=len(keys))

    def kv_batch_put(self, keys, partition_id, fields):
        for key, uid in zip(keys, fields["uid"]):
            self.store[key]["uid"] = uid


def run_sampler(monkeypatch, cfg, n=8, num_prompts=8, seed=0):
    uids = [f"p{i}" for i in range(num_prompts)]
    engine = FakeEngine({u: p for u, p in zip(uids, np.linspace(0.05, 0.95, num_prompts))}, seed)
    monkeypatch.setattr(vigor_plugin.tq, "kv_batch_get", engine.kv_batch_get)
    monkeypatch.setattr(vigor_plugin.tq, "kv_batch_put", engine.kv_batch_put)
    sampler = VigorSampler(SimpleNamespace(sample=engine.sample, poll_interval=0.05),
                           VigorAllocator(cfg, n), submit=engine.submit)
    prompts = tu.get_tensordict({"input_ids": torch.arange(num_prompts * 3).reshape(num_prompts, 3),
                                 "uid": np.array(uids, dtype=object),
                                 "data_source": np.array([("hard", "easy")[i % 2] for i in range(num_prompts)],
                                                         dtype=object)})
    engine.submit(sampler.first_round(prompts))  # what GAPOTrainer.prepare_step does
    meta, metrics = sampler.sample(global_steps=1, partition_id="train", batch_size=num_prompts)
    return engine, sampler, meta, metrics, uids


def test_sampler_runs_the_schedule_and_merges_one_group_per_prompt(monkeypatch):
    cfg = VigorConfig(enable=True)
    engine, sampler, meta, metrics, uids = run_sampler(monkeypatch, cfg)
    assert sampler.poll_interval == 0.05  # everything else is the wrapped buffer's
    # round t resubmits the kept prompts under `{uid}.r{t}` with `__rollout_n__` = their extra rollouts
    budgets = round_budgets(8, 8, cfg)
    assert [sum(n for _, n in rows) for rows in engine.submitted] == budgets
    for t, rows in enumerate(engine.submitted[1:], 1):
        assert all(uid.endswith(f".r{t}") for uid, _ in rows)
    # the merged batch: every round's rollouts once, n * P in all; later rounds' uid field is the prompt's uid
    assert len(meta.keys) == len(set(meta.keys)) == 64 and set(meta.keys) == set(engine.store)
    sizes = {u: sum(engine.store[k]["uid"] == u for k in meta.keys) for u in uids}
    assert all(engine.store[k]["uid"] in uids for k in meta.keys)
    # ordered by prompt, each prompt's rollouts contiguous (round 0's first): verl cuts mini-batches in order
    order = [engine.store[k]["uid"] for k in meta.keys]
    runs = [u for i, u in enumerate(order) if i == 0 or order[i - 1] != u]
    assert runs == uids
    for u in uids:
        rounds = [k.rsplit("_", 2)[0].count(".r") and int(k.rsplit("_", 2)[0].rsplit(".r", 1)[1])
                  for k in meta.keys if engine.store[k]["uid"] == u]
        assert rounds == sorted(rounds) and rounds[:cfg.m0] == [0] * cfg.m0
    assert len(meta.tags) == len(meta.keys)
    # the same allocation as the pure schedule on the same rewards and seed
    rewards = {}
    for key in meta.keys:
        rewards.setdefault(engine.store[key]["uid"], []).append(engine.store[key]["rm_scores"].sum().item())
    assert sorted(sizes.values()) == sorted(len(r) for r in rewards.values())
    assert metrics["vigor/rollouts"] == 64 and metrics["vigor/group_size/max"] == max(sizes.values())
    assert sum(metrics[f"vigor/group_size/k{k}"] for k in set(sizes.values())) == 8
    assert [metrics[f"vigor/round{t}/rollouts"] for t in range(len(budgets))] == budgets
    assert metrics["vigor/round1/kept"] == 4 and "vigor/round4/gen_s" in metrics
    # per data_source counts (prompts alternate hard, easy): they add up to the batch and follow the kept sets
    for name, total in (("prompts", 8), ("rollouts", 64), ("dropped_round1", 4)):
        assert metrics[f"vigor/source/hard/{name}"] + metrics[f"vigor/source/easy/{name}"] == total, name
    hard = [u for i, u in enumerate(uids) if i % 2 == 0]
    assert metrics["vigor/source/hard/rollouts"] == sum(sizes[u] for u in hard)
    assert metrics["vigor/source/hard/dropped_round1"] == sum(sizes[u] == cfg.m0 for u in hard)


def test_source_metrics_hand_computed():
    sources = ["hard", "hard", "easy", "easy", "hard"]
    round0 = [[0, 0], [1, 0], [1, 1], [0, 1], [0.5, 0.5]]
    final = [[0, 0], [1, 0, 0, 0, 1], [1, 1, 1, 1], [0, 1, 1, 1], [0.5, 0.5]]
    m = source_metrics(sources, round0, final, kept_round1={1, 2, 3})
    assert m == {"vigor/source/hard/prompts": 3, "vigor/source/hard/rollouts": 9,
                 "vigor/source/hard/dropped_round1": 2, "vigor/source/hard/flat_round0": 2,
                 "vigor/source/hard/flat_round0_dropped": 2, "vigor/source/hard/flat_final": 2,
                 "vigor/source/easy/prompts": 2, "vigor/source/easy/rollouts": 8,
                 "vigor/source/easy/dropped_round1": 0, "vigor/source/easy/flat_round0": 1,
                 "vigor/source/easy/flat_round0_dropped": 0, "vigor/source/easy/flat_final": 1}
    # round 1 did not run (m0 = n): every prompt kept its m0 rollouts
    assert source_metrics(sources, round0, round0, None)["vigor/source/easy/dropped_round1"] == 2


def test_sampler_matches_the_pure_allocate(monkeypatch):
    """Same rewards in, same group sizes out as gapo.vigor.allocate (the tested schedule), tie-break stream included."""
    cfg = VigorConfig(enable=True)
    engine, _, meta, _, uids = run_sampler(monkeypatch, cfg, seed=3)
    by_round = {}
    for key in meta.keys:
        prompt = key.rsplit("_", 2)[0]
        by_round.setdefault(base_uid(prompt), []).append((prompt, engine.store[key]["rm_scores"].sum().item()))
    queues = {uids.index(u): [s for _, s in sorted(v, key=lambda x: (x[0].count(".r"), x[0]))]
              for u, v in by_round.items()}

    def replay(request):  # hand back the rewards the trainer saw, in sampling order
        return {p: [queues[p].pop(0) for _ in range(c)] for p, c in request.items()}

    alloc = allocate(replay, 8, 8, cfg, np.random.default_rng(cfg.seed))
    assert alloc.group_sizes == [len(by_round[u]) for u in uids]


def test_validation_and_untracked_calls_go_to_verls_buffer(monkeypatch):
    calls = []
    sampler = VigorSampler(SimpleNamespace(sample=lambda **kw: calls.append(kw) or ("meta", {})),
                           VigorAllocator(VigorConfig(enable=True), 8), submit=None)
    assert sampler.sample(global_steps=1, partition_id="val", batch_size=4) == ("meta", {})
    assert calls == [{"global_steps": 1, "partition_id": "val", "batch_size": 4}]


def test_state_file_round_trip(tmp_path, monkeypatch):
    cfg = VigorConfig(enable=True, seed=7)
    a = VigorAllocator(cfg, 8)
    a.rng.random(13)
    save_state(str(tmp_path), a)
    b = VigorAllocator(cfg, 8)
    assert load_state(str(tmp_path), b) == str(tmp_path / "vigor_state.json")
    assert b.rng.random(5).tolist() == a.rng.random(5).tolist()
    assert load_state(str(tmp_path / "none"), VigorAllocator(cfg, 8)) is None


# --- the loss's per-c diagnostics with groups larger than rollout.n ---------------------------------------------------

def test_per_c_diagnostics_cover_groups_larger_than_rollout_n():
    from tests.test_gapo_loss import _random_batch, actor_config

    old, new, adv, mask = _random_batch(0)
    adv = adv.abs()  # every rollout a success with a positive advantage: all get the adaptive bound
    num_correct, group_size = torch.tensor([1.0, 9, 20, 39, 3, 39]), torch.full((6,), 40.0)
    cfg = actor_config("gapo", rollout_n=8)
    kwargs = dict(old_log_prob=old, log_prob=new.clone().requires_grad_(True), advantages=adv,
                  response_mask=mask.bool(), loss_agg_mode=cfg.loss_agg_mode, config=cfg, rollout_is_weights=None)
    with group_stats_context(num_correct, group_size, num_correct > 0, max_count=40) as stats:
        get_policy_loss_fn("gapo")(**kwargs)
    rows = {int(k.split("/")[1][1:]) for k in stats.sums if k.startswith(f"{SUMS_PREFIX}/c")}
    assert rows == set(range(1, 41))
    assert stats.sums[f"{SUMS_PREFIX}/c39/rollouts"] == 2 and stats.sums[f"{SUMS_PREFIX}/c20/rollouts"] == 1
    assert sum(stats.sums[f"{SUMS_PREFIX}/c{c}/rollouts"] for c in rows) == 6  # nobody left out
    assert stats.sums[f"{SUMS_PREFIX}/positive_rollouts"] == 6
    # without the bound the table stops at rollout_n: c = 9, 20, 39 would be dropped (the bug this fixes)
    with group_stats_context(num_correct, group_size, num_correct > 0) as stats:
        get_policy_loss_fn("gapo")(**{**kwargs, "log_prob": new.clone().requires_grad_(True)})
    assert sum(v for k, v in stats.sums.items() if k.endswith("/rollouts")) == 2
    # the actor loss callable carries the trainer's bound to every micro-batch (default: rollout_n)
    assert GAPOActorLoss(cfg).max_count == 8 and GAPOActorLoss(cfg, max_count=47).max_count == 47

"""verl's real trainer at world size 2 (2 FSDP ranks, gloo, on CPU): what only happens with several ranks.

All of it reads the session's smoke run (tests/conftest.py, tests/cluster_runs.py): run1 trains steps 1-2 with a
checkpoint each and is SIGKILLed inside the save of step 3, run2 resumes and trains step 3 and is ended in step 4 by a
SIGKILL of rank 1's worker, and run3 resumes and trains step 4. Checked:

- the killed rank ends the run by itself within a bound, with an error naming the dead worker, and the restart resumes
  from the last checkpoint (each step logged once; both ranks load their own shards);
- the batch order across the kill is the dataloader's own (each step's prompts are the t-th batch of verl's sampler,
  recomputed here), so no batch is lost or repeated;
- every per-c GAPO metric equals the recount from both ranks' per-row loss values (GAPO_DEBUG_LOSS_ROWS); rank 0's
  rows alone give other values; the (c, k, success) the loss saw are those recomputed from verl's rollout dump;
- a resume at another world size stops before Ray starts, naming both sizes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hydra import compose, initialize_config_dir

from gapo.threshold import adaptive_eps_high
from tests.cluster_runs import END_BOUND_S, RANK_KILL_STEP, RANKS, SMOKE_RUN_STEPS
from tests.test_trainer_e2e import read_rollouts

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


@pytest.fixture(scope="module")
def smoke(smoke_run):
    return smoke_run


@pytest.fixture(scope="module")
def config():
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose("smoke_cpu")


def loss_rows(smoke) -> dict[int, dict[int, list[dict]]]:
    """{step: {rank: rows}} of the loss's per-row dump, each step from the run that logged it (a killed run's rows of
    the step it was killed in, if any, are left out: that step never finished)."""
    out: dict[int, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for run, steps in SMOKE_RUN_STEPS.items():
        for path in sorted((smoke["rows_dir"] / run).glob("rank*.jsonl")):
            rank = int(path.stem[len("rank"):])
            for line in path.read_text().splitlines():
                row = json.loads(line)
                if int(row["step"]) in steps:
                    out[int(row["step"])][rank].append(row)
    return out


@pytest.mark.slow
def test_a_killed_rank_ends_the_run_within_a_bound_naming_the_worker(smoke):
    kill = smoke["kill"]
    assert kill["exit_code"] != 0
    assert kill["ended_s"] < END_BOUND_S, kill["ended_s"]
    log = kill["log"]
    assert "ray.exceptions.ActorDiedError" in log
    error = log[log.index("ray.exceptions.ActorDiedError"):]
    assert f"pid: {kill['pid']}" in error and "WorkerDict" in error  # the dead worker, by pid and class
    assert f"pid: {kill['rank0_pid']}" not in error
    print(f"\n[cluster e2e] rank 1 killed in step {RANK_KILL_STEP}: run2 ended after {kill['ended_s']:.1f} s (exit {kill['exit_code']})")


@pytest.mark.slow
def test_the_restart_resumes_from_the_last_checkpoint_on_both_ranks(smoke):
    assert {run: sorted(smoke[run]) for run in SMOKE_RUN_STEPS} == {
        run: list(steps) for run, steps in SMOKE_RUN_STEPS.items()}
    ckpt, last = smoke["ckpt_dir"], RANK_KILL_STEP - 1
    log3 = smoke["kill"]["run3_log"]
    assert f"Resuming from {ckpt}/global_step_{last}, setting global step to {last}" in log3
    for rank in range(RANKS):
        for what, kind in (("model", "model"), ("optimizer", "optim"), ("lr_scheduler", "extra_state")):
            name = f"{kind}_world_size_{RANKS}_rank_{rank}.pt"
            assert f"[Rank {rank}] Loaded {what} from {ckpt}/global_step_{last}/actor/{name}" in log3, (rank, what)


@pytest.mark.slow
def test_batch_order_across_the_kill_is_the_dataloaders(smoke, config):
    """Each step's prompts (their ground truths, n rollouts each) are the t-th batch of verl's own sampler."""
    from verl.trainer.ppo.utils import create_rl_sampler

    table = pq.read_table(smoke["out"] / "data" / "train.parquet").to_pylist()
    truths = [row["reward_model"]["ground_truth"] for row in table]
    order = list(create_rl_sampler(config.data, list(range(len(truths)))))
    size, n = int(config.data.train_batch_size), int(config.actor_rollout_ref.rollout.n)
    for step in range(1, RANK_KILL_STEP + 1):
        rows = [json.loads(line) for line in (smoke["rollout_dir"] / f"{step}.jsonl").read_text().splitlines()]
        expected = Counter({truths[i]: n for i in order[(step - 1) * size:step * size]})
        assert Counter(row["gts"] for row in rows if not row["uid"].startswith("pad")) == expected, step


def _recount(rows: list[dict]) -> dict[str, float]:
    """Per-c metrics from per-row loss values (what diagnostics_from_sums computes from the summed table)."""
    sums: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    eps = []
    for row in rows:
        if not row["adaptive"]:
            continue
        s = sums[int(row["c"])]
        s[0] += row["clipped"]
        s[1] += row["ratio_dev"]
        s[2] += row["tokens"]
        s[3] += row["advantage"]
        eps.append(row["eps_high"])
    out = {"gapo/loss_eps_high_mean": sum(eps) / len(eps)}
    for c, (clipped, dev, tokens, adv) in sums.items():
        out.update({f"gapo/clipfrac_pos/c{c}": clipped / tokens, f"gapo/ratio_dev_pos/c{c}": dev / tokens,
                    f"gapo/adv_pos/c{c}": adv / tokens})
    return out


@pytest.mark.slow
def test_per_c_metrics_are_the_rows_of_both_ranks(smoke, config):
    metrics = smoke["metrics"]
    rows = loss_rows(smoke)
    assert sorted(rows) == list(range(1, RANK_KILL_STEP + 1))
    actor = config.actor_rollout_ref.actor
    eps_low, eps_high_max = float(actor.clip_ratio_low), float(actor.policy_loss.eps_high_max)
    rank0_differs = False
    for step, by_rank in rows.items():
        assert sorted(by_rank) == list(range(RANKS)) and all(by_rank.values()), step  # rows on every rank
        every = [row for rank in sorted(by_rank) for row in by_rank[rank]]
        for row in every:  # each row's bound is Eq. 11 of its own (c, k)
            expected = adaptive_eps_high(row["c"], row["k"], eps_low, eps_high_max) if row["adaptive"] else eps_low
            assert row["eps_high"] == pytest.approx(float(expected), rel=1e-6), (step, row)
        logged = {k: v for k, v in metrics[step].items()
                  if k.startswith(("gapo/clipfrac_pos/c", "gapo/ratio_dev_pos/c", "gapo/adv_pos/c"))
                  or k == "gapo/loss_eps_high_mean"}
        recount = _recount(every)
        assert logged.keys() == recount.keys(), step
        for name, value in recount.items():
            assert logged[name] == pytest.approx(value, rel=1e-5, abs=1e-7), (step, name)
        alone = _recount(by_rank[0])
        rank0_differs |= alone.keys() != recount.keys() or any(
            alone[k] != pytest.approx(v, rel=1e-3) for k, v in recount.items())
    assert rank0_differs, "rank 0's rows alone gave the logged values: the test cannot tell a per-rank metric"


@pytest.mark.slow
def test_the_loss_saw_the_group_statistics_of_the_rollout_dump(smoke, config):
    """Per step, the multiset of (c, k, success) over both ranks' loss rows is the one recomputed from verl's dump."""
    threshold = float(config.actor_rollout_ref.actor.policy_loss.success_threshold)
    for step, by_rank in loss_rows(smoke).items():
        rollouts = [(key.rsplit("_", 2)[0], score) for key, score in read_rollouts(smoke["rollout_dir"] / f"{step}.jsonl")
                    if not key.startswith("pad")]
        k = Counter(uid for uid, _ in rollouts)
        c = Counter(uid for uid, score in rollouts if score > threshold)
        expected = Counter((c[uid], k[uid], score > threshold) for uid, score in rollouts)
        seen = Counter((int(r["c"]), int(r["k"]), bool(r["success"])) for rows in by_rank.values() for r in rows)
        assert seen == expected, step
        assert sum(len(rows) for rows in by_rank.values()) == len(rollouts)  # each rollout once (one PPO epoch)


@pytest.mark.slow
def test_every_checkpoint_has_one_shard_per_rank(smoke):
    from recipe.smoke import missing_shards

    for step in range(1, RANK_KILL_STEP + 1):
        assert missing_shards(smoke["ckpt_dir"], step, RANKS) == [], step
        assert missing_shards(smoke["ckpt_dir"], step, 1) != []  # the check can fail


@pytest.mark.slow
def test_resume_at_another_world_size_stops_before_ray(smoke):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "GAPO_SKIP_PREFLIGHT"))}
    env.update(VERL_PLATFORM="cpu", VERL_ENGINE_DEVICE="cuda", GAPO_SMOKE_DIR=str(smoke["out"]))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "recipe.main_gapo", "--config-name", "smoke_cpu",
                           "trainer.n_gpus_per_node=1", "ray_kwargs.ray_init.num_gpus=1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240, check=False, stdin=subprocess.DEVNULL)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert "GAPO preflight failed" in proc.stderr
    assert f"was written at world size {RANKS} (model_world_size_{RANKS}_rank_*.pt), but this run has world size 1 " \
           "(trainer.nnodes=1 x trainer.n_gpus_per_node=1)" in proc.stderr
    assert "ray init kwargs" not in proc.stdout + proc.stderr  # before run_ppo started Ray
    print(f"\n[cluster e2e] resume at world size 1 from a world-size-2 checkpoint refused after {elapsed:.1f} s")


def explore_rows(smoke) -> dict[int, list[dict]]:
    """{step: rows} of the driver's exploration dump (GAPO_DEBUG_EXPLORE_ROWS), each step from the run that logged
    it."""
    out: dict[int, list[dict]] = defaultdict(list)
    for run, steps in SMOKE_RUN_STEPS.items():
        for line in (smoke["rows_dir"] / f"explore-{run}" / "driver.jsonl").read_text().splitlines():
            row = json.loads(line)
            if int(row["step"]) in steps:
                out[int(row["step"])].append(row)
    return out


@pytest.mark.slow
def test_exploration_metrics_are_a_recount_of_verls_rollout_dump(smoke, config):
    """At world size 2, each step's gapo/explore/* values equal a recount from verl's rollout dump (groups by uid,
    success by score, padding rows by key) and the driver's per-row first tokens and entropy sums, written out before
    any instrument ran. The first tokens decode to the start of verl's dumped response text, so they are that
    rollout's. Entropy means: sums over both ranks' rows (gathered by verl), token-weighted."""
    from transformers import AutoTokenizer

    from gapo.entrance import first_move, group_entrances

    tokenizer = AutoTokenizer.from_pretrained(smoke["out"] / "model")
    threshold = float(config.actor_rollout_ref.actor.policy_loss.success_threshold)
    m = int(config.exploration.entrance_tokens)
    cover = float(config.trainer.val_coverage_threshold)
    metrics = smoke["metrics"]
    rows = explore_rows(smoke)
    assert sorted(rows) == list(range(1, RANK_KILL_STEP + 1))
    for step, driver in rows.items():
        dump = {json.loads(line)["uid"]: json.loads(line)
                for line in (smoke["rollout_dir"] / f"{step}.jsonl").read_text().splitlines()}
        by_key = {row["key"]: row for row in driver}
        assert by_key.keys() == dump.keys(), step  # every rollout of the step, padding rows included
        groups: dict[str, list[tuple]] = defaultdict(list)
        entropy = defaultdict(lambda: [0.0, 0.0])  # "failure" or c -> [sum, tokens]
        real = [(key, rec) for key, rec in dump.items() if not key.startswith("pad")]
        c_of = Counter(key.rsplit("_", 2)[0] for key, rec in real if float(rec["score"]) > threshold)
        for key, rec in real:
            row = by_key[key]
            assert rec["output"].startswith(tokenizer.decode(row["lead"], skip_special_tokens=True)), (step, key)
            success = float(rec["score"]) > threshold
            uid = key.rsplit("_", 2)[0]
            groups[uid].append((first_move(row["lead"], m), success))
            slot = entropy[c_of[uid] if success else "failure"]
            slot[0] += row["entropy_sum"]
            slot[1] += row["entropy_tokens"]
        logged = metrics[step]
        per_group = [group_entrances([mv for mv, _ in g], [s for _, s in g]) for g in groups.values()]
        assert logged["gapo/explore/entrance_distinct"] == pytest.approx(
            sum(g.distinct / g.size for g in per_group) / len(per_group)), step
        with_success = [g.unique_successes / g.successes for g in per_group if g.successes]
        assert logged["gapo/explore/entrance_unique_success"] == pytest.approx(
            sum(with_success) / len(with_success)), step
        assert logged["gapo/explore/coverage_frac"] == pytest.approx(
            sum(g.successes / g.size > cover for g in per_group) / len(per_group)), step
        succ = [v for key, v in entropy.items() if key != "failure"]
        assert logged["gapo/explore/entropy_success"] == pytest.approx(
            sum(s for s, _ in succ) / sum(t for _, t in succ), rel=1e-6), step
        assert logged["gapo/explore/entropy_failure"] == pytest.approx(
            entropy["failure"][0] / entropy["failure"][1], rel=1e-6), step
        for c, (s, t) in entropy.items():
            if c != "failure":
                assert logged[f"gapo/explore/entropy_success/c{c}"] == pytest.approx(s / t, rel=1e-6), (step, c)
        # the window restarts with each process: run1 pools steps 1-2, run2 and run3 start again
        first = next(steps.start for steps in SMOKE_RUN_STEPS.values() if step in steps)
        assert logged["gapo/explore/coverage_window_steps"] == step - first + 1

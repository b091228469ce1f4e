"""VIGOR end to end on CPU: verl's real trainer (Ray, FSDP2 actor at world size 2, HF rollout, reward loop, GAPO
loss) with `vigor=enabled`, in the session's 2-node run (conftest's ``lost_node``, tests/cluster_runs.py: a local
2-node Ray cluster, one rank per node, submitted with launch/submit.sh): run1 trains steps 1-2 with a checkpoint each
step and loses a node in step 3, run2 resumes and trains step 3. The loss dumps its per-row values on each rank
(GAPO_DEBUG_LOSS_ROWS, one folder per run): the merged groups, of uneven sizes, are split over both ranks, one on each
node.

Everything is recomputed from verl's own rollout dump (`trainer.rollout_data_dir`: each rollout's TransferQueue key
`{prompt}_{session}_{index}` and score; a later round's prompt key is `{uid}.r{t}`), not from VIGOR's code: the
rounds' budgets and kept sets, the variance ranking, the final group sizes, and the (c, k) the loss saw."""

import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from gapo.vigor import TIE_DECIMALS, VigorAllocator, VigorConfig, kept_counts, round_budgets
from tests.test_trainer_e2e import expected_metrics, read_rollouts

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PROMPTS, N = 8, 8  # the smoke preset: data.train_batch_size, actor_rollout_ref.rollout.n
RANKS = 2  # the 2-node run: one rank on each node
CFG = VigorConfig(enable=True)  # configs/vigor/enabled.yaml: the defaults, switched on
ROUND_KEY = re.compile(r"^(?P<uid>[^_.]+)(?:\.r(?P<round>\d+))?_(?P<session>\d+)_(?P<index>\d+)$")


@pytest.fixture(scope="module")
def vigor_run(lost_node):
    """The 2-node run's steps as this module reads them: metrics of the steps each job logged, its checkpoints, verl's
    rollout dump, the loss rows of each job (run1's rows of the step it lost a node in are left out: that step never
    finished), run2's log."""
    runs = {"run1": lost_node["run1_metrics"], "run2": lost_node["run2_metrics"]}
    return {**runs, "metrics": {**runs["run1"], **runs["run2"]}, "ckpt_dir": lost_node["ckpt"],
            "rollout_dir": lost_node["rollout_dir"], "rows_dir": lost_node["rows_dir"],
            "run2_log": lost_node["run2_log"]}


def rounds_of(rollouts):
    """{uid: {round: [scores in session order]}} from one step's dump (all rollouts are real: no padding here)."""
    groups = defaultdict(lambda: defaultdict(list))
    for key, score in sorted(rollouts, key=lambda r: r[0]):
        m = ROUND_KEY.match(key)
        assert m, f"unexpected key {key}"
        groups[m["uid"]][int(m["round"] or 0)].append((int(m["session"]), score))
    return {u: {t: [s for _, s in sorted(v)] for t, v in r.items()} for u, r in groups.items()}


def variance(scores):
    return round(float(np.var(np.asarray(scores, dtype=np.float64))), TIE_DECIMALS)


@pytest.mark.slow
def test_each_step_follows_the_schedule(vigor_run):
    budgets, kept = round_budgets(PROMPTS, N, CFG), kept_counts(PROMPTS, CFG)
    assert budgets == [16, 9, 9, 10, 20] and kept == [4, 2, 1, 1]  # the numbers the checks below rely on
    for step, m in vigor_run["metrics"].items():
        groups = rounds_of(read_rollouts(vigor_run["rollout_dir"] / f"{step}.jsonl"))
        assert len(groups) == PROMPTS, step
        active = set(groups)
        for t, budget in enumerate(budgets):
            members = {u for u, r in groups.items() if t in r}
            spent = sum(len(r[t]) for r in groups.values() if t in r)
            assert spent == budget == m[f"vigor/round{t}/rollouts"], (step, t)
            if t == 0:
                assert all(len(r[0]) == CFG.m0 for r in groups.values()), step
                continue
            # round t keeps the K_t active prompts with the highest variance of all their rewards so far
            assert len(members) == kept[t - 1] == m[f"vigor/round{t}/prompts"] and members <= active, (step, t)
            so_far = {u: variance([s for tt in range(t) for s in groups[u].get(tt, [])]) for u in active}
            assert min(so_far[u] for u in members) >= max((so_far[u] for u in active - members), default=-1), (
                step, t, so_far, members)
            base = budget // len(members)
            assert sorted(len(groups[u][t]) for u in members) in (
                sorted([base] * (len(members) - budget % len(members)) + [base + 1] * (budget % len(members))),
            ), (step, t)
            active = members
        sizes = [sum(len(v) for v in r.values()) for r in groups.values()]
        assert sum(sizes) == PROMPTS * N == m["vigor/rollouts"]
        histogram = {int(k.rsplit("/k", 1)[1]): v for k, v in m.items() if k.startswith("vigor/group_size/k")}
        assert histogram == {k: sizes.count(k) for k in set(sizes)}, step
        assert max(sizes) > N  # groups larger than rollout.n: what the loss's per-c table must cover


@pytest.mark.slow
def test_loss_sees_each_prompts_merged_group(vigor_run):
    """GAPO's group metrics and the loss's mean threshold equal those recomputed with one group per prompt (every
    round merged): c and k reached advantage and loss as the merged group's, not rollout.n's."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose("smoke_cpu", overrides=["vigor=enabled"])
    actor = cfg.actor_rollout_ref.actor
    eps_low, eps_high_max = float(actor.clip_ratio_low), float(actor.policy_loss.eps_high_max)
    threshold = float(actor.policy_loss.success_threshold)
    for step, m in vigor_run["metrics"].items():
        rollouts = read_rollouts(vigor_run["rollout_dir"] / f"{step}.jsonl")
        # the prompt's own uid as the group: `{uid}.r{t}_{s}_{i}` -> `{uid}_{t}x{s}_{i}` (unique per rollout)
        merged = []
        for key, score in rollouts:
            g = ROUND_KEY.match(key)
            merged.append((f"{g['uid']}_{g['round'] or 0}x{g['session']}_{g['index']}", score))
        expected = expected_metrics(merged, eps_low, eps_high_max, threshold)
        for name, value in expected.items():
            assert m[name] == pytest.approx(value, rel=1e-5, abs=1e-7), (step, name, m[name], value)
        # the loss's per-c diagnostics: exactly the success counts of mixed groups, c > rollout.n included
        groups = defaultdict(list)
        for key, score in merged:
            groups[key.split("_")[0]].append(score > threshold)
        levels = {sum(v) for v in groups.values() if 0 < sum(v) < len(v)}
        # live coverage counts each prompt's merged group once, at its own size (not rollout.n's blocks)
        cover = float(cfg.trainer.val_coverage_threshold)
        assert m["gapo/explore/coverage_frac"] == pytest.approx(
            sum(sum(v) / len(v) > cover for v in groups.values()) / len(groups)), step
        logged = {int(k.rsplit("/c", 1)[1]) for k in m if k.startswith("gapo/clipfrac_pos/c")}
        assert logged == levels, (step, logged, levels)
        assert m["gapo/is_adv_corr_levels"] == len(levels)
        assert m["training/rollout_probs_diff_max"] < 1e-5  # every round sampled from the current weights
    assert any(c > N for m in vigor_run["metrics"].values()
               for c in (int(k.rsplit("/c", 1)[1]) for k in m if k.startswith("gapo/clipfrac_pos/c")))


@pytest.mark.slow
def test_each_rank_saw_its_rows_merged_groups(vigor_run):
    """World size 2: the (c, k, success) the loss used on each rank, over both ranks, are the merged groups' from
    the rollout dump (k the group's size after every round, not rollout.n), each rollout once: the budget is exact
    and no row is padding. Both ranks got rows, and different ones (a rank-0-only view would not pass)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        threshold = float(compose("smoke_cpu", overrides=["vigor=enabled"]).actor_rollout_ref.actor.policy_loss
                          .success_threshold)
    rows = defaultdict(lambda: defaultdict(list))
    for run in ("run1", "run2"):
        for path in sorted((vigor_run["rows_dir"] / run).glob("rank*.jsonl")):
            for line in path.read_text().splitlines():
                row = json.loads(line)
                if int(row["step"]) in vigor_run[run]:  # the steps this run logged
                    rows[int(row["step"])][int(path.stem[len("rank"):])].append(row)
    assert sorted(rows) == sorted(vigor_run["metrics"])
    for step, by_rank in rows.items():
        assert sorted(by_rank) == list(range(RANKS)) and all(by_rank.values()), step
        groups = defaultdict(list)
        for key, score in read_rollouts(vigor_run["rollout_dir"] / f"{step}.jsonl"):
            groups[ROUND_KEY.match(key)["uid"]].append(score > threshold)
        expected = Counter((sum(v), len(v), s) for v in groups.values() for s in v)
        seen = [Counter((int(r["c"]), int(r["k"]), bool(r["success"])) for r in by_rank[rank]) for rank in range(RANKS)]
        assert sum(seen, Counter()) == expected, step
        assert sum(len(v) for v in by_rank.values()) == PROMPTS * N, step
        assert any(k > N for _, k, _ in expected), step  # uneven merged groups reached the loss
        assert seen[0] != seen[1], step


@pytest.mark.slow
def test_resume_continues_the_tie_break_stream(vigor_run):
    """Step 3 (resumed process) draws from the stream where step 2 left it: its saved state equals a fresh
    allocator's after three steps' draws (one uniform per active prompt per round: 8 + 4 + 2 + 1), as in an
    uninterrupted run; a restart from vigor.seed would equal one step's."""
    ckpt = vigor_run["ckpt_dir"]
    assert sorted(vigor_run["run1"]) == [1, 2] and sorted(vigor_run["run2"]) == [3]
    log = vigor_run["run2_log"]
    assert f"VIGOR: resumed the allocator's random state from {ckpt}/global_step_2/vigor_state.json" in log
    fresh = VigorAllocator(CFG, N)
    draws = [PROMPTS, *kept_counts(PROMPTS, CFG)[:-1]]
    for step in (1, 2, 3):
        for count in draws:
            fresh.rng.random(count)
        saved = json.loads((ckpt / f"global_step_{step}" / "vigor_state.json").read_text())
        assert saved["rng"] == fresh.state_dict()["rng"], step
        assert saved["config"]["enable"] is True and saved["n"] == N

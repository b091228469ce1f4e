"""recipe/studies/vigor_2x2.py: the 2x2 study's own report section from constructed metrics files (hand-computed
numbers), its methods' overrides, and its flag's errors. The real reduced study (verl's trainer, vLLM rollout,
uniform and VIGOR runs) runs in tests/vllm/test_study_vllm.py."""

import json
import math

import pytest

import recipe.studies.gspo_vs_gapo as study
import recipe.studies.vigor_2x2 as sv
import tests.test_studies_gspo_vs_gapo as study_tests
from recipe.studies.gspo_vs_gapo import StudySettings, report
from tests.test_studies_gspo_vs_gapo import run_metrics

METHODS = ["gapo_linear", "vigor_gapo_linear", "vigor_harder_gapo_linear"]
SLOPE = {"gapo_linear": 0.1, "vigor_gapo_linear": 0.15, "vigor_harder_gapo_linear": 0.12}


def settings(**kw) -> StudySettings:
    base = dict(seeds=[0, 1], methods=METHODS, steps=6, val_every=3, val_n=4, val_per_bucket=3, n_train=16, last=2)
    return StudySettings(**{**base, **kw})


def vigor_metrics(method: str, mi: int, seed: int, s: StudySettings) -> dict[int, dict]:
    steps = run_metrics(mi, seed, s)
    for t in range(1, s.steps + 1):
        m = steps[t]
        m[sv.SUCCESS_RATE] = SLOPE[method] * t + 0.01 * seed
        m["timing_s/gen"] = 3.0 if sv.is_vigor(method) else 2.0
        if not sv.is_vigor(method):
            continue
        # seed 1 of the random tie-break spends 60 at step 2: the budget check must see it
        m["vigor/rollouts"] = 60.0 if (method == "vigor_gapo_linear" and seed == 1 and t == 2) else 64.0
        for r in range(5):
            m[f"vigor/round{r}/gen_s"] = 0.5 + 0.1 * r
            m[f"vigor/round{r}/rollouts"] = 16.0 if r == 0 else 12.0
        hard = "vigor/source/gapo_smoke_hard/"
        m.update({hard + "prompts": 3.0, hard + "rollouts": 12.0 if seed == 0 else 9.0, hard + "dropped_round1": 2.0,
                  hard + "flat_round0": 2.0, hard + "flat_final": 1.0,
                  hard + "flat_round0_dropped": 2.0 if method == "vigor_gapo_linear" else 1.0})
        m[sv.KR_PREFIX + "k5-8/rate0.25-0.5"] = 0.1 * seed + 0.01 * t
        if seed == 0:
            m[sv.KR_PREFIX + "k33-64/rate0-0.25"] = 0.5  # one seed only: left out
    return steps


def write_runs(out, s):
    return study_tests.write_runs(out, s, vigor_metrics)


def test_section_numbers_hand_computed(tmp_path):
    s = settings()
    summary = report(tmp_path, s, write_runs(tmp_path, s), wall_s=5.0, preset=sv.VIGOR_STUDY)
    saved = json.loads((tmp_path / "report.json").read_text())["vigor_study"]
    assert saved == json.loads(json.dumps(summary["vigor_study"]))
    # smoothed success rate (trailing 4 steps) at steps 4, 5, 6 = slope * (t - 1.5) + 0.01 seed; the lowest maximum
    # over the runs is gapo_linear seed 0's 0.45: the target
    assert saved["target"] == pytest.approx(0.45)
    methods = saved["methods"]
    # gapo_linear reaches 0.45 / 0.46 at step 6; random VIGOR 0.525 / 0.535 at step 5; harder-first 0.42 < 0.45 at
    # step 5, 0.54 at step 6
    assert methods["gapo_linear"]["rollouts_to_target"]["values"] == [384, 384]
    assert methods["vigor_gapo_linear"]["rollouts_to_target"]["values"] == [320, 320]
    assert methods["vigor_harder_gapo_linear"]["rollouts_to_target"]["values"] == [384, 384]
    # success rate over the last 2 steps (5, 6): slope * 5.5 + 0.01 seed
    assert methods["vigor_gapo_linear"]["success_rate_late"]["values"] == pytest.approx([0.825, 0.835])
    assert methods["gapo_linear"]["gen_s"]["mean"] == 2.0 and methods["vigor_gapo_linear"]["gen_s"]["mean"] == 3.0
    assert methods["vigor_gapo_linear"]["round_gen_s"]["3"]["mean"] == pytest.approx(0.8)
    assert methods["vigor_gapo_linear"]["budget_steps_off"] == 1
    assert methods["vigor_harder_gapo_linear"]["budget_steps_off"] == 0
    hard = methods["vigor_gapo_linear"]["buckets"]["hard"]
    assert hard["rollouts_per_prompt"]["values"] == pytest.approx([4.0, 3.0])
    assert hard["rollouts_per_prompt"]["std"] == pytest.approx(math.sqrt(0.5))
    assert hard["dropped_if_flat_round0"]["mean"] == pytest.approx(1.0)
    assert hard["starved_frac"]["mean"] == pytest.approx(2 / 3)
    assert methods["vigor_harder_gapo_linear"]["buckets"]["hard"]["starved_frac"]["mean"] == pytest.approx(1 / 3)
    assert methods["vigor_harder_gapo_linear"]["buckets"]["hard"]["dropped_if_flat_round0"]["mean"] == 0.5
    assert methods["vigor_gapo_linear"]["buckets"]["mid"]["rollouts_per_prompt"] is None  # no mid counts logged
    # (k, rate) clip fraction: mean over 6 steps of 0.1 seed + 0.01 t; the one-seed bucket is left out
    kr = methods["vigor_gapo_linear"]["clipfrac_kr"]
    assert list(kr) == ["k5-8/rate0.25-0.5"] and kr["k5-8/rate0.25-0.5"]["values"] == pytest.approx([0.035, 0.135])
    assert "buckets" not in methods["gapo_linear"]
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# Uniform vs VIGOR allocation")
    assert "| vigor_gapo_linear | 320 ± 0 |" in md and "## VIGOR per difficulty bucket" in md
    assert "| vigor_gapo_linear | hard | 3.500 ± 0.707 |" in md
    found = summary["findings"]
    assert "vigor_gapo_linear: 1 step(s) did NOT spend exactly 64 rollouts" in found
    assert "vigor_harder_gapo_linear: spent 64 rollouts in every step (the uniform budget)" in found
    line = next(f for f in found if f.startswith("vigor_gapo_linear vs gapo_linear: rollouts"))
    assert "320 ± 0 vs 384 ± 0" in line and "uniform / VIGOR = 1.20" in line
    line = next(f for f in found if f.startswith("Harder-first vs random tie-break"))
    assert "0.333 vs 0.667 (-0.333" in line
    line = next(f for f in found if f.startswith("vigor_gapo_linear: a hard prompt got 3.50 rollouts"))
    assert "1.000 of those were dropped" in line and "0.667 of hard prompts were starved" in line
    assert all(f"- {f}" in md for f in found)


def test_a_target_set_by_hand_and_one_never_reached(tmp_path):
    s = settings()
    metrics = {name: study.read_metrics(p) for name, p in write_runs(tmp_path, s).items()}
    low = sv.summarize(metrics, s, target=0.3)["methods"]
    assert low["gapo_linear"]["rollouts_to_target"]["values"] == [320, 320]  # 0.35 / 0.36 at step 5
    assert low["vigor_harder_gapo_linear"]["rollouts_to_target"]["values"] == [256, 256]  # 0.30 at step 4
    high = sv.summarize(metrics, s, target=0.6)
    never = high["methods"]["gapo_linear"]["rollouts_to_target"]
    assert never["values"] == [None, None] and never["reached"] == 0 and never["mean"] is None
    found = sv.findings(high, study.summarize(metrics, s), s)
    assert any("not reached (0/2 seeds)" in f for f in found)


def test_methods_turn_vigor_on_with_the_runs_seed_and_tie_break(tmp_path):
    s = settings(seeds=[5])
    plain = study.run_overrides(tmp_path, "gapo_linear", 5, s)
    assert "vigor=enabled" not in plain and "vigor.seed=5" in plain
    on = study.run_overrides(tmp_path, "vigor_gapo_linear", 5, s)
    assert "vigor=enabled" in on and "actor_rollout_ref.actor.policy_loss.schedule=linear" in on
    harder = study.run_overrides(tmp_path, "vigor_harder_gapo_linear", 5, s)
    assert "vigor.tie_break=harder_first" in harder
    fixed = study.run_overrides(tmp_path, "vigor_gspo_clip_higher", 5, s)
    assert "actor_rollout_ref.actor.policy_loss.schedule=constant" in fixed and "vigor=enabled" in fixed
    # the clip study's defaults do not change
    assert StudySettings().methods == list(study.CLIP_METHODS)


@pytest.mark.parametrize("value", ["0", "1.5", "nan", "-0.2"])
def test_bad_target_is_refused_naming_the_flag(value, capsys):
    with pytest.raises(SystemExit):
        sv.main(["--target", value, "--report-only", "--out", "/nonexistent"])
    assert "--target must be a success rate in (0, 1]" in capsys.readouterr().err


def test_study_train_rows_carry_their_buckets_data_source(tmp_path):
    """VIGOR's per-bucket counts key on the train prompts' data_source: each train row must carry its bucket's."""
    import pyarrow.parquet as pq

    from gapo.smoke.task import DIFFICULTY_BUCKETS, bucket_source, make_study_dataset

    paths = make_study_dataset(tmp_path, n_train=31, n_val_per_bucket=2)
    for split, per_bucket in (("train", {10, 11}), ("val", {2})):
        rows = pq.read_table(paths[split]).to_pylist()
        for row in rows:
            assert row["data_source"] == bucket_source(row["extra_info"]["bucket"])
            lo, hi = DIFFICULTY_BUCKETS[row["extra_info"]["bucket"]]
            assert lo <= len(row["reward_model"]["ground_truth"]) <= hi
        counts = {b: sum(r["extra_info"]["bucket"] == b for r in rows) for b in DIFFICULTY_BUCKETS}
        assert set(counts.values()) <= per_bucket and sum(counts.values()) == len(rows)


def test_held_out_comparisons_list_the_hard_bucket_always_and_others_only_beyond_noise(tmp_path):
    # vigor_gapo_linear's validation numbers are 0.1 above gapo_linear's in every bucket
    # (tests/test_studies_gspo_vs_gapo.py's run_metrics)
    for per_bucket, others in ((3, False), (400, True)):
        s = settings(val_per_bucket=per_bucket)
        metrics = {name: study.read_metrics(p) for name, p in write_runs(tmp_path / str(per_bucket), s).items()}
        found = sv.findings(sv.summarize(metrics, s), study.summarize(metrics, s), s)
        pair = [f for f in found if f.startswith("vigor_gapo_linear - gapo_linear, final held-out")]
        assert sum("on the hard bucket" in f for f in pair) == 2  # pass@1 and pass@4, whatever the noise
        assert any("on the mid bucket: +0.100" in f for f in pair) is others
        assert all("beyond 2 standard errors" in f for f in pair if "hard" not in f)

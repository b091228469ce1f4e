"""The exploration study's statistics and report (recipe.studies.stats, recipe.studies.explore_report) on constructed
logs, against values computed by hand here; its command line's refusals. The runs themselves:
tests/trl_integration/test_study_explore.py."""

import json
import math
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from recipe.studies import explore, stats
from recipe.studies.explore import run_dir
from recipe.studies.explore_report import (
    clip_numbers,
    heldout_numbers,
    live_numbers,
    pilot_result,
    write_report,
)
from recipe.studies.explore_run import METHODS, RunSpec, StudySettings, eval_steps

T975_2 = 4.302652729749  # Student's t, 97.5% quantile, 2 degrees of freedom (printed tables: 4.303)


# --- statistics ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("p, df, expected", [
    (0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 11, 2.2010), (0.975, 30, 2.0423), (0.8, 11, 0.8755),
    (0.95, 5, 2.0150), (0.975, 10_000, 1.9602), (0.025, 11, -2.2010), (0.5, 7, 0.0),
])
def test_t_quantiles_match_printed_tables(p, df, expected):
    assert stats.t_quantile(p, df) == pytest.approx(expected, abs=1e-4)
    assert stats.t_cdf(stats.t_quantile(p, df), df) == pytest.approx(p, abs=1e-9)


def test_summary_paired_and_power_by_hand():
    s = stats.summary([0.1, 0.15, 0.2])
    assert (s["mean"], s["sd"], s["se"]) == pytest.approx((0.15, 0.05, 0.05 / math.sqrt(3)))
    assert (s["low"], s["high"]) == pytest.approx((0.15 - T975_2 * 0.05 / math.sqrt(3), 0.15 + T975_2 * 0.05 / math.sqrt(3)))
    assert s["dz"] == pytest.approx(3.0)
    d = stats.paired([0.5, 0.625, 0.375], [0.25, 0.375, 0.25])  # differences 0.25, 0.25, 0.125
    sd = math.sqrt(((0.25 - 0.625 / 3) ** 2 * 2 + (0.125 - 0.625 / 3) ** 2) / 2)
    assert (d["mean"], d["sd"]) == pytest.approx((0.625 / 3, sd))
    assert stats.verdict(d) == "above 0" and stats.verdict(stats.summary([-1, 1])) == "includes 0"
    one = stats.summary([0.3])
    assert one["low"] is None and stats.verdict(one) == "one seed"
    # mde(12) = (t(.975, 11) + t(.8, 11)) sd / sqrt(12); seeds for 0.05 at sd 0.05: n = 10 (n = 9 gives 0.0533)
    assert stats.minimum_detectable(0.05, 12) == pytest.approx((2.200985 + 0.875530) * 0.05 / math.sqrt(12), abs=1e-6)
    assert stats.minimum_detectable(0.05, 9) == pytest.approx((2.306004 + 0.888890) * 0.05 / 3, abs=1e-6)
    assert stats.seeds_needed(0.05, 0.05) == 10
    with pytest.raises(ValueError, match="one of each per seed"):
        stats.paired([1, 2], [1])
    with pytest.raises(ValueError, match="must be > 0"):
        stats.seeds_needed(0.1, 0)


# --- per-run numbers ----------------------------------------------------------------------------------------------

def test_heldout_numbers_by_hand():
    numbers = heldout_numbers({"hard": {"n": 16, "correct": [0, 4, 16], "distinct": [3, 5, 1]},
                               "easy": {"n": 16, "correct": [8], "distinct": [2]}})
    assert numbers["pass1/hard"] == pytest.approx((0 + 0.25 + 1) / 3)
    # pass@8 of 4 correct in 16: 1 - C(12, 8) / C(16, 8) = 1 - 495 / 12870
    assert numbers["pass8/hard"] == pytest.approx((0 + 1 - 495 / 12870 + 1) / 3)
    assert numbers["coverage/hard"] == pytest.approx(2 / 3)  # c / n above 5%: 4/16 and 16/16
    assert numbers["distinct/hard"] == pytest.approx(3.0)
    assert numbers["pass1/all"] == pytest.approx((0 + 0.25 + 1 + 0.5) / 4)  # pooled over the prompts, not the buckets
    assert numbers["distinct/all"] == pytest.approx(11 / 4)


def test_clip_numbers_average_within_a_step_then_over_steps():
    metrics = {1: {"gapo/clipfrac_pos/c1": 0.4, "gapo/clipfrac_pos/c2": 0.0, "gapo/clipfrac_pos/c6": 0.1,
                   "gapo/ratio_dev_pos/c1": 0.3, "gapo/ratio_dev_pos/c6": 0.1, "gapo/is_adv_corr": 0.5},
               2: {"gapo/clipfrac_pos/c2": 0.5, "gapo/clipfrac_pos/c7": 0.3, "gapo/ratio_dev_pos/c7": 0.2},
               3: {"gapo/clipfrac_pos/c4": 0.9, "gapo/is_adv_corr": -0.1}}
    n = clip_numbers(metrics)
    assert n["clip_small"] == pytest.approx((0.2 + 0.5) / 2)  # not (0.4 + 0 + 0.5) / 3 = 0.3
    assert n["clip_large"] == pytest.approx(0.2)
    assert n["clip_gap"] == pytest.approx(0.15)
    assert n["dev_small"] == pytest.approx(0.3) and n["dev_large"] == pytest.approx(0.15)
    assert n["corr"] == pytest.approx(0.2)
    assert clip_numbers({1: {"gapo/clipfrac_pos/c1": 0.4}})["clip_gap"] is None  # no large-c success: no gap
    # the real design's large band (c = 4-7): step 3's c = 4 joins it -> (0.1 + 0.3 + 0.9) / 3
    real = clip_numbers(metrics, ((1, 2), (4, 5, 6, 7)))
    assert real["clip_large"] == pytest.approx(1.3 / 3) and real["clip_small"] == pytest.approx(n["clip_small"])


def test_live_numbers_read_the_last_quarter():
    metrics = {s: {"gapo/explore/entrance_distinct": s / 10, "reward": 1.0 if s > 6 else 0.0} for s in range(1, 9)}
    metrics[8].pop("gapo/explore/entrance_distinct")  # a step that did not generate
    live = live_numbers(metrics, 8)
    assert live["live_distinct"] == pytest.approx(0.7) and live["reward"] == pytest.approx(1.0)
    assert live["entropy_success"] is None
    # quarters of 8 steps: (0, 2], (2, 4], (4, 6], (6, 8]
    assert [live[f"live_distinct@q{j}"] for j in range(1, 5)] == pytest.approx([0.15, 0.35, 0.55, 0.7])
    assert [live[f"reward@q{j}"] for j in range(1, 5)] == pytest.approx([0, 0, 0, 1])


# --- a constructed study ------------------------------------------------------------------------------------------

SETTINGS = replace(StudySettings(), steps=8, eval_every=4, eval_prompts=2, eval_samples=4)
SEEDS = (1, 2, 3)
# held-out correct counts (of 4) per seed, after the last step, for the primaries' metrics
HARD_FINAL = {"gapo_linear": [[2, 2], [3, 2], [2, 1]], "gspo_clip_higher": [[1, 1], [1, 2], [1, 1]],
              "gspo_symmetric": [[0, 1], [1, 1], [1, 1]]}
HIGH_FINAL = {"gapo_linear": [[3, 4], [4, 3], [3, 3]], "gspo_clip_higher": [[4, 4], [3, 3], [3, 4]],
              "gspo_symmetric": [[2, 2], [3, 3], [3, 3]]}


def write_run(out, spec, settings=SETTINGS, hard_final=None, hard_start=(0, 1)):
    folder = run_dir(out, spec)
    folder.mkdir(parents=True)
    i = spec.seed - 1
    lines = []
    for step in eval_steps(settings):
        if spec.regime == "tail":
            hard = list(hard_start) if step == 0 else (hard_final or HARD_FINAL[spec.method])[i]
            buckets = {"hard": hard, "mid": [2, 2], "easy": [3, 3]}
        else:
            buckets = {"high": [3, 3] if step == 0 else HIGH_FINAL[spec.method][i]}
        for bucket, correct in buckets.items():
            collapsed = step == settings.steps and spec == RunSpec("high", "gspo_symmetric", 1)
            lines.append({"step": step, "bucket": bucket, "n": settings.eval_samples, "correct": correct,
                          "distinct": [1, 1] if collapsed else [3, 4]})
    (folder / "heldout.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    clip_small = 0.4 + 0.1 * i if spec.method == "gspo_symmetric" else 0.2
    metrics = [{"step": 1, "data": {"gapo/clipfrac_pos/c1": clip_small, "gapo/clipfrac_pos/c6": 0.1}},
               {"step": 2, "data": {"gapo/clipfrac_pos/c2": 0.2, "gapo/clipfrac_pos/c7": 0.3}}]
    metrics += [{"step": s, "data": {"reward": 0.5, "gapo/explore/entrance_distinct": 0.5 + 0.1 * i}} for s in (7, 8)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (folder / "done.json").write_text(json.dumps({"settings": asdict(settings)}))


def constructed_study(out, skip=()):
    for spec in explore.specs(SEEDS):
        if spec not in skip:
            write_run(out, spec)


def test_report_numbers_and_sentences_from_constructed_runs(tmp_path):
    constructed_study(tmp_path, skip={RunSpec("high", "gspo_clip_higher", 3)})
    paths = write_report(tmp_path, SEEDS, SETTINGS, "study", 61.0)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["missing"] == ["high/gspo_clip_higher/seed3"]

    # effect: hard pass@1 GAPO 0.5, 0.625, 0.375 vs clip-higher 0.25, 0.375, 0.25 -> 0.25, 0.25, 0.125
    effect = report["primary"]["effect"]["result"]
    mean = 0.625 / 3
    sd = math.sqrt((2 * (0.25 - mean) ** 2 + (0.125 - mean) ** 2) / 2)
    half = T975_2 * sd / math.sqrt(3)
    assert (effect["n"], effect["mean"], effect["low"], effect["high"]) == pytest.approx((3, mean, mean - half, mean + half))
    assert effect["dz"] == pytest.approx(mean / sd)
    assert report["primary"]["effect"]["verdict"] == "the interval lies above 0"
    assert report["primary"]["effect"]["power"]["mde"] == pytest.approx((T975_2 + stats.t_quantile(0.8, 2)) * sd / math.sqrt(3))

    # diagnosis: symmetric clip small-c 0.4, 0.5, 0.6 at step 1 and 0.2 at step 2 -> (0.3, 0.35, 0.4) - 0.2
    diagnosis = report["primary"]["diagnosis"]["result"]
    assert (diagnosis["mean"], diagnosis["sd"]) == pytest.approx((0.15, 0.05))
    assert diagnosis["low"] == pytest.approx(0.15 - T975_2 * 0.05 / math.sqrt(3))

    # high-pass: paired over the two seeds both have: GAPO 0.875, 0.875 vs clip-higher 1.0, 0.75 -> -0.125, +0.125
    high = report["primary"]["high_pass"]["result"]
    assert (high["n"], high["mean"], high["sd"]) == pytest.approx((2, 0.0, 0.125 * math.sqrt(2)))
    assert report["primary"]["high_pass"]["verdict"].startswith("the interval includes 0: no difference detected")
    stability = report["stability"]
    assert stability["gspo_symmetric"] == {"runs": 3, "drops": 1, "collapses": 1}  # seed 1: 0.75 -> 0.5, distinct 1
    assert stability["gapo_linear"] == {"runs": 3, "drops": 0, "collapses": 0}
    assert stability["gspo_clip_higher"]["runs"] == 2

    # a secondary: GAPO minus the symmetric clip in hard pass@1 (0.125, 0.25, 0.25 there)
    vs = report["tables"]["effect"]["pass1/hard"]["vs"]["gspo_symmetric"]
    assert vs["mean"] == pytest.approx((0.375 + 0.375 + 0.125) / 3)
    # worst drop of hard pass@1 from step 0 (0.125): the lowest of steps 4 and 8 (the same counts)
    runs = report["runs"]["tail"]["gspo_symmetric"]
    assert runs["1"]["worst_drop/hard"] == pytest.approx(0.0) and runs["1"]["pass1_change/hard"] == pytest.approx(0.0)
    assert report["tables"]["effect"]["live_distinct"]["methods"]["gapo_linear"]["mean"] == pytest.approx(0.6)

    # over training: hard pass@1 of GAPO at steps 0, 4, 8 (0.125 at step 0 for every seed; 0.5, 0.625, 0.375 after)
    over = report["heldout_over_training"]["tail/hard"]["gapo_linear"]
    assert over["0"]["mean"] == pytest.approx(0.125) and over["0"]["sd"] == pytest.approx(0.0)
    assert over["8"]["mean"] == pytest.approx(0.5) and over["4"]["mean"] == pytest.approx(0.5)
    quarter4 = report["quarters"]["tail"]["live_distinct"]["gapo_linear"][3]
    assert quarter4["mean"] == pytest.approx(0.6) and report["quarters"]["tail"]["live_distinct"]["gapo_linear"][0] is None
    md = (tmp_path / "report.md").read_text()
    assert "| tail/hard | step 0 | step 4 | step 8 |" in md and "verl plug-in's on a shared batch" in md
    assert f"{mean:.3f} [{mean - half:.3f}, {mean + half:.3f}]" in md
    assert "the interval lies above 0" in md and "a null result" in md
    assert "Missing or unfinished runs (left out): high/gspo_clip_higher/seed3" in md
    assert "Wall time 1.0 min" in md
    assert any(line.startswith("Effect (primary)") and f"{mean:.3f}" in line for line in report["findings"])
    assert "1 of 3 runs dropped" in md
    assert paths[-1].name == "heldout_pass1.png"


def test_a_run_with_other_settings_is_not_counted_done(tmp_path):
    spec = RunSpec("tail", "gapo_linear", 1)
    write_run(tmp_path, spec)
    assert explore.is_done(run_dir(tmp_path, spec), SETTINGS)
    assert not explore.is_done(run_dir(tmp_path, spec), replace(SETTINGS, learning_rate=0.01))
    assert not explore.is_done(tmp_path / "nowhere", SETTINGS)


def test_pilot_rule_picks_the_smallest_learning_rate_that_moves_the_hard_bucket(tmp_path):
    still = {m: [[0, 1]] * 4 for m in METHODS}  # hard pass@1 stays at its step-0 value 0.125
    for lr, hard in ((0.01, still), (0.03, None)):
        settings = replace(SETTINGS, learning_rate=lr)
        for spec in explore.specs(SEEDS):
            write_run(tmp_path / f"lr{lr:g}", spec, settings, hard_final=hard[spec.method] if hard else None)
    result = pilot_result({0.01: tmp_path / "lr0.01", 0.03: tmp_path / "lr0.03"}, SEEDS, SETTINGS)
    assert result["moving"] == [0.03] and result["chosen_lr"] == 0.03
    # GAPO moved 0.375, 0.5, 0.25 from 0.125 at 0.03
    assert result["per_lr"][0.03]["moves"]["gapo_linear"]["mean"] == pytest.approx(0.375)
    assert result["per_lr"][0.01]["moves"]["gapo_linear"]["mean"] == pytest.approx(0.0)
    sd_effect = result["per_lr"][0.03]["primary"]["effect"]["result"]["sd"]
    needed = {q: stats.seeds_needed(p["result"]["sd"], 0.05) for q, p in result["per_lr"][0.03]["primary"].items()}
    assert result["needed"] == needed
    assert result["seeds"] == min(24, max(12, *needed.values()))
    assert stats.seeds_needed(sd_effect, 0.05) > 12  # sd 0.072: 12 seeds detect only ~0.064
    # the high-pass primary (sd 0.177 over two seeds) needs more than 24: capped, and said
    assert needed["high_pass"] > 24 and result["seeds"] == 24 and result["underpowered"] == ["high_pass"]


@pytest.mark.parametrize("argv, message", [
    (["--jobs", "0"], "--jobs must be >= 1, got 0"),
    (["--reduced", "--pilot"], "two different studies"),
    (["--steps", "0"], "steps must be an integer >= 1, got 0"),
    (["--lr", "-1"], "learning_rate must be > 0, got -1.0"),
])
def test_command_line_refuses_bad_settings_before_training(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        explore.main(["--out", str(tmp_path / "s"), *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_report_only_names_the_settings_the_runs_there_were_trained_with(tmp_path, capsys):
    write_run(tmp_path, RunSpec("tail", "gapo_linear", 1))
    with pytest.raises(SystemExit):
        explore.main(["--out", str(tmp_path), "--report-only", "--seeds", "1"])
    err = capsys.readouterr().err
    assert "none of the 6 runs" in err and "steps: 8 (now 200)" in err and "eval_samples: 4 (now 16)" in err
    assert not (tmp_path / "report.md").exists()


def test_a_failed_run_stops_the_study_with_its_name_and_exit_1(tmp_path, capsys, monkeypatch):
    def failing(out, run_specs, settings, jobs, echo=print):
        raise RuntimeError("run tail/gapo_linear/seed3 failed (ValueError: boom); its folder is X; a rerun keeps the "
                           "5 finished runs")

    monkeypatch.setattr(explore, "run_all", failing)
    assert explore.main(["--out", str(tmp_path), "--seeds", "3"]) == 1
    err = capsys.readouterr().err
    assert "[study-explore] stopped: run tail/gapo_linear/seed3 failed (ValueError: boom)" in err
    assert "a rerun keeps the 5 finished runs" in err and not (tmp_path / "report.md").exists()


def test_fresh_wipes_the_pilots_runs_too(tmp_path, monkeypatch):
    for lr in explore.PILOT_LEARNING_RATES:
        write_run(tmp_path / f"lr{lr:g}", RunSpec("tail", "gapo_linear", 1))
    seen = []
    monkeypatch.setattr(explore, "run_all", lambda out, *a, **k: seen.append(out) or 0.0)
    assert explore.main(["--out", str(tmp_path), "--pilot", "--fresh", "--seeds", "1"]) == 0
    assert [p.name for p in seen] == [f"lr{lr:g}" for lr in explore.PILOT_LEARNING_RATES]
    assert not any((tmp_path / f"lr{lr:g}" / "runs").exists() for lr in explore.PILOT_LEARNING_RATES)
    assert (tmp_path / "pilot.md").exists()


# --- the study on a real policy (task arithmetic) -------------------------------------------------------------------

from recipe.studies import explore_real  # noqa: E402
from recipe.studies.explore_report import write_real_report  # noqa: E402

REAL = replace(explore_real.SETTINGS, steps=4, eval_every=4, eval_prompts=2)
REAL_BUCKETS = ("add1", "sub1", "mul1", "add2")
# add2 correct counts (of 8) per seed after the last step; every run starts at [0, 1] (pass@1 1/16)
REAL_ADD2 = {"gapo_linear": [[2, 1], [1, 1], [3, 2]], "gspo_clip_higher": [[1, 0], [1, 1], [1, 1]],
             "gspo_symmetric": [[0, 1], [0, 0], [1, 1]]}


def write_real_run(out, spec, settings=REAL):
    """A finished real-study run: held-out at steps 0 and 4 for the four buckets, clip diagnostics at c = 1, 2, 4, 6, 7
    that differ by method and seed (c = 4 is in the real design's large band, not in the tiny study's)."""
    folder = run_dir(out, spec)
    folder.mkdir(parents=True)
    i = spec.seed - 1
    lines = []
    for step in (0, settings.steps):
        for bucket in REAL_BUCKETS:
            if bucket == "add2":
                correct = REAL_ADD2[spec.method][i] if step else [0, 1]
            else:
                correct = [4, 6] if step else [2, 2]
            lines.append({"step": step, "bucket": bucket, "n": 8, "correct": correct, "distinct": [2, 3]})
    (folder / "heldout.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    symmetric = spec.method == "gspo_symmetric"
    # c = 1 clipped 0.3 + 0.1 i under the symmetric clip (0.1 otherwise), c = 2 0.2, c = 4 0.35, c = 6 and 7 0.05
    metrics = [{"step": 1, "data": {"gapo/clipfrac_pos/c1": 0.3 + 0.1 * i if symmetric else 0.1,
                                    "gapo/ratio_dev_pos/c1": 0.004, "gapo/clipfrac_pos/c6": 0.05,
                                    "gapo/ratio_dev_pos/c6": 0.001}},
               {"step": 2, "data": {"gapo/clipfrac_pos/c2": 0.2, "gapo/clipfrac_pos/c4": 0.35,
                                    "gapo/clipfrac_pos/c7": 0.05, "reward": 0.4}}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (folder / "done.json").write_text(json.dumps({"settings": asdict(settings)}))


def test_the_real_design_is_the_learning_runs_settings_on_the_arithmetic_buckets():
    from recipe.learn_trl import LEARN_SETTINGS

    s = explore_real.SETTINGS
    s.validate()
    assert s.task == "arithmetic" and s.learning_rate == LEARN_SETTINGS["learning_rate"]
    # the tiny study's clips: the learning run's (3e-3 / 5e-3) clipped every off-policy success (explore_real.SETTINGS)
    assert (s.eps_low, s.eps_high_max) == (StudySettings().eps_low, StudySettings().eps_high_max) == (0.02, 0.05)
    assert s.prompts_per_generation * s.k // s.steps_per_generation == LEARN_SETTINGS["per_device_train_batch_size"]
    assert s.max_completion_length == LEARN_SETTINGS["max_completion_length"]
    chosen = explore.design("arithmetic")
    assert len(chosen.seeds) >= 8 and not set(chosen.seeds) & set(chosen.pilot_seeds)
    run_specs = explore.specs(chosen.seeds, task="arithmetic")
    assert {sp.regime for sp in run_specs} == {"arith"} and len(run_specs) == 3 * len(chosen.seeds)
    assert explore_real.PRIMARY["effect"]["metric"] == "pass1/add2"
    # the diagnosis's bands: rare (c <= k/4) against half or more (c >= k/2); the tiny study keeps c = 6-7
    assert chosen.bands == ((1, 2), (4, 5, 6, 7)) and explore.design("smoke").bands == ((1, 2), (6, 7))
    assert "(4-7)" in explore_real.PRIMARY["diagnosis"]["text"]
    with pytest.raises(ValueError, match="unknown task 'chess'"):
        explore.design("chess")
    with pytest.raises(ValueError, match="task must be one of smoke, arithmetic, got 'chess'"):
        replace(s, task="chess").validate()


def test_arithmetic_rows_hold_out_the_same_prompts_for_every_run_apart_from_training():
    from recipe.studies.explore_run import arith_rows

    train, heldout = arith_rows("train", REAL), arith_rows("heldout", REAL)
    assert arith_rows("heldout", REAL) == heldout and len(train) == REAL.n_train
    assert sorted({r["bucket"] for r in heldout}) == sorted(REAL_BUCKETS)
    assert all(sum(r["bucket"] == b for r in heldout) == REAL.eval_prompts for b in REAL_BUCKETS)
    assert not {r["extra_info"]["problem"] for r in heldout} & {r["extra_info"]["problem"] for r in train}
    row = heldout[0]
    assert row["data_source"] == f"gapo_arith_{row['bucket']}" and row["ground_truth"].lstrip("-").isdigit()


def test_a_run_recorded_before_a_setting_existed_counts_at_that_settings_default(tmp_path):
    spec = RunSpec("tail", "gapo_linear", 1)
    write_run(tmp_path, spec)
    done = json.loads((run_dir(tmp_path, spec) / "done.json").read_text())
    del done["settings"]["task"]  # a run of the smoke study from before the real task existed
    (run_dir(tmp_path, spec) / "done.json").write_text(json.dumps(done))
    assert explore.is_done(run_dir(tmp_path, spec), SETTINGS)
    assert explore.settings_differ(run_dir(tmp_path, spec), replace(SETTINGS, task="arithmetic")) == [
        "task: smoke (now arithmetic)"]


def test_real_report_numbers_from_constructed_runs(tmp_path):
    seeds = (1, 2, 3)
    for spec in explore.specs(seeds, task="arithmetic"):
        write_real_run(tmp_path, spec)
    write_real_report(tmp_path, seeds, REAL, "study", None)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["missing"] == [] and report["task"] == "arithmetic"
    # effect: add2 pass@1 GAPO 3/16, 2/16, 5/16 vs clip-higher 1/16, 2/16, 2/16 -> 2/16, 0, 3/16
    effect = report["primary"]["effect"]["result"]
    diffs = [2 / 16, 0.0, 3 / 16]
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
    assert (effect["n"], effect["mean"], effect["sd"]) == pytest.approx((3, mean, sd))
    assert effect["low"] == pytest.approx(mean - T975_2 * sd / math.sqrt(3))
    # diagnosis under the symmetric clip: small c mean of (c1, c2) per step -> step 1 c1 (0.3, 0.4, 0.5), step 2 0.2;
    # large, the real design's c = 4-7: step 1 c6 0.05, step 2 mean of c4 0.35 and c7 0.05 = 0.2 -> 0.125 (the tiny
    # study's c = 6-7 would give 0.05)
    diagnosis = report["primary"]["diagnosis"]["result"]
    assert diagnosis["mean"] == pytest.approx((0.25 + 0.3 + 0.35) / 3 - 0.125)
    assert diagnosis["sd"] == pytest.approx(0.05)
    assert report["tables"]["diagnosis"]["clip_large"]["methods"]["gapo_linear"]["mean"] == pytest.approx(0.125)
    assert any(line.startswith("Diagnosis (primary): under the fixed symmetric clip, the clip fraction of successes "
                               "at c = 1-2 minus that at c = 4-7 was ") for line in report["findings"])
    # per c: the symmetric clip's c = 1 clip fraction across seeds, and GAPO minus it paired by seed
    per_c = report["tables"]["per_c"]
    assert per_c["clip_c1"]["methods"]["gspo_symmetric"]["mean"] == pytest.approx(0.4)
    assert per_c["clip_c1"]["vs"]["gspo_symmetric"]["mean"] == pytest.approx(0.1 - 0.4)
    assert per_c["dev_c1"]["methods"]["gapo_linear"]["mean"] == pytest.approx(0.004)
    assert per_c["clip_c3"]["methods"]["gapo_linear"] is None  # no success with c = 3 logged
    # every bucket and the overall before and after; pass@1 over all buckets rose from (2+2)*3/16/... by hand
    over = report["heldout_over_training"]
    assert set(over) == {*REAL_BUCKETS, "all"}
    assert over["add1"]["gapo_linear"]["0"]["mean"] == pytest.approx(0.25)
    assert over["add1"]["gapo_linear"]["4"]["mean"] == pytest.approx(0.625)
    change = report["tables"]["effect"]["pass1_change/all"]["methods"]["gapo_linear"]["mean"]
    before = (3 * 0.25 + 1 / 16) / 4
    after = (3 * 0.625 + (3 + 2 + 5) / 3 / 16) / 4
    assert change == pytest.approx(after - before)
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# Exploration study on a real policy: GAPO vs fixed clips (study)")
    assert "SmolLM2-135M-Instruct" in md and "| clip_c1 |" in md and "| add2 | step 0 | step 4 |" in md
    assert any(line.startswith("Effect (primary): held-out pass@1 on the hard bucket (add2)") for line in
               report["findings"])


def test_the_real_task_through_the_command_line_reports_and_refuses(tmp_path, capsys, monkeypatch):
    for spec in explore.specs((1, 2), task="arithmetic"):
        write_real_run(tmp_path, spec, explore_real.SETTINGS)
    assert explore.main(["--task", "arithmetic", "--out", str(tmp_path), "--report-only", "--seeds", "1", "2"]) == 0
    assert (tmp_path / "report.md").read_text().startswith("# Exploration study on a real policy")
    # the smoke study's settings do not count the real runs done
    with pytest.raises(SystemExit):
        explore.main(["--out", str(tmp_path), "--report-only", "--seeds", "1", "2"])
    assert "runs of task arithmetic are there: pass --task arithmetic" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        explore.main(["--task", "chess", "--out", str(tmp_path / "x")])
    assert exit_info.value.code == 2 and "invalid choice: 'chess'" in capsys.readouterr().err
    seen = []
    monkeypatch.setattr(explore, "run_all", lambda out, run_specs, settings, jobs: seen.append(
        (out, run_specs, settings)) or 0.0)
    monkeypatch.chdir(tmp_path)
    explore.main(["--task", "arithmetic", "--reduced"])
    out, run_specs, settings = seen[0]
    assert out == Path("runs/study-explore-real-reduced") and settings.task == "arithmetic"
    assert len(run_specs) == 6 and settings.steps == explore_real.REDUCED["settings"]["steps"]

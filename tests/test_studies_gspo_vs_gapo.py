"""recipe/studies/gspo_vs_gapo.py: the report's numbers from constructed metrics files (hand-computed), the run
bookkeeping (kept, rerun and command lines) with the trainer replaced, and the settings' errors. The real reduced
study (verl's trainer, both methods) runs in tests/vllm/test_study_vllm.py."""

import json
import math
import statistics
from pathlib import Path

import pytest

import recipe.studies.gspo_vs_gapo as study
from recipe.studies.gspo_vs_gapo import StudySettings, report, run_name, summarize

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BUCKETS = ("hard", "mid", "easy")


def settings(**kw) -> StudySettings:
    base = dict(seeds=[0, 1], methods=["gspo_clip_higher", "gapo_linear"], steps=4, val_every=2, val_n=4,
                val_per_bucket=3, n_train=16, last=2)
    return StudySettings(**{**base, **kw})


def val_value(mi: int, seed: int, step: int, bucket: int, which: int) -> float:
    """A distinct value per (method, seed, step, bucket, quantity): picking the wrong one changes the result."""
    return 0.1 * (mi + 1) + 0.01 * seed + 0.001 * step + 0.0001 * bucket + 0.00001 * which


def run_metrics(mi: int, seed: int, s: StudySettings) -> dict[int, dict]:
    names = ["pass@1", f"pass@{s.val_n}", "coverage_frac@5%"]
    steps: dict[int, dict] = {}
    for step in range(0, s.steps + 1):
        m = {}
        if step % s.val_every == 0:
            for b, bucket in enumerate(BUCKETS):
                for w, name in enumerate(names):
                    m[f"val-passk/gapo_smoke_{bucket}/{name}"] = val_value(mi, seed, step, b, w)
                m[f"val-passk/gapo_smoke_{bucket}/pass@2"] = 0.5  # logged, not reported
        if step >= 1:
            m["critic/score/mean"] = 0.2 * step + 0.05 * seed + 0.1 * mi
            m["gapo/groups/all_wrong_frac"] = 0.5 - 0.1 * step
            m["gapo/groups/mixed_frac"] = 0.3 + 0.1 * step
            m["gapo/groups/all_correct_frac"] = 0.2
            m["gapo/ratio_dev_pos/c2"] = 0.01 * step + 0.001 * seed
            m["gapo/clipfrac_pos/c2"] = 0.1
            m["gapo/is_adv_corr"] = 0.5 + 0.1 * seed
        # c1: seed 0 at steps 1 and 3 (0.2, 0.4), seed 1 at step 2 only (0.6): absent steps do not count
        if (seed == 0 and step in (1, 3)) or (seed == 1 and step == 2):
            m["gapo/clipfrac_pos/c1"] = {1: 0.2, 3: 0.4, 2: 0.6}[step]
            m["gapo/ratio_dev_pos/c1"] = 0.1
        if seed == 0 and step == 4:  # c5 in one seed only: left out of the per-c table
            m["gapo/clipfrac_pos/c5"] = 0.9
        steps[step] = m
    return steps


def write_runs(out: Path, s: StudySettings, metrics=None) -> dict[str, Path]:
    """Each run's metrics file; `metrics(method, mi, seed, s)` gives its {step: metrics} (default run_metrics)."""
    metrics = metrics or (lambda method, mi, seed, s: run_metrics(mi, seed, s))
    files = {}
    for mi, method in enumerate(s.methods):
        for seed in s.seeds:
            path = out / "runs" / run_name(method, seed) / "logs" / "train.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            # verl's file logger: one {"step", "data"} line per step (validation before training at step 0)
            path.write_text("".join(json.dumps({"step": t, "data": m}) + "\n"
                                    for t, m in metrics(method, mi, seed, s).items()))
            files[run_name(method, seed)] = path
    return files


def test_report_numbers_are_the_logged_ones_hand_computed(tmp_path):
    s = settings()
    files = write_runs(tmp_path, s)
    summary = report(tmp_path, s, files, wall_s=12.0)
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["methods"] == summary["methods"] and saved["findings"] == summary["findings"]
    for mi, method in enumerate(s.methods):
        res = saved["methods"][method]
        # validation: step 0 (base) and the last step (final), per bucket, across the two seeds
        for phase, step in (("base", 0), ("final", 4)):
            for b, bucket in enumerate(BUCKETS):
                for w, name in enumerate(["pass@1", "pass@4", "coverage_frac@5%"]):
                    vals = [val_value(mi, seed, step, b, w) for seed in (0, 1)]
                    got = res[phase][bucket][name]
                    assert got["values"] == pytest.approx(vals)
                    assert got["mean"] == pytest.approx(sum(vals) / 2)
                    assert got["std"] == pytest.approx(statistics.stdev(vals))  # sample std, n - 1
                assert "pass@2" not in res[phase][bucket]
        # training: the last 2 steps (3, 4): reward 0.2 * 3.5 + 0.05 seed + 0.1 mi
        reward = res["late"]["critic/score/mean"]
        assert reward["values"] == pytest.approx([0.7 + 0.1 * mi, 0.75 + 0.1 * mi])
        assert res["late"]["gapo/groups/all_wrong_frac"]["mean"] == pytest.approx(0.5 - 0.35)
        # and the first 2 steps (1, 2), to tell whether training moved the reward
        assert res["early"]["critic/score/mean"]["values"] == pytest.approx([0.3 + 0.1 * mi, 0.35 + 0.1 * mi])
        # mechanism over every step; c1 averages only the steps where it was logged
        c1 = res["mechanism"]["gapo/clipfrac_pos"]["1"]
        assert c1["values"] == pytest.approx([0.3, 0.6]) and c1["std"] == pytest.approx(math.sqrt(0.045))
        assert res["mechanism"]["gapo/ratio_dev_pos"]["2"]["values"] == pytest.approx([0.025, 0.026])
        assert set(res["mechanism"]["gapo/clipfrac_pos"]) == {"1", "2"}  # c5: one seed only
        assert res["mechanism"]["gapo/is_adv_corr"]["values"] == pytest.approx([0.5, 0.6])
    md = (tmp_path / "report.md").read_text()
    # the markdown shows the same numbers (3 decimals)
    final = saved["methods"]["gapo_linear"]["final"]["hard"]["pass@1"]
    assert f"{final['mean']:.3f} ± {final['std']:.3f}" in md
    assert "wall time of the whole study 12 s" in md
    for f in saved["findings"]:
        assert f"- {f}" in md
    for name in ("curves.png", "mechanism_gspo_clip_higher.png", "mechanism_gapo_linear.png"):
        path = tmp_path / "figures" / name
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 5000


def test_findings_follow_the_numbers(tmp_path):
    s = settings(val_per_bucket=400)
    metrics = {name: study.read_metrics(path) for name, path in write_runs(tmp_path, s).items()}
    found = summarize(metrics, s)["findings"]
    # gapo_linear (mi = 1) is 0.1 above gspo at every validated number; the seeds differ by 0.01 (std 0.00707), and
    # 400 problems x 4 samples x 2 seeds make the evaluation's noise small: p (1 - p) / 3200 per mean, p = 0.109 and
    # 0.209 (above the seeds' 0.00707^2 / 2), so the standard error is sqrt(3.03e-5 + 5.17e-5) = 0.009
    hard = next(f for f in found if f.startswith("gapo_linear - gspo_clip_higher, final pass@1 on hard"))
    assert "+0.100 (standard error 0.009" in hard and "beyond 2 standard errors" in hard
    # 1 GAPO method x 1 fixed clip x 3 buckets x 2 metrics: 6 comparisons, 0.27 crossing by chance
    assert any(f.startswith("6 held-out comparisons") and "about 0.3 of them" in f for f in found)
    # the same numbers from 3 problems x 4 samples: the evaluation's noise (not the seeds' agreement) decides
    small = summarize(metrics, settings(val_per_bucket=3))["findings"]
    hard = next(f for f in small if f.startswith("gapo_linear - gspo_clip_higher, final pass@1 on hard"))
    assert "+0.100 (standard error 0.105" in hard and "not distinguishable from noise" in hard
    assert any("clip fraction at c = 1 is 0.4500" in f and "binds" in f for f in found)
    # c1's |ratio - 1| (0.1 in both seeds) is above c2's (0.025, 0.026)
    assert any(f.startswith("gspo_clip_higher: mean |ratio - 1| of successes is 0.1000 at c = 1 and 0.0255 at c = 2")
               and "larger at small c beyond 2 standard errors" in f for f in found)
    # held-out pass@1 of each bucket rose by 0.004 from step 0 to step 4 (0.001 per step): within the noise of
    # 400 x 4 draws (standard error ~0.014), so nothing moved
    hard = next(f for f in found if f.startswith("gapo_linear: held-out pass@1 from step 0 to step 4"))
    assert "hard +0.004 (standard error 0.010)" in hard and "nowhere beyond 2 standard errors" in hard
    assert "over the first 2 steps 0.425, over the last 0.825" in hard
    # an easy bucket that rose from 0.2 to 0.9: moved
    summary = summarize(metrics, s)
    summary["methods"]["gapo_linear"]["final"]["easy"]["pass@1"] = {"mean": 0.9, "std": 0.01, "values": [0.89, 0.91]}
    moved = next(f for f in study.findings(summary, s) if f.startswith("gapo_linear: held-out pass@1"))
    # from 0.2052 (method 1, seeds 0 and 1, bucket 2)
    assert "easy +0.695" in moved and "beyond 2 standard errors in easy." in moved
    # the same runs with one seed: nothing is called distinguishable
    one = settings(seeds=[0])
    found = summarize({k: v for k, v in metrics.items() if k.endswith("-s0")}, one)["findings"]
    hard = next(f for f in found if f.startswith("gapo_linear - gspo_clip_higher, final pass@1 on hard"))
    assert "one seed: no spread to judge it by" in hard


def test_clip_that_never_binds_at_c1_is_reported_as_a_null_result(tmp_path):
    s = settings()
    files = write_runs(tmp_path, s)
    for name, path in files.items():
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        for rec in lines:
            if "gapo/clipfrac_pos/c1" in rec["data"]:
                rec["data"]["gapo/clipfrac_pos/c1"] = 0.0
            if "critic/score/mean" in rec["data"]:  # a reward that alternates and never rises
                rec["data"]["critic/score/mean"] = 0.4 + 0.1 * (rec["step"] % 2) + 0.01 * int(name[-1])
        path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    found = summarize({k: study.read_metrics(p) for k, p in files.items()}, s)["findings"]
    assert any(f.startswith("gspo_clip_higher: clip fraction at c = 1 is 0.0000 (< 0.01)") and "null result" in f
               for f in found)
    assert any(f.startswith("gapo_linear: held-out pass@1") and "over the first 2 steps 0.455, over the last 0.455"
               in f for f in found)


def test_finished_runs_are_kept_unfinished_ones_rerun_and_the_commands_written(tmp_path, monkeypatch):
    s = settings(seeds=[3], steps=2, val_every=2)
    calls = []

    def fake_train(run_dir, run, total_steps, overrides, timeout_s):
        calls.append((Path(run_dir).name, overrides))
        log = Path(run_dir) / "logs" / f"{run}.jsonl"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("".join(json.dumps({"step": t, "data": {}}) + "\n" for t in range(total_steps + 1)))

    monkeypatch.setattr(study, "train", fake_train)
    # gspo_clip_higher-s3 finished before (its last step logged); gapo_linear-s3 stopped after step 1
    done = tmp_path / "runs" / "gspo_clip_higher-s3" / "logs" / "train.jsonl"
    done.parent.mkdir(parents=True)
    done.write_text("".join(json.dumps({"step": t, "data": {}}) + "\n" for t in range(3)))
    partial = tmp_path / "runs" / "gapo_linear-s3" / "logs" / "train.jsonl"
    partial.parent.mkdir(parents=True)
    partial.write_text(json.dumps({"step": 1, "data": {}}) + "\n" + '{"step": 2, "da')
    printed = []
    files = study.run_all(tmp_path, s, echo=printed.append)
    assert [c[0] for c in calls] == ["gapo_linear-s3"]
    assert files == {"gspo_clip_higher-s3": done, "gapo_linear-s3": partial}
    assert any("gspo_clip_higher-s3: done before, kept" in p for p in printed)
    overrides = calls[0][1]
    for expected in ("data.seed=3", "actor_rollout_ref.rollout.seed=3", "trainer.test_freq=2",
                     "trainer.val_before_train=true", "actor_rollout_ref.rollout.val_kwargs.n=4",
                     "actor_rollout_ref.actor.policy_loss.schedule=linear", "trainer.save_freq=-1",
                     "actor_rollout_ref.actor.optim.lr=0.02"):
        assert expected in overrides
    commands = (tmp_path / "commands.sh").read_text().splitlines()
    runs = [line for line in commands if "recipe.main_gapo" in line]
    assert len(runs) == 2 and "schedule=constant" in runs[0] and "schedule=linear" in runs[1]
    assert all("VERL_PLATFORM=cpu" in line and "trainer.total_training_steps=2" in line for line in runs)
    # the symmetric clip sets eps_high_max to the lower clip (quoted for the shell)
    sym = study.run_overrides(tmp_path, "gspo_symmetric", 0, s)
    assert "actor_rollout_ref.actor.policy_loss.eps_high_max=${actor_rollout_ref.actor.clip_ratio_low}" in sym


@pytest.mark.parametrize("kw, message", [
    (dict(methods=["gspo", "gapo_linear"]), "unknown method(s) ['gspo']"),
    (dict(steps=10, val_every=4), "--steps (10) must be a multiple of --val-every (4)"),
    (dict(val_n=0), "--val-n must be >= 1, got 0"),
    (dict(last=9, steps=8), "--last (9) must be <= --steps (8)"),
    (dict(seeds=[1, 1]), "--seeds must be distinct"),
    (dict(rollout="sglang"), "--rollout 'sglang': choose from ['hf', 'vllm']"),
    (dict(jobs=0), "--jobs must be >= 1, got 0"),
    (dict(lr=float("nan")), "--lr must be a finite number > 0, got nan"),
])
def test_bad_settings_name_the_flag(kw, message):
    with pytest.raises(ValueError) as exc:
        settings(**kw).validate()
    assert message in str(exc.value)


def test_cli_refuses_bad_flags_before_running(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        study.main(["--out", str(tmp_path), "--steps", "5", "--val-every", "2"])
    assert exc.value.code == 2 and "--steps (5) must be a multiple of --val-every (2)" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_defaults_are_the_full_study_and_reduced_is_small():
    full, reduced = StudySettings(), StudySettings.reduced()
    full.validate()
    reduced.validate()
    assert full.methods == list(study.CLIP_METHODS) == ["gspo_symmetric", "gspo_clip_higher", "gapo_linear",
                                                        "gapo_exp"] and len(full.seeds) >= 3
    assert reduced.seeds == [0] and set(reduced.methods) == {"gspo_clip_higher", "gapo_linear"}


def test_figure_lines_are_means_over_the_seeds_that_logged_each_point():
    a = {1: {"gapo/clipfrac_pos/c1": 0.2, "timing_s/step": 3.0}, 2: {"gapo/clipfrac_pos/c1": 0.4}}
    b = {1: {"gapo/clipfrac_pos/c2": 0.9}, 2: {"gapo/clipfrac_pos/c1": 0.6}}
    run = study.seed_mean_run("m", [a, b], lambda k: k.startswith("gapo/"))
    assert run.steps == {1: {"gapo/clipfrac_pos/c1": 0.2, "gapo/clipfrac_pos/c2": 0.9},
                         2: {"gapo/clipfrac_pos/c1": pytest.approx(0.5)}}

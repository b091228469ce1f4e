"""The 2x2 study in reduced mode (`python -m recipe.studies.vigor_2x2 --reduced`: seed 0, fixed clip-higher GSPO, GAPO
linear and GAPO linear under VIGOR's allocation, 3 steps, validation before and after) through verl's trainer with
verl's real vLLM rollout on CPU. It is the clip study's reduced run (`recipe.studies.gspo_vs_gapo --reduced`: the
same two uniform methods, the same report code) plus a VIGOR run and the VIGOR study's own section, so one fixture
covers both.

It runs here, in the vLLM stream of `make test`, because that stream finishes minutes before the default one; the
study code is the same for both engines (`--rollout` only adds `platform=cpu_vllm`), and VIGOR's rounds with the HF
rollout are checked in tests/test_vigor_e2e.py. Checked: the report and the figures are written, every number of
report.json equals the one recomputed here from the runs' metrics files (verl's file logger), the methods got the
clips they name, each run sampled from the actor's weights, and the VIGOR run spent the uniform budget in groups of
the sizes its rounds logged. The study is the session's (tests/vllm/conftest.py's ``reduced_study``; its runs also
checkpoint their last step, and tests/vllm/test_vllm_rollout.py resumes its GAPO run).
"""

import json
import statistics
from pathlib import Path

import pytest

from recipe.smoke import MAX_ROLLOUT_PROBS_DIFF
from recipe.studies.gspo_vs_gapo import StudySettings
from recipe.studies.vigor_2x2 import REDUCED_METHODS, SUCCESS_RATE

pytestmark = pytest.mark.slow
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def logged(out: Path, method: str) -> dict[int, dict]:
    lines = (out / "runs" / f"{method}-s0" / "logs" / "train.jsonl").read_text().splitlines()
    return {rec["step"]: rec["data"] for rec in map(json.loads, lines)}


def test_report_and_figures_are_written(reduced_study):
    out = reduced_study["out"]
    md = (out / "report.md").read_text()
    for section in ("## Held-out pass@k at the last step (3)", "## Mechanism", "## Allocation: rollouts to a target",
                    "## VIGOR per difficulty bucket", "## What this shows and what it does not"):
        assert section in md
    for name in ("curves.png", *(f"mechanism_{m}.png" for m in REDUCED_METHODS)):
        path = out / "figures" / name
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 5000, name
    commands = (out / "commands.sh").read_text()
    assert commands.count("recipe.main_gapo") == 3 and "platform=cpu_vllm" in commands
    assert commands.count("vigor=enabled") == 1
    assert "[study] report:" in reduced_study["stdout"]


def test_report_numbers_equal_those_recomputed_from_the_logs(reduced_study):
    out = reduced_study["out"]
    s = StudySettings.reduced(REDUCED_METHODS)
    saved = json.loads((out / "report.json").read_text())
    assert list(saved["methods"]) == list(REDUCED_METHODS)
    for method in REDUCED_METHODS:
        m, res = logged(out, method), saved["methods"][method]
        assert sorted(m) == [0, 1, 2, 3]  # validation before training at step 0, then 3 steps
        for phase, step in (("base", 0), ("final", 3)):
            for bucket in ("hard", "mid", "easy"):
                for name in ("pass@1", f"pass@{s.val_n}", "coverage_frac@5%"):
                    assert res[phase][bucket][name]["values"] == [m[step][f"val-passk/gapo_smoke_{bucket}/{name}"]]
        late = [m[t]["critic/score/mean"] for t in (2, 3)]  # the last `last` = 2 steps
        assert res["late"]["critic/score/mean"]["mean"] == pytest.approx(statistics.mean(late))
        for c, got in res["mechanism"]["gapo/clipfrac_pos"].items():
            vals = [m[t][f"gapo/clipfrac_pos/c{c}"] for t in (1, 2, 3) if f"gapo/clipfrac_pos/c{c}" in m[t]]
            assert got["mean"] == pytest.approx(statistics.mean(vals))
        assert res["mechanism"]["gapo/clipfrac_pos"], f"{method}: no per-c clip fraction in the report"


def test_each_method_ran_its_clip_and_synced_the_engine(reduced_study):
    out = reduced_study["out"]
    fixed, gapo = logged(out, "gspo_clip_higher"), logged(out, "gapo_linear")
    for t in (1, 2, 3):
        # the fixed clip gives every success eps_high_max (0.05 in the smoke preset); GAPO spreads its thresholds
        assert fixed[t]["gapo/eps_high/min"] == pytest.approx(0.05) == fixed[t]["gapo/eps_high/max"]
        assert 0.02 - 1e-6 <= gapo[t]["gapo/eps_high/min"] <= gapo[t]["gapo/eps_high/max"] <= 0.05 + 1e-6
        for run in (fixed, gapo):
            assert run[t]["training/rollout_probs_diff_max"] < MAX_ROLLOUT_PROBS_DIFF
    assert any(gapo[t]["gapo/eps_high/min"] < 0.05 for t in (1, 2, 3))


def test_vigor_run_spent_the_budget_in_its_rounds_and_the_section_matches_the_logs(reduced_study):
    out = reduced_study["out"]
    saved = json.loads((out / "report.json").read_text())["vigor_study"]
    vigor = logged(out, "vigor_gapo_linear")
    uniform = logged(out, "gapo_linear")
    for t in (1, 2, 3):
        m = vigor[t]
        assert m["vigor/rollouts"] == 64 and m["training/rollout_probs_diff_max"] < MAX_ROLLOUT_PROBS_DIFF
        assert sum(m[f"vigor/round{r}/rollouts"] for r in range(5)) == 64 and m["vigor/round0/rollouts"] == 16
        assert m["vigor/group_size/max"] > 8 and m["vigor/group_size/min"] == 2  # grown and dropped prompts
        # per difficulty bucket: the batch's 8 prompts and 64 rollouts, nothing lost
        per = {b: {k: m[f"vigor/source/gapo_smoke_{b}/{k}"] for k in ("prompts", "rollouts")}
               for b in ("hard", "mid", "easy") if f"vigor/source/gapo_smoke_{b}/prompts" in m}
        assert sum(v["prompts"] for v in per.values()) == 8 and sum(v["rollouts"] for v in per.values()) == 64
        assert any(k.startswith("gapo/clipfrac_pos_kr/") for k in m)  # GAPO's clip by (k, success rate)
        assert "vigor/rollouts" not in uniform[t] and uniform[t]["gapo/groups/size_mean"] == 8
    res = saved["methods"]["vigor_gapo_linear"]
    assert res["budget_steps_off"] == 0
    assert res["success_rate_late"]["mean"] == pytest.approx(statistics.mean(vigor[t][SUCCESS_RATE] for t in (2, 3)))
    assert res["round_gen_s"]["0"]["mean"] == pytest.approx(statistics.mean(vigor[t]["vigor/round0/gen_s"]
                                                                            for t in (1, 2, 3)))
    hard = [vigor[t].get("vigor/source/gapo_smoke_hard/" + k, 0.0) for t in (1, 2, 3) for k in ("rollouts", "prompts")]
    if sum(hard[1::2]):
        assert res["buckets"]["hard"]["rollouts_per_prompt"]["mean"] == pytest.approx(sum(hard[::2]) / sum(hard[1::2]))
    # the reduced study smooths over its 3 steps: the target is the lowest run's 3-step mean, which every run reaches
    curves = {m: statistics.mean(logged(out, m)[t][SUCCESS_RATE] for t in (1, 2, 3)) for m in REDUCED_METHODS}
    assert saved["target"] == pytest.approx(min(curves.values()))
    assert all(saved["methods"][m]["rollouts_to_target"]["values"] == [192] for m in REDUCED_METHODS)

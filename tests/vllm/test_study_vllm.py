"""The study in reduced mode (`python -m recipe.study --reduced`: seed 0, fixed clip-higher GSPO and GAPO linear,
3 steps, validation before and after) through verl's trainer with verl's real vLLM rollout on CPU.

It runs here, in the vLLM stream of `make test`, because that stream finishes minutes before the default one; the
study code is the same for both engines (`--rollout` only adds `platform=cpu_vllm`). Checked: the report and the
figures are written, every number of report.json equals the one recomputed here from the runs' metrics files
(verl's file logger), the two methods got the clips they name, and each run sampled from the actor's weights.
"""

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.smoke import MAX_ROLLOUT_PROBS_DIFF
from recipe.study import REDUCED_METHODS, StudySettings

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def reduced_study(tmp_path_factory):
    out = tmp_path_factory.mktemp("study")
    proc = subprocess.run([sys.executable, "-m", "recipe.study", "--reduced", "--rollout", "vllm", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"out": out, "stdout": proc.stdout}


def logged(out: Path, method: str) -> dict[int, dict]:
    lines = (out / "runs" / f"{method}-s0" / "logs" / "train.jsonl").read_text().splitlines()
    return {rec["step"]: rec["data"] for rec in map(json.loads, lines)}


def test_report_and_figures_are_written(reduced_study):
    out = reduced_study["out"]
    md = (out / "report.md").read_text()
    for section in ("## Held-out pass@k at the last step (3)", "## Mechanism",
                    "## What this shows and what it does not"):
        assert section in md
    for name in ("curves.png", *(f"mechanism_{m}.png" for m in REDUCED_METHODS)):
        path = out / "figures" / name
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 5000, name
    commands = (out / "commands.sh").read_text()
    assert commands.count("recipe.main_gapo") == 2 and "platform=cpu_vllm" in commands
    assert "[study] report:" in reduced_study["stdout"]


def test_report_numbers_equal_those_recomputed_from_the_logs(reduced_study):
    out = reduced_study["out"]
    s = StudySettings.reduced()
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

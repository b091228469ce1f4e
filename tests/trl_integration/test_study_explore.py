"""The exploration study's engine (recipe.studies.explore_run, TRL) against the verl path, and its reduced mode end to
end: the runs, the resume, and the report recomputed from the files."""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl", reason="trl is not installed: tests/trl_integration run in .venv-trl (make install-trl, make test-trl)")

from gapo.clip_diagnostics import metrics_from_sums  # noqa: E402
from gapo.integrations.trl import GAPOGRPOTrainer, NUM_CORRECT_KEY, GROUP_SIZE_KEY, SUCCESS_KEY  # noqa: E402
from recipe.studies.explore import REDUCED, run_dir, specs  # noqa: E402
from recipe.studies.explore_report import read_heldout, run_outcomes  # noqa: E402
from recipe.studies.explore_run import METHODS, RunSpec, StudySettings, prompt_rows, trl_args  # noqa: E402
from recipe.trl_smoke import smoke_reward  # noqa: E402
from tests.test_gapo_loss import actor_config, call  # noqa: E402
from tests.trl_integration.test_trl_integration import tiny_model, trl_loss  # noqa: E402,F401

REPO = Path(__file__).resolve().parents[2]
K = StudySettings.k

# Eight completions from groups of k = 8 with different success counts, sequence-level ratios spread around the
# study's clips (eps_low 0.02, eps_high_max 0.05): (c, success, advantage, ratio)
ROWS = [
    (1, True, 7 / 8, 1.045),   # c = 1: GAPO's bound 1.05 keeps it; the symmetric 1.02 clips it
    (1, True, 7 / 8, 1.06),    # past every bound
    (2, True, 6 / 8, 1.03),    # c = 2: GAPO 1.0457 keeps it, symmetric clips
    (6, True, 2 / 8, 1.03),    # c = 6: GAPO 1.0286 clips it, clip-higher 1.05 does not
    (7, True, 1 / 8, 1.025),   # c = 7: GAPO 1.0243 clips it
    (4, True, 4 / 8, 1.01),    # inside every bound
    (6, False, -6 / 8, 0.97),  # failure: the lower clip 0.98 binds for all
    (2, False, -2 / 8, 1.04),  # failure above 1: no upper clip applies to A < 0
]
LENGTHS = [3, 5, 2, 4, 1, 5, 3, 2]


def case():
    b, t = len(ROWS), 5
    mask = torch.zeros(b, t)
    for i, n in enumerate(LENGTHS):
        mask[i, :n] = 1
    old = -1.0 - torch.arange(b * t, dtype=torch.float32).reshape(b, t) / 50
    new = old + torch.log(torch.tensor([r[3] for r in ROWS])).unsqueeze(-1)
    adv = torch.tensor([r[2] for r in ROWS])
    stats = {NUM_CORRECT_KEY: torch.tensor([float(r[0]) for r in ROWS]), GROUP_SIZE_KEY: torch.full((b,), float(K)),
             SUCCESS_KEY: torch.tensor([r[1] for r in ROWS])}
    return old, new, adv, mask, stats


@pytest.mark.parametrize("method", list(METHODS))
def test_study_runs_clip_diagnostics_equal_the_verl_paths(method, tiny_model, tmp_path, monkeypatch):
    """The shared check the report relies on: the study's own TRL configuration of each method gives the verl
    plug-in's loss, gradient and per-c diagnostics on one batch of k = 8 groups."""
    settings = StudySettings()
    args = trl_args(RunSpec("tail", method, 1), tmp_path, settings)
    from datasets import Dataset
    from transformers import AutoTokenizer

    trainer = GAPOGRPOTrainer(model=str(tiny_model), reward_funcs=smoke_reward, args=args,
                              train_dataset=Dataset.from_list(prompt_rows("tail", 8, "train", 1)),
                              processing_class=AutoTokenizer.from_pretrained(tiny_model))
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    old, new, adv, mask, stats = case()
    loss, grad, _ = trl_loss(trainer, monkeypatch, old, new, adv, mask, stats)
    gapo = args.gapo
    config = actor_config("gapo", lo=settings.eps_low, hi=gapo.eps_high_max, agg="seq-mean-token-mean", rollout_n=K,
                          eps_high_max=gapo.eps_high_max, schedule=gapo.schedule)
    ref_loss, ref_grad, ref = call("gapo", config, old, new, adv.unsqueeze(-1).expand_as(mask).contiguous(), mask,
                                   stats[NUM_CORRECT_KEY], stats[GROUP_SIZE_KEY], stats[SUCCESS_KEY])
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)
    verl_sums = {key.split("/", 1)[1]: value for key, value in ref.items() if key.startswith("gapo_sums/")}
    trl_metrics = metrics_from_sums(dict(trainer._gapo_sums["train"]))
    verl_metrics = metrics_from_sums(verl_sums)
    assert set(trl_metrics) == set(verl_metrics)
    for key, value in verl_metrics.items():
        assert trl_metrics[key] == pytest.approx(value, abs=1e-6), key
    # the three methods differ where the table says (clip fractions per token: c = 1 rows have 3 and 5 tokens): c = 1
    # at 1.045 is clipped only by the symmetric clip, c = 6 at 1.03 and c = 7 at 1.025 by GAPO and the symmetric clip
    expected = {"gspo_symmetric": (1.0, 1.0, 1.0), "gspo_clip_higher": (5 / 8, 0.0, 0.0),
                "gapo_linear": (5 / 8, 1.0, 1.0)}[method]
    observed = tuple(verl_metrics[f"gapo/clipfrac_pos/c{c}"] for c in (1, 6, 7))
    assert observed == pytest.approx(expected, abs=1e-6)

def run_reduced(out: Path, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recipe.studies.explore", "--reduced", "--out", str(out), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


def test_reduced_study_runs_resumes_and_reports_what_the_files_hold(tmp_path):
    out = tmp_path / "study"
    first = run_reduced(out)
    assert first.returncode == 0, first.stderr[-3000:]
    settings = replace(StudySettings(), **REDUCED["settings"])
    run_specs = specs(REDUCED["seeds"])
    assert len(run_specs) == 12
    assert "12 runs: 0 done before (kept), 12 to train, 2 at once" in first.stdout
    assert "12/12" in first.stdout and "min left" in first.stdout
    for spec in run_specs:
        folder = run_dir(out, spec)
        heldout = read_heldout(folder / "heldout.jsonl")
        assert sorted(heldout) == [0, 4, 8]
        n_buckets = 3 if spec.regime == "tail" else 1
        assert all(len(by_bucket) == n_buckets for by_bucket in heldout.values())
        assert all(len(e["correct"]) == settings.eval_prompts and e["n"] == settings.eval_samples
                   for by_bucket in heldout.values() for e in by_bucket.values())
        lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        assert {row["step"] for row in lines} == set(range(1, settings.steps + 1))
        assert json.loads((folder / "done.json").read_text())["settings"]["steps"] == settings.steps
    # held-out samples of one seed at step 0 are the same for every method (same model, same random numbers)
    zero = {m: read_heldout(run_dir(out, RunSpec("tail", m, 1)) / "heldout.jsonl")[0] for m in METHODS}
    assert len({json.dumps(v, sort_keys=True) for v in zero.values()}) == 1
    # ... and differ between seeds
    other = read_heldout(run_dir(out, RunSpec("tail", "gapo_linear", 2)) / "heldout.jsonl")[0]
    assert json.dumps(other, sort_keys=True) != json.dumps(zero["gapo_linear"], sort_keys=True)

    report = json.loads((out / "report.json").read_text())
    assert report["mode"] == "reduced" and report["missing"] == []
    effect = report["primary"]["effect"]["result"]
    diffs = [run_outcomes(run_dir(out, RunSpec("tail", "gapo_linear", s)), settings)["pass1/hard"]
             - run_outcomes(run_dir(out, RunSpec("tail", "gspo_clip_higher", s)), settings)["pass1/hard"]
             for s in REDUCED["seeds"]]
    assert effect["n"] == 2 and effect["mean"] == pytest.approx(sum(diffs) / 2)
    md = (out / "report.md").read_text()
    assert "Reduced mode: a check" in md and "## Pre-registered primary outcomes" in md
    assert (out / "figures" / "heldout_pass1.png").stat().st_size > 0

    # resume: everything kept; a run without done.json (stopped part way) is trained again, alone
    (run_dir(out, RunSpec("high", "gapo_linear", 2)) / "done.json").unlink()
    second = run_reduced(out)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "12 runs: 11 done before (kept), 1 to train" in second.stdout
    assert "high/gapo_linear/seed2" in second.stdout

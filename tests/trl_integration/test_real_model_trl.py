"""One TRL step with the real pretrained model (CI's reduced check of `make learn ENGINE=trl`): SmolLM2-135M-Instruct,
GAPO as GRPOTrainer's loss with the learning run's settings (recipe.learn_trl), the arithmetic task's reward on the
model's own completions; the trained model is saved where `python -m eval --model` reads it. One prompt x 2
completions of 8 tokens: TRL 1.16.0's step costs ~80-110 s for 8 x 16 on 2 cores (docs/learn.md), and this check
runs beside the rest of the suite."""

from __future__ import annotations

import json
import sys

import pytest

from gapo.arithmetic import write_splits

pytestmark = pytest.mark.slow


def test_one_trl_step_of_the_real_model(real_model, tmp_path, monkeypatch):
    from recipe import learn_trl

    paths = write_splits(tmp_path / "data", seed=0, n_train=16, n_heldout_per_bucket=1, n_transfer_per_bucket=0)
    monkeypatch.setattr(sys, "argv", ["learn_trl"])
    learn_trl.main(["--out", str(tmp_path / "trl"), "--model", str(real_model), "--train-file", str(paths["train"]),
                    "--steps", "1", "per_device_train_batch_size=2", "num_generations=2",
                    "max_completion_length=8"])
    rows = [json.loads(line) for line in (tmp_path / "trl" / "logs" / "metrics.jsonl").read_text().splitlines()]
    step = next(r["data"] for r in rows if "loss" in r["data"])
    assert 0.0 <= step["reward"] <= 1.0 and step["completions/mean_length"] > 1
    # GAPO's diagnostics ran in the loss (a step's batch may hold no mixed group, so no threshold is asserted)
    assert "gapo/is_adv_corr_levels" in step and any(k.startswith("gapo/explore/") for k in step)
    saved = tmp_path / "trl" / "model"
    assert (saved / "config.json").is_file() and (saved / "tokenizer.json").is_file()


def test_one_run_of_the_real_study_grades_the_models_own_answers(real_model, tmp_path):
    """recipe.studies.explore_run.run_one on the arithmetic task with the real model, at a size CI affords (2 prompts x
    4 completions of 8 tokens, 2 optimizer steps, 1 held-out prompt per bucket x 4 samples): the held-out file has
    every bucket before and after, the training log has the per-c diagnostics' keys, and the report reads it."""
    from dataclasses import replace

    from recipe.studies import explore_real
    from recipe.studies.explore_report import read_heldout, run_outcomes
    from recipe.studies.explore_run import RunSpec, run_one

    settings = replace(explore_real.SETTINGS, steps=2, eval_every=2, prompts_per_generation=2, k=4,
                       max_completion_length=8, eval_prompts=1, eval_samples=4, n_train=8, threads=2)
    out = tmp_path / "run"
    done = run_one(RunSpec(explore_real.REGIME, "gapo_linear", 1), out, real_model, settings)
    assert done["settings"]["task"] == "arithmetic"
    heldout = read_heldout(out / "heldout.jsonl")
    assert sorted(heldout) == [0, 2]
    assert all(sorted(by_bucket) == ["add1", "add2", "mul1", "sub1"] for by_bucket in heldout.values())
    assert all(e["n"] == 4 and len(e["correct"]) == 1 and 0 <= e["correct"][0] <= 4 and 1 <= e["distinct"][0] <= 4
               for by_bucket in heldout.values() for e in by_bucket.values())
    rows = [json.loads(line)["data"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("gapo/is_adv_corr_levels" in r for r in rows) and all(0.0 <= r.get("reward", 0.0) <= 1.0 for r in rows)
    outcomes = run_outcomes(out, settings)
    assert 0.0 <= outcomes["pass1/add2"] <= 1.0 and outcomes["pass1_change/all"] is not None
    with pytest.raises(ValueError, match="regime 'tail' is not one of task 'arithmetic'"):
        run_one(RunSpec("tail", "gapo_linear", 1), tmp_path / "wrong", real_model, settings)

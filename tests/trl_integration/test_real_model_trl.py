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

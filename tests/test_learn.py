"""recipe.learn's pieces on records that tell right from wrong: pass@1 per bucket from an evaluation's samples, the
rise's interval paired by prompt, the training checks, the table, and the driver's refusals."""

from __future__ import annotations

import json

import pytest

from recipe.learn import (
    MAX_ROLLOUT_PROBS_DIFF,
    LearnError,
    check_training,
    pass1_by_bucket,
    rise_interval,
    run_learn,
    table_lines,
)


def _samples(path, correct: dict[tuple[str, int], list[bool]]):
    with open(path, "w") as fh:
        for (bucket, problem), marks in correct.items():
            for i, ok in enumerate(marks):
                fh.write(json.dumps({"data_source": f"gapo_arith_{bucket}", "problem": problem, "sample": i,
                                     "correct": ok}) + "\n")
    return path


def test_pass1_per_bucket_is_the_mean_over_prompts_of_each_prompts_rate(tmp_path):
    # add1: prompts at 1/4 and 3/4 -> 0.5; add2: one prompt at 0 of 2 -> 0; overall: mean over the 3 prompts
    path = _samples(tmp_path / "s.jsonl", {("add1", 0): [True, False, False, False],
                                           ("add1", 1): [True, True, True, False], ("add2", 2): [False, False]})
    result = pass1_by_bucket(path)
    assert result["add1"] == pytest.approx(0.5) and result["add2"] == 0.0
    assert result["overall"] == pytest.approx((0.25 + 0.75 + 0.0) / 3)  # not over samples: (4 / 10)
    assert "mul1" not in result and len(result["per_prompt"]) == 3


def test_the_rise_is_paired_by_prompt(tmp_path):
    before = pass1_by_bucket(_samples(tmp_path / "b.jsonl", {("add1", 0): [False] * 4, ("add1", 1): [True, False] * 2,
                                                             ("add2", 2): [False] * 4}))
    after = pass1_by_bucket(_samples(tmp_path / "a.jsonl", {("add1", 0): [True] * 4, ("add1", 1): [True] * 4,
                                                            ("add2", 2): [True, False, False, False]}))
    rise = rise_interval(before, after)
    assert rise["prompts"] == 3 and rise["mean"] == pytest.approx((1.0 + 0.5 + 0.25) / 3)
    assert rise["low"] < rise["mean"] < rise["high"]
    lines = table_lines(before, after, None, rise)
    assert lines[2].startswith("| before | 0.167 |") and lines[3].startswith("| after | 0.750 | 1.000 |")
    assert "rise over 3 held-out prompts: +0.583" in lines[-1]


def _metrics(steps, gap=3e-5):
    return {s: {"training/rollout_probs_diff_max": gap, "critic/score/mean": 0.5} for s in steps}


def test_training_checks_name_a_missing_step_and_a_stale_rollout():
    check_training(_metrics([1, 2, 3]), 3, "verl")
    with pytest.raises(LearnError, match="logged steps \\[1, 3\\], expected 1..3"):
        check_training(_metrics([1, 3]), 3, "verl")
    with pytest.raises(LearnError, match="step 2: rollout/actor log-prob gap"):
        check_training({**_metrics([1, 3]), 2: {"training/rollout_probs_diff_max": 10 * MAX_ROLLOUT_PROBS_DIFF}}, 3,
                       "verl")
    check_training({s: {} for s in range(1, 7)}, 3, "trl")  # TRL: 2 optimizer steps a generation, no rollout gap


@pytest.mark.parametrize("kwargs, message", [({"engine": "jax"}, "unknown engine 'jax'"),
                                             ({"steps": 0}, "--steps must be at least 1")])
def test_bad_options_are_refused_before_anything_runs(tmp_path, kwargs, message):
    with pytest.raises(LearnError, match=message):
        run_learn(tmp_path / "learn", **kwargs)
    assert not (tmp_path / "learn").exists()

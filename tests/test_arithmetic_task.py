"""The real-model arithmetic task (gapo.arithmetic): splits drawn apart, and grading as the prompt asks."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from gapo.arithmetic import BUCKETS, HARD_BUCKET, PROMPT, bucket_source, final_answer, make_splits, write_splits
from gapo.rewards import compute_score, is_known_data_source

PROBLEM = PROMPT.format(a=7, op="+", b=8)
pytestmark = pytest.mark.usefixtures("roomy_math_pool")  # the verdicts below, not a loaded machine (math_pool_room)


def _pair(row):
    words = row["extra_info"]["problem"].split()
    return row["data_source"], int(words[2]), words[3], int(words[4].rstrip("?"))


def test_heldout_and_transfer_prompts_never_appear_in_training():
    splits = make_splits(n_train=256, n_heldout_per_bucket=16, n_transfer_per_bucket=16, seed=3)
    train = {_pair(r) for r in splits["train"]}
    heldout, transfer = [_pair(r) for r in splits["heldout"]], [_pair(r) for r in splits["transfer"]]
    assert len(set(heldout)) == len(heldout) == 16 * len(BUCKETS)
    assert not train & set(heldout) and not train & set(transfer) and not set(heldout) & set(transfer)
    assert len(splits["train"]) == 256
    counts = {b: sum(r["extra_info"]["bucket"] == b for r in splits["train"]) for b in BUCKETS}
    assert counts == {b: 64 for b in BUCKETS}
    # the gold is the value, and subtraction never goes below 0
    for row in splits["train"] + splits["heldout"]:
        _source, a, op, b = _pair(row)
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        assert row["reward_model"]["ground_truth"] == str(value) and value >= 0
        assert row["prompt"] == [{"role": "user", "content": row["extra_info"]["problem"]}]
    assert HARD_BUCKET in BUCKETS


def test_splits_are_seeded():
    assert make_splits(seed=1) == make_splits(seed=1)
    assert make_splits(seed=1)["heldout"] != make_splits(seed=2)["heldout"]


def test_bad_sizes_are_refused_naming_the_bucket():
    with pytest.raises(ValueError, match="bucket add1 has 100 problems"):
        make_splits(n_heldout_per_bucket=60, n_transfer_per_bucket=40)
    with pytest.raises(ValueError, match="n_train >= 1"):
        make_splits(n_train=0)
    with pytest.raises(ValueError, match="unknown bucket 'add9'"):
        bucket_source("add9")


def test_written_parquet_reads_back(tmp_path):
    paths = write_splits(tmp_path, seed=0, n_train=8, n_heldout_per_bucket=2, n_transfer_per_bucket=0)
    assert sorted(paths) == ["heldout", "train"]  # no transfer rows asked, no file
    rows = pq.read_table(paths["heldout"]).to_pylist()
    assert len(rows) == 2 * len(BUCKETS) and all(is_known_data_source(r["data_source"]) for r in rows)


@pytest.mark.parametrize("response, score, reason", [
    ("15", 1.0, ""),
    (" 15.\n", 1.0, ""),
    ("7 + 8 = 15", 1.0, ""),
    ("7+8=15.", 1.0, ""),
    ("16", 0.0, "wrong"),
    ("7 + 8 = 16", 0.0, "false_equation"),  # the math reward checks the equation
    ("3 + 4 = 15", 0.0, "false_equation"),
    ("7 + 8", 0.0, "not_a_number"),  # the problem restated
    ("8 + 7", 0.0, "not_a_number"),
    ("Update: 7 + 8 = 15", 0.0, "not_a_number"),  # prose around an equation
    ("The answer is 15", 0.0, "not_a_number"),
    ("15 is the only positive integer that can be factored into 4 and", 0.0, "not_a_number"),
    ("fifteen", 0.0, "not_a_number"),
    ("", 0.0, "not_a_number"),
    ("1" * 65, 0.0, "too_long"),
])
def test_grading_as_the_prompt_asks(response, score, reason):
    result = compute_score(bucket_source("add1"), response, "15", {"problem": PROBLEM})
    assert (result["score"], result["reason"]) == (score, reason), result


def test_final_answer_reads_the_last_side():
    assert final_answer("12 * 3 = 36") == ("12 * 3 = 36", "36")
    assert final_answer("1,000") == ("1,000", "1000")
    assert final_answer("36 = x") == ("", "not_a_number")

"""The evaluation's sample records (eval/records.py): a torn line and unfinished problems on resume."""

from __future__ import annotations

import json

import pytest


def test_records_tolerate_a_torn_line_and_drop_unfinished_problems(tmp_path):
    from eval.records import SampleStore

    store = SampleStore(tmp_path, n=2)
    assert store.load() == {}
    rec = lambda b, p, s: {"benchmark": b, "problem": p, "sample": s, "correct": s == 0}
    store.append([rec("x", 0, 0), rec("x", 0, 1)])
    store.append([rec("x", 1, 0), rec("x", 1, 1)])
    with open(store.path, "a") as f:
        f.write(json.dumps(rec("x", 2, 0)) + "\n")  # problem 2 lost its second sample
        f.write('{"benchmark": "x", "prob')  # killed mid-write
    again = SampleStore(tmp_path, n=2)
    assert sorted(again.load()) == [("x", 0), ("x", 1)]
    assert len(store.path.read_text().splitlines()) == 4  # repaired: whole problems only
    again.append([rec("x", 2, 0), rec("x", 2, 1)])
    assert sorted(SampleStore(tmp_path, n=2).load()) == [("x", 0), ("x", 1), ("x", 2)]
    store.path.write_text('{"benchmark": "x"\n' + json.dumps(rec("x", 0, 0)) + "\n")
    with pytest.raises(ValueError, match="corrupt record"):
        SampleStore(tmp_path, n=2).load()

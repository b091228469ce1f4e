"""The evaluation's reports (eval/report.py): the aggregate over checkpoints."""

from __future__ import annotations

import pytest

from tests.eval_helpers import _fake_summary


def test_aggregate_over_checkpoints_gives_exact_mean_and_spread():
    import statistics

    from eval.report import aggregate_runs, aggregate_table

    n = 64
    per_ckpt = [[0, 3, 4, 64], [1, 8, 16, 32], [4, 4, 4, 60]]  # covered at 5% (>= 4 of 64): 2, 3, 4
    runs = [(f"global_step_{s}", _fake_summary(cs, n)) for s, cs in zip((100, 120, 140), per_ckpt)]
    agg = aggregate_runs(runs)
    b = agg["benchmarks"]["bench"]
    assert agg["checkpoints"] == ["global_step_100", "global_step_120", "global_step_140"]
    assert b["coverage"]["values"] == [2, 3, 4]
    assert (b["coverage"]["mean"], b["coverage"]["std"], b["coverage"]["min"], b["coverage"]["max"]) == (3, 1, 2, 4)
    p1 = [sum(cs) / (n * len(cs)) for cs in per_ckpt]
    assert b["pass@k"]["1"]["values"] == pytest.approx(p1, abs=0)
    assert b["pass@k"]["1"]["mean"] == pytest.approx(statistics.fmean(p1), abs=1e-15)
    assert b["pass@k"]["1"]["std"] == pytest.approx(statistics.stdev(p1), abs=1e-15)
    assert b["pass@k"]["64"]["values"] == [0.75, 1.0, 1.0]
    table = aggregate_table(agg, "run")
    assert "| coverage (problems, solve rate > 5%) | 3.00 ± 1.00 [2.00, 4.00] |" in table
    with pytest.raises(ValueError, match="different n"):
        aggregate_runs([runs[0], ("other", _fake_summary([1], 16))])

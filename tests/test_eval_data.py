"""The evaluation's benchmarks (eval/data.py): names resolve under the data dir."""

from __future__ import annotations

import pytest

from tests.eval_helpers import write_code_benchmark


def test_benchmark_names_resolve_under_the_data_dir(tmp_path, monkeypatch):
    from eval.data import load_benchmark, resolve_benchmark_path

    code = write_code_benchmark(tmp_path / "code" / "code_fixture.parquet")
    monkeypatch.setenv("GAPO_DATA_DIR", str(tmp_path))
    assert resolve_benchmark_path("code_fixture") == code
    bench = load_benchmark("code_fixture", limit=2)
    assert bench.name == "code_fixture" and len(bench.problems) == 2 and bench.total_rows > 2
    with pytest.raises(FileNotFoundError, match="available there: .*code_fixture"):
        resolve_benchmark_path("aime24")

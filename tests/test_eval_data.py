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


def test_an_unknown_benchmark_lists_the_data_dir_and_how_to_pass_a_file(tmp_path):
    """`--bench smoke` with a smoke run's data folder as GAPO_DATA_DIR: the names there, the parquet-path form and the
    smoke run's file (`make eval-smoke`), in one message."""
    from eval.data import SMOKE_VAL, resolve_benchmark_path

    for name in ("train", "val"):
        write_code_benchmark(tmp_path / f"{name}.parquet", humaneval=0)
    with pytest.raises(FileNotFoundError) as err:
        resolve_benchmark_path("smoke", root=tmp_path)
    msg = str(err.value)
    assert msg.startswith("no benchmark 'smoke': looked for ") and "\n" not in msg
    assert "available there: train, val." in msg and "pass a .parquet path" in msg
    assert f"{SMOKE_VAL} after `make smoke` (`make eval-smoke`" in msg
    with pytest.raises(FileNotFoundError, match="available there: none"):
        resolve_benchmark_path("aime24", root=tmp_path / "nothere")

"""recipe.bench.precision: the rounding it reports is bf16 autocast's, and the update's movement is the update's."""

from __future__ import annotations

import pytest

from gapo.smoke.tiny_model import build_tiny_model
from recipe.bench import precision


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("precision") / "tiny")


def test_no_update_moves_nothing_and_bf16_rounding_is_what_remains(tiny):
    still = precision.ratio_errors(tiny, lr=0.0, rows=8)
    assert still["update_moves_ratio"] == 0.0  # the same weights twice in float32: a ratio of exactly 1
    assert still["bf16_rounding_median"] == 0.0  # and under bf16 the same rounding on both sides
    moved = precision.ratio_errors(tiny, lr=3e-3, rows=8)
    assert moved["update_moves_ratio"] > 1e-3  # a real step moves the ratio
    assert 0.0 < moved["bf16_rounding_median"] <= moved["bf16_rounding_p90"]
    larger = precision.ratio_errors(tiny, lr=3e-2, rows=8)
    assert larger["update_moves_ratio"] > moved["update_moves_ratio"]


def test_an_unprepared_model_folder_is_refused_with_the_command_that_prepares_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        precision.main(["--model", str(tmp_path / "nothere")])
    assert stop.value.code == 2
    assert "python -m gapo.real_model --out" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        precision.main(["--rows", "1"])
    assert stop.value.code == 2 and "--rows must be >= 2, got 1" in capsys.readouterr().err

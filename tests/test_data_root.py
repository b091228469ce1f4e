"""One data root for the prepare CLIs, the experiment configs and the evaluator: $GAPO_DATA_DIR (default ./data)."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from gapo.data.prepare_code import main as prepare_code
from gapo.data.prepare_math import main as prepare_math

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def _config_files(name: str) -> list[Path]:
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose(name)
    files = []
    for key in ("train_files", "val_files"):
        value = OmegaConf.to_container(cfg.data, resolve=True)[key]
        files += [Path(v) for v in (value if isinstance(value, list) else [value])]
    return files


@pytest.mark.parametrize("family, prepare, experiment", [
    ("math", prepare_math, "math/r1_1.5b_gapo"),
    ("code", prepare_code, "code/r1_1.5b_gapo_token"),
])
def test_prepared_data_is_where_the_training_config_reads_it(tmp_path, monkeypatch, family, prepare, experiment):
    root = tmp_path / "elsewhere"
    monkeypatch.setenv("GAPO_DATA_DIR", str(root))
    monkeypatch.chdir(tmp_path)  # a CLI that ignored the root would write ./data/<family> here
    prepare(["--dataset", "all", "--source", str(FIXTURES / family)])
    assert not (tmp_path / "data").exists()
    files = _config_files(experiment)
    assert files and all(f.parent == root / family for f in files), files
    missing = [f for f in files if not f.is_file()]
    assert not missing, f"the config reads files the CLI did not write: {missing}"


def test_without_the_variable_everything_is_under_data(tmp_path, monkeypatch):
    monkeypatch.delenv("GAPO_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    prepare_math(["--dataset", "aime24", "--source", str(FIXTURES / "math" / "aime24.jsonl")])
    assert (tmp_path / "data" / "math" / "aime24.parquet").is_file()
    assert Path("data/math/aime24.parquet") in _config_files("math/r1_1.5b_gapo")

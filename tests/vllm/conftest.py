"""Tests that need vLLM's CPU build: they run in the vLLM CPU environment (`make test-vllm`, part of `make test`).

In any other environment (the default .venv has no vLLM) every test here is skipped with the command that runs it.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

VLLM_CPU = importlib.util.find_spec("vllm") is not None


def pytest_collection_modifyitems(config, items):
    if VLLM_CPU:
        return
    skip = pytest.mark.skip(reason="needs the vLLM CPU environment: make test-vllm "
                                   "(.venv-vllm/bin/python -m pytest tests/vllm)")
    for item in items:
        if "tests/vllm/" in str(item.fspath):
            item.add_marker(skip)


ROOT = Path(__file__).resolve().parents[2]
# the reduced study's runs checkpoint their last step (3) so that tests/vllm/test_vllm_rollout.py resumes one of them
STUDY_SAVE_FREQ = 3


@pytest.fixture(scope="session")
def reduced_study(tmp_path_factory):
    """The reduced 2x2 study with verl's vLLM rollout (`python -m recipe.studies.vigor_2x2 --reduced --rollout vllm`:
    3 runs of 3 steps, validation before and after), each run checkpointing its last step
    (`--override trainer.save_freq=3`). Read by tests/vllm/test_study_vllm.py (the study) and
    tests/vllm/test_vllm_rollout.py (training with vLLM rollouts: the study's GAPO run, resumed for a 4th step)."""
    out = tmp_path_factory.mktemp("study")
    proc = subprocess.run([sys.executable, "-m", "recipe.studies.vigor_2x2", "--reduced", "--rollout", "vllm", "--out",
                           str(out), "--override", f"trainer.save_freq={STUDY_SAVE_FREQ}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=1500, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"out": out, "stdout": proc.stdout}

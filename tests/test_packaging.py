"""Packaging: only the editable install from a clone is built (a wheel is refused with the fix); the GPU extra
resolves to verl's GPU stack; flash-attn is pinned to verl's own pin and installed without build isolation."""

import json
import re
import subprocess
import sys
from importlib.metadata import requires
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _pip(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "pip", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("command", [["wheel", "--no-deps", "--no-build-isolation", "-w", "{tmp}", "."],
                                     ["install", "--no-deps", "--no-build-isolation", "--target", "{tmp}", "."]])
def test_a_regular_wheel_is_refused_naming_the_editable_install(tmp_path, command):
    proc = _pip(*[arg.format(tmp=tmp_path) for arg in command])
    assert proc.returncode != 0
    assert "pip install -e ." in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert not list(tmp_path.glob("*.whl")) and not (tmp_path / "recipe").exists()


def test_the_editable_install_is_what_runs():
    import gapo
    import recipe

    assert Path(gapo.__file__).resolve().is_relative_to(ROOT) and Path(recipe.__file__).resolve().is_relative_to(ROOT)
    assert (Path(recipe.__file__).parent.parent / "configs" / "gapo_trainer.yaml").is_file()


def test_flash_attn_pin_is_verls_own_and_installed_after_torch_without_build_isolation():
    verl_pins = [r for r in requires("verl") if r.startswith("flash-attn") and "cu130torch211" in r]
    assert verl_pins, requires("verl")
    verl_pin = verl_pins[0].split(";")[0].strip()
    makefile = (ROOT / "Makefile").read_text()
    assert f"FLASH_ATTN ?= {verl_pin}" in makefile
    dry = subprocess.run(["make", "-n", "install-gpu", "PY=python"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    gpu = next(i for i, line in enumerate(dry) if "pip install -e '.[gpu" in line)
    flash = next(i for i, line in enumerate(dry) if "--no-build-isolation" in line and verl_pin in line)
    assert gpu < flash
    pyproject = (ROOT / "pyproject.toml").read_text()
    extra = re.search(r"^gpu = \[(.*)\]$", pyproject, re.M).group(1)
    assert "flash-attn" not in extra  # it cannot build under build isolation


@pytest.mark.slow
def test_gpu_extra_resolves_to_verls_gpu_stack(tmp_path):
    """pip's resolver in --dry-run --report mode (metadata only, no CUDA wheel downloaded)."""
    report = tmp_path / "report.json"
    proc = _pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report), ".[gpu]")
    assert proc.returncode == 0, proc.stderr[-4000:]
    resolved = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    assert resolved["verl"] == "0.9.1" and resolved["vllm"] == "0.24.0" and resolved["torch"] == "2.11.0", resolved
    major, minor = (int(x) for x in resolved["transformers"].split(".")[:2])
    assert (major, minor) < (5, 11)  # the project's own cap, satisfied together with vllm's


def test_a_failed_side_stream_names_its_failed_tests_at_the_end(tmp_path):
    # make test's stream_failed, run from the Makefile itself on a constructed stream log: the short summary lines
    # (and only those: a -v progress line "... FAILED [ 5%]" and the passing tests are not repeated), prefixed
    (tmp_path / ".test-logs").mkdir()
    (tmp_path / ".test-logs" / "vllm.log").write_text(
        "tests/vllm/test_a.py::test_b FAILED [ 5%]\ntests/vllm/test_a.py::test_ok PASSED [ 10%]\n"
        "FAILED tests/vllm/test_a.py::test_b - AssertionError: boom\nERROR tests/vllm/test_c.py::test_d - OSError\n")
    (tmp_path / "mk").write_text(f"include {ROOT / 'Makefile'}\nshow:\n"
                                 "\t@false || { $(call stream_failed,vllm,tests/vllm); }\n")
    out = subprocess.run(["make", "-s", "-f", "mk", "show"], cwd=tmp_path, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == ["ERROR: tests/vllm failed (lines marked [vllm] above; its log: .test-logs/vllm.log); its failures:",
                   "  [vllm] FAILED tests/vllm/test_a.py::test_b - AssertionError: boom",
                   "  [vllm] ERROR tests/vllm/test_c.py::test_d - OSError"]

"""The first hour with `python -m eval`: evaluating the smoke run with the documented commands (`make eval-smoke`,
docs/eval/README.md's example) and the mistakes a new user makes (a mistyped --model or --run-dir, no smoke run yet),
each through the real entry point: one line naming the value and what exists, within seconds, no traceback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.eval_helpers import ROOT

# Before is_hub_id, `--model runs/nothere` went to the hub: five retries (about 50 s), then an 88-line traceback.
# The bound leaves room for a busy machine's start-up and stays below those retries.
FAST_S = 40
OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
MAKE_VARS = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")  # a nested make under `make test` must not use its jobserver


def _online_env(tmp_path: Path) -> dict:
    """The environment with the hub reachable as far as huggingface_hub knows (the retries came from there), its
    cache in tmp_path."""
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE_VARS + MAKE_VARS}
    return {**env, "HF_HOME": str(tmp_path / "hf"), "GAPO_EVAL_CACHE": str(tmp_path / "eval_cache")}


def _run(cmd, cwd, env, timeout=120):
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    return proc, time.time() - t0


def _one_line_error(proc, wall_s) -> str:
    """The run failed within FAST_S seconds with one `error:` line and no traceback; that line."""
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    assert wall_s < FAST_S, f"{wall_s:.1f} s: {proc.stderr[-2000:]}"
    errors = [line for line in (proc.stderr + proc.stdout).splitlines() if line.startswith("error")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


@pytest.fixture()
def user_folder(tmp_path):
    """A working folder like a clone's after make smoke: runs/smoke/checkpoints/global_step_{1,2}, runs/smoke-trl,
    and a one-problem benchmark file (the model is checked first, the benchmark need not be real)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    work = tmp_path / "work"
    for step in (1, 2):
        (work / "runs" / "smoke" / "checkpoints" / f"global_step_{step}" / "actor").mkdir(parents=True)
    (work / "runs" / "smoke-trl").mkdir()
    bench = work / "val.parquet"
    pq.write_table(pa.Table.from_pylist([{"data_source": "gapo_smoke", "prompt": [{"role": "user", "content": "1+1"}],
                                          "reward_model": {"style": "rule", "ground_truth": "2"}}]), bench)
    return work


def test_a_mistyped_model_path_is_named_in_seconds_not_looked_up_on_the_hub(user_folder, tmp_path):
    proc, wall_s = _run([sys.executable, "-m", "eval", "--model", "runs/nothere", "--bench", "val.parquet",
                         "--backend", "hf"], user_folder, _online_env(tmp_path))
    line = _one_line_error(proc, wall_s)
    assert proc.returncode == 1
    assert line.startswith("error: --model: no such local folder: runs/nothere; runs/ has: smoke, smoke-trl;")
    assert "verl checkpoints there: runs/smoke/checkpoints (global_step_1..2)" in line
    assert "not taken as a hub id" in line
    assert not (user_folder / "runs" / "eval").exists()  # no output folder for a run that never started


def test_a_missing_step_and_a_missing_run_dir_are_named(user_folder, tmp_path):
    proc, wall_s = _run([sys.executable, "-m", "eval", "--model", "runs/smoke/checkpoints/global_step_9",
                         "--bench", "val.parquet", "--backend", "hf"], user_folder, _online_env(tmp_path))
    line = _one_line_error(proc, wall_s)
    assert line.startswith("error: --model: no such local folder: runs/smoke/checkpoints/global_step_9; "
                           "runs/smoke/checkpoints/ has: global_step_1, global_step_2")
    proc, wall_s = _run([sys.executable, "-m", "eval", "--run-dir", "runs/nothere", "--steps", "1:2",
                         "--bench", "val.parquet"], user_folder, _online_env(tmp_path))
    line = _one_line_error(proc, wall_s)
    assert line.startswith("error: --run-dir: no such local folder: runs/nothere; runs/ has: smoke, smoke-trl;")
    assert "runs/smoke/checkpoints (global_step_1..2)" in line and "hub" not in line
    proc, wall_s = _run([sys.executable, "-m", "eval", "--run-dir", "runs/smoke", "--steps", "1:2",
                         "--bench", "val.parquet"], user_folder, _online_env(tmp_path))
    line = _one_line_error(proc, wall_s)
    assert line.endswith("it has: none; verl checkpoint folders under it: runs/smoke/checkpoints (global_step_1..2)")


def _make_eval_smoke(tmp_path: Path, smoke_dir: Path, *extra: str, env: dict | None = None):
    """`make eval-smoke` with this interpreter and an install stamp of its own (the target depends on `install`,
    which must not reinstall .venv from inside a test)."""
    venv = tmp_path / "venv"
    venv.mkdir(exist_ok=True)
    (venv / ".installed").touch()
    cmd = ["make", "--no-print-directory", "eval-smoke", f"VENV={venv}", f"PY={sys.executable}",
           f"SMOKE_DIR={smoke_dir}", *extra]
    return _run(cmd, ROOT, env or _online_env(tmp_path), timeout=600)


def test_eval_smoke_without_a_smoke_run_says_run_make_smoke(tmp_path):
    proc, wall_s = _make_eval_smoke(tmp_path, tmp_path / "no-smoke")
    line = _one_line_error(proc, wall_s)
    assert line == (f"error: no smoke run in {tmp_path / 'no-smoke'} (no checkpoints/ or data/val.parquet): "
                    "run make smoke first")


@pytest.fixture(scope="module")
def conversions(eval_cache) -> dict:
    """The session's verl-to-HF conversion cache (tests/conftest.py's eval_cache) as GAPO_EVAL_CACHE: each checkpoint
    of the smoke run is converted once, whichever evaluation reads it first."""
    return {"GAPO_EVAL_CACHE": str(eval_cache)}


@pytest.mark.slow
def test_make_eval_smoke_writes_the_table_and_the_plot(smoke_run, conversions, tmp_path):
    """The README's command after make smoke, on the session's smoke run (tests/conftest.py; only read here): its
    latest checkpoint, converted, on the run's validation prompts; results.md, summary.json, passk.png, and the
    last line names where they are."""
    import pyarrow.parquet as pq

    smoke, out = smoke_run["out"], tmp_path / "eval_smoke"
    proc, wall_s = _make_eval_smoke(tmp_path, smoke, f"EVAL_SMOKE_OUT={out}",
                                    env={**_online_env(tmp_path), **conversions})
    assert proc.returncode == 0, proc.stderr[-4000:]
    print(f"\n[eval-smoke] make eval-smoke: {wall_s:.1f} s")
    run = json.loads((out / "run.json").read_text())
    latest = int((smoke / "checkpoints" / "latest_checkpointed_iteration.txt").read_text())
    assert run["model_kind"] == "verl" and run["step"] == latest and run["max_new_tokens"] == 8 and run["n"] == 16
    summary = json.loads((out / "summary.json").read_text())
    val = summary["benchmarks"]["val"]
    assert list(summary["benchmarks"]) == ["val"] and summary["complete"]
    assert val["problems"] == pq.read_metadata(smoke / "data" / "val.parquet").num_rows
    assert 0 < val["pass@k"]["1"] < 1  # the smoke task: the tiny model succeeds at intermediate rates
    assert re.search(r"^\| pass@16 \| [\d.]+ \|$", (out / "results.md").read_text(), re.MULTILINE)
    assert (out / "passk.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert proc.stdout.splitlines()[-1] == (f"[eval] this table: {out}/results.md; plot: {out}/passk.png; every "
                                            f"number: {out}/summary.json; samples: {out}/samples.jsonl")


def _docs_example() -> list[str]:
    """The command lines of docs/eval/README.md's first bash block."""
    text = (ROOT / "docs" / "eval" / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.DOTALL).group(1)
    return [line for line in block.splitlines() if line.strip()]


@pytest.mark.slow
def test_the_docs_example_runs_after_make_smoke(smoke_run, conversions, tmp_path):
    """docs/eval/README.md's example, line by line as written, in a folder holding a smoke run as runs/smoke (the
    session's, tests/conftest.py) and the repository's tests/ (its fixtures are the example's benchmarks)."""
    lines = _docs_example()
    assert lines[0].startswith("make smoke")
    work = tmp_path / "work"
    (work / "runs").mkdir(parents=True)
    (work / "runs" / "smoke").symlink_to(smoke_run["out"])
    (work / "tests").symlink_to(ROOT / "tests")
    env = {**_online_env(tmp_path), **conversions, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    script = "set -euo pipefail\n" + "\n".join(lines[1:]) + "\n"
    proc, wall_s = _run(["bash", "-c", script], work, env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    print(f"\n[eval-smoke] docs/eval/README.md's example after make smoke: {wall_s:.1f} s")
    step1 = json.loads((work / "runs" / "eval" / "step1" / "summary.json").read_text())
    assert list(step1["benchmarks"]) == ["val", "aime24", "math500", "livecodebench", "humanevalplus"]
    assert json.loads((work / "runs" / "eval" / "base" / "run.json").read_text())["model_kind"] == "hf"
    assert (work / "runs" / "compare.png").read_bytes()[:4] == b"\x89PNG"
    assert "| random init |" in (work / "runs" / "compare.md").read_text()
    agg = json.loads((work / "runs" / "eval" / "smoke_steps" / "aggregate.json").read_text())
    assert agg["checkpoints"] == [f"global_step_{s}" for s in (1, 2, 3)]

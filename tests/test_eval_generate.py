"""The evaluation's backends (eval/generate.py): the parallel layout, vLLM's CPU build, data and tensor parallel
engines in spawned processes (a fake vLLM; real vLLM in tests/vllm/test_eval_vllm.py)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.eval_helpers import FIXTURES, ROOT, _eval_cmd

FAKE_VLLM = FIXTURES / "eval" / "fake_vllm"  # multi-GPU layout only; real vLLM (CPU build) in tests/vllm


def test_parallel_layout():
    from eval.generate import parallel_layout

    assert parallel_layout(list("01234567"), None, None) == (1, 8)
    assert parallel_layout(list("01234567"), 2, None) == (2, 4)
    assert parallel_layout(list("01"), 2, 1) == (2, 1)
    with pytest.raises(ValueError):
        parallel_layout(list("01"), 2, 2)
    with pytest.raises(RuntimeError):
        parallel_layout([], None, None)


def test_vllm_cpu_build_detection_and_layout(monkeypatch):
    """Without vLLM's CPU build (this environment) the GPU layout applies; with it, one engine and a clear error for
    more. The backend itself runs against real vLLM in tests/vllm/test_eval_vllm.py (the vLLM CPU environment)."""
    import importlib.metadata as md

    from eval import generate
    from eval.generate import cpu_layout, vllm_cpu_build

    versions = {"vllm": "0.24.0+cpu"}

    def version(dist):
        if dist not in versions:
            raise md.PackageNotFoundError(dist)
        return versions[dist]

    monkeypatch.setattr(md, "version", version)
    assert vllm_cpu_build() and generate.vllm_version() == "0.24.0+cpu"
    versions.clear()
    assert not vllm_cpu_build() and generate.vllm_version() is None
    versions["vllm-cpu"] = "0.24.0"  # no metadata-only `vllm`: read as vLLM's own platform detection does
    assert vllm_cpu_build()
    versions.clear()
    versions["vllm"] = "0.24.0"  # a GPU build
    assert not vllm_cpu_build()
    assert cpu_layout(None, None) == cpu_layout(1, 1) == (1, 1)
    with pytest.raises(ValueError, match="--tensor-parallel-size/--tp 2: vLLM's CPU build runs one engine"):
        cpu_layout(2, None)
    with pytest.raises(ValueError, match="--data-parallel-size/--dp 3"):
        cpu_layout(None, 3)


@pytest.mark.slow
def test_vllm_data_parallel_engines_in_spawned_processes(tmp_path, tiny_model):
    """Tensor and data parallel layout over several GPUs, which one CPU cannot show: a fake vLLM
    (tests/fixtures/eval/fake_vllm) answers from each request's seed and names the GPUs its engine sees. Real vLLM
    (its CPU build, one engine) runs in tests/vllm/test_eval_vllm.py."""
    from eval.generate import vllm_cpu_build
    from gapo.smoke.task import make_dataset

    if vllm_cpu_build():
        pytest.skip("vLLM's CPU build is installed: eval runs it as one CPU engine, whatever the fake on the path")

    val = make_dataset(tmp_path / "smoke", n_train=1, n_val=12)["val"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FAKE_VLLM), str(ROOT)]), "CUDA_VISIBLE_DEVICES": "0,1"}
    runs = {}
    for name, extra in (("dp2", ["--dp", "2"]), ("tp2", ["--tp", "2"])):
        out = tmp_path / name
        proc = subprocess.run(_eval_cmd(tiny_model, [val], out, "--backend", "vllm", *extra), cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    devices = {r["response"].split(" dev")[1] for r in runs["dp2"]}
    assert devices == {"0", "1"}  # two engines, one GPU each
    assert {r["response"].split(" dev")[1] for r in runs["tp2"]} == {"0,1"}  # one engine on both GPUs
    key = lambda r: (r["problem"], r["sample"])
    first = lambda rs: {key(r): (r["response"][0], r["correct"]) for r in rs}
    assert first(runs["dp2"]) == first(runs["tp2"])  # per-(problem, sample) seeds: same samples either way
    assert 0 < sum(r["correct"] for r in runs["dp2"]) < len(runs["dp2"])

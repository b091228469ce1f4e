"""`python -m eval` (eval/__main__.py): byte sizes and --timeout, a step range of checkpoints aggregated, and end to
end on CPU from a real verl checkpoint (report and plot included), killed and resumed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.eval_helpers import ROOT, _eval_cmd, _fake_summary, brute_force_pass_at_k, prepare_math, write_code_benchmark


def test_cli_byte_sizes_and_timeout_flags():
    from eval.__main__ import eval_parser

    parse = lambda *a: eval_parser().parse_args(["--model", "m", "--bench", "b", *a])
    assert parse().kv_cache_bytes is None and parse().timeout is None
    assert parse("--kv-cache-bytes", "268435456").kv_cache_bytes == 256 * 1024**2
    assert parse("--kv-cache-bytes", "256MiB").kv_cache_bytes == parse("--kv-cache-bytes", "256m").kv_cache_bytes
    assert parse("--kv-cache-bytes", "1G").kv_cache_bytes == 1024**3
    assert parse("--timeout", "2.5").timeout == 2.5
    for bad in (["--kv-cache-bytes", "lots"], ["--kv-cache-bytes", "-5"], ["--timeout", "0"]):
        with pytest.raises(SystemExit):
            parse(*bad)
    assert "--kv-cache-bytes" in eval_parser().format_help() and "--timeout" in eval_parser().format_help()


def test_timeout_ends_the_run_with_a_named_error_and_kills_it(tmp_path):
    """--timeout on the HF backend (the vLLM CPU run of it is in tests/vllm/test_eval_vllm.py): the supervised
    evaluation, cut while it still imports, is killed with every process of it; exit code 124, EvalTimeout named."""
    import psutil

    marker = f"timeout-{os.getpid()}"
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "eval", "--model", str(tmp_path), "--bench", "x",  # a folder, no model
                           "--backend", "hf", "--timeout", "0.5", "--out", str(tmp_path / "out")],
                          cwd=ROOT, env={**os.environ, "GAPO_EVAL_TEST_MARKER": marker}, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 124, proc.stderr[-2000:]
    assert "error: EvalTimeout: the evaluation exceeded its wall-clock limit of 0.5 s (--timeout)" in proc.stderr
    assert time.time() - t0 < 60
    left = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("GAPO_EVAL_TEST_MARKER") == marker:
                left.append(p.pid)
        except (psutil.Error, OSError):
            continue
    assert not left


def test_cli_evaluates_a_step_range_of_checkpoints_and_aggregates(tmp_path):
    from eval.__main__ import eval_parser, parse_steps, run_checkpoints, select_checkpoints

    run_dir = tmp_path / "ckpts"
    for step in (80, 100, 120, 140, 160, 200):
        (run_dir / f"global_step_{step}" / "actor").mkdir(parents=True)
    (run_dir / "latest_checkpointed_iteration.txt").write_text("200")
    assert parse_steps("100:200") == (100, 200, None) and parse_steps("100:200:40") == (100, 200, 40)
    assert parse_steps("160,100") == [100, 160]
    for bad in ("200:100", "1:2:0", "a:b", "", "1:2:3:4"):
        with pytest.raises(ValueError, match="--steps"):
            parse_steps(bad)
    assert [s for s, _ in select_checkpoints(run_dir, "100:160")] == [100, 120, 140, 160]
    assert [s for s, _ in select_checkpoints(run_dir, "100:200:40")] == [100, 140]
    with pytest.raises(FileNotFoundError, match=r"no checkpoint for step\(s\) \[110\]; it has: 80, 100, 120"):
        select_checkpoints(run_dir, "100,110")

    args = eval_parser().parse_args(["--run-dir", str(run_dir), "--steps", "100:140", "--bench", "b", "--n", "64",
                                     "--out", str(tmp_path / "agg"), "--coverage-threshold", "0.05"])
    cs = {100: [0, 4], 120: [8, 9], 140: [64, 3]}
    seen = []

    def fake_evaluate(cfg, overwrite=False):
        step = int(Path(cfg.model).name.split("_")[-1])
        seen.append((step, cfg.out, cfg.n, cfg.coverage_threshold))
        return _fake_summary(cs[step], cfg.n, cfg.coverage_threshold, cfg.label)

    assert run_checkpoints(args, select_checkpoints(run_dir, args.steps), fake_evaluate) == 0
    assert seen == [(s, str(tmp_path / "agg" / f"global_step_{s}"), 64, 0.05) for s in (100, 120, 140)]
    agg = json.loads((tmp_path / "agg" / "aggregate.json").read_text())
    assert agg["benchmarks"]["bench"]["coverage"]["values"] == [1, 2, 1]
    assert agg["n"] == 64 and agg["checkpoints"] == ["global_step_100", "global_step_120", "global_step_140"]
    assert "pass@64" in (tmp_path / "agg" / "aggregate.md").read_text()
    with pytest.raises(SystemExit):  # --model and --run-dir are alternatives
        eval_parser().parse_args(["--model", "m", "--run-dir", str(run_dir), "--bench", "b"])


@pytest.fixture(scope="module")
def e2e(tmp_path_factory, smoke_run, eval_cache):
    """A real verl checkpoint (step 1 of the session's smoke run, tests/conftest.py; only read here), the session's
    conversion cache, and benchmarks in the math, code and smoke formats."""
    root = tmp_path_factory.mktemp("eval_e2e")
    smoke = smoke_run["out"]
    data = root / "data"
    prepare_math(data / "math")
    write_code_benchmark(data / "code" / "code_fixture.parquet")
    return {"root": root, "ckpt": smoke_run["ckpt_dir"] / "global_step_1", "cache": eval_cache,
            "val": smoke / "data" / "val.parquet", "env": {**os.environ, "GAPO_DATA_DIR": str(data)},
            "train_s": smoke_run["runs"][0]["wall_s"]}


def _run(cmd, env, ok=(0,)):
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode in ok, proc.stderr[-4000:]
    return proc, time.time() - t0


def _table_numbers(md: str) -> dict[str, list[str]]:
    rows = {}
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and re.fullmatch(r"pass@\d+", cells[0]):
            rows[cells[0]] = cells[1:]
    return rows


@pytest.mark.slow
def test_end_to_end_from_a_verl_checkpoint_and_resume(e2e):
    benches = [e2e["val"], "aime24", "math500", "code_fixture"]
    cache = e2e["cache"]  # the session's: another evaluation of step 1 may have converted it already
    full = e2e["root"] / "full"
    proc, full_s = _run(_eval_cmd(e2e["ckpt"], benches, full, "--limit", "12", "--seed", "1", "--cache-dir", cache),
                        e2e["env"])
    print(f"\n[eval e2e] the smoke run's first training run: {e2e['train_s']:.0f} s; "
          f"evaluation incl. conversion: {full_s:.1f} s")
    assert "converting verl checkpoint" in proc.stderr or "using converted checkpoint" in proc.stderr
    summary = json.loads((full / "summary.json").read_text())
    run = json.loads((full / "run.json").read_text())
    assert run["model_kind"] == "verl" and run["step"] == 1 and summary["complete"]
    assert list(summary["benchmarks"]) == ["val", "aime24", "math500", "code_fixture"]
    assert summary["ks"] == [1, 2, 4]

    # JSONL -> pass@k recomputed independently of the summary code
    records = [json.loads(line) for line in (full / "samples.jsonl").read_text().splitlines()]
    by_problem = {}
    for r in records:
        by_problem.setdefault((r["benchmark"], r["problem"]), []).append(r)
    assert all(sorted(r["sample"] for r in rs) == [0, 1, 2, 3] for rs in by_problem.values())
    # first moves: the default m = 8 tokens, or the whole response when shorter (8 new tokens here)
    assert run["entrance_tokens"] == 8 and all(len(r["entrance"]) == min(8, r["response_tokens"]) for r in records)
    assert all(0 < b["entrance"]["distinct_frac_mean"] <= 1 for b in summary["benchmarks"].values())
    table = _table_numbers((full / "results.md").read_text())
    for name, bench in summary["benchmarks"].items():
        cs = [sum(r["correct"] for r in rs) for (b, _), rs in by_problem.items() if b == name]
        assert len(cs) == bench["problems"] == bench["problems_total"]
        for k in (1, 2, 4):
            want = sum(float(brute_force_pass_at_k(4, c, k)) for c in cs) / len(cs)
            assert bench["pass@k"][str(k)] == pytest.approx(want, abs=1e-12)
            col = list(summary["benchmarks"]).index(name)
            assert table[f"pass@{k}"][col] == f"{100 * bench['pass@k'][str(k)]:.1f}"
        assert bench["coverage"]["problems"] == sum(c / 4 > 0.05 for c in cs)
    assert 0 < summary["benchmarks"]["val"]["pass@k"]["1"] < 1  # the smoke task: mixed verdicts
    assert {r["data_source"] for r in records} >= {"gapo_smoke", "aime24", "math500", "taco", "livecodebench"}
    assert (full / "passk.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # killed run: stop after 5 problems, lose part of the next problem and tear the last line, resume
    part = e2e["root"] / "resumed"
    cmd = _eval_cmd(e2e["ckpt"], benches, part, "--limit", "12", "--seed", "1", "--cache-dir", cache)
    proc, _ = _run([*cmd, "--stop-after", "5"], e2e["env"], ok=(3,))
    assert "using converted checkpoint" in proc.stderr
    lines = (part / "samples.jsonl").read_text().splitlines(keepends=True)
    assert len(lines) == 5 * 4
    (part / "samples.jsonl").write_text("".join(lines[:-2]) + lines[-2][: len(lines[-2]) // 2])
    proc, _ = _run(cmd, e2e["env"])
    assert "4 already recorded" in proc.stderr
    resumed = json.loads((part / "summary.json").read_text())
    assert resumed["benchmarks"] == summary["benchmarks"]
    key = lambda r: (r["benchmark"], r["problem"], r["sample"], r["response"], r["correct"])
    again = [json.loads(x) for x in (part / "samples.jsonl").read_text().splitlines()]
    assert sorted(map(key, again)) == sorted(map(key, records))

    # report rebuilds from the records; plot and compare two runs
    (part / "summary.json").unlink()
    proc, _ = _run([sys.executable, "-m", "eval", "report", str(part)], e2e["env"])
    assert json.loads((part / "summary.json").read_text())["benchmarks"] == summary["benchmarks"]
    proc, _ = _run([sys.executable, "-m", "eval", "report", str(full), str(part), "--labels", "a", "b"], e2e["env"])
    assert "## pass@4 (%)" in proc.stdout and "| a |" in proc.stdout
    png = e2e["root"] / "compare.png"
    _run([sys.executable, "-m", "eval", "plot", str(full), str(part), "--out", str(png)], e2e["env"])
    assert png.read_bytes()[:4] == b"\x89PNG"

    # other settings in the same folder are refused
    proc = subprocess.run([*cmd, "--n", "2"], cwd=ROOT, env=e2e["env"], capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "other settings" in proc.stderr

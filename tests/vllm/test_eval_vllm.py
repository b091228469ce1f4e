"""`python -m eval --backend vllm` against real vLLM (its CPU build, `.venv-vllm`), with the tiny model.

One successful evaluation (module fixture) is checked for n seeded samples per problem at the eval defaults
(temperature 0.6, top_p 0.95), `finish_reason` at --max-new-tokens and at the --max-model-len cap, and pass@k
recomputed exactly from the records; an in-process engine then regenerates its samples in another batch order.
A broken engine setting and --timeout must end the run with a named error and leave no process and no /dev/shm
segment behind. Every `python -m eval` runs in its own session under a marker variable, so the test finds all of its
processes (vLLM's engine core and worker included) and the /dev/shm segments they hold, independently of eval's
own clean-up.

Run: .venv-vllm/bin/python -m pytest tests/vllm/test_eval_vllm.py  (each vLLM engine start is ~25-60 s here).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
SHM = Path("/dev/shm")
MARKER = "GAPO_EVAL_TEST_MARKER"
N = 4  # samples per problem
MAX_NEW = 16  # --max-new-tokens
CAP = 6  # new tokens left to the long prompt by --max-model-len
NEVER = "#"  # a ground truth no response can start with: the tiny vocabulary has no "#"


# ------------------------------------------------------------------------------------------ helpers
def _shm_names() -> set[str]:
    return {p.name for p in SHM.iterdir()}


def _held(proc: psutil.Process) -> set:
    """/dev/shm names a process has open or mapped, and ("inode", n) of each mapped one: a POSIX semaphore's creator
    maps it under a temporary name (then renamed), so only its inode ties it to the creator."""
    held = set()
    try:
        held.update(f.path[len("/dev/shm/"):] for f in proc.open_files() if f.path.startswith("/dev/shm/"))
        with open(f"/proc/{proc.pid}/maps") as maps:
            for line in maps:
                if "/dev/shm/" in line:
                    held.add(line.split("/dev/shm/", 1)[1].split()[0])
                    held.add(("inode", int(line.split()[4])))
    except (psutil.Error, OSError):
        pass
    return held


def _with_inode(name: str):
    try:
        return ("inode", (SHM / name).stat().st_ino)
    except OSError:
        return None


class WatchedEval:
    """``python -m eval ARGS`` in its own session, its environment marked; :meth:`wait` polls every process of it and
    the /dev/shm segments they hold. A process of the run: one that carries the marker, or one in a session that such a
    process leads or belongs to (vLLM renames its processes with setproctitle, which overwrites their environment as
    /proc shows it, so the marker alone misses them)."""

    def __init__(self, args: list[str], log_dir: Path, env: dict | None = None):
        self.token = uuid.uuid4().hex
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.names: set[str] = set()  # process names seen
        self.shm_seen: set = set()
        self.shm_before = _shm_names()
        self.t0 = time.monotonic()
        with open(log_dir / "stdout", "w") as out, open(log_dir / "stderr", "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "eval", *args], cwd=ROOT, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": str(ROOT), MARKER: self.token, **(env or {})},
                start_new_session=True)
        self.sessions = {self.proc.pid}

    def processes(self) -> list[psutil.Process]:
        found, others = [], []
        for proc in psutil.process_iter():
            try:
                if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                sid = os.getsid(proc.pid)
                if proc.environ().get(MARKER) == self.token:
                    self.sessions.add(sid)
                    found.append(proc)
                else:
                    others.append((sid, proc))
            except (psutil.Error, OSError):
                continue
        return found + [proc for sid, proc in others if sid in self.sessions]

    def wait(self, limit_s: float, on_poll=None) -> WatchedEval:
        while self.proc.poll() is None:
            procs = self.processes()
            for proc in procs:
                try:
                    self.names.add(proc.name())
                except psutil.Error:
                    pass
                self.shm_seen |= _held(proc)
            if on_poll:
                on_poll(self, procs)
            if time.monotonic() - self.t0 > limit_s:
                os.killpg(self.proc.pid, signal.SIGKILL)
                for proc in self.processes():
                    proc.kill()
                pytest.fail(f"python -m eval still running after {limit_s} s; stderr:\n{self.stderr[-3000:]}")
            time.sleep(0.5)
        self.wall = time.monotonic() - self.t0
        return self

    @property
    def stdout(self) -> str:
        return (self.log_dir / "stdout").read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return (self.log_dir / "stderr").read_text(errors="replace")

    def assert_nothing_left(self) -> None:
        """No process of the run alive, and none of the segments its processes held still under /dev/shm."""
        left = [(p.pid, p.name()) for p in self.processes()]
        assert not left, f"processes of the run outlived it: {left}"
        kept = sorted(name for name in _shm_names() - self.shm_before
                      if name in self.shm_seen or _with_inode(name) in self.shm_seen)
        assert not kept, f"/dev/shm segments of the run left behind: {kept}"


def _smoke_row(content: str, ground_truth: str, index: int) -> dict:
    return {"data_source": "gapo_smoke", "prompt": [{"role": "user", "content": content}], "ability": "char_choice",
            "reward_model": {"style": "rule", "ground_truth": ground_truth}, "extra_info": {"index": index}}


def _write(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _first_visible(text: str) -> str:
    return text.lstrip()[:1]


# ------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The tiny model; benchmarks: the smoke task's val split (mixed verdicts), a scripted one (problems no response
    can solve, and problems any visible first character solves) and one prompt that leaves CAP tokens of context."""
    from transformers import AutoTokenizer

    from eval.generate import encode_prompt, render_prompt
    from gapo.smoke.task import CHOICE_POOL, make_dataset, make_prompt
    from gapo.smoke.tiny_model import PUNCT_CHARS, build_tiny_model

    root = tmp_path_factory.mktemp("eval_vllm")
    model = build_tiny_model(root / "model")
    tokenizer = AutoTokenizer.from_pretrained(model)
    smoke = make_dataset(root / "smoke", n_train=1, n_val=6)["val"]
    anything = "".join(CHOICE_POOL) + "".join(PUNCT_CHARS)
    scripted = _write(root / "scripted.parquet", [
        _smoke_row(make_prompt("abc"), NEVER, 0), _smoke_row(make_prompt("xyz"), NEVER, 1),
        _smoke_row(make_prompt("0123"), anything, 2), _smoke_row(make_prompt("789"), anything, 3)])
    long_content = make_prompt(CHOICE_POOL) + " please" * 8
    long = _write(root / "long.parquet", [_smoke_row(long_content, CHOICE_POOL, 0)])
    long_len = len(encode_prompt(tokenizer, render_prompt(tokenizer, [{"role": "user", "content": long_content}])))
    max_model_len = long_len + CAP
    assert long_len > 102 + MAX_NEW  # the smoke task's longest prompt (102 tokens) is never capped
    return {"root": root, "model": model, "tokenizer": tokenizer, "benches": [smoke, scripted, long],
            "long_len": long_len, "max_model_len": max_model_len}


def _eval_args(data, out: Path, *extra) -> list[str]:
    return ["--model", str(data["model"]), "--bench", *map(str, data["benches"]), "--out", str(out), "--n", str(N),
            "--max-new-tokens", str(MAX_NEW), "--backend", "vllm", "--dtype", "float32", "--no-progress", *extra]


@pytest.fixture(scope="module")
def cli_run(data):
    """One `python -m eval --backend vllm` (eval's default sampling: temperature 0.6, top_p 0.95)."""
    out = data["root"] / "run"
    run = WatchedEval(_eval_args(data, out, "--max-model-len", str(data["max_model_len"]), "--timeout", "600"),
                      data["root"] / "run_logs").wait(limit_s=700)
    assert run.proc.returncode == 0, run.stderr[-4000:]
    print(f"\n[eval vllm] successful run: {run.wall:.1f} s; processes {sorted(run.names)}")
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return {"watch": run, "out": out, "records": records, "summary": json.loads((out / "summary.json").read_text()),
            "run": json.loads((out / "run.json").read_text())}


# ------------------------------------------------------------------------------------------ the run
def test_n_seeded_samples_per_problem_at_the_papers_sampling_settings(data, cli_run):
    from eval.data import load_benchmarks
    from eval.generate import sample_seed

    run, records = cli_run["run"], cli_run["records"]
    assert (run["backend"], run["n"], run["temperature"], run["top_p"]) == ("vllm", N, 0.6, 0.95)
    assert "VLLM::EngineCore" in cli_run["watch"].names  # vLLM's engine really ran (in its own process)
    by_problem = defaultdict(list)
    for r in records:
        by_problem[(r["benchmark"], r["problem"])].append(r)
    expected = {(b.name, p.index) for b in load_benchmarks([str(x) for x in data["benches"]]) for p in b.problems}
    assert set(by_problem) == expected and len(expected) == 6 + 4 + 1
    for (bench, problem), recs in by_problem.items():
        assert sorted(r["sample"] for r in recs) == list(range(N)), (bench, problem)
        assert [r["seed"] for r in sorted(recs, key=lambda r: r["sample"])] == [
            sample_seed(0, bench, problem, i) for i in range(N)]
    assert len({r["response"] for r in records}) > len(records) // 2  # sampled, not greedy
    cli_run["watch"].assert_nothing_left()


def test_finish_reason_at_max_new_tokens_and_at_the_max_model_len_cap(data, cli_run):
    records = cli_run["records"]
    normal = [r for r in records if r["benchmark"] != "long"]
    for r in normal:  # "length": --max-new-tokens ran out; "stop": end of sequence (counted), at the last token at most
        assert r["finish_reason"] in ("length", "stop"), r
        assert r["response_tokens"] == MAX_NEW if r["finish_reason"] == "length" else 1 <= r["response_tokens"] <= MAX_NEW
    assert {r["finish_reason"] for r in normal} == {"length", "stop"}
    capped = [r for r in records if r["benchmark"] == "long"]
    assert len(capped) == N
    for r in capped:  # prompt + response must fit --max-model-len: max_tokens reduced to CAP
        assert r["finish_reason"] in ("length", "stop"), r
        assert r["response_tokens"] == CAP if r["finish_reason"] == "length" else 1 <= r["response_tokens"] <= CAP
    assert any(r["finish_reason"] == "length" for r in capped)
    stderr = cli_run["watch"].stderr
    assert (f"max new tokens {MAX_NEW} + prompt {data['long_len']} exceeds max model len {data['max_model_len']}: "
            f"capped at {CAP}") in stderr


def test_passk_recomputed_from_the_records_is_exact(data, cli_run):
    import pyarrow.parquet as pq

    truths = {path.stem: [row["reward_model"]["ground_truth"] for row in pq.read_table(path).to_pylist()]
              for path in data["benches"]}
    counts = defaultdict(dict)
    for r in cli_run["records"]:
        # the verdict, independently: the smoke task's rule on the recorded text
        first = _first_visible(r["response"])
        assert r["correct"] == (bool(first) and first in truths[r["benchmark"]][r["problem"]]), r
        counts[r["benchmark"]][r["problem"]] = counts[r["benchmark"]].get(r["problem"], 0) + r["correct"]
    summary = cli_run["summary"]
    assert summary["ks"] == [1, 2, 4]
    for bench, cs in counts.items():
        reported = summary["benchmarks"][bench]
        assert reported["problems"] == len(cs)
        for k in (1, 2, 4):
            exact = sum((1 - Fraction(math.comb(N - c, k), math.comb(N, k)) for c in cs.values()), Fraction(0))
            exact /= len(cs)
            # the same rational, to the float's last bits (eval sums per-problem floats)
            assert reported["pass@k"][str(k)] == pytest.approx(float(exact), rel=1e-15, abs=0), (bench, k)
    scripted = counts["scripted"]
    assert scripted[0] == scripted[1] == 0  # scripted: no response starts with "#"
    for k in (1, 2, 4):  # so pass@k there is that of the two answerable problems, halved
        exact = sum(1 - Fraction(math.comb(N - scripted[i], k), math.comb(N, k)) for i in (2, 3)) / 4
        assert summary["benchmarks"]["scripted"]["pass@k"][str(k)] == pytest.approx(float(exact), rel=1e-15, abs=0)
    assert 0 < summary["benchmarks"]["val"]["pass@k"]["1"] < 1


# ------------------------------------------------------------------------------------------ failures
@pytest.mark.slow
def test_a_broken_engine_setting_ends_the_run_with_vllms_error_and_leaves_nothing(data):
    limit = 300  # seconds; an engine start is ~25-60 s here, its failure comes after model load and warm-up
    run = WatchedEval(_eval_args(data, data["root"] / "broken", "--kv-cache-bytes", "4KiB"),
                      data["root"] / "broken_logs").wait(limit_s=limit + 60)
    print(f"\n[eval vllm] broken engine: exit {run.proc.returncode} after {run.wall:.1f} s")
    assert run.proc.returncode != 0
    assert run.wall < limit
    assert "VLLM::EngineCore" in run.names  # it failed in vLLM's engine core, not before
    assert re.search(r"ValueError: To serve at least one request .*KV cache", run.stderr), run.stderr[-4000:]
    assert "Engine core initialization failed" in run.stderr
    assert any(str(name).startswith("psm_") for name in run.shm_seen - run.shm_before)  # the engine made segments
    run.assert_nothing_left()


def test_timeout_kills_the_run_with_a_named_error_and_leaves_nothing(data):
    # the limit must fall after vLLM's engine core and worker processes start (their titles show ~10 s in alone; the
    # engine's start took 15-25 s alone and over 35 s beside `make test`'s default suite, and in one CI run beside it
    # more than 50 s) and long before the run could finish: a run cut before its engine started has not tested the
    # kill of vLLM's processes, so it is run again with twice the limit (every run must still end as a timeout)
    seen_engine: list[int] = []

    def note_engine(_run, procs):
        seen_engine.extend(p.pid for p in procs if p.pid != _run.proc.pid and _safe_name(p).startswith("VLLM::"))

    for attempt, timeout in enumerate((50, 100, 200)):
        seen_engine.clear()
        # 2048 samples of up to 512 tokens for each of 11 problems: minutes of generation (256 samples took ~30 s on
        # an idle machine), so the run is cut by the limit
        args = _eval_args(data, data["root"] / f"timeout{attempt}", "--timeout", str(timeout))
        args[args.index("--n") + 1], args[args.index("--max-new-tokens") + 1] = "2048", "512"
        run = WatchedEval(args, data["root"] / f"timeout{attempt}_logs").wait(limit_s=timeout + 90,
                                                                              on_poll=note_engine)
        print(f"\n[eval vllm] --timeout {timeout}: exit {run.proc.returncode} after {run.wall:.1f} s; "
              f"engine processes seen: {len(set(seen_engine))}")
        assert run.proc.returncode == 124, run.stderr[-3000:]
        assert f"error: EvalTimeout: the evaluation exceeded its wall-clock limit of {timeout} s (--timeout)" \
            in run.stderr
        assert timeout <= run.wall < timeout + 45
        run.assert_nothing_left()
        if seen_engine:
            break
    assert seen_engine, f"vLLM's engine processes had not started after {timeout} s, in three runs"
    found = re.search(r"killed with its (\d+) process", run.stderr)
    assert found, run.stderr[-3000:]
    killed = int(found.group(1))
    assert killed >= 3  # the evaluation, vLLM's engine core and its worker (and helpers)


def _safe_name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.Error:
        return ""


# ------------------------------------------------------------------------------------------ the backend
def test_the_cpu_build_runs_one_engine_and_refuses_more(data):
    from eval.generate import SamplingConfig, VLLMBackend, vllm_cpu_build

    assert vllm_cpu_build()
    for kwargs, flag in (({"tp": 2}, "--tensor-parallel-size"), ({"dp": 4}, "--data-parallel-size")):
        with pytest.raises(ValueError, match=f"{flag}.*vLLM's CPU build runs one engine"):
            VLLMBackend(str(data["model"]), SamplingConfig(), **kwargs)


@pytest.fixture(scope="module")
def engine(data):
    """eval's vLLM backend in this process, with the CLI run's settings."""
    from eval.generate import SamplingConfig, VLLMBackend

    backend = VLLMBackend(str(data["model"]), SamplingConfig(0.6, 0.95, MAX_NEW), tp=1, dtype="float32",
                          max_model_len=data["max_model_len"], seed=0)
    yield backend
    backend.close()


@pytest.mark.slow
def test_seeded_samples_reproduce_across_runs_and_batch_orders(data, cli_run, engine):
    from eval.data import load_benchmarks
    from eval.generate import DEFAULT_CPU_KV_CACHE_BYTES, Request, encode_prompt, render_prompt

    config = engine.engine.llm.llm_engine.vllm_config
    assert (engine.tp, engine.dp) == (1, 1) and config.model_config.enforce_eager
    assert config.cache_config.enable_prefix_caching  # a problem's n requests share their prompt
    assert config.cache_config.kv_cache_memory_bytes == DEFAULT_CPU_KV_CACHE_BYTES
    # seeded requests whose prefill is chunked kill vLLM 0.24.0's CPU engine (the timeout test's large batch did)
    assert not config.scheduler_config.enable_chunked_prefill
    assert config.scheduler_config.max_num_batched_tokens >= data["max_model_len"]
    assert engine.engine.max_model_len == data["max_model_len"]
    tok = data["tokenizer"]
    recorded = {(r["benchmark"], r["problem"], r["seed"]): r for r in cli_run["records"]}
    problems = [p for b in load_benchmarks([str(x) for x in data["benches"]]) for p in b.problems]
    problems.reverse()  # another order than the run's, the seeds of each problem reversed too, in two batches
    reqs = [Request(encode_prompt(tok, render_prompt(tok, p.prompt)),
                    [recorded[(b, i, s)]["seed"] for (b, i, s) in recorded if (b, i) == (p.benchmark, p.index)][::-1])
            for p in problems]
    half = len(reqs) // 2
    out = engine.generate(reqs[:half]) + engine.generate(reqs[half:])
    for p, req, comps in zip(problems, reqs, out, strict=True):
        assert len(comps) == N
        for seed, comp in zip(req.seeds, comps):
            rec = recorded[(p.benchmark, p.index, seed)]
            assert (comp.text, comp.tokens, comp.finish_reason) == (
                rec["response"], rec["response_tokens"], rec["finish_reason"]), (p.benchmark, p.index, seed)
    # and one sample alone is the same sample again
    one = engine.generate([Request(reqs[0].prompt_ids, reqs[0].seeds[:1])])[0][0]
    assert one == out[0][0]

"""Benchmark: cost of the code sandbox against a plain subprocess with no isolation, in one run.

Measures, with the same interpreter and flags on both sides:

1. latency of one test run at a time (median per test);
2. throughput of many tests over the sandbox's slots (plain: a thread pool of the same size);
3. scoring a typical problem: 15 stdin/stdout tests, and 15 function-call tests (median wall time).

Usage: ``python -m recipe.bench.sandbox [--tests 200] [--repeats 10] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from gapo.rewards.code.score import compute_code_score
from gapo.rewards.sandbox.client import Sandbox, SandboxConfig

PROGRAM = "import sys\nnums = list(map(int, sys.stdin.read().split()))\nprint(sum(nums[1:]))\n"
CALL_PROGRAM = "def total(xs):\n    return sum(xs)\n"


def _input(i: int) -> str:
    return f"{i % 50 + 1}\n" + " ".join(str(j) for j in range(i % 50 + 1)) + "\n"


def _plain_run(interpreter: str, args: tuple[str, ...], path: str, stdin: str) -> bytes:
    return subprocess.run([interpreter, *args, path], input=stdin.encode(), capture_output=True,
                          timeout=30, check=True, env={"PATH": "/usr/bin:/bin"}).stdout


def bench(n_tests: int, repeats: int) -> dict:
    """Run the three measurements (module docstring) on ``n_tests`` inputs, ``repeats`` scorings per problem;
    returns latency (ms, median), throughput (tests/s) and problem times (s), sandbox against plain subprocesses."""
    sandbox = Sandbox(SandboxConfig()).start()
    cfg = sandbox.config
    inputs = [_input(i) for i in range(n_tests)]
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(PROGRAM)
        path = f.name
    try:
        # warm-up (page cache, executor)
        _plain_run(cfg.interpreter, cfg.python_args, path, inputs[0])
        sandbox.run(PROGRAM, inputs[:4])

        n_lat = min(n_tests, 60)
        plain_lat, box_lat = [], []
        for stdin in inputs[:n_lat]:
            t = time.perf_counter()
            _plain_run(cfg.interpreter, cfg.python_args, path, stdin)
            plain_lat.append(time.perf_counter() - t)
            t = time.perf_counter()
            (res,) = sandbox.run(PROGRAM, [stdin])
            box_lat.append(time.perf_counter() - t)
            assert res.exited_ok, res

        t = time.perf_counter()
        with ThreadPoolExecutor(cfg.slots) as pool:
            list(pool.map(lambda s: _plain_run(cfg.interpreter, cfg.python_args, path, s), inputs))
        plain_tp = n_tests / (time.perf_counter() - t)
        t = time.perf_counter()
        results = sandbox.run(PROGRAM, inputs)
        box_tp = n_tests / (time.perf_counter() - t)
        assert all(r.exited_ok for r in results)
    finally:
        os.unlink(path)

    stdio_gt = json.dumps({"inputs": inputs[:15], "outputs": [str(sum(range(i % 50 + 1))) for i in range(15)]})
    call_gt = json.dumps([{"type": "function_call", "fn_name": "total", "input": [list(range(i))], "output": [sum(range(i))]}
                          for i in range(15)])
    problem_s = {}
    for name, code, gt in (("stdio", PROGRAM, stdio_gt), ("call", CALL_PROGRAM, call_gt)):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            out = compute_code_score("deepcoder_lcb", f"```python\n{code}```", gt, sandbox=sandbox)
            times.append(time.perf_counter() - t)
            assert out["score"] == 1.0 and out["total"] == 15, out
        problem_s[name] = statistics.median(times)
    sandbox.close()
    med_plain, med_box = statistics.median(plain_lat), statistics.median(box_lat)
    return {
        "slots": cfg.slots, "mode": sandbox.mode, "interpreter": cfg.interpreter, "python_args": list(cfg.python_args),
        "latency_ms": {"plain": 1e3 * med_plain, "sandbox": 1e3 * med_box,
                       "overhead": 1e3 * (med_box - med_plain), "ratio": med_box / med_plain},
        "throughput_tests_per_s": {"plain": plain_tp, "sandbox": box_tp, "ratio": plain_tp / box_tp},
        "problem_15_tests_s": problem_s,
    }


def main() -> None:
    """CLI entry: run :func:`bench` and print the comparison (and ``--json``)."""
    parser = argparse.ArgumentParser(prog="python -m recipe.bench.sandbox", description=__doc__.split("\n")[0])
    parser.add_argument("--tests", type=int, default=200, help="test runs for the throughput measurement")
    parser.add_argument("--repeats", type=int, default=10, help="repetitions of the 15-test problem")
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args()
    r = bench(args.tests, args.repeats)
    lat, tp = r["latency_ms"], r["throughput_tests_per_s"]
    print(f"sandbox mode: {r['mode']}, slots: {r['slots']}, interpreter: {r['interpreter']} {' '.join(r['python_args'])}")
    print(f"one test at a time (median):  plain {lat['plain']:.1f} ms   sandbox {lat['sandbox']:.1f} ms   "
          f"overhead {lat['overhead']:+.1f} ms   ratio {lat['ratio']:.2f}x")
    print(f"throughput ({args.tests} tests):     plain {tp['plain']:.0f}/s    sandbox {tp['sandbox']:.0f}/s    "
          f"ratio {tp['ratio']:.2f}x")
    print(f"15-test problem (median of {args.repeats}): stdin/stdout {r['problem_15_tests_s']['stdio'] * 1e3:.0f} ms   "
          f"function-call {r['problem_15_tests_s']['call'] * 1e3:.0f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()

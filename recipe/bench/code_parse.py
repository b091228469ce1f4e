"""Benchmark: the code reward's parent-side parsing is linear, and a hostile batch costs the parent little.

1. Time per KB of each parser the parent runs on model-controlled text, on adversarial inputs of 1 KB,
   10 KB, 100 KB and 1 MB (best of several runs): code-fence extraction, stdout token comparison (integer
   and float expectations), the runner's result line (decode + compare) for function-call and HumanEval.
   The regexes these replaced are timed too, up to 100 KB (they are quadratic: 1 MB would take minutes).
   ``--max-growth R`` exits 1 if a parser's time per KB at 1 MB exceeds R times its time per KB at 1 KB.
2. ``--hostile``: a set of hostile answers (the red-team examples and variants: harness calls, test-file
   reads, shadowed builtins, inexact integers, bool for int, int-digit overflows, deeply nested results,
   long digit runs, fence floods, eight answers printing 60 MB each) scored one by one with
   ``compute_code_score`` in the sandbox: wall time, and the parent's peak memory (``ru_maxrss`` and
   ``tracemalloc``). Every item must score 0 without raising.

Usage: ``python -m recipe.bench.code_parse [--max-growth 3] [--hostile] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import sys
import time
import tracemalloc

from gapo.rewards.code import score as C

SIZES_KB = (1, 10, 100, 1024)
OLD_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.#-]*)[^\n]*\n(.*?)```", re.DOTALL)
OLD_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def _best(fn, arg, budget_s: float = 0.3, max_runs: int = 20) -> float:
    best, spent, runs = float("inf"), 0.0, 0
    while runs < max_runs and (runs < 2 or spent < budget_s):
        t = time.perf_counter()
        fn(arg)
        dt = time.perf_counter() - t
        best, spent, runs = min(best, dt), spent + dt, runs + 1
    return best


def _result_line(n_bytes: int) -> bytes:
    k = max(1, n_bytes // 8)
    return ("\n" + json.dumps([[0, list(range(1000000, 1000000 + k))]], separators=(",", ":")) + "\n").encode()


def _parsers() -> dict:
    """name -> (input maker for a size in bytes, function on that input, largest size in KB to time, or None)."""
    call_want = {}

    def call_judge(line: bytes) -> bool:
        (item,) = C.read_results(line, 1)
        got = C._untag(item[1], False)
        return C.values_match(got, call_want.setdefault(len(line), list(got)))

    def script_judge(line: bytes) -> str:
        items = C.read_results(line, 1)
        want = C._untag(items[0][1], True)
        return C.judge_script(C.Plan(calls=["[[],{}]"], checks=[["eq", 0, 1, want, ""]]), items)

    def fence_text(n):
        return "```python " * (n // 10)

    def digits_x(n):
        return "1" * n + "x"

    return {
        "fences: ```python x N, no newline": (fence_text, C.extract_code, None),
        "  (old fence regex)": (fence_text, OLD_FENCE.findall, 100),
        "stdout: digits+'x' vs int": (digits_x, lambda s: C.stdout_matches(s, "5"), None),
        "stdout: digits+'x' vs float": (digits_x, lambda s: C.stdout_matches(s, "1.5"), None),
        "  (old number regex)": (digits_x, OLD_NUMBER.fullmatch, 10),
        "stdout: floats, all tokens compared": (lambda n: "0.5000001 " * (n // 10),
                                                lambda s: C.stdout_matches(s, s.replace("1 ", "2 ")), None),
        "result line: function call": (_result_line, call_judge, None),
        "result line: HumanEval check": (_result_line, script_judge, None),
        "result line: nested 100 deep, long str": (
            lambda n: ("\n[[0," + "[" * 100 + json.dumps("x" * n) + "]" * 100 + "]]\n").encode(),
            lambda line: C.values_match(C._untag(C.read_results(line, 1)[0][1], False), [[1]]), None),
    }


def bench_parsers(show=None) -> dict:
    """Time each parser on inputs of SIZES_KB (the old regexes only up to their cap); returns
    ``{name: {"us_per_kb": {kb: microseconds per KB, best of several runs}, "old": bool}}``. ``show(name, row)``
    is called as each row is done."""
    table = {}
    for name, (make, fn, max_kb) in _parsers().items():
        row = {}
        for kb in SIZES_KB:
            if max_kb is not None and kb > max_kb:
                continue
            data = make(kb * 1024)
            row[kb] = _best(fn, data) * 1e6 / kb  # microseconds per KB
        table[name] = {"us_per_kb": row, "old": max_kb is not None}
        if show is not None:
            show(name, table[name])
    return table


# ----- hostile set -----------------------------------------------------------------------------------
HE = {"prompt": 'def add(a, b):\n    """Add two numbers."""\n',
      "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
      "entry_point": "add"}
WRONG_ADD = "def add(a, b):\n    return a - b\n"
STDIO_INT = json.dumps({"inputs": ["\n"], "outputs": ["999999999\n"]})
CALL_ONE = json.dumps([{"type": "function_call", "fn_name": "f", "input": [], "output": [1]}])
DEEP = "import json\njson.dumps = lambda *a, **k: '[' * 200000 + ']' * 200000\n"


def _fence(code: str) -> str:
    return f"```python\n{code}```"


def hostile_set() -> list[tuple[str, str, str, object]]:
    """(name, data_source, response, ground truth); each must score 0."""
    items = [
        ("he: token emitter at module level", "humaneval", _fence("_g_emit()\n" + WRONG_ADD), HE),
        ("he: read tests from own file", "humaneval", _fence(
            "import re\n_t = dict(re.findall(r'candidate\\((.*?)\\) == (-?\\d+)', open('/main.py').read()))\n"
            "def add(a, b):\n    return int(_t.get(f'{a}, {b}', 7))\n"), HE),
        ("he: shadow any() + __eq__ object", "humaneval", _fence(
            "import builtins\nbuiltins.any = lambda *a: True\nclass A:\n    __eq__ = lambda s, o: True\n"
            "def add(a, b):\n    return A()\n"), HE),
        ("he: shadow isinstance/type", "humaneval", _fence(
            "import builtins\nbuiltins.isinstance = lambda *a: True\nbuiltins.type = lambda *a: int\n" + WRONG_ADD), HE),
        ("he: deeply nested result", "humaneval", _fence(DEEP + WRONG_ADD), HE),
        ("he: int past 4300 digits", "humaneval", _fence("def add(a, b):\n    return 10 ** 5000\n"), HE),
        ("stdin: 999999000.0 for 999999999", "taco", _fence("print('999999000.0')\n"), STDIO_INT),
        ("stdin: '1' * 4301", "taco", _fence("print('1' * 4301)\n"), STDIO_INT),
        ("stdin: '1' * 16000 + 'x'", "taco", _fence("print('1' * 16000 + 'x')\n"), STDIO_INT),
        ("stdin: '1' * 1000000 + 'x'", "taco", _fence("print('1' * 1000000 + 'x')\n"), STDIO_INT),
        ("call: True for [1]", "primeintellect", _fence("def f():\n    return True\n"), CALL_ONE),
        ("call: deeply nested result", "primeintellect", _fence(DEEP + "def f():\n    return 1\n"), CALL_ONE),
        ("call: 5000-digit decimal in result", "primeintellect", _fence(
            "import json\njson.dumps = lambda *a, **k: '[[0,' + '1' * 5000 + ']]'\ndef f():\n    return 1\n"), CALL_ONE),
        ("fences: 120 KB of ```python ", "taco", "```python " * 12000, STDIO_INT),
        ("fences: 1 MB of ```python ", "taco", "```python " * 100000, STDIO_INT),
    ]
    for k in range(8):
        items.append((f"he: prints 60 MB then wrong ({k + 1}/8)", "humaneval", _fence(
            "import sys\n_b = 'x' * (1 << 20)\nfor _ in range(60):\n    sys.stdout.write(_b)\n" + WRONG_ADD), HE))
    for k in range(8):
        items.append((f"he: 60 MB into the result fd ({k + 1}/8)", "humaneval", _fence(
            "import os, sys\n_b = b'[' * (1 << 20)\nfor _ in range(60):\n"
            "    os.write(sys.modules['__main__']._g_fd, _b)\n" + WRONG_ADD), HE))
    return items


def bench_hostile() -> dict:
    """Score :func:`hostile_set` one answer at a time in a fresh sandbox; returns each item's time and verdict, the
    total time, the parent's ``ru_maxrss`` before and after and its ``tracemalloc`` peak (MB), and ``all_zero``."""
    from gapo.rewards.sandbox.client import Sandbox, SandboxConfig

    sandbox = Sandbox(SandboxConfig()).start()
    try:
        # warm-up: the executor, and HumanEval's plan (extraction happens once per problem, then is cached)
        assert C.compute_code_score("humaneval", _fence("def add(a, b):\n    return a + b\n"), HE,
                                    sandbox=sandbox)["score"] == 1.0
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        tracemalloc.start()
        rows, start = [], time.perf_counter()
        for name, source, response, gt in hostile_set():
            t = time.perf_counter()
            try:
                out = C.compute_code_score(source, response, gt, sandbox=sandbox)
                verdict = f"score {out['score']:.0f}: {out['reason'][:60]}"
                ok = out["score"] == 0.0
            except Exception as exc:  # noqa: BLE001 - the point is to show there are none
                verdict, ok = f"RAISED {type(exc).__name__}", False
            rows.append({"name": name, "s": time.perf_counter() - t, "verdict": verdict, "ok": ok})
        total = time.perf_counter() - start
        _, traced_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    finally:
        sandbox.close()
    return {"items": rows, "total_s": total, "ru_maxrss_before_mb": rss0 / 1024, "ru_maxrss_after_mb": rss1 / 1024,
            "tracemalloc_peak_mb": traced_peak / 2 ** 20, "all_zero": all(r["ok"] for r in rows)}


def main() -> None:
    """CLI entry: print the parser table (and the hostile set with ``--hostile``); exits 1 when a limit fails."""
    parser = argparse.ArgumentParser(prog="python -m recipe.bench.code_parse", description=__doc__.split("\n")[0])
    parser.add_argument("--max-growth", type=float, default=None,
                        help="fail if a parser's time per KB at 1 MB is more than this many times that at 1 KB")
    parser.add_argument("--hostile", action="store_true", help="also score the hostile set in the sandbox")
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args()
    print("parent-side parsing, microseconds per KB of input (best of several runs; old regexes for comparison)")
    print(f"{'parser':40s}" + "".join(f"{f'{kb} KB':>12s}" for kb in SIZES_KB) + f"{'1MB/1KB':>10s}")
    failed = []

    def show(name, row):
        per = row["us_per_kb"]
        cells = "".join(f"{per[kb]:12.2f}" if kb in per else f"{'-':>12s}" for kb in SIZES_KB)
        growth = per[1024] / per[1] if 1024 in per else None
        print(f"{name:40s}{cells}{'' if growth is None else f'{growth:10.2f}'}", flush=True)
        if growth is not None and args.max_growth is not None and growth > args.max_growth:
            failed.append(name)

    report = {"parsers": bench_parsers(show)}
    if args.hostile:
        h = bench_hostile()
        report["hostile"] = h
        print(f"\nhostile set through compute_code_score ({len(h['items'])} answers, one at a time): "
              f"{h['total_s']:.2f} s; parent ru_maxrss {h['ru_maxrss_before_mb']:.0f} -> {h['ru_maxrss_after_mb']:.0f} MB, "
              f"tracemalloc peak {h['tracemalloc_peak_mb']:.1f} MB")
        for r in h["items"]:
            print(f"  {r['s']:7.2f} s  {r['name']:42s} {r['verdict']}")
        if not h["all_zero"]:
            failed.append("hostile set: an item did not score 0 or raised")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if failed:
        print("FAILED: " + "; ".join(failed), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

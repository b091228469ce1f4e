"""Code rewards (DeepCoder recipe): run the answer's last Python block on the problem's tests in the sandbox.

Reward 1 only if every selected test passes (at most ``max_tests``, the ones with the longest inputs,
as DeepCoder does); the problem stops at its first failure. Tests run in :mod:`gapo.rewards.sandbox`;
**judging happens here, in the parent**: expected outputs never enter the sandbox, and function-call
results come back as JSON (plain data), so a returned object whose ``__eq__`` is always true, or a
``sys.exit(0)`` before the checks, cannot pass.

Test formats accepted (``ground_truth`` as a JSON string, or already decoded):

- TACO-verified: ``{"inputs": [...], "outputs": [...], "fn_name"?: str}``. With ``fn_name``, each
  input is the argument list and each output the return value or ``[return value]``.
- PrimeIntellect SYNTHETIC-1: ``[{"type": "stdin_stdout" | "function_call", "input", "output",
  "fn_name"?}]``; function-call inputs are argument lists, outputs ``[return value]``.
- LiveCodeBench: ``[{"input", "output", "testtype": "stdin" | "functional", "metadata": {"func_name"}}]``;
  a functional input holds one JSON value per line (one per argument), the output one JSON value;
  the solution is usually ``class Solution`` with that method.
- HumanEval(+): ``{"prompt"?, "test", "entry_point"}`` (or the test code as a string, with
  ``entry_point``/``prompt`` in ``extra_info``): runs ``prompt + answer + test + check(entry_point)``.
  Here the asserts run inside the sandbox, so returned values are first checked to be plain builtin
  types (defeats ``__eq__`` tricks), and a pass needs exit code 0 *and* a token printed after
  ``check`` that the program reads from stdin before the answer's code runs.

stdin/stdout tests are compared line by line after stripping, then token by token with a float
tolerance (integers exactly). Function-call results are compared as JSON values with the same float
tolerance (TACO/PrimeIntellect also accept the bare value for a one-element expected list).
"""

from __future__ import annotations

import ast
import json
import math
import queue
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from gapo.rewards.sandbox import RunResult, Sandbox, SandboxConfig, get_sandbox

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# data_source names this scorer is meant for (the format is read from each row's shape, not the name).
CODE_SOURCES = ("deepcoder_taco", "deepcoder_primeintellect", "deepcoder_lcb", "taco", "primeintellect",
                "livecodebench", "lcbv5", "humaneval", "humanevalplus")
RESULT_KEYS = {"passed": 0, "total": 0, "sandbox_error": False}
PY_LANGS = {"", "python", "py", "python3", "py3"}
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.#-]*)[^\n]*\n(.*?)```", re.DOTALL)
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_INT = re.compile(r"[+-]?\d+")
_FUTURE = re.compile(r"^from\s+__future__\s+import[^\n]*$", re.MULTILINE)

# Names LeetCode-style solutions use without importing them (LiveCodeBench's graders add the same).
CALL_PRELUDE = (
    "from typing import *\nfrom collections import *\nfrom heapq import *\nfrom bisect import *\n"
    "from itertools import *\nfrom functools import *\nfrom math import *\n"
    "import collections, heapq, bisect, itertools, functools, math, string, re, sys\n"
)

# Function-call harness. The arguments are read from stdin *before* the answer's code runs (so the
# answer cannot consume them), the answer runs as a module not named __main__, the result goes out as
# JSON after a per-problem marker, and os._exit skips the answer's atexit hooks and stray threads.
CALL_HARNESS = '''\
import json as _gj, os as _go, sys as _gs
_g_args = _gj.loads(_gs.stdin.read())
_g_ns = {{"__name__": "solution", "__builtins__": __builtins__}}
exec(compile({prelude!r}, "<prelude>", "exec"), _g_ns)
exec(compile({source!r}, "<solution>", "exec"), _g_ns)
_g_cls = _g_ns.get("Solution")
if isinstance(_g_cls, type) and hasattr(_g_cls, {fn!r}):
    _g_fn = getattr(_g_cls(), {fn!r})
else:
    _g_fn = _g_ns[{fn!r}]
_g_res = _g_fn(*_g_args)
def _g_plain(o):
    if isinstance(o, (set, frozenset)):
        try:
            return sorted(o)
        except TypeError:
            return list(o)
    raise TypeError("result is not JSON data: " + type(o).__name__)
_g_out = _gj.dumps(_g_res, default=_g_plain)
_gs.stdout.flush()
_go.write(1, ("\\n" + {marker!r} + _g_out + "\\n").encode())
_go._exit(0)
'''

# HumanEval harness: prologue (before the answer) and epilogue (after the test code).
SCRIPT_PROLOGUE = '''\
def _g_make_emit():
    import os, sys
    token = sys.stdin.readline().strip().encode()
    def emit():
        sys.stdout.flush()
        os.write(1, b"\\n" + token + b"\\n")
        os._exit(0)
    return emit
_g_emit = _g_make_emit()
del _g_make_emit
'''
SCRIPT_EPILOGUE = '''
def _g_guard(fn):
    plain = (int, float, complex, str, bytes, bool, type(None))
    def check(v):
        t = type(v)
        if any(t is p for p in plain):
            return
        if any(t is c for c in (list, tuple, set, frozenset)):
            for x in v:
                check(x)
        elif t is dict:
            for k, x in v.items():
                check(k)
                check(x)
        else:
            raise TypeError("candidate returned a " + t.__name__)
    def guarded(*args, **kwargs):
        out = fn(*args, **kwargs)
        check(out)
        return out
    return guarded
'''


@dataclass
class CodeProblem:
    """Tests in one shape: ``stdio`` (stdin -> expected stdout), ``call`` (args -> expected value) or
    ``script`` (one program whose asserts are the test, HumanEval)."""

    kind: str
    inputs: list = field(default_factory=list)  # stdio: str; call: list of args
    outputs: list = field(default_factory=list)  # stdio: str; call: value
    fn_name: str | None = None
    unwrap_single: bool = False  # TACO/PrimeIntellect: ``[value]`` also matches ``value``
    prompt: str = ""
    test_code: str = ""
    entry_point: str | None = None


# ----- answer extraction -----------------------------------------------------------------------------
def answer_region(response: str, require_think: bool = False) -> str | None:
    """Text after the last ``</think>``; ``None`` if the response is truncated inside a thought."""
    if THINK_CLOSE in response:
        region = response.rsplit(THINK_CLOSE, 1)[1]
        return None if THINK_OPEN in region else region
    if require_think or THINK_OPEN in response:
        return None
    return response


def extract_code(response: str, require_think: bool = False) -> str | None:
    """The last complete fenced block tagged python (or untagged) of the answer; ``None`` if none."""
    region = answer_region(str(response), require_think)
    if region is None:
        return None
    blocks = [body for lang, body in _FENCE.findall(region) if lang.lower() in PY_LANGS]
    if not blocks or not blocks[-1].strip():
        return None
    return blocks[-1].rstrip() + "\n"


# ----- test formats ----------------------------------------------------------------------------------
def _decode(value):
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()  # numpy arrays from parquet
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return ast.literal_eval(value)
    return value


def _as_text(x) -> str:
    if isinstance(x, (list, tuple)):
        return "\n".join(str(v) for v in x)
    return str(x)


def _fn_from_metadata(meta) -> str | None:
    meta = _decode(meta) if isinstance(meta, str) else meta
    return (meta or {}).get("func_name") if isinstance(meta, dict) else None


def parse_tests(ground_truth, extra_info=None) -> CodeProblem:
    """Normalise a DeepCoder / HumanEval ``ground_truth`` into a :class:`CodeProblem` (by its shape)."""
    extra = extra_info if isinstance(extra_info, dict) else {}
    # JSON first: a HumanEval row stored as '{"test": "def check(...", ...}' must not be run as test code
    # (the dict literal would define no check() call and every answer would pass).
    is_json = isinstance(ground_truth, str) and ground_truth.lstrip()[:1] in ("{", "[")
    if isinstance(ground_truth, str) and not is_json and "def check(" in ground_truth:
        gt = {"test": ground_truth}
    else:
        gt = _decode(ground_truth)
    if isinstance(gt, dict) and "test" in gt:  # HumanEval(+)
        entry = gt.get("entry_point") or extra.get("entry_point")
        if not entry:  # fail closed: without it check(candidate) is never called and every answer would pass
            raise ValueError("HumanEval test code without entry_point (in the ground truth or extra_info)")
        return CodeProblem("script", prompt=str(gt.get("prompt") or extra.get("prompt") or ""),
                           test_code=str(gt["test"]), entry_point=entry)
    if isinstance(gt, dict) and "inputs" in gt:  # TACO
        ins, outs = list(gt["inputs"]), list(gt["outputs"])
        if gt.get("fn_name"):
            return CodeProblem("call", [_decode(i) if isinstance(i, str) else i for i in ins],
                               [_decode(o) if isinstance(o, str) else o for o in outs],
                               fn_name=gt["fn_name"], unwrap_single=True)
        return CodeProblem("stdio", [_as_text(i) for i in ins], [_as_text(o) for o in outs])
    if isinstance(gt, list) and gt and isinstance(gt[0], dict):
        first = gt[0]
        if "testtype" in first:  # LiveCodeBench
            if first["testtype"] == "functional":
                fn = _fn_from_metadata(first.get("metadata")) or extra.get("func_name") or extra.get("fn_name")
                if not fn:
                    raise ValueError("LiveCodeBench functional test without metadata.func_name")
                ins = [[json.loads(line) for line in t["input"].split("\n")] if isinstance(t["input"], str)
                       else t["input"] for t in gt]
                outs = [json.loads(t["output"]) if isinstance(t["output"], str) else t["output"] for t in gt]
                return CodeProblem("call", ins, outs, fn_name=fn)
            return CodeProblem("stdio", [_as_text(t["input"]) for t in gt], [_as_text(t["output"]) for t in gt])
        if first.get("type") == "function_call" or first.get("fn_name"):  # PrimeIntellect
            ins = [_decode(t["input"]) if isinstance(t["input"], str) else t["input"] for t in gt]
            outs = [_decode(t["output"]) if isinstance(t["output"], str) else t["output"] for t in gt]
            return CodeProblem("call", ins, outs, fn_name=first["fn_name"], unwrap_single=True)
        if "input" in first and "output" in first:  # PrimeIntellect stdin_stdout, Codeforces-like
            return CodeProblem("stdio", [_as_text(t["input"]) for t in gt], [_as_text(t["output"]) for t in gt])
    raise ValueError(f"unrecognised code test format: {type(gt).__name__} {str(gt)[:200]!r}")


def select_tests(problem: CodeProblem, max_tests: int | None) -> list[int]:
    """Indices of the tests to run: all, or the ``max_tests`` with the longest inputs (DeepCoder)."""
    n = len(problem.inputs)
    if not max_tests or n <= max_tests:
        return list(range(n))
    size = [len(x) if isinstance(x, str) else len(json.dumps(x, default=str)) for x in problem.inputs]
    return sorted(range(n), key=lambda i: size[i], reverse=True)[:max_tests]


# ----- comparison ------------------------------------------------------------------------------------
def _close(a: float, b: float, tol: float) -> bool:
    return a == b or math.isclose(a, b, rel_tol=tol, abs_tol=tol)


def stdout_matches(got: str, want: str, tol: float = 1e-6) -> bool:
    """Whitespace-tolerant comparison: equal lines after stripping, else equal tokens where numeric
    tokens may differ by ``tol`` (integers must be equal)."""
    g_lines = [line.rstrip() for line in got.strip().splitlines()]
    w_lines = [line.rstrip() for line in want.strip().splitlines()]
    if g_lines == w_lines:
        return True
    g_tok, w_tok = got.split(), want.split()
    if len(g_tok) != len(w_tok):
        return False
    for g, w in zip(g_tok, w_tok):
        if g == w:
            continue
        if _INT.fullmatch(g) and _INT.fullmatch(w):
            if int(g) != int(w):
                return False
        elif _NUMBER.fullmatch(g) and _NUMBER.fullmatch(w):
            if not _close(float(g), float(w), tol):
                return False
        else:
            return False
    return True


def values_match(got, want, tol: float = 1e-6) -> bool:
    """Plain-data equality (lists/tuples alike, floats within ``tol``)."""
    if isinstance(got, bool) or isinstance(want, bool) or got is None or want is None:
        return got == want
    if isinstance(got, (int, float)) and isinstance(want, (int, float)):
        if isinstance(got, int) and isinstance(want, int):
            return got == want
        return _close(float(got), float(want), tol)
    if isinstance(got, (list, tuple)) and isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(values_match(g, w, tol) for g, w in zip(got, want))
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(values_match(got[k], want[k], tol) for k in got)
    return type(got) is type(want) and got == want


# ----- programs --------------------------------------------------------------------------------------
def _hoist_future(code: str) -> tuple[str, str]:
    future = "\n".join(_FUTURE.findall(code))
    return (future + "\n" if future else ""), _FUTURE.sub("", code)


def build_program(problem: CodeProblem, code: str, marker: str) -> str:
    if problem.kind == "stdio":
        return code
    if problem.kind == "call":
        return CALL_HARNESS.format(prelude=CALL_PRELUDE, source=code, fn=problem.fn_name, marker=marker)
    future, body = _hoist_future(problem.prompt + "\n" + code)
    program = future + SCRIPT_PROLOGUE + body + "\n\n" + problem.test_code + "\n" + SCRIPT_EPILOGUE
    if problem.entry_point:
        program += f"\ncheck(_g_guard({problem.entry_point}))\n"
    return program + "_g_emit()\n"


def _output_cap(expected_len: int, config: SandboxConfig) -> int:
    # A program printing far more than the answer is wrong anyway: stop it early, bound memory.
    return min(config.max_output_bytes, max(1 << 20, 4 * expected_len + 4096))


@dataclass
class _Item:
    problem: CodeProblem | None
    selected: list[int]
    marker: str
    code: str | None = None
    job: object = None
    passed: int = 0
    done: bool = False
    result: dict | None = None


def _result(score: bool, *, format_error=False, timeout=False, passed=0, total=0, sandbox_error=False) -> dict:
    return {"score": 1.0 if score else 0.0, "acc": bool(score), "pred": "", "format_error": format_error,
            "timeout": timeout, "passed": passed, "total": total, "sandbox_error": sandbox_error}


def _judge(item: _Item, idx: int, res: RunResult, tol: float) -> bool:
    problem = item.problem
    if not res.exited_ok:
        return False
    out = res.stdout.decode("utf-8", errors="replace")
    if problem.kind == "stdio":
        return stdout_matches(out, problem.outputs[item.selected[idx]], tol)
    if problem.kind == "script":
        return out.rstrip("\n").rsplit("\n", 1)[-1] == item.marker
    _head, sep, payload = out.rpartition(item.marker)
    if not sep:
        return False
    try:
        got = json.loads(payload.strip().split("\n", 1)[0])
    except ValueError:
        return False
    want = problem.outputs[item.selected[idx]]
    if values_match(got, want, tol):
        return True
    return problem.unwrap_single and isinstance(want, list) and len(want) == 1 and values_match(got, want[0], tol)


def score_code_batch(solution_strs: Sequence[str], ground_truths: Sequence, extra_infos: Sequence | None = None, *,
                     max_tests: int | None = 15, test_timeout_s: float | None = None,
                     problem_timeout_s: float | None = None, memory_mb: int | None = None,
                     batch_timeout_s: float | None = None, require_think: bool = False, float_tol: float = 1e-6,
                     sandbox: Sandbox | None = None) -> list[dict]:
    """Score many answers at once: every problem is submitted up front and runs in parallel over the
    sandbox's slots; the whole call returns within ``batch_timeout_s`` (default: the problem limit
    times the number of rounds the slots need, plus 30 s); unfinished problems score 0 with ``timeout``."""
    n = len(solution_strs)
    extra_infos = list(extra_infos) if extra_infos is not None else [None] * n
    sandbox = sandbox or get_sandbox()
    cfg = sandbox.config
    items: list[_Item] = []
    for i in range(n):
        extra = extra_infos[i] if isinstance(extra_infos[i], dict) else {}
        code = extract_code(solution_strs[i], bool(extra.get("require_think", require_think)))
        problem = parse_tests(ground_truths[i], extra)
        selected = [0] if problem.kind == "script" else select_tests(problem, max_tests)
        item = _Item(problem, selected, f"__gapo_result_{secrets.token_hex(8)}__", code)
        items.append(item)
        if code is None:
            item.done, item.result = True, _result(False, format_error=True, total=len(selected))
    sink: queue.Queue = queue.Queue()
    for i, item in enumerate(items):
        if item.done:
            continue
        program = build_program(item.problem, item.code, item.marker)
        if item.problem.kind == "stdio":
            inputs = [item.problem.inputs[j] for j in item.selected]
            caps = [_output_cap(len(item.problem.outputs[j]), cfg) for j in item.selected]
        elif item.problem.kind == "call":
            inputs = [json.dumps(item.problem.inputs[j]) for j in item.selected]
            caps = [_output_cap(len(json.dumps(item.problem.outputs[j], default=str)), cfg) for j in item.selected]
        else:
            inputs, caps = [item.marker + "\n"], [cfg.max_output_bytes]
        item.job = sandbox.submit(program, inputs, output_caps=caps, test_timeout_s=test_timeout_s,
                                  problem_timeout_s=problem_timeout_s, memory_mb=memory_mb, sink=sink, tag=i)
        if not inputs:  # a problem without tests cannot be verified: it scores 0
            item.done, item.result = True, _result(False)
    pending = sum(not item.done for item in items)
    if batch_timeout_s is None:
        rounds = math.ceil(max(pending, 1) / cfg.slots)
        batch_timeout_s = (problem_timeout_s or cfg.problem_timeout_s) * rounds + 30.0
    end = time.monotonic() + batch_timeout_s
    received = [0] * n
    while pending:
        try:
            i, idx, res = sink.get(timeout=max(0.0, end - time.monotonic()))
        except queue.Empty:
            break
        item = items[i]
        received[i] += 1
        if item.done:
            continue
        total = len(item.selected)
        if idx >= 0 and _judge(item, idx, res, float_tol):
            item.passed += 1
            if item.passed == total:
                item.done, item.result = True, _result(True, passed=total, total=total)
                pending -= 1
            continue
        # First failure decides: stop the problem's other tests.
        if res.status == "skipped" and received[i] < total:
            continue  # a sibling's failure (reported separately) stopped this one; wait for that report
        item.job.cancel()
        item.done = True
        item.result = _result(False, timeout=res.status == "timeout", passed=item.passed, total=total,
                              sandbox_error=res.status == "error")
        pending -= 1
    for item in items:
        if not item.done:
            item.job.cancel()
            item.result = _result(False, timeout=True, passed=item.passed, total=len(item.selected))
    return [item.result for item in items]


def compute_code_score_batch(data_sources, solution_strs, ground_truths, extra_infos=None, **kwargs) -> list[dict]:
    """Batch entry point (verl's ``BatchRewardManager`` signature); ``data_sources`` only route here."""
    return score_code_batch(solution_strs, ground_truths, extra_infos, **kwargs)


def compute_code_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """verl's custom-reward signature: one answer; thread-safe (verl's reward loop calls it from threads).

    Keyword arguments (``reward_kwargs``): ``max_tests`` (15), ``test_timeout_s``, ``problem_timeout_s``,
    ``memory_mb`` (default: :class:`SandboxConfig`), ``require_think``, ``float_tol``, ``sandbox``.
    Returns ``score`` (1.0 / 0.0), ``acc``, ``format_error`` (no code block, or truncated thought),
    ``timeout``, ``passed`` / ``total`` (tests passed before stopping / tests selected), ``sandbox_error``.
    """
    return score_code_batch([solution_str], [ground_truth], [extra_info], **kwargs)[0]


__all__ = ["CODE_SOURCES", "RESULT_KEYS", "CodeProblem", "build_program", "compute_code_score",
           "compute_code_score_batch", "extract_code", "parse_tests", "score_code_batch", "select_tests",
           "stdout_matches", "values_match"]

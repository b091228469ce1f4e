"""Code rewards (DeepCoder recipe): run the answer's last Python block on the problem's tests in the sandbox.

Reward 1 only if every selected test passes; the problem stops at its first failure. Which tests run and
their time limits follow the row's ``data_source`` (DeepCoder's protocol, :mod:`gapo.rewards.code.protocol`:
TACO/PrimeIntellect the 15 longest inputs at 12 s each, LiveCodeBench every test at 6 s each). Programs run
in :mod:`gapo.rewards.sandbox.client`; **judging happens here, in the parent**, and the answer's process never holds
anything it could use to fake a pass: no expected value, no test code, no token, no judging code. It gets the
inputs, and sends
back what it printed (stdin/stdout problems) or what its function returned, as plain data (a tagged JSON
of ``None``/bool/int/float/str/list/tuple/set/dict/bytes/complex). A returned object whose ``__eq__`` is
always true, a ``sys.exit(0)`` before the checks, a forged result line or a replaced ``json.dumps`` can
at most report other values, which the parent compares like any other.

Test formats accepted (``ground_truth`` as a JSON string, or already decoded):

- TACO-verified: ``{"inputs": [...], "outputs": [...], "fn_name"?: str}``. With ``fn_name``, each
  input is the argument list and each output the return value or ``[return value]``.
- PrimeIntellect SYNTHETIC-1: ``[{"type": "stdin_stdout" | "function_call", "input", "output",
  "fn_name"?}]``; function-call inputs are argument lists, outputs ``[return value]``.
- LiveCodeBench: ``[{"input", "output", "testtype": "stdin" | "functional", "metadata": {"func_name"}}]``;
  a functional input holds one JSON value per line (one per argument), the output one JSON value;
  the solution is usually ``class Solution`` with that method.
- HumanEval(+): ``{"prompt"?, "test", "entry_point"}`` (or the test code as a string, with
  ``entry_point``/``prompt`` in ``extra_info``). Judged like function-call problems, in three steps:

  1. *Extraction* (once per problem, cached): the trusted test code runs in the sandbox **without the
     answer**, with ``candidate`` replaced by a recorder. Its asserts are rewritten (``ast``) so that each
     records the call's arguments and what the result is compared against: ``candidate(x) == e`` (and
     ``e == candidate(x)``, ``tuple(candidate(x)) == e``), ``candidate(x) is True/False/None``,
     ``candidate(x)`` / ``not candidate(x)``, ``abs(candidate(x) - e) < tol`` (``<=``, ``math.fabs``),
     and HumanEval+'s ``assertion(candidate(*inp), exp, atol)`` (only when ``assertion``/``is_floats``
     are evalplus's own definitions). Loops, helpers and random inputs run as written (``random`` seeded).
  2. The answer runs in its own sandboxed process on the recorded arguments only and returns plain data;
     the parent compares: ``==`` exactly (bool apart from int, list apart from tuple), tolerances as
     the assert wrote them, evalplus's ``np.allclose`` rule (same shape, no broadcasting).
  3. Only for asserts of another shape (HumanEval/32: ``abs(poly(coeffs, candidate(c))) < 1e-4``): the
     test code runs once more, still without the answer, with ``candidate`` answering from the values
     the answer returned (plain data); it reports pass/fail (``humaneval_replay=False``: such problems
     score 0 with a reason instead).

  Test code that cannot be judged this way (it catches exceptions, or fails without the answer, e.g. it
  branches on the answer's value outside an assert) scores 0 with a ``reason``; nothing falls back to
  running tests inside the answer's process.

stdin/stdout tests are compared line by line after stripping, then token by token: where the expected
token is an integer the output token must be the same integer (``7.0`` is accepted for ``7``, ``6.9999999``
is not); other numbers may differ by ``float_tol``. Function-call results are compared as values with
the same rule and the types of the benchmarks' judges (:func:`~gapo.rewards.code.compare.call_result`: a
returned top-level tuple reads as a list, nothing else changes type, so a set is not a list and a nested tuple
is not a list; ``True`` is not ``1``; TACO/PrimeIntellect also accept the bare value for a one-element expected
list). Every result has a ``reason`` (``""`` when passed); a program's failure, whatever it printed, is a score
of 0, never an exception; so is an answer whose code is not valid text (a lone surrogate, which no file can
hold), and a test whose input or expected output is not (:func:`utf8`). Parsing is linear in the output's size
(no regex that backtracks, numeric tokens longer than ``NUM_TOKEN_MAX`` are compared as text).
"""

from __future__ import annotations

import hashlib
import json
import math
import queue
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gapo.rewards.code.protocol import CODE_SOURCES, _check_value, protocol_for, resolve_protocols
from gapo.rewards.sandbox.client import RunResult, Sandbox, SandboxConfig, get_sandbox

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# data_source names this scorer is meant for: the protocol table's (gapo/rewards/code/protocol.py). The test
# format is read from each row's shape; the name picks the protocol (test cap, time limits).
# isolation: what contained the programs ("cgroup_v2", "cgroup_v1" or "rlimits"; gapo/rewards/sandbox/client.py)
RESULT_KEYS = {"passed": 0, "total": 0, "sandbox_error": False, "reason": "", "isolation": ""}
PY_LANGS = {"", "python", "py", "python3", "py3"}
# Output caps (bytes of stdout). Prints of function-call and HumanEval answers go to stderr (only its
# tail is kept), so their stdout carries the result line alone: the cap is what that line can need.
RESULT_CAP_BASE = 64 << 10
RESULT_CAP_PER_OPEN_CALL = 16 << 10  # a HumanEval call whose result no recorded check bounds
PLAN_CACHE_ENTRIES = 1024
PLAN_CACHE_BYTES = 64 << 20  # total size of the extraction outputs kept (least recently used dropped first)
PLAN_CACHE_MAX_BYTES = 8 << 20  # larger plans are used but not kept
_LANG = re.compile(r"[ \t]*([A-Za-z0-9_+.#-]*)")
_FUTURE = re.compile(r"^from[ \t]+__future__[ \t]+import[^\n]*$", re.MULTILINE)
_EXC_NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_.]{0,63})(?::|$)")

# Names LeetCode-style solutions use without importing them (LiveCodeBench's graders add the same).
CALL_PRELUDE = (
    "from typing import *\nfrom collections import *\nfrom heapq import *\nfrom bisect import *\n"
    "from itertools import *\nfrom functools import *\nfrom math import *\n"
    "import collections, heapq, bisect, itertools, functools, math, string, re, sys\n"
)

from gapo.rewards.code._programs import CODEC_SRC, EXTRACTOR, EXTRACTOR_SRC, RUNNER  # noqa: E402,F401




@dataclass
class CodeProblem:
    """Tests in one shape: ``stdio`` (stdin -> expected stdout), ``call`` (args -> expected value) or
    ``script`` (HumanEval: trusted test code, turned into calls and checks by extraction)."""

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


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every complete fenced block, in order, in linear time.

    Same reading as the regex ``` ```[ \\t]*(lang)[^\\n]*\\n(.*?)``` ``` (the language is the word after the
    fence, the rest of that line is ignored, the body ends at the next fence), but every character is
    looked at a bounded number of times: once an opening fence has no newline after it, or a body has
    no closing fence, no later block can be complete either.
    """
    blocks, pos = [], 0
    while True:
        start = text.find("```", pos)
        if start < 0:
            break
        newline = text.find("\n", start + 3)
        if newline < 0:
            break
        end = text.find("```", newline + 1)
        if end < 0:
            break
        lang = _LANG.match(text, start + 3, newline).group(1)
        blocks.append((lang, text[newline + 1:end]))
        pos = end + 3
    return blocks


def extract_code(response: str, require_think: bool = False) -> str | None:
    """The last complete fenced block tagged python (or untagged) of the answer; ``None`` if none."""
    region = answer_region(str(response), require_think)
    if region is None:
        return None
    blocks = [body for lang, body in fenced_blocks(region) if lang.lower() in PY_LANGS]
    if not blocks or not blocks[-1].strip():
        return None
    return blocks[-1].rstrip() + "\n"


def _format_reason(response: str, require_think: bool) -> str:
    if answer_region(str(response), require_think) is None:
        return "no answer after the thought (missing </think>)"
    return "no complete python code block"


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
            import ast

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
    """Normalise a DeepCoder / HumanEval ``ground_truth`` into a :class:`CodeProblem` (by its shape).
    A malformed ground truth (a dataset bug, not the answer's) raises ``ValueError``."""
    extra = extra_info if isinstance(extra_info, dict) else {}
    # JSON first: a HumanEval row stored as '{"test": "def check(...", ...}' must not be run as test code.
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
                           test_code=str(gt["test"]), entry_point=str(entry))
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
    """Indices of the tests to run: all (``max_tests`` None or 0), or the ``max_tests`` with the longest inputs
    (DeepCoder's ``check_correctness``, rllm 18e446c5 ``rllm/rewards/code_reward.py``; ties keep source order)."""
    n = len(problem.inputs)
    if not max_tests or n <= max_tests:
        return list(range(n))
    size = [len(x) if isinstance(x, str) else len(json.dumps(x, default=str)) for x in problem.inputs]
    return sorted(range(n), key=lambda i: size[i], reverse=True)[:max_tests]


from gapo.rewards.code.compare import (  # noqa: E402,F401  (re-exported: the judge's comparisons)
    MAX_DEPTH,
    NUM_TOKEN_MAX,
    GotDict,
    GotSet,
    _allclose,
    _check_passes,
    _close,
    _int_token,
    _integral_token,
    _same,
    _same_items,
    _tag,
    _token_matches,
    _untag,
    call_result,
    check_passes,
    read_results,
    stdout_matches,
    values_match,
)


# ----- programs --------------------------------------------------------------------------------------
def _hoist_future(code: str) -> tuple[str, str]:
    future = "\n".join(_FUTURE.findall(code))
    return (future + "\n" if future else ""), _FUTURE.sub("", code)


def build_program(problem: CodeProblem, code: str) -> str:
    """The answer's program: stdin/stdout problems run the code as is; function-call and HumanEval problems
    run it under :data:`RUNNER`, which calls the function on the inputs it reads and returns plain data."""
    if problem.kind == "stdio":
        return code
    if problem.kind == "call":
        return RUNNER.format(codec=CODEC_SRC, prelude=CALL_PRELUDE, sources=(code,), fn=problem.fn_name,
                             allow_class=True)
    # The prompt, then the answer (a chat model may answer with the function's body only); if that does
    # not parse (a prompt that is a bare signature), the answer alone.
    future, body = _hoist_future(problem.prompt + "\n" + code)
    return RUNNER.format(codec=CODEC_SRC, prelude="", sources=(future + body, code), fn=problem.entry_point,
                         allow_class=False)


def utf8(text: str, what: str) -> bytes:
    """``text`` as UTF-8, the only form in which the sandbox takes a program or an input. Text that UTF-8 cannot
    hold (a lone surrogate such as ``'\\ud800'``: no file, no judge's input, holds one) raises ``ValueError``
    naming ``what`` and where; the scorer turns it into a failed row with that reason."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} is not valid text: {text[exc.start]!r} at character {exc.start} cannot be "
                         f"encoded as UTF-8") from None


def _output_cap(expected_len: int, config: SandboxConfig) -> int:
    # A program printing far more than the answer is wrong anyway: stop it early, bound memory.
    return min(config.max_output_bytes, max(1 << 20, 4 * expected_len + 4096))


def _result_cap(expected_bytes: int, n_calls: int, open_calls: int, config: SandboxConfig) -> int:
    # The result line of a runner: its values (about the size of the expected ones) and a little framing.
    need = RESULT_CAP_BASE + 4 * expected_bytes + 64 * n_calls + RESULT_CAP_PER_OPEN_CALL * open_calls
    return min(config.max_output_bytes, need)


# ----- HumanEval plans -------------------------------------------------------------------------------
@dataclass
class Plan:
    """What extraction found: the calls to make (tagged JSON of ``[args, kwargs]``), the checks on their
    results (``[op, call index, test line, ...]``, expected values decoded), how many asserts need the
    replay step, or why the problem cannot be judged (``error``)."""

    calls: list = field(default_factory=list)
    checks: list = field(default_factory=list)
    sites: int = 0
    expected_bytes: int = 0
    error: str = ""

    @property
    def open_calls(self) -> int:
        """Calls whose result no recorded check bounds (each adds RESULT_CAP_PER_OPEN_CALL to the result cap)."""
        return len(self.calls) - len({c[1] for c in self.checks})


_PLANS: OrderedDict[str, tuple[Plan, int]] = OrderedDict()  # key -> (plan, size of its extraction output)
_PLANS_BYTES = [0]
_PLANS_LOCK = threading.Lock()
_CHECK_ARITY = {"eq": 5, "is": 4, "close": 6, "plus": 6}


def plan_key(problem: CodeProblem) -> str:
    """Cache key of a problem's extraction plan: sha256 over its prompt, test code and entry point."""
    h = hashlib.sha256()
    for part in (problem.prompt, problem.test_code, problem.entry_point or ""):
        h.update(part.encode("utf-8", errors="surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()


def read_plan(res: RunResult) -> tuple[Plan, bool]:
    """An extraction run -> (plan, whether to cache it). Only the program's own verdicts are cached, not a
    sandbox failure (a timeout on a loaded machine)."""
    if not res.exited_ok:
        return Plan(error=f"test extraction failed: {_run_reason(res)}"), False
    try:
        text = res.stdout.decode("utf-8", errors="replace").rstrip()
        data = json.loads(text[text.rfind("\n") + 1:])
        if not data.get("ok"):
            return Plan(error=str(data.get("error") or "test extraction failed")[:500]), True
        calls, raw_checks, sites = data["calls"], data["checks"], data["sites"]
        if not (isinstance(calls, list) and all(type(c) is str for c in calls) and isinstance(raw_checks, list)
                and type(sites) is int):
            raise ValueError("malformed plan")
        checks, expected = [], 0
        for c in raw_checks:
            if type(c) is not list or _CHECK_ARITY.get(c[0] if c else None) != len(c):
                raise ValueError("malformed check")
            if type(c[1]) is not int or not 0 <= c[1] < len(calls):
                raise ValueError("check of an unknown call")
            if c[0] in ("eq", "close", "plus"):
                expected += len(json.dumps(c[3]))
                c = [*c[:3], _untag(c[3], True), *([_untag(c[4], True)] if c[0] != "eq" else [c[4]]), *c[5:]]
            checks.append(c)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        return Plan(error=f"unreadable test extraction: {type(exc).__name__}: {str(exc)[:200]}"), False
    if not calls:
        return Plan(error="the test code never calls candidate"), True
    return Plan(calls, checks, sites, expected), True


def _cache_plan(key: str, plan: Plan, size: int) -> None:
    if size > PLAN_CACHE_MAX_BYTES:
        return
    with _PLANS_LOCK:
        if key in _PLANS:
            _PLANS_BYTES[0] -= _PLANS.pop(key)[1]
        _PLANS[key] = (plan, size)
        _PLANS_BYTES[0] += size
        while len(_PLANS) > PLAN_CACHE_ENTRIES or _PLANS_BYTES[0] > PLAN_CACHE_BYTES:
            _PLANS_BYTES[0] -= _PLANS.popitem(last=False)[1][1]


def _cached_plan(key: str) -> Plan | None:
    with _PLANS_LOCK:
        entry = _PLANS.get(key)
        if entry is None:
            return None
        _PLANS.move_to_end(key)
        return entry[0]


def judge_script(plan: Plan, items: list) -> str:
    """The answer's results against the plan's checks: ``""`` if all pass, else why not."""
    for j, item in enumerate(items):
        if item[0] == 1:
            return f"the answer raised {str(item[1])[:64]} on test call {j + 1}"
    got = [_untag(item[1], False) for item in items]  # every value, so the replay only sees plain data
    for check in plan.checks:
        i = check[1]
        if not check_passes(check, got[i]):
            return f"wrong answer (assert on line {check[2]} of the test, call {i + 1})"
    return ""


# ----- batch scoring ---------------------------------------------------------------------------------
def _run_reason(res: RunResult) -> str:
    if res.status == "timeout":
        return "timeout"
    if res.status == "output_limit":
        return "output limit exceeded"
    if res.status == "skipped":
        return "stopped"
    if res.status == "error":
        return "sandbox error: " + res.stderr.decode("utf-8", errors="replace").strip()[-200:]
    if res.signal:
        return f"killed by signal {res.signal}"
    if res.exit_code:
        tail = res.stderr.decode("utf-8", errors="replace").rstrip()
        m = _EXC_NAME.match(tail[tail.rfind("\n") + 1:])
        if m:
            return f"runtime error ({m.group(1)})"
        # in the sandbox bwrap reports a program killed by signal N as exit code 128 + N
        return f"exit code {res.exit_code}" + (f" (killed by signal {res.exit_code - 128}?)"
                                               if 128 < res.exit_code < 160 else "")
    return ""


@dataclass
class _Item:
    problem: CodeProblem | None
    selected: list[int]
    code: str | None = None
    job: object = None
    passed: int = 0
    done: bool = False
    result: dict | None = None
    key: str = ""  # HumanEval: plan key
    plan: Plan | None = None
    test_s: float = 0.0  # per-test limit (HumanEval under a protocol: per recorded call)
    problem_s: float | None = None  # per-problem limit (None: HumanEval per call, set when the calls are known)
    per_call: bool = False


def _result(score: bool, *, reason: str = "", format_error=False, timeout=False, passed=0, total=0,
            sandbox_error=False) -> dict:
    return {"score": 1.0 if score else 0.0, "acc": bool(score), "pred": "", "format_error": format_error,
            "timeout": timeout, "passed": passed, "total": total, "sandbox_error": sandbox_error,
            "reason": "" if score else (reason or "failed")}


def _judge_test(item: _Item, idx: int, res: RunResult, tol: float) -> str:
    """One stdin/stdout or function-call test: ``""`` if it passed, else why not."""
    problem = item.problem
    if not res.exited_ok:
        return _run_reason(res) or "failed"
    want = problem.outputs[item.selected[idx]]
    if problem.kind == "stdio":
        out = res.stdout.decode("utf-8", errors="replace")
        return "" if stdout_matches(out, want, tol) else f"wrong answer on test {idx + 1}"
    (item_,) = read_results(res.stdout, 1)
    if item_[0] == 1:
        return f"the answer raised {str(item_[1])[:64]} on test {idx + 1}"
    got = _untag(item_[1], False)
    return "" if call_result(got, want, tol, problem.unwrap_single) else f"wrong answer on test {idx + 1}"


@dataclass(frozen=True)
class CodeScoringSettings:
    """The knobs of a code-scoring call (the code reward's ``reward_kwargs``), checked when built.

    Per-source defaults (test cap, per-test and per-problem limits) are not repeated here: they are the table
    :data:`gapo.rewards.code.protocol.PROTOCOLS`, and ``None`` below means "the row's protocol" (a row without a
    ``data_source``: :data:`~gapo.rewards.code.protocol.DEFAULT_PROTOCOL`, i.e. 15 tests and the sandbox's
    :class:`SandboxConfig` limits). A bad value raises ``ValueError`` naming it and what is allowed.

    Attributes:
        max_tests: tests run per problem (the ones with the longest inputs), over every source's cap; ``0``: every
            test; ``None``: the source's.
        test_timeout_s: per-test wall-clock limit in seconds (HumanEval under a source: per recorded call), over
            every source's; ``None``: the source's, else the sandbox's.
        problem_timeout_s: per-problem limit over every source's; ``None``: the source's (``(test_timeout_s + 1)
            x tests + 5``), else the sandbox's. Also the limit of HumanEval's extraction and replay runs
            (``None``: the sandbox's ``problem_timeout_s``).
        memory_mb: address-space limit of each test process, MiB; ``None``: the sandbox's ``memory_mb``.
        batch_timeout_s: limit of the whole batch; problems unfinished by then score 0 with ``timeout``. ``None``:
            the longest problem limit x the rounds the sandbox's slots need + 30 s (with HumanEval problems, plus
            two test limits per round and one extraction limit), extended as HumanEval answers get their limits.
        require_think: the answer must follow a closed ``<think>`` (a row's ``extra_info["require_think"]``
            overrides it).
        float_tol: relative and absolute tolerance of numbers whose expected value is not an integer.
        humaneval_replay: judge HumanEval asserts of other shapes by replaying the test code on the answer's
            values; ``False``: such problems score 0 with a reason.
        source_protocol: ``{source: {max_tests, test_timeout_s, problem_timeout_s}}`` applied over
            :data:`~gapo.rewards.code.protocol.PROTOCOLS` (``reward_kwargs.source_protocol``; a Hydra mapping works).
        protocols: derived, not an argument: :data:`~gapo.rewards.code.protocol.PROTOCOLS` with
            ``source_protocol`` applied (:func:`~gapo.rewards.code.protocol.resolve_protocols`).
    """

    max_tests: int | None = None
    test_timeout_s: float | None = None
    problem_timeout_s: float | None = None
    memory_mb: int | None = None
    batch_timeout_s: float | None = None
    require_think: bool = False
    float_tol: float = 1e-6
    humaneval_replay: bool = True
    source_protocol: Mapping | None = None
    protocols: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        # A bad global override is a config error, raised before anything runs (the messages are protocol.py's).
        for key in ("max_tests", "test_timeout_s", "problem_timeout_s"):
            _check_value(key, getattr(self, key))
        object.__setattr__(self, "protocols", resolve_protocols(self.source_protocol))
        _check_value("batch_timeout_s", self.batch_timeout_s)
        mem = self.memory_mb
        if mem is not None and (type(mem) is not int or mem < 1):
            raise ValueError(f"memory_mb must be a positive integer of MiB (null: the sandbox's), got {mem!r}")
        tol = self.float_tol
        if type(tol) not in (int, float) or not 0 <= tol < math.inf:
            raise ValueError(f"float_tol must be a finite number >= 0 (default 1e-6), got {tol!r}")
        for key in ("require_think", "humaneval_replay"):
            if type(getattr(self, key)) is not bool:
                raise ValueError(f"{key} must be true or false, got {getattr(self, key)!r}")


class CodeBatchScorer:
    """Scores batches of code answers under one :class:`CodeScoringSettings`, through one sandbox.

    ``score`` runs a batch in four steps, a method each:

    1. ``_plan``: each row's code (the answer's last python block), tests (parsed; the protocol's selection) and
       limits; a row without code finishes at once with ``format_error``.
    2. ``_submit``: every problem goes to the sandbox up front, so they run in parallel over its slots:
       stdin/stdout and function-call problems as one job of their tests; HumanEval as an extraction (shared by
       rows with the same test code, cached across batches), then the answer's program, then a replay if needed.
       Then the batch's deadline (``batch_timeout_s``) is set.
    3. ``_collect``: results arrive on one queue until every problem is finished or the deadline passes; each
       is judged here in the parent, and a problem finishes at its first failure (its other tests are stopped).
    4. ``_close``: extractions still running are cancelled; unfinished problems score 0 with ``timeout``.

    The batch's state (``_items``, ``_sink``, ``_deadline``, ...) lives on the object between those steps, so one
    object scores one batch at a time (``score`` holds a lock); :func:`score_code_batch` builds one per call, so
    concurrent calls (verl's reward threads) run side by side.

    Args:
        settings: the knobs (default: :class:`CodeScoringSettings` ``()``).
        sandbox: where programs run (default: :func:`~gapo.rewards.sandbox.client.get_sandbox`'s shared one,
            looked up at each ``score``).
    """

    def __init__(self, settings: CodeScoringSettings | None = None, sandbox: Sandbox | None = None):
        self.settings = settings if settings is not None else CodeScoringSettings()
        self.sandbox = sandbox
        self._lock = threading.Lock()
        self._reset()

    def score(self, solution_strs: Sequence[str], ground_truths: Sequence, extra_infos: Sequence | None = None,
              data_sources: Sequence | None = None) -> list[dict]:
        """One result per answer, in order (``n = len(solution_strs)``; the other sequences have ``n`` entries).

        Row ``i`` is the answer ``solution_strs[i]`` to the tests ``ground_truths[i]`` (any format
        :func:`parse_tests` reads), with ``extra_infos[i]`` (``entry_point``/``prompt``/``func_name`` of some
        formats, ``require_think``) and the protocol of ``data_sources[i]`` (``None``: the default protocol).
        Its result: ``score`` (1.0 only if every selected test passed, else 0.0), ``acc``, ``pred`` (``""``),
        ``format_error``, ``timeout``, ``passed`` / ``total`` (tests passed before stopping / tests selected; a
        HumanEval test program counts as one), ``sandbox_error``, ``reason`` (``""`` when passed) and
        ``isolation`` (the sandbox's). A malformed ground truth, or ``data_sources`` of another length, raises
        ``ValueError`` before anything runs; whatever a program does costs its row only.
        """
        n = len(solution_strs)
        extra_infos = list(extra_infos) if extra_infos is not None else [None] * n
        if data_sources is not None and len(data_sources) != n:
            raise ValueError(f"{len(data_sources)} data_sources for {n} solutions")
        with self._lock:
            self._box = self.sandbox or get_sandbox()
            try:
                self._plan(solution_strs, ground_truths, extra_infos, data_sources)
                self._submit()
                self._collect()
                self._close()
                return [{**item.result, "isolation": self._box.isolation} for item in self._items]
            finally:
                self._reset()

    # --- one batch's state -----------------------------------------------------------------------------------
    def _reset(self) -> None:
        self._box: Sandbox | None = None
        self._items: list[_Item] = []
        self._sink: queue.Queue = queue.Queue()
        self._extracting: dict[str, list[int]] = {}  # plan key -> rows waiting for it
        self._extract_jobs: dict[str, object] = {}  # plan key -> its extraction job
        self._pending = 0  # rows not finished
        self._rounds = 1  # how many times the sandbox's slots must be filled to run every row once
        self._deadline = 0.0  # absolute; with batch_timeout_s unset, extended as HumanEval answers get their limits
        self._received: list[int] = []  # per row: results received

    @property
    def _helper_limit_s(self) -> float:
        """Limit of HumanEval's extraction and replay runs (the global ``problem_timeout_s``, else the sandbox's)."""
        return self.settings.problem_timeout_s or self._box.config.problem_timeout_s

    # --- 1. plan ----------------------------------------------------------------------------------------------
    def _plan(self, solution_strs, ground_truths, extra_infos, data_sources) -> None:
        settings = self.settings
        for i in range(len(solution_strs)):
            extra = extra_infos[i] if isinstance(extra_infos[i], dict) else {}
            think = bool(extra.get("require_think", settings.require_think))
            code = extract_code(solution_strs[i], think)
            problem = parse_tests(ground_truths[i], extra)
            proto = protocol_for(None if data_sources is None else data_sources[i], settings.protocols)
            cap = proto.max_tests if settings.max_tests is None else (settings.max_tests or None)
            selected = [0] if problem.kind == "script" else select_tests(problem, cap)
            item = _Item(problem, selected, code)
            self._set_limits(item, proto)
            self._items.append(item)
            if code is None:
                item.done = True
                item.result = _result(False, format_error=True, total=len(selected),
                                      reason=_format_reason(solution_strs[i], think))
                continue
            try:
                utf8(code, "the program")  # a failed program, before anything runs (it could not be a file)
            except ValueError as exc:
                item.done = True
                item.result = _result(False, total=len(selected), reason=str(exc))
        self._pending = sum(not item.done for item in self._items)
        self._rounds = math.ceil(max(self._pending, 1) / self._box.config.slots)
        self._received = [0] * len(self._items)

    def _set_limits(self, item: _Item, proto) -> None:
        """The row's per-test and per-problem limits: the global setting, else the protocol's, else the sandbox's."""
        settings, cfg = self.settings, self._box.config
        item.test_s = float(settings.test_timeout_s or proto.test_timeout_s or cfg.test_timeout_s)
        # HumanEval(+) under a source's protocol: the limit is per recorded call (known after extraction).
        item.per_call = item.problem.kind == "script" and proto.test_timeout_s is not None
        if settings.problem_timeout_s or proto.problem_timeout_s:
            item.problem_s = float(settings.problem_timeout_s or proto.problem_timeout_s)
        elif proto.test_timeout_s is None:  # no source: the sandbox's own limit, as before the protocol table
            item.problem_s = float(cfg.problem_timeout_s)
        elif not item.per_call:
            item.problem_s = proto.problem_budget(len(item.selected), item.test_s)

    # --- 2. submit --------------------------------------------------------------------------------------------
    def _submit(self) -> None:
        for i, item in enumerate(self._items):
            if item.done:
                continue
            if item.problem.kind == "script":
                self._start_extraction(i)
            else:
                self._submit_tests(i)
        self._set_deadline()

    def _submit_tests(self, i: int) -> None:
        """A stdin/stdout or function-call problem: one job running its selected tests."""
        item, cfg = self._items[i], self._box.config
        p = item.problem
        try:
            if p.kind == "stdio":
                inputs = [utf8(p.inputs[j], f"test {n}'s input") for n, j in enumerate(item.selected, 1)]
                caps = [_output_cap(len(p.outputs[j]), cfg) for j in item.selected]
                for n, j in enumerate(item.selected, 1):  # an expected output no program can print
                    if not p.outputs[j].isascii():
                        utf8(p.outputs[j], f"test {n}'s expected output")
            else:
                inputs = [json.dumps([[_tag(p.inputs[j]), {"d": []}]]) for j in item.selected]
                caps = [_result_cap(len(json.dumps(p.outputs[j], default=str)), 1, 0, cfg) for j in item.selected]
        except (ValueError, TypeError, RecursionError) as exc:
            self._finish(i, False, f"unusable tests: {exc}")
            return
        if not inputs:  # a problem without tests cannot be verified: it scores 0
            self._finish(i, False, "no tests")
            return
        item.job = self._box.submit(build_program(p, item.code), inputs, output_caps=caps, sink=self._sink,
                                    tag=("test", i), test_timeout_s=item.test_s, problem_timeout_s=item.problem_s,
                                    memory_mb=self.settings.memory_mb)

    def _start_extraction(self, i: int) -> None:
        """HumanEval: the row's plan from the cache, else from an extraction run (one per distinct test code)."""
        item = self._items[i]
        item.key = plan_key(item.problem)
        item.plan = _cached_plan(item.key)
        if item.plan is not None:
            self._start_answer(i)
            return
        waiting = self._extracting.setdefault(item.key, [])
        waiting.append(i)
        if len(waiting) == 1:
            job = json.dumps({"mode": "discover", "prompt": item.problem.prompt, "test": item.problem.test_code,
                              "entry": item.problem.entry_point})
            self._extract_jobs[item.key] = self._run_extractor(job, ("extract", item.key),
                                                               self._box.config.max_output_bytes)

    def _start_answer(self, i: int) -> None:
        """HumanEval, once the plan is known: the answer's program on the recorded calls (or the row's verdict)."""
        item, cfg = self._items[i], self._box.config
        plan = item.plan
        if plan.error:
            self._finish(i, False, plan.error)
            return
        if plan.sites and not self.settings.humaneval_replay:
            self._finish(i, False, "the test has asserts that only a replay can judge (humaneval_replay=False)")
            return
        program = build_program(item.problem, item.code)
        cap = _result_cap(plan.expected_bytes, len(plan.calls), plan.open_calls, cfg)
        test_s, problem_s = item.test_s, item.problem_s
        if item.per_call:  # rllm's humanevalplus_check_correctness: 1 s x the test inputs, for the whole program
            test_s = item.test_s * max(1, len(plan.calls))
            problem_s = problem_s or test_s
        self._extend_deadline(problem_s)
        item.job = self._box.submit(program, ["[" + ",".join(plan.calls) + "]"], output_caps=[cap], sink=self._sink,
                                    tag=("answer", i), test_timeout_s=test_s,
                                    problem_timeout_s=max(problem_s, test_s), memory_mb=self.settings.memory_mb)

    def _run_extractor(self, job: str, tag: tuple, cap: int):
        """The trusted extraction program (without the answer) on ``job``: an extraction or a replay."""
        lim = self._helper_limit_s
        return self._box.submit(EXTRACTOR, [job], output_caps=[cap], sink=self._sink, tag=tag, test_timeout_s=lim,
                                problem_timeout_s=lim, memory_mb=self.settings.memory_mb)

    def _set_deadline(self) -> None:
        """``batch_timeout_s`` from now; unset: the budget in :class:`CodeScoringSettings` ``.batch_timeout_s``."""
        if self.settings.batch_timeout_s is not None:
            self._deadline = time.monotonic() + self.settings.batch_timeout_s
            return
        live = [it for it in self._items if not it.done]
        longest = max([it.problem_s for it in live if it.problem_s] + [self._helper_limit_s])
        budget = longest * self._rounds + 30.0
        if any(it.problem.kind == "script" for it in live):  # extraction and replay, besides the answer
            budget += 2 * max(it.test_s for it in live) * self._rounds + self._helper_limit_s
        self._deadline = max(self._deadline, time.monotonic() + budget)

    def _extend_deadline(self, problem_s: float) -> None:
        if self.settings.batch_timeout_s is None:
            self._deadline = max(self._deadline, time.monotonic() + problem_s * self._rounds + 30.0)

    # --- 3. collect and judge ---------------------------------------------------------------------------------
    def _collect(self) -> None:
        while self._pending:
            try:
                (stage, ref), idx, res = self._sink.get(timeout=max(0.0, self._deadline - time.monotonic()))
            except queue.Empty:
                break
            if stage == "extract":
                self._on_extraction(ref, res)
                continue
            i = ref
            self._received[i] += 1
            if self._items[i].done:
                continue
            try:
                if stage == "test":
                    self._on_test(i, idx, res)
                elif stage == "answer":
                    self._on_answer(i, res)
                elif stage == "replay":
                    self._on_replay(i, res)
            except Exception as exc:  # noqa: BLE001 - a hostile output must cost its item, never the batch
                self._finish(i, False, f"unreadable result: {type(exc).__name__}: {str(exc)[:200]}")

    def _on_extraction(self, key: str, res: RunResult) -> None:
        self._extract_jobs.pop(key, None)
        plan, keep = read_plan(res)
        if keep:
            _cache_plan(key, plan, len(res.stdout))
        for i in self._extracting.pop(key, []):
            self._items[i].plan = plan
            try:
                self._start_answer(i)
            except Exception as exc:  # noqa: BLE001 - e.g. an answer that cannot be put in a program
                self._finish(i, False, f"judge error: {type(exc).__name__}")

    def _on_test(self, i: int, idx: int, res: RunResult) -> None:
        """Test ``idx`` of row ``i`` (``idx < 0``: the job itself failed); the first failure decides."""
        item = self._items[i]
        total = len(item.selected)
        if idx >= 0:
            reason = _judge_test(item, idx, res, self.settings.float_tol)
        else:
            reason = _run_reason(res) or "sandbox error"
        if not reason:
            item.passed += 1
            if item.passed == total:
                self._finish(i, True)
            return
        # First failure decides: stop the problem's other tests.
        if res.status == "skipped" and self._received[i] < total:
            return  # a sibling's failure (reported separately) stopped this one; wait for that report
        self._fail(i, reason, res)

    def _on_answer(self, i: int, res: RunResult) -> None:
        """HumanEval: the answer's results against the plan's checks, then the replay if asserts need it."""
        item = self._items[i]
        if not res.exited_ok:
            self._fail(i, _run_reason(res) or "failed", res)
            return
        results = read_results(res.stdout, len(item.plan.calls))
        reason = judge_script(item.plan, results)
        if reason or not item.plan.sites:
            self._finish(i, not reason, reason)
            return
        replay = json.dumps({"mode": "replay", "prompt": item.problem.prompt, "test": item.problem.test_code,
                             "entry": item.problem.entry_point,
                             "outputs": [[c, r[1]] for c, r in zip(item.plan.calls, results)]})
        item.job = self._run_extractor(replay, ("replay", i), RESULT_CAP_BASE)

    def _on_replay(self, i: int, res: RunResult) -> None:
        if not res.exited_ok:
            self._fail(i, "replay of the test failed: " + (_run_reason(res) or "failed"), res)
            return
        text = res.stdout.decode("utf-8", errors="replace").rstrip()
        verdict = json.loads(text[text.rfind("\n") + 1:])
        ok = type(verdict) is dict and verdict.get("ok") is True
        self._finish(i, ok, "" if ok else str(verdict.get("error", "replay failed"))[:300])

    def _fail(self, i: int, reason: str, res: RunResult) -> None:
        self._finish(i, False, reason, timeout=res.status == "timeout", sandbox_error=res.status == "error")

    def _finish(self, i: int, ok: bool, reason: str = "", **kw) -> None:
        """Row ``i``'s result (once); a failure stops what it still has running."""
        item = self._items[i]
        if item.done:
            return
        self._pending -= 1
        if item.job is not None and not ok:
            item.job.cancel()
        item.done = True
        total = len(item.selected)
        item.result = _result(ok, reason=reason, passed=total if ok else item.passed, total=total, **kw)

    # --- 4. close ---------------------------------------------------------------------------------------------
    def _close(self) -> None:
        for job in self._extract_jobs.values():
            job.cancel()
        for i, item in enumerate(self._items):
            if not item.done:
                self._finish(i, False, "batch time limit reached", timeout=True)


def score_code_batch(solution_strs: Sequence[str], ground_truths: Sequence, extra_infos: Sequence | None = None, *,
                     data_sources: Sequence | None = None, max_tests: int | None = None,
                     test_timeout_s: float | None = None, problem_timeout_s: float | None = None,
                     memory_mb: int | None = None, batch_timeout_s: float | None = None,
                     require_think: bool = CodeScoringSettings.require_think,
                     float_tol: float = CodeScoringSettings.float_tol,
                     humaneval_replay: bool = CodeScoringSettings.humaneval_replay,
                     source_protocol: Mapping | None = None, sandbox: Sandbox | None = None) -> list[dict]:
    """Score many answers at once: :meth:`CodeBatchScorer.score` under the :class:`CodeScoringSettings` that the
    keywords make (each is the field of that name; a bad one raises ``ValueError`` naming it, before anything
    runs), through ``sandbox`` (default: the shared one).

    Every problem is submitted up front and runs in parallel over the sandbox's slots; the whole call returns
    within ``batch_timeout_s`` (default: the longest problem limit times the number of rounds the slots need,
    plus 30 s, plus two test limits per round for HumanEval's extra steps); unfinished problems score 0 with
    ``timeout``. A malformed ground truth raises ``ValueError``; whatever a program does, its item scores 0 with
    a ``reason``, never an exception.

    Each row is tested under its ``data_sources`` entry's protocol (:mod:`gapo.rewards.code.protocol`: test
    cap, per-test and per-problem limits), with ``source_protocol`` (``{source: {key: value}}``) applied over
    the table; without ``data_sources``, DeepCoder's default cap (15) and the sandbox's limits. ``max_tests``
    (0: every test), ``test_timeout_s`` and ``problem_timeout_s``, when given, override every source's."""
    settings = CodeScoringSettings(max_tests=max_tests, test_timeout_s=test_timeout_s,
                                   problem_timeout_s=problem_timeout_s, memory_mb=memory_mb,
                                   batch_timeout_s=batch_timeout_s, require_think=require_think, float_tol=float_tol,
                                   humaneval_replay=humaneval_replay, source_protocol=source_protocol)
    return CodeBatchScorer(settings, sandbox).score(solution_strs, ground_truths, extra_infos, data_sources)


def compute_code_score_batch(data_sources, solution_strs, ground_truths, extra_infos=None, **kwargs) -> list[dict]:
    """Batch entry point (verl's ``BatchRewardManager`` signature); each row is scored under its
    ``data_sources`` entry's protocol."""
    return score_code_batch(solution_strs, ground_truths, extra_infos, data_sources=list(data_sources), **kwargs)


def compute_code_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """verl's custom-reward signature: one answer; thread-safe (verl's reward loop calls it from threads).

    Keyword arguments (``reward_kwargs``: the fields of :class:`CodeScoringSettings`, and ``sandbox``):
    ``source_protocol`` (``{source: {max_tests, test_timeout_s, problem_timeout_s}}`` over
    :data:`gapo.rewards.code.protocol.PROTOCOLS`); ``max_tests`` (0: every test), ``test_timeout_s``,
    ``problem_timeout_s`` (each, when set, overrides every source's), ``memory_mb`` (default:
    :class:`SandboxConfig`), ``batch_timeout_s``, ``require_think``, ``float_tol``, ``humaneval_replay`` (True),
    ``sandbox``.
    Returns ``score`` (1.0 / 0.0), ``acc``, ``format_error`` (no code block, or truncated thought),
    ``timeout``, ``passed`` / ``total`` (tests passed before stopping / tests selected; a HumanEval test
    program counts as one), ``sandbox_error``, ``reason`` (``""`` when passed).
    """
    return score_code_batch([solution_str], [ground_truth], [extra_info], data_sources=[data_source], **kwargs)[0]


__all__ = ["CODE_SOURCES", "RESULT_KEYS", "CodeBatchScorer", "CodeProblem", "CodeScoringSettings", "Plan",
           "build_program", "check_passes", "compute_code_score", "compute_code_score_batch", "extract_code",
           "fenced_blocks", "parse_tests", "read_results", "score_code_batch", "select_tests", "stdout_matches",
           "values_match"]

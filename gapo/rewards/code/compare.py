"""The code reward's parent-side judging: decoding what a sandboxed program sent back (never trusted) and
comparing it with the expected values (function calls with the types of the benchmarks' judges, integers
exact, bool apart from int, float tolerance elsewhere), in time linear in the output.
"""

from __future__ import annotations

import json
import math
import re

NUM_TOKEN_MAX = 400  # longer non-integer tokens are compared as text only (float() and regexes stay cheap)
MAX_DEPTH = 100  # nesting of returned values the parent accepts
# Unambiguous, so a failed match is linear (the old ``\d+\.?\d*`` backtracked quadratically).
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_MISSING = object()

# ----- plain data from the sandbox -------------------------------------------------------------------
class GotSet:
    """A set the answer returned, kept as its items: the parent never hashes an answer's values into a
    table of its own (deliberately colliding ints would make that quadratic)."""

    __slots__ = ("items",)

    def __init__(self, items):
        self.items = items

    def __repr__(self):
        return f"GotSet({self.items!r})"


class GotDict:
    """A dict the answer returned, kept as its ``(key, value)`` pairs (see :class:`GotSet`)."""

    __slots__ = ("pairs",)

    def __init__(self, pairs):
        self.pairs = pairs

    def __repr__(self):
        return f"GotDict({self.pairs!r})"


def _untag(x, trusted: bool, depth: int = 0):
    """Tagged JSON (see ``CODEC_SRC``) -> Python values. Untrusted (the answer's): sets and dicts come back
    as :class:`GotSet` / :class:`GotDict`; anything malformed raises ``ValueError``."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t = type(x)
    if t is list:
        return [_untag(v, trusted, depth + 1) for v in x]
    if t is not dict:
        if t in (str, int, float, bool) or x is None:
            return x
        raise ValueError(f"not plain data: {t.__name__}")
    if len(x) != 1:
        raise ValueError("malformed tag")
    ((tag, v),) = x.items()
    if tag in ("t", "s", "d") and type(v) is not list:
        raise ValueError("malformed tag")
    if tag == "t":
        return tuple(_untag(e, trusted, depth + 1) for e in v)
    if tag == "s":
        items = [_untag(e, trusted, depth + 1) for e in v]
        return frozenset(items) if trusted else GotSet(items)
    if tag == "d":
        pairs = []
        for pair in v:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("malformed dict")
            pairs.append((_untag(pair[0], trusted, depth + 1), _untag(pair[1], trusted, depth + 1)))
        return dict(pairs) if trusted else GotDict(pairs)
    if type(v) is str and tag == "i":
        return int(v, 16)  # base 16: linear, and not subject to the int-digits limit
    if type(v) is str and tag == "f" and v in ("nan", "inf", "-inf"):
        return float(v)
    if type(v) is str and tag == "b":
        return bytes.fromhex(v)
    if tag == "c" and type(v) is list and len(v) == 2:
        re_, im = (_untag(e, trusted, depth + 1) for e in v)
        if type(re_) is float and type(im) is float:
            return complex(re_, im)
    raise ValueError("malformed tag")


def _tag(x, depth: int = 0):
    """The parent's encoder, for trusted values (function-call arguments from the dataset)."""
    if depth > 10 * MAX_DEPTH:
        raise ValueError("argument nested too deeply")
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, int):
        return x if -(1 << 53) < x < (1 << 53) else {"i": hex(x)}
    if isinstance(x, float):
        return x if x - x == 0 else {"f": repr(x)}
    if isinstance(x, list):
        return [_tag(v, depth + 1) for v in x]
    if isinstance(x, tuple):
        return {"t": [_tag(v, depth + 1) for v in x]}
    if isinstance(x, dict):
        return {"d": [[_tag(k, depth + 1), _tag(v, depth + 1)] for k, v in x.items()]}
    raise ValueError(f"argument is not JSON data: {type(x).__name__}")


def read_results(stdout: bytes, n_calls: int) -> list:
    """The runner's result line (the last line of stdout) -> ``n_calls`` items ``[0, raw value]`` or
    ``[1, exception name]`` (raw values still tagged). Raises ``ValueError`` on anything else."""
    text = stdout.decode("utf-8", errors="replace").rstrip()
    line = text[text.rfind("\n") + 1:]
    try:
        items = json.loads(line)
    except RecursionError:
        raise ValueError("result nested too deeply") from None
    if type(items) is not list or len(items) != n_calls:
        raise ValueError(f"expected {n_calls} results")
    for item in items:
        if type(item) is not list or len(item) != 2 or item[0] not in (0, 1) or type(item[0]) is not int:
            raise ValueError("malformed result")
    return items


# ----- comparison ------------------------------------------------------------------------------------
def _close(a: float, b: float, tol: float) -> bool:
    return a == b or math.isclose(a, b, rel_tol=tol, abs_tol=tol)


def _int_token(s: str) -> str | None:
    """Canonical form of an integer token (``+007`` -> ``7``, ``-0`` -> ``0``); ``None`` if not one."""
    digits = s[1:] if s[:1] in ("+", "-") else s
    if not digits or not (digits.isascii() and digits.isdigit()):
        return None
    digits = digits.lstrip("0") or "0"
    return "-" + digits if s[0] == "-" and digits != "0" else digits


def _integral_token(s: str) -> str | None:
    """Canonical integer of a token that is an integer or a decimal with a zero fraction (``7.00``)."""
    whole, dot, frac = s.partition(".")
    if not dot:
        return _int_token(s)
    if frac and not (frac.isascii() and frac.isdigit() and frac.strip("0") == ""):
        return None
    if whole in ("", "+", "-"):
        return "0" if frac else None
    return _int_token(whole)


def _token_matches(g: str, w: str, tol: float) -> bool:
    want_int = _int_token(w)
    if want_int is not None:  # integers are exact
        return _integral_token(g) == want_int
    if len(g) > NUM_TOKEN_MAX or len(w) > NUM_TOKEN_MAX:
        return False  # equal texts were accepted already; no float() of huge tokens
    if not (_NUMBER.fullmatch(g) and _NUMBER.fullmatch(w)):
        return False
    try:
        return _close(float(g), float(w), tol)
    except (ValueError, OverflowError):
        return False


def stdout_matches(got: str, want: str, tol: float = 1e-6) -> bool:
    """Whitespace-tolerant comparison: equal lines after stripping, else equal tokens where a number may
    differ by ``tol`` unless the expected token is an integer (then the values must be equal). Linear time."""
    g_lines = [line.rstrip() for line in got.strip().splitlines()]
    w_lines = [line.rstrip() for line in want.strip().splitlines()]
    if g_lines == w_lines:
        return True
    g_tok, w_tok = got.split(), want.split()
    if len(g_tok) != len(w_tok):
        return False
    return all(g == w or _token_matches(g, w, tol) for g, w in zip(g_tok, w_tok))


def values_match(got, want, tol: float = 1e-6, _depth: int = 0) -> bool:
    """A function call's result (``got``, as decoded from the sandbox) against its expected value, with the types
    of the benchmarks' judges: Python's ``==`` between the returned value and the expected one as JSON decodes it
    (LiveCodeBench's ``grade_call_based`` and APPS/TACO's call-based judge both end in ``prediction == gt_out``).
    So a list is not a tuple (the caller reads a returned *top-level* tuple as a list first, as both judges do:
    :func:`call_result`), a set is never a list, dict keys must equal the expected keys (JSON's are strings: an
    int key is not ``"1"``), an integral float equals its int. Two rules of this project's differ, both stricter
    or equal on types: bool is not int (Python: ``True == 1``), and a number whose expected value is not an
    integer may differ by ``tol`` (the judges: exactly equal)."""
    if _depth > MAX_DEPTH:
        return False
    if want is None or want is True or want is False:
        return got is want
    tw, tg = type(want), type(got)
    if tw is int:
        return (tg is int or tg is float) and got == want
    if tw is float:
        if tg is not int and tg is not float:
            return False
        try:
            return _close(float(got), want, tol)
        except OverflowError:
            return False
    if tw is str:
        return tg is str and got == want
    if tw is list or tw is tuple:  # JSON arrays (a tuple only from a literal read with ast): a returned list
        if tg is not list or len(got) != len(want):
            return False
        return all(values_match(g, w, tol, _depth + 1) for g, w in zip(got, want))
    if tw is set or tw is frozenset:  # only from a literal read with ast (JSON has no sets)
        return isinstance(got, GotSet) and _same_items(got.items, list(want), None, _depth)
    if tw is dict:
        pairs = got.pairs if isinstance(got, GotDict) else list(got.items()) if tg is dict else None
        if pairs is None or len(pairs) != len(want):
            return False
        keys = {k: k for k in want}  # looked up in the expected (trusted) table, never one of the answer's
        used = set()
        for k, v in pairs:
            try:
                wk = keys.get(k, _MISSING)
            except TypeError:  # an unhashable key (a set, a list) is no key of the expected dict
                return False
            if wk is _MISSING or wk in used or not _same(k, wk, _depth + 1):
                return False
            if not values_match(v, want[wk], tol, _depth + 1):
                return False
            used.add(wk)
        return True
    return tg is tw and got == want


def call_result(got, want, tol: float = 1e-6, unwrap_single: bool = False) -> bool:
    """Whether a function call's returned value (decoded) passes for ``want``, as the row's judge reads it.

    Both judges DeepCoder scores with (rllm 18e446c5) first turn a returned top-level tuple into a list, and only
    that one: LiveCodeBench's ``grade_call_based`` (``rllm/rewards/code_utils/livecodebench.py``, taken from
    LiveCodeBench's ``lcb_runner/evaluation/testing_util.py``), and TACO/PrimeIntellect's ``execute_cb_code``
    (``rllm/rewards/code_utils/taco.py``); then :func:`values_match`. ``unwrap_single`` (TACO/PrimeIntellect,
    whose outputs wrap the value as ``[value]``): as ``execute_cb_code``, the value also passes for ``want[0]``,
    and so does a list of tuples read as a list of lists (its ``[list(x) for x in exec_outputs]``). That judge
    tries ``want[0]`` for any non-empty ``want``; here only for a one-element one (a bare 3 is not ``[3, 4]``)."""
    if type(got) is tuple:
        got = list(got)
    if values_match(got, want, tol):
        return True
    if not (unwrap_single and type(want) is list and len(want) == 1):
        return False
    if values_match(got, want[0], tol):
        return True
    return (type(got) is list and bool(got) and type(got[0]) is tuple
            and all(type(x) is tuple or type(x) is list for x in got)
            and values_match([list(x) for x in got], want[0], tol))


def _same(got, want, depth: int = 0) -> bool:
    """Python's ``got == want`` for plain data, except that bool is not int (``True != 1``)."""
    if depth > MAX_DEPTH:
        return False
    if want is None or want is True or want is False:
        return got is want
    tw, tg = type(want), type(got)
    if tw is int or tw is float:
        return (tg is int or tg is float) and got == want
    if tw is complex:
        return (tg is int or tg is float or tg is complex) and got == want
    if tw is str or tw is bytes:
        return tg is tw and got == want
    if tw is list or tw is tuple:
        return tg is tw and len(got) == len(want) and all(_same(g, w, depth + 1) for g, w in zip(got, want))
    if tw is frozenset:
        return isinstance(got, GotSet) and _same_items(got.items, list(want), None, depth)
    if tw is dict:
        return (isinstance(got, GotDict) and len(got.pairs) == len(want)
                and _same_items([k for k, _ in got.pairs], list(want), [v for _, v in got.pairs], depth, want))
    return False


def _same_items(keys: list, want_keys: list, values, depth: int, want_map=None) -> bool:
    """Set / dict equality by lookups in the *expected* (trusted) table, each expected key used once."""
    if len(keys) != len(want_keys):
        return False
    index = {k: i for i, k in enumerate(want_keys)}
    used = set()
    for j, k in enumerate(keys):
        try:
            i = index.get(k)
        except TypeError:  # an unhashable value (a list) cannot be a member
            return False
        if i is None or i in used or not _same(k, want_keys[i], depth + 1):
            return False
        if values is not None and not _same(values[j], want_map[want_keys[i]], depth + 1):
            return False
        used.add(i)
    return True


def _allclose(out, exp, rtol: float, atol: float, equal_nan: bool, depth: int = 0) -> bool:
    """numpy's ``allclose`` on plain data of the same shape (no broadcasting, no bools)."""
    if depth > MAX_DEPTH:
        return False
    te, to = type(exp), type(out)
    if te is list or te is tuple:
        return ((to is list or to is tuple) and len(out) == len(exp)
                and all(_allclose(o, e, rtol, atol, equal_nan, depth + 1) for o, e in zip(out, exp)))
    if te not in (int, float) or to not in (int, float):
        return False
    a, b = float(out), float(exp)
    if math.isnan(a) or math.isnan(b):
        return equal_nan and math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= atol + rtol * abs(b)


def check_passes(check: list, got) -> bool:
    """One extracted HumanEval check against the answer's (decoded) value, with the assert's semantics.
    Never raises: a value that cannot be compared (a huge int against a float tolerance) fails."""
    try:
        return _check_passes(check, got)
    except (ArithmeticError, ValueError, TypeError, RecursionError):
        return False


def _check_passes(check: list, got) -> bool:
    op = check[0]
    if op == "eq":
        want, via = check[3], check[4]
        if via:
            if type(got) not in (list, tuple):
                return False
            got = tuple(got) if via == "tuple" else list(got)
        return _same(got, want)
    if op == "is":
        return got is check[3]
    if op == "close":
        want, tol, strict = check[3], check[4], check[5]
        if type(got) not in (int, float) or type(want) not in (int, float) or type(tol) not in (int, float):
            return False
        diff = abs(got - want)
        return diff < tol if strict else diff <= tol
    if op == "plus":
        exp, atol, variant = check[3], check[4], check[5]
        if _same(got, exp):
            return True
        return atol != 0 and _allclose(got, exp, 1e-7, atol, variant == "assert_allclose")
    return False

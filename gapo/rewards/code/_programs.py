"""The programs the code reward runs inside the sandbox, as source text: the answer runner (function-call and
HumanEval answers get only the arguments and send back tagged JSON) and the HumanEval extractor (the trusted
test code, run without the answer, turned into calls and checks). Nothing here runs in the reward's process.
"""

# ----- code that runs inside the sandbox -------------------------------------------------------------
# Plain data <-> tagged JSON. JSON null/bool/str/list/int (|x| < 2**53)/finite float stand for themselves;
# an object is a tag: {"t": [...]} tuple, {"s": [...]} set, {"d": [[k, v], ...]} dict, {"i": "0x.."} int,
# {"f": "nan"} float, {"b": "hex"} bytes, {"c": [re, im]} complex. Used by both sandboxed programs below;
# the parent has its own decoder (:func:`_untag`) and never trusts what comes back.
CODEC_SRC = r'''
import json as _gj


def _g_enc(x, _d=0):
    if _d > 200:
        raise ValueError("value nested too deeply")
    if x is None or x is True or x is False:
        return x
    if isinstance(x, bool):
        return bool(x)
    if isinstance(x, int):
        v = int(x)
        return v if -(1 << 53) < v < (1 << 53) else {"i": hex(v)}
    if isinstance(x, float):
        v = float(x)
        return v if v - v == 0 else {"f": repr(v)}
    if isinstance(x, str):
        return str.__str__(x)
    if isinstance(x, list):
        return [_g_enc(v, _d + 1) for v in list.__iter__(x)]
    if isinstance(x, tuple):
        return {"t": [_g_enc(v, _d + 1) for v in tuple.__iter__(x)]}
    if isinstance(x, dict):
        return {"d": [[_g_enc(k, _d + 1), _g_enc(v, _d + 1)] for k, v in dict.items(x)]}
    if isinstance(x, (set, frozenset)):
        try:
            items = [_g_enc(v, _d + 1) for v in sorted(x)]
        except TypeError:
            items = sorted((_g_enc(v, _d + 1) for v in x), key=lambda e: _gj.dumps(e, sort_keys=True))
        return {"s": items}
    if isinstance(x, (bytes, bytearray)):
        return {"b": bytes(x).hex()}
    if isinstance(x, complex):
        return {"c": [_g_enc(x.real, _d + 1), _g_enc(x.imag, _d + 1)]}
    if getattr(type(x), "tolist", None) is not None:  # numpy arrays and scalars
        return _g_enc(x.tolist(), _d + 1)
    raise TypeError("not plain data: " + type(x).__name__)


def _g_dec(x, _key=False):
    if type(x) is list:
        return [_g_dec(v) for v in x]
    if type(x) is not dict:
        return x
    (tag, v), = x.items()
    if tag == "t":
        return tuple(_g_dec(e, _key) for e in v)
    if tag == "s":
        items = [_g_dec(e, True) for e in v]
        return frozenset(items) if _key else set(items)
    if tag == "d":
        return {_g_dec(k, True): _g_dec(e) for k, e in v}
    if tag == "i":
        return int(v, 16)
    if tag == "f":
        return float(v)
    if tag == "b":
        return bytes.fromhex(v)
    if tag == "c":
        return complex(_g_dec(v[0]), _g_dec(v[1]))
    raise ValueError("unknown tag " + repr(tag))


def _g_send(fd, obj):
    import os
    view = memoryview(("\n" + _gj.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n").encode())
    while len(view):
        view = view[os.write(fd, view):]
'''

# The answer's process. It reads its calls (tagged JSON of [args, kwargs]) before the answer's code runs,
# moves fd 1 to stderr (the answer's prints are diagnostics only, and cannot fill the result channel),
# runs the answer as a module not named __main__ (compiled in here, never in the parent), then calls the function once per input and writes one
# line of results ([0, value] or [1, exception name]) to the saved fd. os._exit skips atexit hooks.
RUNNER = '''\
import os as _go, sys as _gs
{codec}
_g_calls = [_g_dec(c) for c in _gj.loads(_gs.stdin.read())]
_g_fd = _go.dup(1)
_go.dup2(2, 1)
_g_ns = {{"__name__": "solution", "__builtins__": __builtins__}}
exec(compile({prelude!r}, "<prelude>", "exec"), _g_ns)
_g_sources = {sources!r}
for _g_i, _g_src in enumerate(_g_sources):
    try:
        _g_code = compile(_g_src, "<solution>", "exec")
        break
    except SyntaxError:
        if _g_i == len(_g_sources) - 1:
            raise
exec(_g_code, _g_ns)
_g_cls = _g_ns.get("Solution") if {allow_class!r} else None
if isinstance(_g_cls, type) and hasattr(_g_cls, {fn!r}):
    _g_fn = getattr(_g_cls(), {fn!r})
else:
    _g_fn = _g_ns[{fn!r}]
_g_res = []
for _g_a, _g_k in _g_calls:
    try:
        _g_res.append([0, _g_enc(_g_fn(*_g_a, **_g_k))])
    except BaseException as _g_e:
        _g_res.append([1, type(_g_e).__name__[:64]])
_gs.stdout.flush()
_gs.stderr.flush()
_g_send(_g_fd, _g_res)
_go._exit(0)
'''

# HumanEval extraction / replay: trusted test code only (never the answer). Reads a job as JSON on stdin.
EXTRACTOR_SRC = r'''
import ast as _ga, os as _go, random as _gr, sys as _gs
#CODEC#
_G_JOB = _gj.loads(_gs.stdin.read())
_G_FD = _go.dup(1)
_go.dup2(2, 1)
_G_DISCOVER = _G_JOB["mode"] == "discover"
_G_ASSERTION = """
def assertion(out, exp, atol):
    exact_match = out == exp

    if atol == 0 and is_floats(exp):
        atol = 1e-6
    if not exact_match and atol != 0:
        {check}
    else:
        assert exact_match
"""
_G_PLUS_HELPERS = {
    "is_floats": """
def is_floats(x) -> bool:
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)):
        return all(isinstance(i, float) for i in x)
    if isinstance(x, np.ndarray):
        return x.dtype == np.float64 or x.dtype == np.float32
    return False
""",
    # evalplus's two versions of `assertion` differ only in the tolerance check
    "allclose": _G_ASSERTION.format(check="assert np.allclose(out, exp, rtol=1e-07, atol=atol)"),
    "assert_allclose": _G_ASSERTION.format(check="np.testing.assert_allclose(out, exp, atol=atol)"),
}


def _g_done(obj):
    _gs.stdout.flush()
    _g_send(_G_FD, obj)
    _go._exit(0)


class _GMissing(BaseException):
    pass


class _GHoleUsed(Exception):
    pass


_g_touched = [False]


class _GHole:
    """What candidate() returns during extraction: absorbs arithmetic, refuses to decide anything, and
    notes that it was used (an assert that touched it needs the replay)."""
    __slots__ = ()

    def _g_same(self, *args, **kwargs):
        _g_touched[0] = True
        return self

    def _g_used(self, *args):
        _g_touched[0] = True
        raise _GHoleUsed("the test uses the answer's value outside an assert")

    @property
    def __class__(self):
        _g_touched[0] = True
        return _GHole


for _n in ("add radd sub rsub mul rmul truediv rtruediv floordiv rfloordiv mod rmod pow rpow neg pos abs eq ne "
           "lt le gt ge getitem call and rand or ror xor rxor lshift rlshift rshift rrshift invert matmul "
           "rmatmul round getattr").split():
    setattr(_GHole, "__%s__" % _n, _GHole._g_same)
for _n in "bool iter len int float index contains complex".split():
    setattr(_GHole, "__%s__" % _n, _GHole._g_used)

_g_calls, _g_checks, _g_sites = [], [], [0]
_g_outputs = {}
for _k, _v in _G_JOB.get("outputs", ()):
    _g_outputs.setdefault(_k, []).append(_v)


def _g_key(args, kwargs):
    return _gj.dumps([_g_enc(list(args)), _g_enc(dict(kwargs))], separators=(",", ":"), allow_nan=False)


def _g_call(*args, **kwargs):
    if _G_DISCOVER:
        _g_calls.append(_g_key(args, kwargs))
    return len(_g_calls) - 1


def _g_stub(*args, **kwargs):
    key = _g_key(args, kwargs)
    if _G_DISCOVER:
        _g_calls.append(key)
        return _GHole()
    outs = _g_outputs.get(key)
    if not outs:
        raise _GMissing(key[:200])
    return _g_dec(outs.pop(0) if len(outs) > 1 else outs[0])


def _g_eq(i, want, via, line):
    if _G_DISCOVER:
        _g_checks.append(["eq", i, line, _g_enc(want), via])


def _g_eqr(want, i, via, line):
    _g_eq(i, want, via, line)


def _g_is(i, const, line):
    if _G_DISCOVER:
        _g_checks.append(["is", i, line, const])


def _g_close(i, want, tol, strict, line):
    if _G_DISCOVER:
        _g_checks.append(["close", i, line, _g_enc(want), _g_enc(tol), strict])


def _g_closer(want, i, tol, strict, line):
    _g_close(i, want, tol, strict, line)


def _g_plus(i, exp, atol, variant, line):
    if _G_DISCOVER:
        if atol == 0 and _G_NS["is_floats"](exp):
            atol = 1e-6
        _g_checks.append(["plus", i, line, _g_enc(exp), _g_enc(atol), variant])


def _g_site(fn, line):
    if _G_DISCOVER:
        _g_sites[0] += 1
        try:
            fn()
        except Exception:
            pass
    elif not fn():
        raise AssertionError("assert on line %d of the test failed" % line)


def _g_trusted(fn, line):
    # An assert that names no value of the answer. During extraction it must hold without touching a hole,
    # else it is a site for the replay (which runs it as written, so a genuinely false one fails there).
    if not _G_DISCOVER:
        if not fn():
            raise AssertionError("assert on line %d of the test failed" % line)
        return
    _g_touched[0] = False
    try:
        ok = bool(fn())
    except Exception:
        ok = False
    if not ok or _g_touched[0]:
        _g_sites[0] += 1


def _g_stmt(fn, line):
    if _G_DISCOVER:
        _g_sites[0] += 1
        try:
            fn()
        except Exception:
            pass
    else:
        fn()


def _g_bindings(tree):
    """name -> list of how it is bound anywhere in tree: "import:<module>" or "other"."""
    out = {}
    for node in _ga.walk(tree):
        if isinstance(node, (_ga.Import, _ga.ImportFrom)):
            for a in node.names:
                name = a.asname or a.name.split(".")[0]
                how = "import:" + a.name if isinstance(node, _ga.Import) else "other"
                out.setdefault(name, []).append(how)
        elif isinstance(node, (_ga.FunctionDef, _ga.AsyncFunctionDef, _ga.ClassDef)):
            out.setdefault(node.name, []).append("other")
        elif isinstance(node, _ga.Name) and not isinstance(node.ctx, _ga.Load):
            out.setdefault(node.id, []).append("other")
        elif isinstance(node, _ga.arg):
            out.setdefault(node.arg, []).append("other")
        elif isinstance(node, (_ga.Global, _ga.Nonlocal)):
            for name in node.names:
                out.setdefault(name, []).append("other")
    return out


def _g_plus_variant(tree, binds):
    if binds.get("np") != ["import:numpy"] or binds.get("assertion") != ["other"] or binds.get("is_floats") != ["other"]:
        return None
    defs = {n.name: _ga.dump(n) for n in tree.body if isinstance(n, _ga.FunctionDef)}
    known = {k: _ga.dump(_ga.parse(v).body[0]) for k, v in _G_PLUS_HELPERS.items()}
    if defs.get("is_floats") != known["is_floats"]:
        return None
    for variant in ("allclose", "assert_allclose"):
        if defs.get("assertion") == known[variant]:
            return variant
    return None


def _g_tainted(check, names):
    """Names in check() that may hold the answer's values: the candidate, the entry point (the test's own
    program would bind it to the answer's function) and, to a fixpoint, every name assigned from them or
    an object they were passed to a method of (``out.append(candidate(x))``)."""
    tainted = set(names)

    def refs(node):
        return node is not None and any(isinstance(n, _ga.Name) and n.id in tainted for n in _ga.walk(node))

    changed = True
    while changed:
        changed = False
        for node in _ga.walk(check):
            pairs = []
            if isinstance(node, _ga.Assign):
                pairs = [(t, node.value) for t in node.targets]
            elif isinstance(node, (_ga.AugAssign, _ga.AnnAssign, _ga.NamedExpr)):
                pairs = [(node.target, node.value)]
            elif isinstance(node, (_ga.For, _ga.AsyncFor, _ga.comprehension)):
                pairs = [(node.target, node.iter)]
            elif isinstance(node, _ga.withitem):
                pairs = [(node.optional_vars, node.context_expr)]
            elif (isinstance(node, _ga.Call) and isinstance(node.func, _ga.Attribute)
                  and any(refs(a) for a in list(node.args) + [k.value for k in node.keywords])):
                base = node.func.value
                while isinstance(base, (_ga.Attribute, _ga.Subscript)):
                    base = base.value
                pairs = [(base, node)]
            for target, value in pairs:
                if target is None or not refs(value):
                    continue
                for n in _ga.walk(target):
                    if isinstance(n, _ga.Name) and n.id not in tainted:
                        tainted.add(n.id)
                        changed = True
    return tainted


class _GRewrite(_ga.NodeTransformer):
    """Rewrites check(): asserts of a known shape record (call, expected); other asserts and statements
    that involve the answer's values become sites, judged by the replay."""

    def __init__(self, callers, tainted, binds, plus):
        self.callers, self.tainted, self.binds, self.plus = callers, tainted, binds, plus

    def refs(self, node):
        return any(isinstance(n, _ga.Name) and n.id in self.tainted for n in _ga.walk(node))

    def cand(self, node):
        return (isinstance(node, _ga.Call) and isinstance(node.func, _ga.Name) and node.func.id in self.callers
                and not any(self.refs(a) for a in node.args) and not any(self.refs(k.value) for k in node.keywords))

    def free_builtin(self, name):
        return name not in self.binds

    def is_abs(self, f):
        if isinstance(f, _ga.Name):
            return f.id == "abs" and self.free_builtin("abs")
        return (isinstance(f, _ga.Attribute) and f.attr == "fabs" and isinstance(f.value, _ga.Name)
                and f.value.id == "math" and set(self.binds.get("math", ["other"])) == {"import:math"})

    def gcall(self, c):
        return _ga.Call(func=_ga.Name("_g_call", _ga.Load()), args=c.args, keywords=c.keywords)

    def helper(self, name, args, node):
        call = _ga.Call(func=_ga.Name(name, _ga.Load()), args=list(args) + [_ga.Constant(node.lineno)], keywords=[])
        return _ga.copy_location(_ga.Expr(call), node)

    def lam(self, expr):
        noargs = _ga.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None,
                               defaults=[])
        return _ga.Lambda(args=noargs, body=expr)

    def classify(self, t, node):
        if self.cand(t):
            return self.helper("_g_is", [self.gcall(t), _ga.Constant(True)], node)
        if isinstance(t, _ga.UnaryOp) and isinstance(t.op, _ga.Not) and self.cand(t.operand):
            return self.helper("_g_is", [self.gcall(t.operand), _ga.Constant(False)], node)
        if not (isinstance(t, _ga.Compare) and len(t.ops) == 1):
            return None
        op, left, right = t.ops[0], t.left, t.comparators[0]
        if isinstance(op, _ga.Eq):
            for side, other, rev in ((left, right, False), (right, left, True)):
                if self.refs(other):
                    continue
                via, inner = "", side
                if (isinstance(side, _ga.Call) and isinstance(side.func, _ga.Name) and side.func.id in ("tuple", "list")
                        and self.free_builtin(side.func.id) and len(side.args) == 1 and not side.keywords):
                    via, inner = side.func.id, side.args[0]
                if self.cand(inner):
                    if rev:
                        return self.helper("_g_eqr", [other, self.gcall(inner), _ga.Constant(via)], node)
                    return self.helper("_g_eq", [self.gcall(inner), other, _ga.Constant(via)], node)
        if (isinstance(op, _ga.Is) and self.cand(left) and isinstance(right, _ga.Constant)
                and (right.value is True or right.value is False or right.value is None)):
            return self.helper("_g_is", [self.gcall(left), right], node)
        if isinstance(op, (_ga.Lt, _ga.LtE)) and not self.refs(right):
            f = left
            if (isinstance(f, _ga.Call) and len(f.args) == 1 and not f.keywords and self.is_abs(f.func)
                    and isinstance(f.args[0], _ga.BinOp) and isinstance(f.args[0].op, _ga.Sub)):
                a, b = f.args[0].left, f.args[0].right
                strict = _ga.Constant(isinstance(op, _ga.Lt))
                if self.cand(a) and not self.refs(b):
                    return self.helper("_g_close", [self.gcall(a), b, right, strict], node)
                if self.cand(b) and not self.refs(a):
                    return self.helper("_g_closer", [a, self.gcall(b), right, strict], node)
        return None

    def visit_Assert(self, node):
        if not self.refs(node.test):
            return self.helper("_g_trusted", [self.lam(node.test)], node)
        new = self.classify(node.test, node)
        return new if new is not None else self.helper("_g_site", [self.lam(node.test)], node)

    def visit_Expr(self, node):
        v = node.value
        if (self.plus and isinstance(v, _ga.Call) and isinstance(v.func, _ga.Name) and v.func.id == "assertion"
                and len(v.args) == 3 and not v.keywords and self.cand(v.args[0])
                and not self.refs(v.args[1]) and not self.refs(v.args[2])):
            return self.helper("_g_plus", [self.gcall(v.args[0]), v.args[1], v.args[2], _ga.Constant(self.plus)], node)
        if self.refs(v):
            return self.helper("_g_stmt", [self.lam(v)], node)
        return node


def _g_parse_prompt(src):
    for extra in ("", "    pass\n", None):
        if extra is None:
            return _ga.parse("")
        try:
            return _ga.parse(src + extra)
        except SyntaxError:
            continue


def _g_prepare():
    prompt = _g_parse_prompt(_G_JOB["prompt"])
    try:
        tree = _ga.parse(_G_JOB["test"])
    except SyntaxError as exc:
        _g_done({"ok": False, "error": "the test code does not parse: %s" % exc})
    tree.body = [s for s in tree.body if not (isinstance(s, _ga.Expr) and isinstance(s.value, _ga.Call)
                                              and isinstance(s.value.func, _ga.Name) and s.value.func.id == "check")]
    checks = [s for s in tree.body if isinstance(s, _ga.FunctionDef) and s.name == "check"]
    if not checks or not checks[-1].args.args:
        _g_done({"ok": False, "error": "the test code defines no check(candidate) function"})
    check = checks[-1]
    if any(type(n).__name__ in ("Try", "TryStar") for n in _ga.walk(check)):
        _g_done({"ok": False, "error": "the test catches exceptions (try in check()), which this judge does not support"})
    binds = _g_bindings(tree)
    for name, hows in _g_bindings(prompt).items():
        binds.setdefault(name, []).extend(hows)
    callers = {check.args.args[0].arg, _G_JOB["entry"]}
    _GRewrite(callers, _g_tainted(check, callers), binds, _g_plus_variant(tree, binds)).visit(check)
    _ga.fix_missing_locations(tree)
    return compile(prompt, "<prompt>", "exec"), compile(tree, "<test>", "exec")


def _g_where(exc):
    tb, line = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<test>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return "%s%s" % (type(exc).__name__, " (line %d of the test)" % line if line else "")


_G_NS = {"__name__": "__check__", "__builtins__": __builtins__}
for _n in ("_g_call", "_g_eq", "_g_eqr", "_g_is", "_g_close", "_g_closer", "_g_plus", "_g_site", "_g_trusted",
           "_g_stmt"):
    _G_NS[_n] = globals()[_n]
_g_prompt_code, _g_test_code = _g_prepare()
try:
    exec(_g_prompt_code, _G_NS)
    exec(_g_test_code, _G_NS)
except BaseException as exc:
    _g_done({"ok": False, "error": "the test code fails to load: " + _g_where(exc)})
_G_NS[_G_JOB["entry"]] = _g_stub
_gr.seed(0)
if "numpy" in _gs.modules:
    _gs.modules["numpy"].random.seed(0)
try:
    _G_NS["check"](_g_stub)
except _GMissing:
    _g_done({"ok": False, "error": "the test called candidate with arguments not seen during extraction"})
except BaseException as exc:
    if _G_DISCOVER:
        _g_done({"ok": False, "error": "the test fails without the answer: " + _g_where(exc)})
    _g_done({"ok": False, "error": "assertion failed: " + _g_where(exc)})
if _G_DISCOVER:
    _g_done({"ok": True, "calls": _g_calls, "checks": _g_checks, "sites": _g_sites[0]})
_g_done({"ok": True})
'''
EXTRACTOR = EXTRACTOR_SRC.replace("#CODEC#", CODEC_SRC)

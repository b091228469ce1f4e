r"""Worker process of :mod:`gapo.rewards.math.verify_pool`: checks ``(gold, pred)`` answers with math-verify.

Run as a script by the pool (``python _worker.py FD_IN FD_OUT SOFT_TIMEOUT_S MEMORY_MB HOOKS``),
never imported by the trainer. It imports only the standard library and math-verify, so it starts in
~0.3 s without torch. Why a separate process at all:

- math-verify interrupts slow parses with ``signal`` alarms, which only work in a main thread; here
  every check runs in this process's main thread, whatever thread the trainer called from;
- some inputs hang inside C code (``9^{9^{9^9}}`` is one big-integer power) where no signal is
  delivered: the pool then kills this process, which only a process allows;
- ``RLIMIT_AS`` turns a memory blow-up into a ``MemoryError`` here instead of in the trainer.

Protocol (pickled tuples over two pipes): the worker first sends ``("ready", pid)``; then for each
request ``(task_id, gold, pred[, options])`` it answers ``(task_id, status, equal, detail)`` with status
one of ``ok`` / ``timeout`` / ``error``; for ``ok`` and not equal, ``detail`` is the reason (``wrong``,
``unparsed``, ``inexact_decimal``, ``unsolved_relation``, ``false_equation``, ``unknown_operator``). ``options`` is ``None`` or
a dict; its one key, ``numeric_tolerance``, restores math-verify's float tolerance. ``None`` or
end-of-file on the input pipe ends the worker, so it also exits when the parent dies.

What is checked on top of ``verify(gold, pred)`` (each rule closes a way to be paid for a non-answer):

- **Only latex2sympy's reading counts.** The prediction is parsed with LaTeX extraction only and without
  math-verify's unit removal (which deletes any trailing ``\text{}``; the reward strips units itself, from a
  whitelist): when latex2sympy refuses the answer, it is ``unparsed``, never the number math-verify's plain-text
  fallback finds in it (``7 \uparrow 8`` was 8), nor the last side of an equation chain it retried. A gold
  latex2sympy cannot read is compared as text only (its fallback number, 0 in ``\{x \mid x > 0\}``, is not
  its value). See :mod:`gapo.rewards.math.understood` for the whitelist that runs before.
- **Either side, either vector notation.** ``7 = x`` is read as ``x = 7``; a tuple answers a one-column or
  one-row matrix gold and the reverse, when the sizes agree.
- **Decimals are exact.** Every float in the prediction (and then in the gold) is replaced by the exact
  rational its digits write, and the comparison runs with no float in it, at a numeric precision
  (``EXACT_DIGITS``) above any digit count an answer under the length cap can hold. So ``0.5`` equals
  ``1/2`` and ``2.50`` equals ``5/2``, while ``1.414214`` does not equal ``\sqrt2`` nor ``0.333`` equal
  1/3 (math-verify rounds both sides to 6 decimals: any 6-decimal approximation passed). A prediction
  without a decimal is compared as math-verify does (an exact ``\sqrt3`` against a decimal gold keeps
  its 6-decimal tolerance).
- **Relations must be solved.** ``allow_set_relation_comp`` lets math-verify turn a predicted relation
  into its solution set: ``x^2 - 3x + 2 < 0`` then equals ``(1, 2)``. A predicted inequality, chain,
  ``\ne`` (anywhere in the answer) must be a variable against constants (constants: no symbol but the
  gold's own), all atoms about one variable; so must a predicted equation, or each equation of a
  predicted list, when the gold is a set or a tuple (``x \in (1, 2)`` is ``Eq(x, Interval)``: solved;
  ``x + y = 1, x - y = 2`` for ``(1, 2)`` is not). An unsolved gold relation lifts the rule.
- **Equations must be true.** Sides of a predicted equation (or chain) that hold no symbol must be
  equal: math-verify reads ``2+2=7`` as its right side 7.
- **Set operators join sets.** A prediction with ``\cup``, ``\cap`` or ``\setminus`` whose parse holds no
  set (``7 \cup 8``, read as 8) is refused (``unknown_operator``).
- **A set is not a tuple.** A prediction written as a set ``\{...\}``, named or not (``S = \{1, 2\}``), never
  matches a gold that is a tuple or an open interval ``(a, b)`` (math-verify compares them element by element).
"""

import os
import sys

# Run as a script, Python puts this file's folder first on sys.path; a sibling module named like a
# stdlib one (``code.py``, ``math.py``) would then shadow it in every import below.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

import logging
import re
import resource
import signal
import time
from collections import OrderedDict
from multiprocessing.connection import Connection

GOLD_CACHE_SIZE = 4096  # parsed gold answers kept; a prompt's k rollouts share one gold
# Digits of math-verify's numeric comparisons once decimals are exact rationals: more than an answer under
# the extraction's 400-character cap can write, so no finite decimal passes for an irrational gold.
EXACT_DIGITS = 500
CONSTANT_DIGITS = 60  # digits when deciding that an equation's constant sides differ
_SET_OPERATOR = re.compile(r"\\(?:cup|cap|setminus)(?![A-Za-z])")
_SET_BRACE = re.compile(r"^\s*(?:\\left\s*)?(?:\\\{|\\lbrace\b)")
# what a named value's text is after: ``S = \{1, 2\}``, ``x \in \{1, 2\}``
_NAMED_VALUE = re.compile(r"^\s*[A-Za-z](?:_\{?\w+\}?)?\s*(?:=|\\in(?![A-Za-z]))")
# math-verify's own split for its last-equation retry (``a = b = c`` that fails is read as ``c``)
_EQUATION_SPLIT = re.compile(r"(?<!\\|<|!|>)=")
HOOK_PREFIX = "__gapo_test_hook__:"  # requests with this gold drive test behaviours (only when enabled)


class SoftTimeout(BaseException):
    """Raised by the alarm. A BaseException, so math-verify's ``except Exception`` cannot swallow it."""


def _on_alarm(signum, frame):
    raise SoftTimeout()


def _set_memory_limit(memory_mb: int) -> None:
    if memory_mb <= 0:
        return
    limit = memory_mb * 1024 * 1024
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _die_with_parent() -> None:
    """Best effort (Linux): get SIGKILL when the pool's manager thread / parent process goes away."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001, S110  not Linux / no libc: the EOF on the input pipe still ends us
        pass


# ---- rules on top of math-verify (sympy is imported by math-verify before any of these run) ----

def _sympy_item(parsed):
    """The sympy object of a math-verify parse (a list of [expr, extracted string]); ``None`` if none."""
    return next((x for x in parsed if not isinstance(x, str)), None)


def _string_item(parsed) -> str:
    return next((x for x in parsed if isinstance(x, str)), "")


def _free_symbols(expr) -> set:
    try:
        return set(expr.free_symbols)
    except Exception:  # noqa: BLE001  not a sympy object
        return set()


def _has_float(expr) -> bool:
    from sympy import Float

    try:
        return bool(expr.atoms(Float))
    except Exception:  # noqa: BLE001
        return False


def _exact(expr):
    """``expr`` with every float replaced by the exact rational of its decimal digits (0.1 -> 1/10)."""
    from sympy import Float, Rational

    try:
        floats = expr.atoms(Float)
        if not floats:
            return expr
        # str() prints a Float with the digits it was parsed with (15 at least), in decimal: exact.
        return expr.xreplace({f: Rational(str(f)) for f in floats if f.is_finite})
    except Exception:  # noqa: BLE001  left as it is; math-verify then compares as before
        return expr


def _relation_atoms(expr):
    """The relations of ``expr`` (a relation, or an And / Or of them); ``None`` if something else is inside."""
    from sympy import And, Or
    from sympy.core.relational import Relational

    if isinstance(expr, Relational):
        return [expr]
    if isinstance(expr, (And, Or)):
        atoms = []
        for arg in expr.args:
            sub = _relation_atoms(arg)
            if sub is None:
                return None
            atoms += sub
        return atoms
    return None


def _is_equation_chain(expr) -> bool:
    from sympy import Eq

    atoms = _relation_atoms(expr)
    return bool(atoms) and all(isinstance(a, Eq) for a in atoms)


def _is_condition(expr) -> bool:
    """An inequality, ``\\ne``, or an And / Or holding relations (equation chains excluded)."""
    return _relation_atoms(expr) is not None and not _is_equation_chain(expr)


def _variables(expr) -> set | None:
    """The symbols of a variable: ``x``, or a tuple of distinct symbols ``(x, y)``; ``None`` otherwise."""
    from sympy import Symbol, Tuple

    if isinstance(expr, Symbol):
        return {expr}
    if isinstance(expr, Tuple) and len(expr) > 0 and all(isinstance(e, Symbol) for e in expr) \
            and len(set(expr)) == len(expr):
        return set(expr)
    return None


def _solved_variable(rel, params: set):
    """The variable ``rel`` is solved for: one side a variable, the other side constant (no symbol but
    the gold's own, ``params``, and not the variable); ``None`` if there is none."""
    for var, other in ((rel.lhs, rel.rhs), (rel.rhs, rel.lhs)):
        names = _variables(var)
        if names is not None and not (_free_symbols(other) - (params - names)):
            return var
    return None


def _is_solved(expr, params: set) -> bool:
    """A condition in solved form: every atom a variable against constants, one variable in all.
    An equation chain is solved when one atom is ``variable = constant`` and the others are constant."""
    atoms = _relation_atoms(expr)
    if not atoms:
        return False
    if _is_equation_chain(expr):
        solved = [a for a in atoms if _solved_variable(a, params) is not None]
        return len(solved) == 1 and all(not (_free_symbols(a) - params) for a in atoms if a is not solved[0])
    variables = {_solved_variable(a, params) for a in atoms}
    return None not in variables and len(variables) == 1


def _provably_unequal(a, b, tolerance: float) -> bool:
    """True only if ``a - b`` evaluates to a number clearly away from 0 (undecidable: False)."""
    try:
        if a.is_Rational and b.is_Rational:  # the common case (2+2 is parsed unevaluated, so not always)
            return abs(a - b) > tolerance * max(1, abs(a))
        diff = (a - b).evalf(CONSTANT_DIGITS, chop=True)
        scale = max(1.0, abs(float(a.evalf(CONSTANT_DIGITS))))
        return bool(diff.is_Number) and abs(float(diff)) > tolerance * scale
    except Exception:  # noqa: BLE001  sets, matrices, booleans: not decided here
        return False


def _false_equation(expr, tolerance: float) -> bool:
    for atom in _relation_atoms(expr) or []:
        if not _free_symbols(atom.lhs) and not _free_symbols(atom.rhs) and _provably_unequal(atom.lhs, atom.rhs, tolerance):
            return True
    return False


def _holds_set(expr) -> bool:
    from sympy import Set, preorder_traversal

    try:
        return any(isinstance(node, Set) for node in preorder_traversal(expr))
    except Exception:  # noqa: BLE001  not a sympy tree
        return False


def _variable_first(pred, params: set):
    """``7 = x`` as ``x = 7`` (math-verify reads an equation against a value by its right side); items of a set or
    tuple too. Anything else is returned as it is."""
    from sympy import Eq, FiniteSet, Tuple

    if isinstance(pred, (FiniteSet, Tuple)):
        items = [_variable_first(item, params) for item in pred.args]
        return pred if items == list(pred.args) else pred.func(*items)
    if isinstance(pred, Eq) and _variables(pred.rhs) is not None and _variables(pred.lhs) is None \
            and not (_free_symbols(pred.lhs) - params):
        return Eq(pred.rhs, pred.lhs, evaluate=False)
    return pred


def _vector_as_gold(gold, pred):
    """A vector in the gold's notation: a tuple ``(1, 2, 3)`` (or the open interval ``(1, 2)``) for a one-column or
    one-row matrix gold, and such a matrix for a tuple gold; ``pred`` as it is otherwise, or when the sizes differ."""
    from sympy import Interval, MatrixBase, Tuple

    def entries(x):
        if isinstance(x, Tuple):
            return list(x)
        if isinstance(x, Interval) and x.left_open and x.right_open:
            return [x.start, x.end]
        if isinstance(x, MatrixBase) and 1 in x.shape and len(x) > 1:
            return list(x)
        return None

    values = entries(pred)
    if values is None or isinstance(pred, type(gold)):
        return pred
    if isinstance(gold, MatrixBase) and 1 in gold.shape and len(gold) == len(values):
        return gold.__class__(values).reshape(*gold.shape)
    if isinstance(gold, Tuple) and isinstance(pred, MatrixBase) and len(gold) == len(values):
        return Tuple(*values)
    return pred


def _named_value_text(pred_text: str) -> str:
    """The text of a value after its name: ``\\{1, 2\\}`` for ``S = \\{1, 2\\}``; the text itself otherwise."""
    m = _NAMED_VALUE.match(pred_text)
    return pred_text[m.end():] if m else pred_text


def form_error(gold, pred, pred_text: str, tolerant: bool) -> str:
    """Why ``pred`` cannot be right whatever math-verify says ('' if no rule applies); see the docstring."""
    from sympy import Eq, FiniteSet, Interval, Set, Tuple

    if _SET_OPERATOR.search(pred_text) and not _holds_set(pred):
        return "unknown_operator"  # ``7 \cup 8`` read as 8: a set operator between values has no value

    params = _free_symbols(gold)
    gold_wants_condition = (_is_condition(gold) or _is_equation_chain(gold)) and not _is_solved(gold, params)
    tolerance = 1e-6 if tolerant else 1e-40
    items = list(pred.args) if isinstance(pred, (FiniteSet, Tuple)) else [pred]
    for item in items:
        if _is_equation_chain(item):
            if _false_equation(item, tolerance):
                return "false_equation"
            # Against a set or tuple, math-verify solves a predicted equation (or reads each element's right
            # side): ``x^2 = 4`` would equal {-2, 2}, ``x + y = 1, x - y = 2`` the pair (1, 2).
            if isinstance(gold, (Set, Tuple)) and not gold_wants_condition and not _is_solved(item, params):
                return "unsolved_relation"
        elif _is_condition(item) and not gold_wants_condition and not _is_solved(item, params):
            return "unsolved_relation"
    value = pred.rhs if isinstance(pred, Eq) and _variables(pred.lhs) is not None else pred
    if isinstance(value, FiniteSet) and (isinstance(gold, Tuple) or (isinstance(gold, Interval) and gold.is_open)) \
            and _SET_BRACE.match(_named_value_text(pred_text)):
        return "wrong"  # ``\{1, 2\}`` or ``S = \{1, 2\}`` for the pair (1, 2): a set is not ordered
    return ""


def _with_item(parsed, item):
    return [item if not isinstance(x, str) else x for x in parsed]


class Checker:
    """math-verify with its own alarms off: one alarm here bounds parse + verify of one item."""

    def __init__(self, soft_timeout_s: float, hooks: bool):
        """Import math-verify, install the alarm handler, warm up the parser and sympy (before reporting ready).

        Args:
            soft_timeout_s: the alarm's budget for parse + verify of one item.
            hooks: honour test hooks (a gold starting with ``HOOK_PREFIX``).
        """
        # math-verify warns once when its alarms are off, and on every parse failure at debug level:
        # the alarm below replaces its timeouts, and failures are reported through the status.
        logging.getLogger("math_verify").setLevel(logging.ERROR)
        from latex2sympy2_extended.latex2sympy2 import NormalizationConfig
        from math_verify import LatexExtractionConfig, parse, verify

        self._parse, self._verify = parse, verify
        # The prediction is read by latex2sympy only (no number fished out of text it refused) and math-verify's
        # unit removal is off (it deletes any trailing \text{}): the reward strips units itself, from a whitelist.
        self._latex_only = [LatexExtractionConfig()]
        self._pred_config = [LatexExtractionConfig(normalization_config=NormalizationConfig(
            basic_latex=True, units=False, malformed_operators=True, nits=True, boxed="all", equations=False))]
        self.soft_timeout_s = soft_timeout_s
        self.hooks = hooks
        self._gold = OrderedDict()
        signal.signal(signal.SIGALRM, _on_alarm)
        self._parse("$1$", parsing_timeout=None)  # ANTLR warm-up (~60 ms) before reporting ready
        form_error(_sympy_item(self._parse("$1$", parsing_timeout=None)), _sympy_item(
            self._parse("$x = 1$", parsing_timeout=None)), "x = 1", False)  # sympy's relational code

    def _parse_math(self, text: str, config=None):
        # Inline-math delimiters: measured best wrapping (``\boxed{}`` loses ``25\%``, bare text loses
        # ``\frac12`` and intervals); see gapo.rewards.math.answer.
        if config is None:
            return self._parse("$" + text + "$", parsing_timeout=None)
        return self._parse("$" + text + "$", extraction_config=config, parsing_timeout=None)

    def _parse_pred(self, pred: str):
        """latex2sympy's reading of the whole answer, or ``[]`` / ``[text]`` if it refused some of it."""
        parsed = self._parse_math(pred, self._pred_config)
        expr = _sympy_item(parsed)
        if expr is not None and len(_EQUATION_SPLIT.split(_string_item(parsed))) > 2 \
                and "," not in pred and ";" not in pred and _relation_atoms(expr) is None:
            # ``a = b = c`` that latex2sympy refused, retried by math-verify on its last side ``c``
            return [_string_item(parsed)]
        return parsed

    def _parsed_gold(self, gold: str):
        r"""(parse, whether latex2sympy read all of it). A gold it could not read is compared as text only: the
        number math-verify's fallback finds in it (0 in ``\{x \mid x > 0\}``) is not its value."""
        if gold in self._gold:
            self._gold.move_to_end(gold)
            return self._gold[gold]
        try:
            parsed, understood = self._parse_math(gold, self._latex_only), True
            if _sympy_item(parsed) is None:
                parsed, understood = [x for x in self._parse_math(gold) if isinstance(x, str)], False
        except SoftTimeout:
            # Remembered as unparseable: the k rollouts of this prompt then fail fast, not k alarms.
            self._gold[gold] = ([], False)
            raise
        self._gold[gold] = (parsed, understood)
        if len(self._gold) > GOLD_CACHE_SIZE:
            self._gold.popitem(last=False)
        return parsed, understood

    def _hook(self, command: str):
        """Test behaviours: ``sleep_blocked:S`` ignores the alarm for S seconds (a stuck worker)."""
        name, _, arg = command.partition(":")
        if name == "sleep_blocked":
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(float(arg))
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
            return "ok", False, "slept"
        if name == "crash":
            os._exit(3)
        return "error", False, f"unknown hook {name!r}"

    def _equal(self, gold, pred, **kwargs) -> bool:
        # Gold first: math-verify is not symmetric (assignments, intervals from relations).
        return bool(self._verify(gold, pred, timeout_seconds=None, allow_set_relation_comp=True, **kwargs))

    def compare(self, parsed_gold, parsed_pred, tolerant: bool) -> tuple[bool, str]:
        """(equal, reason if not) for two math-verify parses; the rules of the module docstring."""
        gold, pred = _sympy_item(parsed_gold), _sympy_item(parsed_pred)
        if pred is None or gold is None:
            return self._equal(parsed_gold, parsed_pred), "wrong"
        pred = _vector_as_gold(gold, _variable_first(pred, _free_symbols(gold)))
        parsed_pred = _with_item(parsed_pred, pred)
        decimals = not tolerant and _has_float(pred)
        exact_pred = _exact(pred) if decimals else pred
        reason = form_error(gold, exact_pred, _string_item(parsed_pred), tolerant)
        if reason:
            return False, reason
        if not decimals:
            return self._equal(parsed_gold, parsed_pred), "wrong"
        exact_gold = _exact(gold)
        if self._equal(_with_item(parsed_gold, exact_gold), _with_item(parsed_pred, exact_pred),
                       numeric_precision=EXACT_DIGITS):
            return True, ""
        # Only to name the reason: would math-verify's tolerance have accepted it?
        return False, "inexact_decimal" if self._equal(parsed_gold, parsed_pred) else "wrong"

    def check(self, gold: str, pred: str, options=None) -> tuple[str, bool, str]:
        """One request's answer: ``(status, equal, detail)`` as the module docstring's protocol says.

        ``status`` is ``ok``, ``timeout`` (the alarm fired) or ``error`` (gold unparseable, memory limit, parser bug);
        never raises, so one odd input cannot end the worker.
        """
        if self.hooks and gold.startswith(HOOK_PREFIX):
            return self._hook(gold[len(HOOK_PREFIX):])
        tolerant = bool(options and options.get("numeric_tolerance"))
        try:
            signal.setitimer(signal.ITIMER_REAL, self.soft_timeout_s)
            try:
                parsed_gold, gold_understood = self._parsed_gold(gold)
                if not parsed_gold:
                    return "error", False, "gold not parsed"
                parsed_pred = self._parse_pred(pred)
                if _sympy_item(parsed_pred) is None and gold_understood:
                    # latex2sympy refused the answer: whatever else math-verify would read in it is not its value
                    return "ok", False, "unknown_operator" if _SET_OPERATOR.search(pred) else "unparsed"
                if not parsed_pred:
                    return "ok", False, "unparsed"
                equal, reason = self.compare(parsed_gold, parsed_pred, tolerant)
                return "ok", equal, "" if equal else reason
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except SoftTimeout:
            # Also reached when the one-shot alarm fires inside the ``finally`` above.
            return "timeout", False, f"over {self.soft_timeout_s:g} s"
        except MemoryError:
            return "error", False, "memory limit"
        except Exception as exc:  # noqa: BLE001  a parser bug on odd input must not end the worker
            return "error", False, f"{type(exc).__name__}: {exc}"[:200]


def main(argv: list[str]) -> int:
    """Serve requests from the pipes in ``argv`` (see the module docstring) until ``None`` or end of file; returns 0."""
    fd_in, fd_out, soft_timeout_s, memory_mb, hooks = argv[1:6]
    conn_in = Connection(int(fd_in), writable=False)
    conn_out = Connection(int(fd_out), readable=False)
    _die_with_parent()
    checker = Checker(float(soft_timeout_s), hooks == "1")
    _set_memory_limit(int(memory_mb))  # after the imports: they are trusted and need their memory
    conn_out.send(("ready", os.getpid()))
    while True:
        try:
            request = conn_in.recv()
        except (EOFError, OSError):
            return 0
        if request is None:
            return 0
        task_id, gold, pred, *options = request
        conn_out.send((task_id, *checker.check(gold, pred, options[0] if options else None)))


if __name__ == "__main__":
    sys.exit(main(sys.argv))

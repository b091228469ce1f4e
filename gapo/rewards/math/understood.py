r"""Grade only what the parser understood: the whitelist of LaTeX an answer may hold, and restated computations.

math-verify never says that it skipped something. Its parser (latex2sympy's ANTLR lexer and grammar) drops an
unknown macro or character with a recognition error and then fails, and math-verify then fishes a number out of the
text with a regular expression (``7 \uparrow 8`` is 8, ``{\geq} 7`` is 7); its normalisation deletes any trailing
``\text{...}`` as a unit (``7 \text{ is wrong}`` is 7); the lexer skips spacing, so ``7 \quad 8`` reaches the grammar
as ``7 8``, which it reads as the mixed number 7 + 8 = 15 (``2(3)`` is 5 there, not 6). Refusing the spellings one
by one (the previous two rounds) cannot end: every macro a policy invents is another hole.

So the check goes one level down and is a **whitelist**: after the formatting known to be meaningless is stripped
(:mod:`gapo.rewards.math.latex`, :func:`gapo.rewards.math.answer.normalize_answer`), every token of the answer must
be one the parser understands, or one the gold itself uses; anything else makes the answer ``unparsed`` (score 0).
A whitelist and not a round trip (re-deriving every value of the text from the parsed expression), because the
parser rewrites values on purpose (``\frac{6}{8}`` is 3/4, ``3\frac12`` is 7/2, ``50\%``, ``1,000``), so a round
trip would have to re-implement its reading; a token list is checked against the parser itself instead:
``tests/test_math_reward_understood.py`` lexes every macro of :data:`UNDERSTOOD_MACROS` with latex2sympy's own lexer (one
token, no recognition error) and generates unknown macros and Unicode signs between values and around relations.
The worker adds the other half (:mod:`gapo.rewards.math._worker`): the prediction's value must be latex2sympy's
reading of the whole answer, never a number math-verify's fallback found in text the parser refused.

What is understood (:func:`not_understood`):

- macros of :data:`UNDERSTOOD_MACROS` (numbers and functions, operators and relations the screen of
  :func:`gapo.rewards.math.latex.operator_error` has already passed, Greek letters, delimiters, spacing);
  ``\left`` / ``\right`` only before a delimiter math-verify knows; ``\begin`` / ``\end`` only for the matrix
  environments of the grammar; ``\\`` and ``&`` only inside them;
- an accent or alphabet (``\overline{AB}``, ``\vec{v}``, ``\mathbb{R}``) over a name;
- ``\text{}`` (``\mbox``, ``\mathrm``, ``\textnormal``) holding nothing, a number, one word (read as a symbol, so
  ``7 \text{apples}`` is not 7), units (:data:`UNIT_WORDS`, which :func:`strip_units` removes at the end of an
  answer, as math-verify did), "and" / "or" (math-verify reads a list), or text a gold holds; any other prose is
  what math-verify would have dropped (``7 \text{ is wrong}``);
- ASCII letters, digits, spaces and :data:`UNDERSTOOD_CHARACTERS`; a non-ASCII character left after
  :func:`gapo.rewards.math.latex.unicode_math` is never understood (``7 ↑ 8``);
- and, whatever the tokens: no two numbers side by side (``7 \quad 8``, ``(7)(8)``, ``2(3)``: the grammar adds
  them), no group holding only a relation or operator (``{\geq} 7``), no subscript on a number (``7_{8}`` is read
  as 7), no empty group.

Restated computations (:func:`restated`, reason ``unevaluated``): an answer that still holds an operation the problem
asks to carry out is not a final answer. ``\sum``, ``\prod``, ``\int``, ``\lim`` and binomial coefficients are
refused unless a gold uses the same macro (when the gold is a number, the problem asked for the number); a
factorial is refused unless a gold has one, except ``n!`` of an integer ``n <= SMALL_FACTORIAL`` (6): ``5!`` for 120
stays right, because a small factorial is a value a reader knows on sight, as ``2^{10}`` is, and nothing is left to
compute (the case table has always paid it), while ``7!`` or ``\frac{10!}{5!}`` leave the multiplication undone.
When the gold is a plain number and the row carries its problem (``extra_info["problem"]``), an answer that is not a
plain number and appears word for word in the problem (``17 \times 23`` for "Compute $17 \times 23$") is the
problem restated, refused too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from gapo.rewards.math.latex import match_braces

UNPARSED, UNEVALUATED = "unparsed", "unevaluated"

GREEK = ("alpha", "beta", "gamma", "Gamma", "delta", "Delta", "epsilon", "varepsilon", "zeta", "eta", "theta", "Theta",
         "vartheta", "iota", "kappa", "lambda", "Lambda", "mu", "nu", "xi", "Xi", "omicron", "pi", "Pi", "varpi", "rho",
         "varrho", "sigma", "Sigma", "varsigma", "tau", "upsilon", "Upsilon", "phi", "Phi", "varphi", "chi", "psi",
         "Psi", "omega", "Omega")
FUNCTIONS = ("frac", "dfrac", "tfrac", "cfrac", "sqrt", "log", "ln", "exp", "sin", "cos", "tan", "csc", "sec", "cot",
             "arcsin", "arccos", "arctan", "arccsc", "arcsec", "arccot", "sinh", "cosh", "tanh", "arsinh", "arcosh",
             "artanh", "arcsinh", "arccosh", "arctanh", "gcd", "lcm", "max", "min", "det", "floor", "ceil")
# operations a problem asks to carry out (restated, below); understood, so they reach that rule
COMPUTATIONS = ("sum", "prod", "int", "lim", "binom", "dbinom", "tbinom", "choose")
OPERATORS = ("times", "cdot", "div", "pm", "mp", "cup", "cap", "setminus", "mod")
RELATIONS = ("le", "leq", "ge", "geq", "lt", "gt", "ne", "neq", "leqslant", "geqslant", "in", "notin", "subseteq",
             "supseteq", "approx", "equiv", "to", "rightarrow")
CONSTANTS = ("infty", "emptyset", "partial", "nabla", "angle", "triangle", "prime", "ell", "hbar", "circ", "degree")
DELIMITERS = ("lbrace", "rbrace", "lbrack", "rbrack", "langle", "rangle", "lfloor", "rfloor", "lceil", "rceil",
              "lvert", "rvert", "vert", "lgroup", "rgroup")
SPACING = ("quad", "qquad", "thinspace", "medspace", "thickspace", "negthinspace", "negmedspace", "negthickspace")
# a macro whose braced argument is read as a name (latex2sympy's ACCENT token)
ACCENTS = ("overline", "bar", "hat", "vec", "tilde", "widetilde", "dot", "ddot", "overrightarrow", "acute",
           "breve", "check", "grave", "mathcal", "mathfrak", "mathscr")
TEXT = ("text", "mbox", "mathrm", "textnormal")
UNDERSTOOD_MACROS = frozenset(GREEK + FUNCTIONS + COMPUTATIONS + OPERATORS + RELATIONS + CONSTANTS + DELIMITERS
                              + SPACING + ACCENTS + TEXT + ("left", "right", "begin", "end", "mathbb", "operatorname"))
# control symbols: braces of a set, norm bars, spacing, percent and dollar signs (``\\`` only in a matrix)
UNDERSTOOD_CONTROL = frozenset(("\\{", "\\}", "\\|", "\\,", "\\;", "\\:", "\\!", "\\ ", "\\%", "\\$"))
UNDERSTOOD_CHARACTERS = frozenset("+-*/^_()[]{}=<>,.;:!|")
MATRIX_ENVIRONMENTS = frozenset(("matrix", "pmatrix", "bmatrix", "vmatrix", "array"))
BLACKBOARD = frozenset("NZQRCP")
OPERATOR_NAMES = frozenset(("gcd", "lcm", "floor", "ceil", "arsinh", "arcsinh", "arcosh", "arccosh", "artanh",
                            "arctanh", "rank", "tr", "trace"))
# what math-verify's normalisation accepts after \left and \right
LEFT_DELIMITERS = ("\\{", "{", "\\|", "|", "[", "(", "\\lgroup", "\\lbrace", "\\lbrack", "\\vert", "\\lvert", "\\lceil",
                   "\\lfloor", "\\langle")
RIGHT_DELIMITERS = ("\\}", "}", "\\|", "|", "]", ")", "\\rgroup", "\\rbrace", "\\rbrack", "\\vert", "\\rvert",
                    "\\rceil", "\\rfloor", "\\rangle")
# Units, currencies and counted nouns an answer may name after its value (singular; a plural s / es is accepted):
# removed at the end of an answer, as math-verify removes any trailing text (tests check each against it).
UNIT_WORDS = frozenset((
    "mm", "cm", "dm", "m", "km", "in", "inch", "ft", "foot", "feet", "yd", "yard", "mi", "mile", "meter", "metre",
    "millimeter", "centimeter", "kilometer", "mg", "g", "gram", "kg", "kilogram", "lb", "pound", "oz", "ounce", "ton",
    "ms", "s", "sec", "second", "min", "minute", "h", "hr", "hour", "day", "week", "month", "yr", "year", "ml", "l",
    "liter", "litre", "gallon", "gal", "mph", "kmh", "dollar", "cent", "euro", "rupee", "degree", "deg", "radian",
    "rad", "unit", "percent", "way", "student", "people", "person", "man", "men", "woman", "women", "child",
    "children", "apple", "coin", "toy", "tile", "edge", "digit", "point", "page", "square", "sq", "cubic", "cu", "per",
))
UNIT_QUALIFIERS = frozenset(("square", "sq", "cubic", "cu", "per"))
CONNECTIVES = frozenset(("and", "or"))
SMALL_FACTORIAL = 6

_TOKEN = re.compile(r"\\(?:[A-Za-z]+|.)|\s+|.", re.DOTALL)
# read as nothing between two values (math-verify deletes ``\$``: ``7 \$ 8`` reaches the grammar as ``7 8``)
_SPACE_TOKENS = frozenset(("\\,", "\\;", "\\:", "\\ ", "\\$") + tuple("\\" + s for s in SPACING))
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?![\d.])"
_NAME = re.compile(r"^\s*(?:[A-Za-z0-9]|\\[A-Za-z]+)(?:\s*[A-Za-z0-9'])*\s*$")  # one way to split a run
_WORD = re.compile(r"^\(?[A-Za-z]+\)?$")  # a word, or a choice ``(C)`` (latex2sympy drops the parentheses)
# Words joined by spaces, slashes or exponents (``cm``, ``square units``, ``km/h``, ``m^2/s``). Every repeat is delimited
# (a separator run needs a ``/`` or ``^`` in each of its steps, a word run starts with a letter), so a failing match
# backtracks linearly: the former ``[A-Za-z]+(?:\s*(?:/|\^\{?\d\}?)?\s*[A-Za-z]*)*`` could split a run of letters
# every way there is and never returned on prose after a number (tests/test_reward_regex_bounds.py).
_UNIT_JOIN = r"(?:\s*(?:/|\^\{?\d\}?))"
_UNIT_PHRASE = rf"[A-Za-z]+(?:(?:{_UNIT_JOIN}+\s*|\s+)[A-Za-z]+)*{_UNIT_JOIN}*"
_TRAILING_UNIT_TEXT = re.compile(
    r"(?<=[\d}\s])\s*\\(?:text|mbox|mathrm|textnormal|textrm)\s*\{\s*(" + _UNIT_PHRASE + r")\s*\}"
    r"(?:\s*\^\s*(?:\{\s*\d\s*\}|\d))?\s*$")
_TRAILING_UNIT_WORD = re.compile(r"(?<=[\d}])\s*(" + _UNIT_PHRASE + r")(?:\s*\^\s*(?:\{\s*\d\s*\}|\d))?\s*$")
# a temperature: the scale after a degree sign (``30^{\circ}C``, ``30^\circ \text{F}``)
_DEGREE_SCALE = re.compile(r"(\^\s*(?:\{\s*\\circ\s*\}|\\circ))\s*(?:\\(?:text|mbox|mathrm)\s*\{\s*[CF]\s*\}|[CF])\s*$")
_LEAD_IN = re.compile(r"^\s*\\(?:text|mbox|textnormal)\s*\{\s*(?:so\s+)?(?:the\s+)?(?:final\s+)?answer(?:\s+is)?"
                      r"\s*:?\s*\}", re.IGNORECASE)
# a value that is one number: 7, (7), {7}, \left( 7 \right) -- for the side-by-side check
_UNSIGNED = r"(?:\d+(?:\.\d*)?|\.\d+)(?![\d.])"
_NUMBER_ATOM = rf"(?:{_UNSIGNED}|\(\s*{_NUMBER}\s*\)|\{{\s*{_NUMBER}\s*\}}|\[\s*{_NUMBER}\s*\])"
_SIDE_BY_SIDE = re.compile(rf"(?<![\\A-Za-z^_}}\d.])({_NUMBER_ATOM})\s*({_NUMBER_ATOM})")
_ARGUMENT_BEFORE = re.compile(r"(?:\\[A-Za-z]+|[\^_]|\})\s*$")  # what takes the atom as an argument: \frac{1}, ^{2}
_NUMBER_SUBSCRIPT = re.compile(r"(?<![A-Za-z\\])\d\s*_")
_RELATION_OR_OPERATOR = (r"(?:[<>=+\-*/:|!,]|\\(?:" + "|".join(RELATIONS + OPERATORS) + r"|ne|neq|not|neg|mid|nmid"
                         r"|approx|sim|cong|equiv|parallel|perp)(?![A-Za-z]))")
_OPERATOR_GROUP = re.compile(r"\{\s*(?:" + _RELATION_OR_OPERATOR + r"\s*)*\}")
_FACTORIAL = re.compile(r"(\d+|\}|\)|\]|[A-Za-z])\s*!(?!=)")
_PLAIN_NUMBER = re.compile(r"^\s*[-+]?(?:\d+(?:\.\d+)?|\d{1,3}(?:,\d{3})+|\\[dt]?frac\s*\{\s*\d+\s*\}\s*\{\s*\d+\s*\}"
                           r"|\d+\s*/\s*\d+)\s*$")
_MATH_SEGMENT = re.compile(r"\$\$(.+?)\$\$|(?<!\\)\$(.+?)(?<!\\)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_COMPACT_DROP = re.compile(r"\s+|\$|\\left|\\right|\\[,;:! ]|\\(?:display|text)style")
_SPACES = re.compile(r"\s+")
_UNIT_SPLIT = re.compile(r"[\s/]+|\^\{?\d\}?")
_TEXT_OPEN = re.compile(r"\\(?:" + "|".join(TEXT) + r")\s*\{")
_TEXT_OR_NAME_OPEN = re.compile(r"\\(?:" + "|".join(TEXT + ("operatorname",)) + r")\s*\{")
_COMPUTATION = {name: re.compile(rf"\\{name}(?![A-Za-z])") for name in COMPUTATIONS}


def _unit_phrase(words: str) -> bool:
    """True if ``words`` (``cm``, ``square units``, ``miles per hour``, ``km/h``) names units only."""
    parts = [w for w in _UNIT_SPLIT.split(words) if w]
    if not parts:
        return False
    for w in parts:
        lower = w.lower()
        if not any(stem in UNIT_WORDS for stem in (lower, lower[:-1] if lower.endswith("s") else "",
                                                     lower[:-2] if lower.endswith("es") else "")):
            return False
    return any(w.lower().rstrip("s") not in UNIT_QUALIFIERS and w.lower() not in UNIT_QUALIFIERS for w in parts)


def strip_units(answer: str) -> str:
    """``12 \\text{ cm}``, ``50\\text{ m}^2``, ``5 hours`` -> the value: units (:data:`UNIT_WORDS`) at the end of an
    answer removed, as math-verify removed any trailing text (here only units: ``7 \\text{ is wrong}`` stays).
    Bare words must be two letters or more (``7 m`` may be a product). A lead-in ``\\text{The answer is}`` goes, and
    a temperature's scale after a degree sign."""
    answer = _DEGREE_SCALE.sub(r"\1", _LEAD_IN.sub("", answer))
    for pattern, min_len in ((_TRAILING_UNIT_TEXT, 1), (_TRAILING_UNIT_WORD, 2)):
        m = pattern.search(answer)
        if m and m.start() > 0 and len(m.group(1).strip()) >= min_len and _unit_phrase(m.group(1)) \
                and answer[:m.start()].strip():
            answer = answer[:m.start()].rstrip()
    return answer


def _text_understood(content: str, gold_texts: set[str]) -> bool:
    words = content.split()
    if not words or content.strip().lower() in gold_texts:
        return True
    if len(words) == 1 and (_WORD.match(words[0]) or re.fullmatch(_NUMBER, words[0])):
        return True  # one word is one symbol (or a number) to the parser: nothing dropped
    return _unit_phrase(content) or all(w.lower() in CONNECTIVES for w in words)


@dataclass(frozen=True)
class _Golds:
    """What the screens read in the golds, once per gold list (the k answers to one prompt share it)."""

    tokens: frozenset[str]  # every token a gold uses: understood in the answer
    texts: frozenset[str]  # the contents of the golds' ``\\text{}`` (lower case)
    joined: str  # the golds side by side
    compact: str  # the same without whitespace
    side_by_side: bool  # a gold writes two numbers side by side
    factorial: bool  # a gold has a factorial
    plain_numbers: bool  # every gold is a plain number


@lru_cache(maxsize=1024)
def _golds_info(golds: tuple[str, ...]) -> _Golds:
    tokens, texts = set(), set()
    for gold in golds:
        tokens.update(t for t in _TOKEN.findall(gold) if not t.isspace())
        for m in _TEXT_OPEN.finditer(gold):
            end = match_braces(gold, m.end() - 1)
            if end is not None:
                texts.add(gold[m.end():end - 1].strip().lower())
    joined = "".join(golds)
    return _Golds(frozenset(tokens), frozenset(texts), joined, _SPACES.sub("", joined),
                  any(_side_by_side(g) for g in golds), any("!" in g.replace("!=", "") for g in golds),
                  all(is_plain_number(g) for g in golds))


def _argument(answer: str, pos: int) -> tuple[str, int] | None:
    """(content, end) of the braced argument starting at ``pos`` (spaces skipped); ``None`` if none."""
    while pos < len(answer) and answer[pos] == " ":
        pos += 1
    if pos >= len(answer) or answer[pos] != "{":
        return None
    end = match_braces(answer, pos)
    return None if end is None else (answer[pos + 1:end - 1], end)


def _next_token(answer: str, pos: int) -> str:
    m = _TOKEN.match(answer, pos)
    while m and m.group().isspace():
        m = _TOKEN.match(answer, m.end())
    return m.group() if m else ""


_ARGUMENT_MACROS = frozenset(TEXT + ACCENTS + ("left", "right", "begin", "end", "mathbb", "operatorname"))


def _tokens_understood(answer: str, gold: _Golds) -> str:
    """The first token of ``answer`` the parser does not understand (and no gold uses); ``""`` if none."""
    pos, matrices = 0, 0
    gold_tokens, gold_text = gold.tokens, gold.compact
    while pos < len(answer):
        m = _TOKEN.match(answer, pos)
        token, pos = m.group(), m.end()
        name = token[1:]
        if token.isspace() or (token in gold_tokens and name not in _ARGUMENT_MACROS):
            continue
        if token[0] != "\\":
            if token.isascii() and (token.isalnum() or token in UNDERSTOOD_CHARACTERS):
                continue
            if token == "&" and matrices:
                continue
            return token
        if not name.isalpha():
            if token in UNDERSTOOD_CONTROL or (token == "\\\\" and matrices):
                continue
            return token
        if name not in UNDERSTOOD_MACROS:
            return token
        if name in ("left", "right"):
            delimiters = LEFT_DELIMITERS if name == "left" else RIGHT_DELIMITERS
            if _next_token(answer, pos) not in delimiters:
                return token
        elif name in ("begin", "end"):
            arg = _argument(answer, pos)
            if arg is None or (arg[0].strip() not in MATRIX_ENVIRONMENTS and f"\\{name}{{{arg[0].strip()}}}"
                               not in gold_text):
                return token
            matrices += 1 if name == "begin" else -1
            pos = arg[1]
            if name == "begin" and arg[0].strip() == "array":
                spec = _argument(answer, pos)
                pos = spec[1] if spec else pos
        elif name in TEXT or name in ACCENTS or name in ("mathbb", "operatorname"):
            arg = _argument(answer, pos)
            if arg is None:
                return token
            content = arg[0]
            if name in TEXT:
                ok = _text_understood(content, gold.texts)
            elif name == "mathbb":
                ok = content.strip() in BLACKBOARD
            elif name == "operatorname":
                ok = content.strip() in OPERATOR_NAMES
            else:
                ok = bool(_NAME.match(content))
            if not ok and _SPACES.sub("", f"{token}{{{content}}}") not in gold_text:
                return f"{token}{{{content}}}"
            pos = arg[1]
    return ""


def _outside_text(answer: str) -> str:
    """``answer`` with every ``\\text{}``-like argument blanked (its words are not values or operators)."""
    out, pos = [], 0
    for m in _TEXT_OR_NAME_OPEN.finditer(answer):
        if m.start() < pos:
            continue
        end = match_braces(answer, m.end() - 1)
        if end is None:
            break
        out += [answer[pos:m.start()], " T "]
        pos = end
    out.append(answer[pos:])
    return "".join(out)


def _side_by_side(text: str) -> str:
    """Two number atoms with nothing but spacing between them (``7 \\quad 8``, ``(7)(8)``, ``2(3)``), outside a
    macro's arguments (``\\frac{1}{2}``, ``2^{3}``); ``""`` if none."""
    for m in _SIDE_BY_SIDE.finditer(text):
        if not _ARGUMENT_BEFORE.search(text[:m.start()]):
            return m.group()
    return ""


def not_understood(answer: str, golds: list[str]) -> str:
    """What in ``answer`` the parser would drop or misread, unless a gold uses it (module docstring); ``""`` if
    everything is understood. The caller scores a non-empty result ``unparsed``."""
    gold = _golds_info(tuple(golds))
    bad = _tokens_understood(answer, gold)
    if bad:
        return bad
    text = "".join(" " if t in _SPACE_TOKENS else t for t in _TOKEN.findall(_outside_text(answer)))
    pair = _side_by_side(text)
    if pair and not gold.side_by_side:
        return pair
    group = _OPERATOR_GROUP.search(text)
    if group and group.group() not in gold.joined:
        return group.group()
    subscript = _NUMBER_SUBSCRIPT.search(text)
    if subscript and "_" not in gold.joined:
        return subscript.group()
    return ""


def _factorials(answer: str) -> list[str]:
    """The operand of each ``!`` (not ``!=``): an integer literal, or ``)`` / ``}`` / ``]`` / a letter."""
    return [m.group(1) for m in _FACTORIAL.finditer(answer)]


def is_plain_number(gold: str) -> bool:
    """``7``, ``-2.5``, ``1,000``, ``\\frac{3}{4}``, ``3/4``: a number with no operation left in it."""
    return bool(_PLAIN_NUMBER.match(gold))


def _compact(text: str) -> str:
    return _COMPACT_DROP.sub("", text).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")


def _in_problem(answer: str, problem: str) -> bool:
    """``answer`` appears in one of ``problem``'s math segments (``$...$``, ``\\(...\\)``, ``\\[...\\]``) as a whole
    expression, spacing ignored: not inside a longer number or name."""
    needle = _compact(answer)
    if len(needle) < 2:
        return False
    for segment in _MATH_SEGMENT.finditer(problem):
        haystack = _compact(next(g for g in segment.groups() if g is not None))
        for m in re.finditer(re.escape(needle), haystack):
            before = haystack[m.start() - 1] if m.start() else " "
            after = haystack[m.end()] if m.end() < len(haystack) else " "
            if not (before.isalnum() or after.isalnum() or before in "^_"):
                return True
    return False


def restated(answer: str, golds: list[str], problem: str | None = None) -> str:
    """What in ``answer`` is a computation left undone (module docstring); ``""`` if it is a final answer. The
    caller scores a non-empty result ``unevaluated``."""
    gold = _golds_info(tuple(golds))
    for name, pattern in _COMPUTATION.items():
        if "\\" + name not in gold.tokens and pattern.search(answer):
            return f"\\{name}"
    if not gold.factorial:
        for operand in _factorials(answer):
            if not (operand.isdigit() and int(operand) <= SMALL_FACTORIAL):
                return f"{operand}!"
    if problem and gold.plain_numbers and not is_plain_number(answer) \
            and _in_problem(answer, problem):
        return "the problem's expression"
    return ""

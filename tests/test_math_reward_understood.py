r"""Math reward, third red team: only what the parser understood is graded (``gapo.rewards.math.understood``).

- the issue's examples, before (paid or refused) and after;
- generated answers: made-up macros and Unicode signs between values and around relations are never graded as a
  value (a list of refused names cannot pass this: the names are new each time);
- the whitelist checked against latex2sympy's own lexer, the units against math-verify's unit removal;
- the worker's half: a prediction latex2sympy refused is ``unparsed``, whatever number math-verify would find in it;
- the restated-computation rule, the normalisations that pay right answers.

The verdicts of the new classes live in :data:`gapo.rewards.math.cases.HACKS` (``tests/test_math_reward_hacks.py``
runs them all).
"""

from __future__ import annotations

import random
import string
import unicodedata

import pytest

from gapo.rewards.math.answer import extract_answer, normalize_answer, normalize_unicode, score_math, score_math_batch
from gapo.rewards.math.latex import DECLARATIONS, DROPPED_WITH_ARGUMENT, WRAPPERS, operator_error, unicode_math
from gapo.rewards.math.understood import (
    ACCENTS,
    SMALL_FACTORIAL,
    TEXT,
    UNDERSTOOD_MACROS,
    UNIT_QUALIFIERS,
    UNIT_WORDS,
    is_plain_number,
    not_understood,
    restated,
    strip_units,
)
from gapo.rewards.math.verify_pool import VerifyPool

# reasons of the screens before grading: an answer refused with one of these was never graded as a value
SCREENED = {"unparsed", "sideless_relation", "negated", "unknown_operator"}


@pytest.fixture(scope="module")
def pool():
    # Legitimate items only: a soft timeout of 60 s, not the pool's default 3 s, which a busy machine can use up on
    # an item needing a second of CPU (CI: solved_radical_bounds)
    with VerifyPool(num_workers=2, soft_timeout_s=60.0, hard_timeout_s=120.0) as p:
        yield p


# ---- the issue's examples ----

ISSUE_WRONG = [  # (answer, gold, reason): each was paid before this change
    (r"{\geq} 7", "7", "unparsed"), (r"7 \uparrow 8", "8", "unparsed"), (r"7 \text{ is wrong}", "7", "unparsed"),
    (r"S = \{1, 2\}", "(1, 2)", "wrong"), (r"7 \quad 8", "15", "unparsed"),
    (r"\sum_{k=1}^{100} k", "5050", "unevaluated"),
]
ISSUE_RIGHT = [  # each was refused before this change
    ("\u221a2", r"\sqrt{2}"), (r"0.\dot{3}", r"\frac{1}{3}"), (r"0.\overline{3}", r"\frac{1}{3}"), ("0.(3)", "1/3"),
    ("7 = x", "7"), ("(1, 2, 3)", r"\begin{pmatrix}1\\2\\3\end{pmatrix}"),
    (r"\begin{pmatrix}1\\2\\3\end{pmatrix}", "(1, 2, 3)"), ("~7", "7"), ("\u00a07", "7"),
]


@pytest.mark.parametrize(("answer", "gold", "reason"), ISSUE_WRONG)
def test_issue_examples_refused(answer, gold, reason, pool):
    result = score_math(rf"\boxed{{{answer}}}", gold, pool=pool)
    assert result["score"] == 0.0 and result["reason"] == reason, result


@pytest.mark.parametrize(("answer", "gold"), ISSUE_RIGHT)
def test_issue_examples_paid(answer, gold, pool):
    assert score_math(rf"\boxed{{{answer}}}", gold, pool=pool)["score"] == 1.0


# ---- generated: nothing made up is graded as a value ----

def _made_up_macros(rng: random.Random, n: int) -> list[str]:
    """Macro names no list of this project holds (understood, formatting, box), new for each seed."""
    known = set(UNDERSTOOD_MACROS) | set(WRAPPERS) | set(DECLARATIONS) | set(DROPPED_WITH_ARGUMENT) | {"boxed", "fbox"}
    names = set()
    while len(names) < n:
        name = "".join(rng.choice(string.ascii_letters) for _ in range(rng.randint(2, 8)))
        if name not in known:
            names.add("\\" + name)
    return sorted(names)


def _unknown_signs() -> list[str]:
    """Unicode symbols and punctuation that normalisation leaves non-ASCII: signs the reward has no reading for
    (``≥`` or ``×`` become macros, ``⑦`` becomes 7: those are read, so not here)."""
    signs = []
    for code in list(range(0xA1, 0x2FF)) + list(range(0x2010, 0x2BFF)):
        ch = chr(code)
        if unicodedata.category(ch)[0] in "SP" and not unicode_math(normalize_unicode(ch)).isascii():
            signs.append(ch)
    return signs


SHAPES = ["7 {m} 8", "{m} 7", "7 {m}", "{{{m}}} 7", "7 {{{m}}}", "x {m} 7", "{m}{{7}}", "{m} = 7", "7 = {m}",
          r"\geq {m} 7", r"{m}\geq 7", r"{{{m} \geq}} 7", r"7 {m} \leq 8", "{m}(7)", "7{m}", "(7, {m} 8)",
          r"x {m}\leq 7", "{m} 7 {m}"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_made_up_macros_and_unknown_signs_are_never_graded_as_a_value(seed, pool):
    rng = random.Random(seed)
    signs = _unknown_signs()
    assert len(signs) > 500  # arrows, boxed operators, letterlike signs, punctuation, ...
    pieces = _made_up_macros(rng, 60) + rng.sample(signs, 60)
    answers = [rng.choice(SHAPES).format(m=m) for m in pieces for _ in range(2)]
    golds = ["7", "8", "15", "56"]
    items = [(a, g) for a in answers for g in golds]
    out = score_math_batch([rf"\boxed{{{a}}}" for a, _ in items], [g for _, g in items], pool=pool)
    graded = [(a, g, r["reason"]) for (a, g), r in zip(items, out) if r["acc"] or r["reason"] not in SCREENED]
    assert graded == []
    # and the screen alone refuses each, before any grader sees it (the worker's own refusal is a second line)
    passed = [a for a in answers if not _screened(extract_answer(rf"\boxed{{{a}}}").answer, golds)]
    assert passed == []


def _screened(answer: str, golds: list[str]) -> str:
    return operator_error(answer, golds) or not_understood(answer, golds)


@pytest.mark.parametrize("pred", [r"7 \uparrow 8", r"7 \zzq 8", r"{\geq} 7", "7 \u2191 8", r"{\geq} = 3 = 8"])
def test_the_worker_grades_only_latex2sympys_reading(pred, pool):
    """Past the screen too: math-verify's fallback (a number found in text the parser refused, or the last side
    of an equation chain it could not read) is never the prediction's value."""
    for gold in ("7", "8"):
        verdict = pool.verify(gold, pred)
        assert verdict.status == "ok" and verdict.equal is False and verdict.detail == "unparsed", (gold, verdict)


def test_a_gold_the_parser_cannot_read_is_compared_as_text(pool):
    r"""math-verify reads ``\{x \mid x > 0\}`` as 0 (its fallback's number): a 0 was paid for it."""
    gold = r"\{x \mid x > 0\}"
    assert pool.verify(gold, gold).equal is True
    assert pool.verify(gold, "0").equal is False
    assert pool.verify(gold, r"\{x \mid x < 0\}").equal is False


# ---- the whitelist against the parser ----

def _lex(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """latex2sympy's own lexer on ``text`` after math-verify's normalisation: (tokens, recognition errors)."""
    from antlr4 import InputStream, Token
    from antlr4.error.ErrorListener import ErrorListener
    from latex2sympy2_extended.antlr_parser import PSLexer, PSParser
    from latex2sympy2_extended.math_normalization import NormalizationConfig, normalize_latex

    class Errors(ErrorListener):
        def __init__(self):
            self.errors = []

        def syntaxError(self, recognizer, offending, line, column, msg, e):  # ANTLR's name
            self.errors.append(msg)

    config = NormalizationConfig(basic_latex=True, units=False, malformed_operators=True, nits=True, boxed="all")
    lexer = PSLexer(InputStream(normalize_latex(text, config)))
    lexer.removeErrorListeners()
    errors = Errors()
    lexer.addErrorListener(errors)
    tokens = []
    while (token := lexer.nextToken()).type != Token.EOF:
        tokens.append((PSParser.symbolicNames[token.type] if token.type < len(PSParser.symbolicNames) else "literal",
                       token.text))
    return tokens, errors.errors


SAMPLES = {"circ": r"7^\circ", "degree": r"7^\degree", "left": r"\left( 7 \right)", "right": r"\left( 7 \right)",
           "begin": r"\begin{pmatrix}1\end{pmatrix}", "end": r"\begin{pmatrix}1\end{pmatrix}", "mathbb": r"\mathbb{R}",
           "operatorname": r"\operatorname{gcd}(4, 6)", "mod": r"7 \mod 3", "sqrt": r"\sqrt{2}"}


@pytest.mark.parametrize("name", sorted(UNDERSTOOD_MACROS))
def test_every_understood_macro_is_a_token_of_latex2sympy(name):
    """Each whitelisted macro is lexed by latex2sympy (after math-verify's own rewrites: ``\\dfrac`` is ``\\frac``,
    ``\\left(`` is ``(``) without a recognition error and without being split into letters (``\\left`` alone is
    ``\\le`` f t there, ``\\uparrow`` an error then r r o w); spacing is skipped by the lexer, as declared."""
    sample = SAMPLES.get(name, rf"\{name}{{x}}" if name in ACCENTS or name in TEXT else rf"\{name}")
    tokens, errors = _lex(sample)
    assert errors == [], (sample, errors)
    letters = [text for kind, text in tokens if kind in ("LETTER_NO_E", "EXP_E") and text in name and text != "x"]
    assert letters == [], (sample, tokens)


def test_made_up_macros_are_what_latex2sympy_refuses():
    """The other side of the whitelist: what it leaves out is what the lexer cannot read."""
    for name in _made_up_macros(random.Random(7), 30):
        assert _lex(f"7 {name} 8")[1], name  # the lexer refuses it (an ``or`` with the screen could not fail)
        assert not_understood(f"7 {name} 8", ["8"]), name


def test_units_are_what_math_verify_removes():
    """Each unit word, after a value in ``\\text{}``, is removed here exactly when math-verify removes it: the value
    is what math-verify read (the reward only stops it from removing anything else)."""
    import logging

    from math_verify import parse

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    for unit in sorted(UNIT_WORDS - UNIT_QUALIFIERS):
        answer = rf"7 \text{{ {unit}}}"
        assert strip_units(answer) == "7", unit
        assert parse(f"${answer}$", parsing_timeout=None)[0] == 7, unit
    for unit in ("square units", "cubic feet", "miles per hour", "km/h", "m^2"):
        assert strip_units(rf"7 \text{{ {unit}}}") == "7", unit
    for prose in ("is wrong", "or less", "not sure", "at least", "more or less"):
        assert strip_units(rf"7 \text{{ {prose}}}") != "7", prose


# ---- the rules, piece by piece ----

@pytest.mark.parametrize(("answer", "golds", "bad"), [
    (r"7 \quad 8", ["15"], "7   8"), ("(7)(8)", ["15"], "(7)(8)"), ("2(3)", ["5"], "2(3)"),
    ("{7}{8}", ["15"], "{7}{8}"),
    (r"{\geq} 7", ["7"], r"{\geq}"), ("{}7", ["7"], "{}"), ("7_{8}", ["7"], "7_"), (r"7 \cdots", ["7"], r"\cdots"),
    (r"\begin{cases} 7 \end{cases}", ["7"], r"\begin"), (r"\left. 7 \right|", ["7"], r"\left"), ("7'", ["7"], "'"),
    (r"\mathbb{X}", [r"\mathbb{R}"], r"\mathbb{X}"), (r"\vec{7 \to 8}", ["8"], r"\vec{7 \to 8}"),
])
def test_not_understood_names_what_the_parser_would_drop(answer, golds, bad):
    assert not_understood(answer, golds) == bad


@pytest.mark.parametrize(("answer", "golds"), [
    (r"\frac{1}{2}", ["0.5"]), (r"3\frac{1}{2}", ["3.5"]), (r"2^{3} 4", ["32"]), (r"\sqrt{4} 2", ["4"]),
    (r"\begin{pmatrix}1 & 2\\3 & 4\end{pmatrix}", ["1"]), (r"\left(1, 2\right]", ["1"]), (r"x_{1} + x_2", ["1"]),
    (r"\text{Monday}", [r"\text{Monday}"]), (r"\text{no real roots}", [r"\text{No real roots}"]),
    (r"\overline{AB}", ["1"]), (r"\mathbb{R}", ["1"]), (r"7 \cdots", [r"1, \cdots, 7"]), ("1011_2", ["1011_2"]),
    (r"\{x \mid x > 0\}", [r"\{x \mid x > 0\}"]), (r"\alpha + \beta", ["1"]), (r"\operatorname{lcm}(4, 6)", ["12"]),
])
def test_understood_answers_pass(answer, golds):
    assert not_understood(answer, golds) == ""


def test_restated_computations():
    assert restated(r"\sum_{k=1}^{100} k", ["5050"]) == r"\sum"
    assert restated(r"\sum_{k=1}^{n} k", [r"\sum_{k=1}^{n} k"]) == ""  # the gold asks for the sum itself
    for n in range(SMALL_FACTORIAL + 1):
        assert restated(f"{n}!", ["1"]) == "", n
    assert restated(f"{SMALL_FACTORIAL + 1}!", ["5040"]) == f"{SMALL_FACTORIAL + 1}!"
    assert restated("n!", ["n!"]) == "" and restated("(n+1)!", ["120"]) == ")!"
    assert restated(r"x \ne 1", ["1"]) == "" and restated(r"10,\!000", ["10000"]) == ""  # no factorial there
    problem = r"Compute $17 \times 23 + 1$ and $2^{10}$."
    assert restated(r"17 \times 23", ["391"], problem) == "the problem's expression"
    assert restated(r"2^{10}", ["1024"], problem) == "the problem's expression"
    assert restated(r"17 \times 23", ["391"]) == ""  # no problem text: graded by value
    assert restated("391", ["391"], problem) == ""  # a plain number is never restated
    assert restated(r"7 \times 23", ["161"], problem) == ""  # 7 is inside 17 there, not the expression
    assert restated(r"2^{10}", [r"2^{10}"], problem) == ""  # the gold is no plain number


def test_plain_numbers():
    for gold in ("7", "-2.5", "1,000", r"\frac{3}{4}", "3/4", r"\dfrac{1}{2}"):
        assert is_plain_number(gold), gold
    for gold in ("2^{10}", r"\sqrt{2}", "x", "(1, 2)", r"\pi"):
        assert not is_plain_number(gold), gold


@pytest.mark.parametrize(("raw", "normal"), [
    ("\u221a2", r"\sqrt{2}"), ("2\u221a3", r"2\sqrt{3}"), ("\u221a12", r"\sqrt{12}"), ("\u221a(x+1)", r"\sqrt{x+1}"),
    ("\u221b8", r"\sqrt[3]{8}"), ("\u03c0/2", r"\pi /2"), ("45\u00b0", r"45^{\circ}"), ("f\u2032(x)", "f'(x)"),
    ("1 000 000", "1000000"), ("12\u00a0345", "12345"), ("10~000", "10000"), ("~7", "7"), ("= 7", "7"),
    (r"25\%", "25"), (r"(25\%, 50\%)", "(25, 50)"), (r"0.\dot{3}", r"\frac{1}{3}"), (r"0.1\dot{6}", r"\frac{1}{6}"),
    (r"0.\dot{1}4285\dot{7}", r"\frac{1}{7}"), ("0.(3)", r"\frac{1}{3}"), ("0.1(6)", r"\frac{1}{6}"),
    (r"0.\dot{1}23", r"0.\dot{1}23"), (r"\big(1, 2\big)", "(1, 2 )"), (r"\lbrace 1 \rbrace", r"\{1 \}"),
    (r"12 \text{ cm}", "12"), (r"\text{The answer is } 7", "7"), ("5 hours", "5"), ("7 m", "7 m"),
    (r"7 \text{ is wrong}", r"7 \text{ is wrong}"), ("7 8", "7 8"), ("1 2345", "1 2345"),
])
def test_normalisation(raw, normal):
    assert normalize_answer(normalize_unicode(raw)) == normal

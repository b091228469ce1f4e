r"""Math reward against answers a policy could be paid for without being right (red-team items 8-11).

- restated conditions: a relation counts only in solved form (``1 < x < 2`` for ``(1, 2)``, not
  ``x^2 - 3x + 2 < 0``);
- decimals: exact unless ``numeric_tolerance`` (``1.414214`` is not ``\sqrt2``; ``2.5`` is ``5/2``);
- boxes and delimiters: the outermost last box, no box or math delimiter left inside it, no false
  equation (``2+2=7``);
- Unicode: fullwidth, math-bold, other-script digits, invisible characters normalised before parsing;
- the scorer never raises: every failure is a 0 with a ``reason``.
- second red team (``gapo.rewards.math.latex``): relations with no side, negations, and statements or value-less
  operators are never paid as one of their sides (every macro of the table is tried); formatting wrappers,
  nested or around fractions, do not turn a right answer wrong.

The verdicts live in :data:`gapo.rewards.math.cases.HACKS` (shared with ``recipe.bench.math_reward
--table hacks``); this file adds the option, the helpers and the failure paths.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from gapo.rewards import RESULT_DEFAULTS, compute_score, compute_score_batch
from gapo.rewards.math.answer import (
    FORMAT_REASONS,
    REASONS,
    extract_answer,
    gold_answers,
    has_math_delimiter,
    last_boxed,
    normalize_answer,
    normalize_unicode,
    score_math,
    score_math_batch,
)
from gapo.rewards.math.cases import CASES, HACKS
from gapo.rewards.math.latex import (
    NEGATIONS,
    RELATIONS,
    UNICODE_OPERATORS,
    UNKNOWN_OPERATOR,
    operator_error,
    strip_formatting,
    unicode_operators,
)
from gapo.rewards.math.verify_pool import PoolBroken, VerifyPool
from tests.math_pool_room import ROOMY

KEYS = {"score", "acc", "pred", "format_error", "timeout", "reason"}
# Every item here is legitimate (none is built to time out): graded with room (tests.math_pool_room).
pytestmark = pytest.mark.usefixtures("roomy_math_pool")


@pytest.fixture(scope="module")
def pool():
    with VerifyPool(num_workers=2, **ROOMY) as p:
        yield p


# ---- the table ----

def test_hack_table_covers_each_class_with_right_and_wrong_answers():
    assert len({c.name for c in HACKS}) == len(HACKS), "case names must be unique"
    assert not {c.name for c in HACKS} & {c.name for c in CASES}
    for prefix in ("cond_", "solved_", "dec_", "exact_", "box_", "delim_", "false_eq_", "true_eq_", "uni_",
                   "sideless_", "negated_", "operator_", "wrap_"):
        group = [c for c in HACKS if c.name.startswith(prefix)]
        assert len(group) >= 4, prefix
    # third red team: each class holds several spellings, both right and wrong
    for prefix in ("wrapped_", "unknown_", "text_", "set_", "side_", "restated_", "repeat_", "eq_side_", "vector_",
                   "tie_"):
        group = [c for c in HACKS if c.name.startswith(prefix)]
        assert sum(c.correct for c in group) >= 1 and sum(not c.correct for c in group) >= 1, prefix
        assert len(group) >= 5, prefix
    assert sum(c.correct for c in HACKS) >= 40 and sum(not c.correct for c in HACKS) >= 40
    assert all(c.reason in REASONS for c in HACKS if c.reason)


@pytest.mark.parametrize("case", HACKS, ids=[c.name for c in HACKS])
def test_hack_verdict(case, pool):
    result = score_math(case.response, case.gold, require_think=case.require_think, problem=case.problem, pool=pool)
    assert set(result) == KEYS
    assert result["acc"] is case.correct, result
    assert result["score"] == (1.0 if case.correct else 0.0)
    assert result["timeout"] is False, result
    if case.correct:
        assert result["reason"] == "" and result["format_error"] is False
    else:
        assert result["reason"] in REASONS
        assert result["format_error"] is (result["reason"] in FORMAT_REASONS)
        if case.reason:
            assert result["reason"] == case.reason, result


def test_batch_gives_the_table_verdicts(pool):
    out = score_math_batch([c.response for c in HACKS], [c.gold for c in HACKS], problems=[c.problem for c in HACKS],
                           pool=pool)
    assert [r["acc"] for r in out] == [c.correct for c in HACKS]


# ---- the red-team report's examples ----

def test_report_examples(pool):
    assert score_math(r"\boxed{x^2 - 3x + 2 < 0}", "(1, 2)", pool=pool)["reason"] == "unsolved_relation"
    assert score_math(r"\boxed{1 < x < 2}", "(1, 2)", pool=pool)["acc"] is True
    assert score_math(r"\boxed{1.414214}", r"\sqrt{2}", pool=pool)["score"] == 0.0
    assert score_math(r"\boxed{0.5}", r"\frac{1}{2}", pool=pool)["score"] == 1.0
    nested = score_math(r"\boxed{\boxed{7}\boxed{8}}", "8", pool=pool)
    assert nested["score"] == 0.0 and nested["format_error"] and nested["reason"] == "box_in_answer"
    delimited = score_math(r"\boxed{8\) or \(7}", "8", pool=pool)
    assert delimited["score"] == 0.0 and delimited["format_error"] and delimited["reason"] == "math_delimiter"
    assert score_math(r"\boxed{2+2=7}", "7", pool=pool)["reason"] == "false_equation"
    assert score_math(r"\boxed{2+2=4}", "4", pool=pool)["acc"] is True
    assert score_math(r"\boxed{x = 7}", "7", pool=pool)["acc"] is True
    for seven in ["\uff17", "\U0001d7d5"]:
        assert score_math(rf"\boxed{{{seven}}}", "7", pool=pool)["acc"] is True
    assert score_math("\\boxed{1\u200b7}", "17", pool=pool)["acc"] is True


# ---- second red team: every macro of the operator table, decided ----

EVALUATED = {"bmod", "mod", "pmod", "pod"}  # integer residues: ``7 \bmod 8`` is 7, rightly


@pytest.mark.parametrize("macro", sorted(UNKNOWN_OPERATOR - EVALUATED))
def test_no_operator_is_paid_as_one_of_its_sides(macro, pool):
    r"""``7 \m 8`` for every statement or value-less macro: neither side is paid, whatever math-verify reads."""
    for gold in ("7", "8"):
        result = score_math(rf"\boxed{{7 \{macro} 8}}", gold, pool=pool)
        assert result["acc"] is False and result["reason"] == "unknown_operator", (macro, gold, result)


@pytest.mark.parametrize("macro", sorted(EVALUATED))
def test_residues_are_evaluated(macro, pool):
    arg = "{8}" if macro in ("pmod", "pod") else " 8"
    assert score_math(rf"\boxed{{15 \{macro}{arg}}}", "7", pool=pool)["acc"] is True
    assert score_math(rf"\boxed{{15 \{macro}{arg}}}", "8", pool=pool)["acc"] is False
    assert score_math(rf"\boxed{{y \{macro}{arg}}}", "8", pool=pool)["reason"] == "unknown_operator"


@pytest.mark.parametrize("relation", [r for r in RELATIONS if r not in NEGATIONS])
def test_no_relation_without_a_side_is_paid(relation, pool):
    for answer in (f"{relation} 7", f"7 {relation}"):
        result = score_math(rf"\boxed{{{answer}}}", "7", pool=pool)
        assert result["acc"] is False and result["reason"] in ("sideless_relation", "unknown_operator"), (
            answer, result)


@pytest.mark.parametrize("negation", NEGATIONS)
def test_no_negation_is_paid_as_what_it_negates(negation, pool):
    result = score_math(rf"\boxed{{{negation} 7}}", "7", pool=pool)
    assert result["acc"] is False and result["reason"] in ("negated", "unknown_operator"), result


def test_unicode_signs_are_their_macros():
    assert unicode_operators("x \u2265 7") == "x \\geq  7"
    assert unicode_operators("7 \u2223 8") == "7 \\mid  8" and unicode_operators("7") == "7"
    assert all(v.startswith("\\") for v in UNICODE_OPERATORS.values())


def test_a_gold_with_the_macro_lets_math_verify_compare():
    """Refusal is for macros the gold does not use: a gold that asks for a statement gets it compared."""
    assert operator_error(r"AB \parallel CD", [r"AB \parallel CD"]) == ""
    assert operator_error(r"AB \parallel CD", ["7"]) == "unknown_operator"
    assert operator_error(r"\geq 7", [r"\geq 7"]) == ""
    assert operator_error(r"\geq 7", ["7"]) == "sideless_relation"


@pytest.mark.parametrize("wrapped, plain", [
    (r"\textcolor{red}{7}", "7"), (r"{\color{red}7}", "7"), (r"\fcolorbox{a}{b}{\bm{7}}", "7"),
    (r"\underline{\emph{\frac{1}{2}}}", r"\frac{1}{2}"), (r"\frac{\bm{3}}{4}", r"\frac{3}{4}"),
    (r"\textbf{1}\textbf{7}", "17"), (r"2^\textbf{10}", "2^{10}"), (r"x_\bm{ij}", "x_{ij}"),
    (r"\hspace{2pt}7\hspace*{1em}", "7"), (r"\phantom{0}7", "7"), (r"\Large\bf 7", "7"),
    (r"5\,\text{cm}", r"5\,\text{cm}"), (r"\mathrm{d}x", r"\mathrm{d}x"), (r"\textcolor{red}{7", r"\textcolor{red}{7"),
])
def test_strip_formatting(wrapped, plain):
    assert strip_formatting(wrapped) == plain


# ---- numeric_tolerance ----

TOLERATED = [("1.414214", r"\sqrt{2}"), ("0.333333", r"\frac{1}{3}"), ("3.141593", r"\pi"),
             ("0.866025", r"\frac{\sqrt{3}}{2}"), ("0.1000001", "0.1")]


@pytest.mark.parametrize(("pred", "gold"), TOLERATED)
def test_numeric_tolerance_restores_math_verify_rounding(pred, gold, pool):
    strict = score_math(rf"\boxed{{{pred}}}", gold, pool=pool)
    assert strict["acc"] is False and strict["reason"] == "inexact_decimal"
    assert score_math(rf"\boxed{{{pred}}}", gold, numeric_tolerance=True, pool=pool)["acc"] is True


def test_numeric_tolerance_keeps_the_other_rules(pool):
    for response, gold in [(r"\boxed{x^2 - 3x + 2 < 0}", "(1, 2)"), (r"\boxed{2+2=7}", "7"),
                           (r"\boxed{\boxed{1.414214}\boxed{2}}", "2"), (r"\boxed{3.14}", r"\pi")]:
        assert score_math(response, gold, numeric_tolerance=True, pool=pool)["acc"] is False, response
    assert score_math(r"\boxed{2.5}", r"\frac52", numeric_tolerance=True, pool=pool)["acc"] is True


def test_numeric_tolerance_from_reward_kwargs_and_extra_info():
    response = r"So \boxed{1.414214}."
    assert compute_score("math", response, r"\sqrt{2}")["acc"] is False
    assert compute_score("math", response, r"\sqrt{2}", numeric_tolerance=True)["acc"] is True
    assert compute_score("math", response, r"\sqrt{2}", extra_info={"numeric_tolerance": True})["acc"] is True
    # A row's extra_info wins over the reward_kwargs default.
    assert compute_score("math", response, r"\sqrt{2}", extra_info={"numeric_tolerance": False},
                         numeric_tolerance=True)["acc"] is False
    out = compute_score_batch(["math"] * 2, [response] * 2, [r"\sqrt{2}"] * 2,
                              [{"numeric_tolerance": True}, {}])
    assert [r["acc"] for r in out] == [True, False]


def test_pool_passes_options_to_the_worker(pool):
    assert pool.verify(r"\sqrt{2}", "1.414214").equal is False
    assert pool.verify(r"\sqrt{2}", "1.414214", {"numeric_tolerance": True}).equal is True
    assert pool.verify(r"\sqrt{2}", "1.414214").detail == "inexact_decimal"


# ---- never raises ----

class _Unprintable:
    def __str__(self):
        raise RuntimeError("no str")


@pytest.mark.parametrize("gold", ["", "   ", [], [""], ["", " "], _Unprintable()], ids=repr)
def test_bad_gold_scores_zero_with_a_reason(gold, pool):
    result = score_math(r"\boxed{3}", gold, pool=pool)
    assert set(result) == KEYS and result["score"] == 0.0 and result["reason"] == "bad_gold"


@pytest.mark.parametrize("response", [None, 3, b"\\boxed{3}", _Unprintable(), "", "\x00\\boxed{\x00}"], ids=repr)
def test_odd_responses_score_zero_without_raising(response, pool):
    result = score_math(response, "7", pool=pool)
    assert set(result) == KEYS and result["score"] == 0.0 and result["reason"] in REASONS


def test_one_bad_row_does_not_spoil_the_batch(pool):
    out = score_math_batch([r"\boxed{3}", r"\boxed{3}", None], ["3", "", "3"], pool=pool)
    assert [r["acc"] for r in out] == [True, False, False]
    assert [r["reason"] for r in out] == ["", "bad_gold", "no_box"]


def test_a_broken_pool_scores_zero_instead_of_raising():
    class BrokenPool:
        def submit(self, *args):
            raise PoolBroken("workers cannot start")

    result = score_math(r"\boxed{3}", "3", pool=BrokenPool())
    assert result["score"] == 0.0 and result["reason"] == "grader_error" and set(result) == KEYS
    closed = VerifyPool(num_workers=1)
    closed.close()
    assert score_math(r"\boxed{3}", "3", pool=closed)["reason"] == "grader_error"


def test_unparseable_gold_is_a_grader_error_not_a_crash(pool):
    result = score_math(r"\boxed{3}", r"\frac{", pool=pool)
    assert result["score"] == 0.0 and result["reason"] in {"grader_error", "wrong", "unparsed"}


# ---- helpers ----

def test_normalize_unicode():
    assert normalize_unicode("plain ascii \\frac12") == "plain ascii \\frac12"
    assert normalize_unicode("\uff11\uff17") == "17"
    assert normalize_unicode("1\u200b\u200c\u200d\u2060\ufeff\u00ad7") == "17"
    assert normalize_unicode("\U0001d7cf\U0001d7d5") == "17"  # math bold 1 7
    assert normalize_unicode("\u0661\u0667 \u06f1\u06f7 \u0967\u096d") == "17 17 17"
    assert normalize_unicode("x\u00b2 + 10\u207b\u00b9\u00b2") == "x^{2} + 10^{-12}"
    assert normalize_unicode("a\u2081\u2080") == "a_{10}"
    assert normalize_unicode("3\u00bd") == r"3\frac{1}{2}"
    assert normalize_unicode("\u22127") == "-7"
    assert normalize_unicode("45\u00ba") == "45\u00b0"
    assert normalize_unicode("\\boxed\uff5b\uff17\uff5d") == r"\boxed{7}"


def test_last_boxed_takes_the_outermost_last_box():
    assert last_boxed(r"\boxed{\boxed{7}\boxed{8}}") == r"\boxed{7}\boxed{8}"
    assert last_boxed(r"\boxed{7} then \boxed{\fbox{8}}") == r"\fbox{8}"
    assert last_boxed(r"\boxed{7} and \boxed{8}") == "8"
    assert last_boxed(r"\boxed{\boxed{7}") is None  # the outer box never closes
    assert last_boxed(r"\(\boxed 7\)") == "7"
    assert last_boxed(r"\[\boxed 7\]") == "7"


def test_extract_answer_format_errors():
    assert extract_answer(r"\boxed{\boxed{7}}").answer == "7"
    assert extract_answer(r"\boxed{\boxed{7}.}").answer == "7"
    assert extract_answer(r"\boxed{\boxed{7}\boxed{8}}").error == "box_in_answer"
    assert extract_answer(r"\boxed{7 \fbox{8}}").error == "box_in_answer"
    for inner in [r"8\) or \(7", r"8\] or \[7", "8$ or $7", "$7$", r"\(7\)", r"\text{$7$}"]:
        assert extract_answer(rf"\boxed{{{inner}}}").error == "math_delimiter", inner


def test_has_math_delimiter():
    for text in ["$7$", r"\(7\)", r"7\)", r"\[7", r"x\]", r"\\\(7"]:
        assert has_math_delimiter(text), text
    for text in [r"\$18.90", r"\begin{pmatrix}1\\[2pt]2\end{pmatrix}", r"\left(1, 2\right]", r"[1, 2)", r"\{1\}",
                 r"\\(1)"]:
        assert not has_math_delimiter(text), text


def test_repeating_decimals_become_fractions():
    assert normalize_answer(r"0.\overline{3}") == r"\frac{1}{3}"
    assert normalize_answer(r"0.1\overline{6}") == r"\frac{1}{6}"
    assert normalize_answer(r"1.\overline{9}") == "2"
    assert normalize_answer(r"2.\overline{142857}") == r"\frac{15}{7}"
    assert normalize_answer(r"-0.\overline 3") == r"-\frac{1}{3}"
    assert normalize_answer(r"\overline{AB}") == r"\overline{AB}"


def test_gold_is_normalised_like_the_answer():
    assert gold_answers("\uff11\uff17") == ["17"]
    assert gold_answers("1\u200b7") == ["17"]
    # Gold is trusted: its math delimiters are unwrapped, not a format error.
    assert gold_answers([r"\(\frac{1}{2}\)", r"\[\frac{1}{2}\]", r"$\frac{1}{2}$"]) == [r"\frac{1}{2}"] * 3
    with pytest.raises(ValueError):
        gold_answers([])


# ---- the result keys ----

def test_reason_is_a_registered_result_key():
    assert RESULT_DEFAULTS["reason"] == ""
    assert set(compute_score("math", r"\boxed{1}", "1")) >= KEYS


def test_reason_key_is_declared_before_any_math_item():
    """verl builds its info arrays from the first item's keys: a code item scored before the first math
    item of a fresh process must already carry ``reason``. math_answer registers the key only when it is
    first imported (on the first math item), so the declaration must come from import time of
    ``gapo.rewards`` (today the code scorer's ``RESULT_KEYS`` declares it, with the same default "")."""
    script = ("from gapo.rewards import compute_score_batch\n"
              "out = compute_score_batch(['gapo_smoke', 'math'], [' b', r'\\boxed{1}'], ['abc', '1'], [{'index': 0}, None])\n"
              "assert set(out[0]) == set(out[1]), out\n")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)

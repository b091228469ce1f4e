"""Math reward: the final ``\\boxed{}`` answer after the reasoning, checked by math-verify in worker processes.

Rules (those of DeepScaleR / rllm, the recipes this project reproduces, made strict where a lenient
reading would pay for an answer that is not one), applied in this order:

1. **Reasoning.** If the response contains ``</think>``, only the text after the last one counts; if
   that text opens a new ``<think>``, the response is truncated. A ``<think>`` with no ``</think>`` is
   a truncated response. With ``require_think=True`` (set it for models whose chat template opens
   ``<think>`` in the prompt, e.g. DeepSeek-R1-Distill: their responses show only the closing tag) a
   response without ``</think>`` is truncated too. Truncated: score 0, ``format_error``.
2. **Answer.** The last *outermost* ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed 7``) of that
   text, by brace matching (escaped ``\\{ \\}`` do not count); a box inside another box is part of
   the outer box's content, and an unclosed box runs to the end of the text. A box whose whole content
   is one box is unwrapped (``\\boxed{\\boxed{7}}`` is 7). Score 0 with ``format_error`` for: no box,
   an unclosed or empty box, a box still holding a box after unwrapping (``\\boxed{\\boxed{7}\\boxed{8}}``:
   two answers), a math delimiter ``$ \\( \\) \\[ \\]`` inside the answer (``\\boxed{8\\) or \\(7}``).
   Parsing only this answer, not the whole text, is what keeps a self-correcting
   ``\\boxed{3} ... \\boxed{5}`` from being read as the set {3, 5}, and a box inside the reasoning
   from earning credit; it is also faster on long outputs.
3. **Unicode.** The box content is normalised before anything else reads it (the whole text too, but
   only when no box is found without that): invisible characters (zero-width space / joiners, word
   joiner, BOM, soft hyphen, bidi controls, variation selectors: every format character) are removed,
   superscripts and subscripts become ``^{}`` / ``_{}`` (``10⁶`` is ``10^{6}``, not ``106``; ``⁷``
   alone is 7), vulgar fractions become ``\\frac{}{}`` (``3½`` is 7/2), then NFKC (fullwidth ``７``,
   math-bold ``𝟕``, circled ``⑦`` -> ``7``) and every other Unicode decimal digit (Arabic-Indic
   ``٧``, Devanagari ``७``, ...) becomes its ASCII digit. Gold answers get the same normalisation.
   Unicode math is then written as the LaTeX it stands for (:func:`gapo.rewards.math.latex.unicode_math`):
   ``√2`` is ``\\sqrt{2}``, ``π`` ``\\pi``, ``≤`` ``\\leq``, ``×`` ``\\times``, ``°`` ``^{\\circ}``, Greek letters
   their macros; a non-breaking or thin space is a space, and so is TeX's tie ``~`` (``\\boxed{~7}`` is 7).
4. **Caps** (before any parsing; math-verify's cost grows with nesting, ~0.1 s per level):
   at most ``MAX_ANSWER_CHARS`` characters and ``MAX_ANSWER_DEPTH`` nested brackets ``( [ {``.
   Over a cap: score 0, ``format_error``.
5. **Equivalence.** ``verify(parse(gold), parse(pred))``, gold first, each wrapped as inline math
   ``$...$`` (measured on the case table: ``\\boxed{}`` wrapping misreads ``25\\%``, bare text misreads
   ``\\frac12`` and intervals), with these rules on top of math-verify (see ``gapo.rewards.math._worker``):

   - *only what the parser understood is graded* (:mod:`gapo.rewards.math.understood`, before math-verify):
     every token of the answer, once known-meaningless formatting is stripped, must be one latex2sympy
     understands (a whitelist checked against its lexer) or one the gold uses; an unknown macro or sign, prose in
     ``\\text{}``, two numbers side by side (``7 \\quad 8``), a group holding only a relation (``{\\geq} 7``)
     score 0 with reason ``unparsed``. The worker grades only latex2sympy's reading of the whole prediction, never
     a number math-verify's fallback found in text the parser refused;
   - *a computation restated is not done* (reason ``unevaluated``): ``\\sum``, ``\\prod``, ``\\int``, ``\\lim``,
     binomial coefficients, a factorial of anything but an integer up to 6 (``5!`` for 120 is right, ``7!`` for
     5040 is not), unless the gold uses the same operation; and, for a plain-number gold, the problem's own
     expression (``problem``: ``extra_info["problem"]``);
   - *right answers in other notations*: digit groups (``1 000 000``), repeating decimals (``0.\\overline{3}``,
     ``0.\\dot{3}``, ``0.(3)``), a final percent sign, units (``12 \\text{ cm}``) and a lead-in
     (``\\text{The answer is }``) are read as math-verify read them; an equation may name its variable on either
     side (``7 = x`` for 7); a vector may be a tuple or a one-column (one-row) matrix, whichever the gold uses;

   - *decimals are exact*: a decimal in the prediction means the exact number it writes (``0.5`` is
     1/2, ``1.414214`` is 1414214/10^6), so it is right only if it equals the gold exactly: ``2.5`` for
     ``5/2`` is right, ``1.414214`` for ``\\sqrt{2}`` or ``0.333`` for ``1/3`` or ``3.14`` for ``\\pi`` is
     wrong (reason ``inexact_decimal`` where math-verify's tolerance would have taken it, else ``wrong``).
     ``numeric_tolerance=True`` restores math-verify's tolerance (floats rounded to 6 decimals). A
     repeating decimal ``0.\\overline{3}`` is exact (1/3). A gold written as a decimal is exact too when
     the prediction is a decimal (``0.1000001`` is not ``0.1``);
   - *a relation must be solved*: an inequality (or chain, ``\\ne``, ``\\in``) is an answer only when it
     is a variable against constants (``1 < x < 2`` or ``x \\in (1, 2)`` for ``(1, 2)``, ``k \\geq 2`` for
     ``[2, \\infty)``); a restated condition (``x^2 - 3x + 2 < 0``, ``(x-1)(x-2) < 0``) is wrong
     (``unsolved_relation``), and so is an equation that is not solved when the gold is a set. An
     equation against a value keeps math-verify's reading (``x = 7`` for 7: its right side);
   - *an equation must be true*: one whose constant sides differ (``2+2=7``, ``x = 3 = 4``) is wrong
     (``false_equation``); a true one is read by its last side (``2+2=4`` for 4 is right);
   - *a set is not a tuple*: ``\\{1, 2\\}`` or ``S = \\{1, 2\\}`` for the pair / interval ``(1, 2)`` is wrong.
   - *a statement is not a value* (:mod:`gapo.rewards.math.latex`, checked before math-verify): a relation
     with no side (``\\geq 7``: ``sideless_relation``), a negation with no left side (``\\ne 7``: ``negated``),
     and statements or value-less operators math-verify reads as one of their sides (``7 \\mid 8``,
     ``7 \\parallel 8``, ``7 \\in 8``, ``7 \\cup 8``: ``unknown_operator``) are wrong unless the gold uses the
     same macro; Unicode signs (``≥``, ``∣``) count as their macros; integer residues are evaluated
     (``15 \\bmod 8`` is 7). Formatting (colour, bold, underline, size, spacing) is stripped from both sides
     first (``\\textcolor{red}{7}`` is 7).

   A ground truth given as a list accepts any of its items.
   Timeout (soft alarm in the worker or hard kill): score 0, ``timeout``.

The scorer never raises on a response or a ground truth: anything that cannot be graded scores 0 with
its ``reason`` (only a batch whose lengths disagree raises, a caller bug). The result has verl's
custom-reward shape: ``score`` (1.0 / 0.0), ``acc`` (bool), ``pred`` (the extracted answer, at most
``PRED_LOG_CHARS`` characters; verl uses it for maj@n), ``format_error`` (bool), ``timeout`` (bool),
``reason`` (``""`` when right, else one of ``REASONS``). Every call returns the same keys, as verl's
reward loop requires.

Options (``reward.custom_reward_function.reward_kwargs``, or per row in ``extra_info``, which wins):
``require_think`` (default off, rule 1) and ``numeric_tolerance`` (default off, rule 5). A row's
``extra_info["problem"]`` (written by ``gapo.data.prepare_math``) feeds the restated-computation rule.
"""

from __future__ import annotations

import functools
import logging
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from gapo.rewards import register_result_key
from gapo.rewards.math.latex import evaluate_modulo, operator_error, strip_formatting, unicode_math
from gapo.rewards.math.latex import match_braces as _match_braces
from gapo.rewards.math.understood import UNEVALUATED, UNPARSED, not_understood, restated, strip_units
from gapo.rewards.math.verify_pool import Verdict, VerifyPool, get_pool

logger = logging.getLogger(__name__)
_errors_logged = 0

MAX_ANSWER_CHARS = 400  # longest MATH-500 answer is 159 characters; matrices and unions fit
MAX_ANSWER_DEPTH = 10  # legit answers nest 2-4 deep; parsing costs ~0.1 s per level
PRED_LOG_CHARS = 100
MAX_ERRORS_LOGGED = 20
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

# Why a result scored 0 (``reason``); ``""`` when right. The first group also sets ``format_error``.
FORMAT_REASONS = ("truncated", "no_box", "empty_box", "box_in_answer", "math_delimiter", "too_long", "too_deep")
REASONS = FORMAT_REASONS + (
    "wrong",  # parsed, graded, not equal
    "unparsed",  # something the parser does not understand (would drop or misread), or nothing read at all
    "unevaluated",  # a computation restated, not done: \sum, \int, 7!, the problem's own expression
    "inexact_decimal",  # a decimal that only approximates an exact gold (see numeric_tolerance)
    "unsolved_relation",  # a condition restated instead of solved
    "sideless_relation",  # a relation with no side: \geq 7 is "at least 7", not 7 (gapo.rewards.math.latex)
    "negated",  # a negation with no left side: \ne 7, \not 7
    "unknown_operator",  # a statement or value-less operator math-verify would read as one side: 7 \mid 8
    "false_equation",  # an equation whose constant sides differ
    "timeout",
    "grader_error",  # worker error, pool failure, unparseable gold: a grading failure, logged
    "bad_gold",  # empty or unreadable ground truth, logged
)
register_result_key("reason", "")

_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
# ``\boxed 7``: one token up to a space, ``$``, or a closing math delimiter ``\)`` / ``\]``.
_BARE_TOKEN = re.compile(r"(?:[^\s$\\]|\\[^\s)\]])+")
_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")
# Tokens of an answer for the delimiter check: ``\\`` (a line break) is one token, so ``\\[2pt]`` is
# not ``\[``; an escaped ``\$`` is a dollar sign, not a delimiter.
_ESCAPE_OR_DOLLAR = re.compile(r"\\.|\$", re.DOTALL)
MATH_DELIMITERS = frozenset({"$", "\\(", "\\)", "\\[", "\\]"})
_WRAPPED_MATH = re.compile(r"^\\\((.*)\\\)$|^\\\[(.*)\\\]$", re.DOTALL)
# Thousands separators math-verify misses: ``10\,000`` (thin space), ``10{,}000`` (braced comma).
_THOUSANDS_SEP = re.compile(r"(?<=\d)(?:\\,|\{,\})(?=\d{3}(?!\d))")
# ``1.5e6`` reads as 1.5 * e * 6 to math-verify; a whole-answer number in e-notation becomes ``\times 10^{}``.
_E_NOTATION = re.compile(r"^([+-]?\d+(?:\.\d*)?|[+-]?\.\d+)[eE]([+-]?\d+)$")
# Repeating decimals, which math-verify reads as 0, 0.1*bar, ... or not at all: ``0.\overline{3}``, ``1.\overline 3``,
# ``0.\dot{3}``, ``0.\dot{1}4285\dot{7}`` (dots over the period's first and last digits), ``0.1(6)``.
_DIGIT = r"(?:\{\s*(\d)\s*\}|(\d))"
_REPEATING = re.compile(r"(?<![\d.])(\d*)\.(\d*)(?:\\overline\s*(?:\{\s*(\d+)\s*\}|(\d))"
                        rf"|\\dot\s*{_DIGIT}(?:(\d*)\\dot\s*{_DIGIT}|(?!\d))|\((\d+)\)(?![\d.]))")
# Digit groups: ``1 000 000``, ``10~000``, ``1\ 000`` (a non-breaking or thin space is a space after NFKC)
_DIGIT_GROUPS = re.compile(r"(?<![\d.])\d{1,3}(?:(?:\s|~|\\ )+\d{3})+(?![\d])")
_GROUP_SPACE = re.compile(r"(?:\s|~|\\ )+")
_UNESCAPED_TIE = re.compile(r"(?<!\\)~")  # TeX's non-breaking space
_LBRACE, _RBRACE = re.compile(r"\\lbrace(?![A-Za-z])\s*"), re.compile(r"\\rbrace(?![A-Za-z])\s*")
_LEADING_EQUALS = re.compile(r"^\s*=(?!=)")  # ``= 7`` says the value
# A percent sign ending the answer or an item: math-verify's parser fails on ``25\%`` and its fallback read 25.
_PERCENT_END = re.compile(r"\s*(?:\\%|(?<!\\)%)(?=\s*(?:$|,|;|\)|\]|\\right))")
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")
_DEGREE_LOOKALIKES = {"\u00ba": "\u00b0", "\u02da": "\u00b0"}  # ordinal o and ring above, written for degrees
_SLASHES = {"\u2044": "/", "\u2215": "/"}  # fraction slash, division slash
# Invisible code points that are not format characters (category Cf, all removed too): combining grapheme
# joiner, Mongolian vowel separator, Hangul fillers, variation selectors, the keycap mark.
_INVISIBLE_EXTRA = frozenset("\u034f\u180e\u115f\u1160\u3164\uffa0\u20e3" + "".join(map(chr, range(0xFE00, 0xFE10))))


@dataclass(frozen=True)
class Extraction:
    """The answer to check, or why there is none (``error``: one of ``FORMAT_REASONS``)."""

    answer: str | None
    error: str = ""


# ---- Unicode ----

@functools.lru_cache(maxsize=8192)
def _char_kind(ch: str) -> tuple[str, str]:
    """(kind, replacement) of one non-ASCII character; kind: ``drop``, ``super``, ``sub`` or ``text``."""
    if ch in _INVISIBLE_EXTRA or unicodedata.category(ch) == "Cf":
        return "drop", ""
    if ch in _DEGREE_LOOKALIKES:
        return "text", _DEGREE_LOOKALIKES[ch]
    if ch in _SLASHES:
        return "text", _SLASHES[ch]
    decomposition = unicodedata.decomposition(ch)
    if decomposition.startswith("<super>"):
        return "super", _plain(ch)
    if decomposition.startswith("<sub>"):
        return "sub", _plain(ch)
    if decomposition.startswith("<fraction>"):  # ½ -> \frac{1}{2}, so that 3½ is the mixed number 7/2
        num, _, den = _plain(ch).partition("\u2044")
        return "text", f"\\frac{{{num}}}{{{den}}}" if num and den else _plain(ch).replace("\u2044", "/")
    return "text", _plain(ch)


def _plain(ch: str) -> str:
    """NFKC of ``ch`` with ASCII digits and an ASCII minus (``⁻`` and ``₋`` decompose to U+2212)."""
    return _digits_ascii(unicodedata.normalize("NFKC", ch)).replace("\u2212", "-")


def _digits_ascii(text: str) -> str:
    """Every Unicode decimal digit (category Nd: Arabic-Indic, Devanagari, ...) as its ASCII digit."""
    if text.isascii():
        return text
    return "".join(str(unicodedata.decimal(c)) if not c.isascii() and unicodedata.decimal(c, None) is not None
                   else c for c in text)


def _normalize_run(match: re.Match) -> str:
    out: list[str] = []
    script_kind, script = "", []  # a super/subscript being collected into ^{...} / _{...}
    plain_kind = ""  # a super/subscript with nothing to attach to, written as plain text (``⁷`` alone is 7)
    start = match.start()
    prev = match.string[start - 1] if start else ""  # what a superscript would attach to

    def flush():
        if script:
            out.append(("^{" if script_kind == "super" else "_{") + "".join(script) + "}")
            script.clear()

    for ch in match.group():
        kind, rep = _char_kind(ch)
        if kind in ("super", "sub"):
            if kind == plain_kind:
                out.append(rep)
            elif script and kind == script_kind:
                script.append(rep)
            elif script or _is_base(prev):
                flush()
                script_kind = kind
                script.append(rep)
            else:
                plain_kind = kind
                out.append(rep)
            continue
        plain_kind = ""
        flush()
        out.append(rep)
        if rep:
            prev = rep[-1]
    flush()
    return unicodedata.normalize("NFKC", "".join(out))  # composes what per-character NFKC could not


def _is_base(ch: str) -> bool:
    return bool(ch) and not ch.isspace() and ch not in "([{,;:=+-*/<>|&^_$"


def normalize_unicode(text: str) -> str:
    """Rule 2 of the module docstring; ASCII text is returned as it is (the common, fast case)."""
    if text.isascii():
        return text
    return _NON_ASCII.sub(_normalize_run, text)


# ---- extraction ----

def answer_region(response: str, require_think: bool = False) -> str | None:
    """Text that may hold the final answer: after the last ``</think>``; ``None`` if truncated."""
    end = response.rfind(THINK_CLOSE)
    if end >= 0:
        tail = response[end + len(THINK_CLOSE):]
        return None if THINK_OPEN in tail else tail
    if require_think or THINK_OPEN in response:
        return None
    return response


def _box_at(text: str, match: re.Match) -> tuple[str, int] | None:
    """(content, end index) of the box whose command ``match`` found; ``None`` if unclosed or empty."""
    pos = match.end()
    while pos < len(text) and text[pos] in " \t":
        pos += 1
    if pos < len(text) and text[pos] == "{":
        end = _match_braces(text, pos)
        return None if end is None else (text[pos + 1:end - 1], end)
    # ``\boxed 7``: TeX takes one token; models write the whole answer up to a space or ``$``.
    token = _BARE_TOKEN.match(text, pos)
    return (token.group(), token.end()) if token else None


def last_boxed(text: str) -> str | None:
    """Content of the last outermost ``\\boxed{}`` / ``\\fbox{}`` / ``\\boxed X``; ``None`` if none or unclosed.

    Boxes are read left to right, each search resuming after the previous box's end, so a box inside
    a box is part of the outer content (``\\boxed{\\boxed{7}\\boxed{8}}`` gives ``\\boxed{7}\\boxed{8}``),
    and an unclosed box, which runs to the end of the text, makes the answer ``None``.
    """
    found = None
    pos = 0
    while True:
        m = _BOX.search(text, pos)
        if m is None:
            return found
        box = _box_at(text, m)
        if box is None:
            return None
        found, pos = box


def _unwrap_boxes(answer: str) -> str:
    """``\\boxed{\\boxed{7}}`` -> ``7``; a box followed by more text is left as it is."""
    while True:
        answer = answer.strip()
        m = _BOX.match(answer)
        box = _box_at(answer, m) if m else None
        if box is None or answer[box[1]:].strip() not in ("", "."):
            return answer
        answer = box[0]


def has_math_delimiter(answer: str) -> bool:
    """True if ``answer`` has an unescaped ``$`` or a ``\\( \\) \\[ \\]`` (``\\\\[2pt]`` is a line break)."""
    if "$" not in answer and "\\" not in answer:
        return False
    return any(m.group() in MATH_DELIMITERS for m in _ESCAPE_OR_DOLLAR.finditer(answer))


def _repeating_to_fraction(m: re.Match) -> str:
    whole, fixed = m.group(1), m.group(2)
    period = (m.group(3) or m.group(4) or m.group(9) or
              (m.group(5) or m.group(6) or "") + (m.group(7) or "") + (m.group(8) or m.group(10) or ""))
    if m.group(9) is None and m.group(7) is not None and not (m.group(8) or m.group(10)):
        return m.group()  # a first dot without its last: not a notation known here
    value = Fraction(int(whole or 0)) + Fraction(int(fixed or 0), 10 ** len(fixed))
    value += Fraction(int(period), 10 ** len(fixed) * (10 ** len(period) - 1))
    return str(value.numerator) if value.denominator == 1 else f"\\frac{{{value.numerator}}}{{{value.denominator}}}"


def normalize_answer(answer: str) -> str:
    """Cheap rewrites math-verify does not do itself: no ``$``, TeX ties ``~`` as spaces, Unicode math as LaTeX
    (``≥`` is ``\\geq``, ``√2`` is ``\\sqrt{2}``: :func:`gapo.rewards.math.latex.unicode_math`), no formatting macros
    (colour, weight, underline, size, spacing: :func:`gapo.rewards.math.latex.strip_formatting`), digit groups and
    thousands separators, repeating decimals, a leading ``=``, a final percent sign, units and a lead-in text at the
    end or start (:func:`gapo.rewards.math.understood.strip_units`), e-notation, integer residues
    (``15 \\bmod 8`` is 7), no final period."""
    answer = _UNESCAPED_TIE.sub(" ", _UNESCAPED_DOLLAR.sub("", answer))
    answer = strip_formatting(unicode_math(answer.strip()))
    if answer.endswith(".") and not answer.endswith(".."):  # "7." is 7; "1, 2, ..." keeps its dots
        answer = answer[:-1].rstrip()
    answer = answer.replace("\\varnothing", "\\emptyset")  # math-verify knows only the latter
    answer = _LBRACE.sub("\\{", _RBRACE.sub("\\}", answer))  # latex2sympy reads only \{ \} as a set's braces
    answer = _THOUSANDS_SEP.sub(lambda m: "," if m.group() == "{,}" else "", answer)
    answer = _DIGIT_GROUPS.sub(lambda m: _GROUP_SPACE.sub("", m.group()), answer)
    if "." in answer:
        answer = _REPEATING.sub(_repeating_to_fraction, answer)
    answer = strip_units(_PERCENT_END.sub("", _LEADING_EQUALS.sub("", answer))).strip()
    m = _E_NOTATION.match(answer)
    if m:
        answer = f"{m.group(1)}\\times 10^{{{int(m.group(2))}}}"
    return evaluate_modulo(answer)


def nesting_depth(text: str) -> int:
    """Deepest nesting of ``( [ {`` (closers of any kind close), e.g. 2 for ``\\frac{\\sqrt{2}}{2}``."""
    depth = deepest = 0
    for ch in text:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}" and depth:
            depth -= 1
    return deepest


def extract_answer(response: str, require_think: bool = False) -> Extraction:
    """Apply rules 1-4 of the module docstring to a model response."""
    region = answer_region(response, require_think)
    if region is None:
        return Extraction(None, "truncated")
    # Normalising only the box content is what keeps long non-ASCII reasoning cheap (~12 ms for 34 KB of
    # CJK text in full); the whole region is normalised only when no box is found without it.
    boxed = last_boxed(region)
    if boxed is None and not region.isascii():
        boxed = last_boxed(normalize_unicode(region))  # a box command written with invisible / fullwidth characters
    if boxed is None:
        return Extraction(None, "no_box")
    if len(boxed) > 4 * MAX_ANSWER_CHARS:  # before normalising: its cost grows with the length
        return Extraction(boxed[:PRED_LOG_CHARS], "too_long")
    answer = _unwrap_boxes(normalize_unicode(boxed))
    if len(answer) > MAX_ANSWER_CHARS:
        return Extraction(answer[:PRED_LOG_CHARS], "too_long")
    if _BOX.search(answer):
        return Extraction(answer[:PRED_LOG_CHARS], "box_in_answer")
    if has_math_delimiter(answer):
        return Extraction(answer[:PRED_LOG_CHARS], "math_delimiter")
    answer = normalize_answer(answer)
    if not answer:
        return Extraction(None, "empty_box")
    if nesting_depth(answer) > MAX_ANSWER_DEPTH:
        return Extraction(answer[:PRED_LOG_CHARS], "too_deep")
    return Extraction(answer)


def gold_answers(ground_truth) -> list[str]:
    """Ground truth as a list of acceptable answers: str, number, or list of those; ``\\boxed`` unwrapped.

    Raises ``ValueError`` if nothing is left (the scorers turn that into a 0 with reason ``bad_gold``).
    """
    if hasattr(ground_truth, "tolist"):  # numpy scalars / arrays from verl's non_tensor_batch
        ground_truth = ground_truth.tolist()
    items = ground_truth if isinstance(ground_truth, (list, tuple)) else [ground_truth]
    golds = []
    for item in items:
        text = normalize_unicode(str(item).strip())
        boxed = last_boxed(text) if _BOX.search(text) else None
        text = _unwrap_boxes(boxed if boxed is not None else text)
        m = _WRAPPED_MATH.match(text)  # a gold stored as \(...\) or \[...\] (its $...$ goes in normalize_answer)
        if m:
            text = m.group(1) if m.group(1) is not None else m.group(2)
        text = normalize_answer(text)
        if text:
            golds.append(text)
    if not golds:
        raise ValueError("empty ground truth")
    return golds


# ---- scoring ----

def _result(correct: bool, pred: str = "", format_error: bool = False, timeout: bool = False,
            reason: str = "") -> dict:
    return {"score": 1.0 if correct else 0.0, "acc": bool(correct), "pred": pred[:PRED_LOG_CHARS],
            "format_error": bool(format_error), "timeout": bool(timeout), "reason": "" if correct else reason}


def _log_error(message: str, *args) -> None:
    # A grading failure is scored 0 like a wrong answer, so say so in the log, a bounded number of times.
    global _errors_logged
    if _errors_logged < MAX_ERRORS_LOGGED:
        _errors_logged += 1
        logger.warning(message, *args)


def _reason(verdict: Verdict) -> str:
    if verdict.status == "timeout":
        return "timeout"
    if verdict.status != "ok":
        return "grader_error"
    return verdict.detail if verdict.detail in REASONS else "wrong"


def _combine(answer: str, verdicts: Sequence[Verdict]) -> dict:
    correct = any(v.equal for v in verdicts)
    for v in verdicts:
        if v.status == "error":
            _log_error("math reward could not grade pred %r: %s", answer[:PRED_LOG_CHARS], v.detail)
    reasons = [_reason(v) for v in verdicts]
    # With several acceptable golds, the most telling reason: a specific one over a plain "wrong".
    reason = next((r for r in reasons if r != "wrong"), "wrong")
    return _result(correct, answer, timeout=not correct and any(v.timed_out for v in verdicts), reason=reason)


def _per_item(value, n: int, name: str) -> list[bool]:
    values = list(value) if isinstance(value, (list, tuple)) else [value] * n
    if len(values) != n:
        raise ValueError(f"{n} responses but {len(values)} values of {name}")
    return [bool(v) for v in values]


def score_math_batch(responses: Sequence[str], ground_truths: Sequence, *, require_think=False,
                     numeric_tolerance=False, problems: Sequence[str | None] | None = None,
                     pool: VerifyPool | None = None) -> list[dict]:
    """Score many responses at once: extraction here, all equivalence checks in parallel in the pool.

    ``require_think`` / ``numeric_tolerance``: one bool for all items, or a sequence with one per item.
    ``problems``: each item's problem text (or ``None``), for the restated-computation rule (rule 5).
    Raises only if the lengths disagree; every failure of one item is that item's 0 with a reason.
    """
    n = len(responses)
    if len(ground_truths) != n:
        raise ValueError(f"{n} responses but {len(ground_truths)} ground truths")
    problems = [None] * n if problems is None else [p if isinstance(p, str) else None for p in problems]
    if len(problems) != n:
        raise ValueError(f"{n} responses but {len(problems)} problems")
    think = _per_item(require_think, n, "require_think")
    tolerant = _per_item(numeric_tolerance, n, "numeric_tolerance")
    results: list[dict | None] = []
    pending = []  # (index, answer, futures): everything is submitted before the first wait
    for i, (response, ground_truth) in enumerate(zip(responses, ground_truths)):
        try:
            golds = gold_answers(ground_truth)
        except Exception as exc:  # noqa: BLE001  a bad row must not end the batch
            _log_error("math reward: unusable ground truth (%s): %s", type(ground_truth).__name__, exc)
            results.append(_result(False, reason="bad_gold"))
            continue
        try:
            ext = extract_answer(response if isinstance(response, str) else str(response), think[i])
        except Exception as exc:  # noqa: BLE001  (e.g. a response object whose str() fails)
            _log_error("math reward could not read a response: %r", exc)
            results.append(_result(False, format_error=True, reason="no_box"))
            continue
        if ext.error:
            results.append(_result(False, ext.answer or "", format_error=True, reason=ext.error))
            continue
        # A computation restated, not done; a statement, not a value (gapo.rewards.math.latex); something the
        # parser would drop or misread (gapo.rewards.math.understood).
        refused = UNEVALUATED if restated(ext.answer, golds, problems[i]) else operator_error(ext.answer, golds)
        if not refused and not_understood(ext.answer, golds):
            refused = UNPARSED
        if refused:  # never graded as a value
            results.append(_result(False, ext.answer, reason=refused))
            continue
        results.append(None)
        options = {"numeric_tolerance": True} if tolerant[i] else None
        try:
            pool = pool or get_pool()
            pending.append((i, ext.answer, [pool.submit(gold, ext.answer, options) for gold in golds]))
        except Exception as exc:  # noqa: BLE001  PoolBroken, closed pool: a grading failure, not a raise
            _log_error("math reward: verify pool unavailable: %r", exc)
            results[i] = _result(False, ext.answer, reason="grader_error")
    for i, answer, futures in pending:
        try:
            verdicts = [pool.result(f) for f in futures]
        except Exception as exc:  # noqa: BLE001
            _log_error("math reward: verify pool failed: %r", exc)
            results[i] = _result(False, answer, reason="grader_error")
            continue
        results[i] = _combine(answer, verdicts)
    return results


def score_math(response: str, ground_truth, *, require_think: bool = False, numeric_tolerance: bool = False,
               problem: str | None = None, pool: VerifyPool | None = None) -> dict:
    """Score one response (thread-safe; callers from many threads share the pool's workers)."""
    return score_math_batch([response], [ground_truth], require_think=require_think,
                            numeric_tolerance=numeric_tolerance, problems=[problem], pool=pool)[0]


def _option(extra_info, name: str, default) -> bool:
    # A row's extra_info[name] wins over the reward_kwargs default.
    if isinstance(extra_info, dict) and name in extra_info:
        return bool(extra_info[name])
    return bool(default)


def _problem(extra_info) -> str | None:
    """The row's problem text (``extra_info["problem"]``, written by ``gapo.data.prepare_math``), if any."""
    problem = extra_info.get("problem") if isinstance(extra_info, dict) else None
    return problem if isinstance(problem, str) else None


def compute_score(data_source, solution_str, ground_truth, extra_info=None, require_think: bool = False,
                  numeric_tolerance: bool = False, **kwargs) -> dict:
    """verl custom-reward signature for math sources.

    ``require_think`` and ``numeric_tolerance`` may come from
    ``reward.custom_reward_function.reward_kwargs`` or per row from ``extra_info``; ``**kwargs`` absorbs
    what else verl passes (reward-router settings).
    """
    return score_math(solution_str, ground_truth, require_think=_option(extra_info, "require_think", require_think),
                      numeric_tolerance=_option(extra_info, "numeric_tolerance", numeric_tolerance),
                      problem=_problem(extra_info))


def compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos=None, require_think: bool = False,
                        numeric_tolerance: bool = False, **kwargs) -> list[dict]:
    """Batch form of :func:`compute_score` (the registry's batch hook)."""
    extra_infos = extra_infos if extra_infos is not None else [None] * len(solution_strs)
    return score_math_batch(solution_strs, ground_truths,
                            require_think=[_option(e, "require_think", require_think) for e in extra_infos],
                            numeric_tolerance=[_option(e, "numeric_tolerance", numeric_tolerance)
                                               for e in extra_infos],
                            problems=[_problem(e) for e in extra_infos])

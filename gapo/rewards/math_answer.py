"""Math reward: the final ``\\boxed{}`` answer after the reasoning, checked by math-verify in worker processes.

Rules (those of DeepScaleR / rllm, the recipes this project reproduces), applied in this order:

1. **Reasoning.** If the response contains ``</think>``, only the text after the last one counts; if
   that text opens a new ``<think>``, the response is truncated. A ``<think>`` with no ``</think>`` is
   a truncated response. With ``require_think=True`` (set it for models whose chat template opens
   ``<think>`` in the prompt, e.g. DeepSeek-R1-Distill: their responses show only the closing tag) a
   response without ``</think>`` is truncated too. Truncated: score 0, ``format_error``.
2. **Answer.** The last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed 7``) of that text, by brace
   matching (escaped ``\\{ \\}`` do not count); nested boxes are unwrapped. None, unclosed or empty:
   score 0, ``format_error``. Parsing only this answer, not the whole text, is what keeps a
   self-correcting ``\\boxed{3} ... \\boxed{5}`` from being read as the set {3, 5}, and a box inside the
   reasoning from earning credit; it is also faster on long outputs.
3. **Caps** (before any parsing; math-verify's cost grows with nesting, ~0.1 s per level):
   at most ``MAX_ANSWER_CHARS`` characters and ``MAX_ANSWER_DEPTH`` nested brackets ``( [ {``.
   Over a cap: score 0, ``format_error``.
4. **Equivalence.** ``verify(parse(gold), parse(pred))``, gold first, each wrapped as inline math
   ``$...$`` (measured on the case table: ``\\boxed{}`` wrapping misreads ``25\\%``, bare text misreads
   ``\\frac12`` and intervals). A ground truth given as a list accepts any of its items.
   Timeout (soft alarm in the worker or hard kill): score 0, ``timeout``.

The result has verl's custom-reward shape: ``score`` (1.0 / 0.0), ``acc`` (bool), ``pred`` (the
extracted answer, at most ``PRED_LOG_CHARS`` characters; verl uses it for maj@n), ``format_error``
(bool), ``timeout`` (bool). Every call returns the same keys, as verl's reward loop requires.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from gapo.rewards.verify_pool import Verdict, VerifyPool, get_pool

logger = logging.getLogger(__name__)
_errors_logged = 0

MAX_ANSWER_CHARS = 400  # longest MATH-500 answer is 159 characters; matrices and unions fit
MAX_ANSWER_DEPTH = 10  # legit answers nest 2-4 deep; parsing costs ~0.1 s per level
PRED_LOG_CHARS = 100
MAX_ERRORS_LOGGED = 20
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_BRACE_OR_ESCAPE = re.compile(r"[{}\\]")
_BARE_TOKEN = re.compile(r"[^\s$]+")
_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")
# Thousands separators math-verify misses: ``10\,000`` (thin space), ``10{,}000`` (braced comma).
_THOUSANDS_SEP = re.compile(r"(?<=\d)(?:\\,|\{,\})(?=\d{3}(?!\d))")
# ``1.5e6`` reads as 1.5 * e * 6 to math-verify; a whole-answer number in e-notation becomes ``\times 10^{}``.
_E_NOTATION = re.compile(r"^([+-]?\d+(?:\.\d*)?|[+-]?\.\d+)[eE]([+-]?\d+)$")


@dataclass(frozen=True)
class Extraction:
    """The answer to check, or why there is none (``error``: ``truncated``, ``no_box``, ...)."""

    answer: str | None
    error: str = ""


def answer_region(response: str, require_think: bool = False) -> str | None:
    """Text that may hold the final answer: after the last ``</think>``; ``None`` if truncated."""
    end = response.rfind(THINK_CLOSE)
    if end >= 0:
        tail = response[end + len(THINK_CLOSE):]
        return None if THINK_OPEN in tail else tail
    if require_think or THINK_OPEN in response:
        return None
    return response


def _match_braces(text: str, open_pos: int) -> int | None:
    """Index just past the ``}`` closing the ``{`` at ``open_pos``; ``None`` if it never closes."""
    depth = 0
    pos = open_pos
    while True:
        m = _BRACE_OR_ESCAPE.search(text, pos)
        if m is None:
            return None
        ch = m.group()
        if ch == "\\":
            pos = m.end() + 1  # skip the escaped character: \{ \} \\ do not count
            continue
        depth += 1 if ch == "{" else -1
        pos = m.end()
        if depth == 0:
            return pos


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
    """Content of the last ``\\boxed{}`` / ``\\fbox{}`` / ``\\boxed X`` in ``text``; ``None`` if none or unclosed."""
    last = None
    for last in _BOX.finditer(text):
        pass
    if last is None:
        return None
    box = _box_at(text, last)
    return None if box is None else box[0]


def _unwrap_boxes(answer: str) -> str:
    """``\\boxed{\\boxed{7}}`` -> ``7``; a box followed by more text is left as it is."""
    while True:
        answer = answer.strip()
        m = _BOX.match(answer)
        box = _box_at(answer, m) if m else None
        if box is None or box[1] != len(answer):
            return answer
        answer = box[0]


def normalize_answer(answer: str) -> str:
    """Cheap rewrites math-verify does not do itself: no ``$``, thousands separators, e-notation, no final period."""
    answer = _UNESCAPED_DOLLAR.sub("", answer).strip()
    if answer.endswith(".") and not answer.endswith(".."):  # "7." is 7; "1, 2, ..." keeps its dots
        answer = answer[:-1].rstrip()
    answer = answer.replace("\\varnothing", "\\emptyset")  # math-verify knows only the latter
    answer = _THOUSANDS_SEP.sub(lambda m: "," if m.group() == "{,}" else "", answer)
    m = _E_NOTATION.match(answer)
    if m:
        answer = f"{m.group(1)}\\times 10^{{{int(m.group(2))}}}"
    return answer


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
    """Apply rules 1-3 of the module docstring to a model response."""
    region = answer_region(response, require_think)
    if region is None:
        return Extraction(None, "truncated")
    boxed = last_boxed(region)
    if boxed is None:
        return Extraction(None, "no_box")
    answer = _unwrap_boxes(boxed)
    if len(answer) > MAX_ANSWER_CHARS:
        return Extraction(answer[:PRED_LOG_CHARS], "too_long")
    answer = normalize_answer(answer)
    if not answer:
        return Extraction(None, "empty_box")
    if nesting_depth(answer) > MAX_ANSWER_DEPTH:
        return Extraction(answer[:PRED_LOG_CHARS], "too_deep")
    return Extraction(answer)


def gold_answers(ground_truth) -> list[str]:
    """Ground truth as a list of acceptable answers: str, number, or list of those; ``\\boxed`` unwrapped."""
    if hasattr(ground_truth, "tolist"):  # numpy scalars / arrays from verl's non_tensor_batch
        ground_truth = ground_truth.tolist()
    items = ground_truth if isinstance(ground_truth, (list, tuple)) else [ground_truth]
    golds = []
    for item in items:
        text = str(item).strip()
        boxed = last_boxed(text) if _BOX.search(text) else None
        text = normalize_answer(_unwrap_boxes(boxed if boxed is not None else text))
        if text:
            golds.append(text)
    if not golds:
        raise ValueError(f"empty ground truth: {ground_truth!r}")
    return golds


def _result(correct: bool, pred: str = "", format_error: bool = False, timeout: bool = False) -> dict:
    return {"score": 1.0 if correct else 0.0, "acc": bool(correct), "pred": pred[:PRED_LOG_CHARS],
            "format_error": bool(format_error), "timeout": bool(timeout)}


def _combine(answer: str, verdicts: Sequence[Verdict]) -> dict:
    global _errors_logged
    correct = any(v.equal for v in verdicts)
    for v in verdicts:
        # An error is a grading failure (unparseable gold, parser bug, dead worker): scored 0 like a
        # wrong answer, so say so in the log, a bounded number of times.
        if v.status == "error" and _errors_logged < MAX_ERRORS_LOGGED:
            _errors_logged += 1
            logger.warning("math reward could not grade pred %r: %s", answer[:PRED_LOG_CHARS], v.detail)
    return _result(correct, answer, timeout=not correct and any(v.timed_out for v in verdicts))


def score_math_batch(responses: Sequence[str], ground_truths: Sequence, *, require_think=False,
                     pool: VerifyPool | None = None) -> list[dict]:
    """Score many responses at once: extraction here, all equivalence checks in parallel in the pool.

    ``require_think``: one bool for all items, or a sequence with one per item.
    """
    n = len(responses)
    if len(ground_truths) != n:
        raise ValueError(f"{n} responses but {len(ground_truths)} ground truths")
    think = list(require_think) if isinstance(require_think, (list, tuple)) else [require_think] * n
    pool = pool or get_pool()
    results: list[dict | None] = []
    pending = []  # (index, answer, futures): everything is submitted before the first wait
    for i, (response, ground_truth) in enumerate(zip(responses, ground_truths)):
        golds = gold_answers(ground_truth)
        ext = extract_answer(str(response), bool(think[i]))
        if ext.error:
            results.append(_result(False, ext.answer or "", format_error=True))
            continue
        results.append(None)
        pending.append((i, ext.answer, [pool.submit(gold, ext.answer) for gold in golds]))
    for i, answer, futures in pending:
        results[i] = _combine(answer, [pool.result(f) for f in futures])
    return results


def score_math(response: str, ground_truth, *, require_think: bool = False, pool: VerifyPool | None = None) -> dict:
    """Score one response (thread-safe; callers from many threads share the pool's workers)."""
    return score_math_batch([response], [ground_truth], require_think=require_think, pool=pool)[0]


def _require_think(extra_info, default) -> bool:
    # A row's extra_info["require_think"] wins over the reward_kwargs default.
    if isinstance(extra_info, dict) and "require_think" in extra_info:
        return bool(extra_info["require_think"])
    return bool(default)


def compute_score(data_source, solution_str, ground_truth, extra_info=None, require_think: bool = False,
                  **kwargs) -> dict:
    """verl custom-reward signature for math sources.

    ``require_think`` may come from ``reward.custom_reward_function.reward_kwargs`` or per row from
    ``extra_info``; ``**kwargs`` absorbs what else verl passes (reward-router settings).
    """
    return score_math(solution_str, ground_truth, require_think=_require_think(extra_info, require_think))


def compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos=None, require_think: bool = False,
                        **kwargs) -> list[dict]:
    """Batch form of :func:`compute_score` (the registry's batch hook)."""
    extra_infos = extra_infos if extra_infos is not None else [None] * len(solution_strs)
    return score_math_batch(solution_strs, ground_truths,
                            require_think=[_require_think(e, require_think) for e in extra_infos])

"""Verifiable rewards behind verl's custom-reward hook, dispatched on each row's ``data_source``.

Use from verl: ``reward.custom_reward_function.path=pkg://gapo.rewards`` and
``reward.custom_reward_function.name=compute_score`` (optional
``reward.custom_reward_function.reward_kwargs.require_think=true`` for models whose chat template
opens ``<think>`` in the prompt; see :mod:`gapo.rewards.math.answer`).

Which scorer a ``data_source`` gets (case-insensitive):

1. an exact registered name, tried on the whole string, then on its last ``/`` component
   (``"lighteval/MATH"`` -> ``math``);
2. else a keyword rule on that last component: it is split into words at non-alphanumerics and the
   leftmost word that *starts with* a registered keyword decides (``"HuggingFaceH4/MATH-500"`` ->
   ``math``, ``"AI-MO/aimo-validation-aime"`` -> ``aime``, ``"OlympiadBench"`` -> ``olympiad``);
3. else ``ValueError`` naming the valid choices.

The contract of every scorer: ``fn(data_source, solution_str, ground_truth, extra_info=None, **kwargs)``
returning a dict with ``score`` (or a number). The dispatcher fills the keys of ``RESULT_DEFAULTS``
that a scorer leaves out, because verl's reward loop builds its per-sample info arrays from the keys
of the *first* item of a batch: sources with different keys in one batch would otherwise fail. A
scorer that adds its own keys should add them to ``RESULT_DEFAULTS`` too (``register_result_key``).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Scorer = Callable[..., "dict | float"]
BatchScorer = Callable[..., list]

# Keys every result carries (verl logs numbers as metrics and uses ``pred`` for majority voting).
# `reason`: why a response scored 0 ("" when right), for every reward
RESULT_DEFAULTS: dict[str, object] = {"score": 0.0, "acc": False, "pred": "", "format_error": False, "timeout": False,
                                      "reason": ""}

MATH_SOURCES = ("deepscaler", "aime", "aime24", "aime25", "amc", "amc23", "math", "math500", "minerva",
                "olympiad", "olympiadbench", "gsm8k")
MATH_KEYWORDS = ("deepscaler", "aime", "amc", "math", "minerva", "olympiad", "gsm8k")


@dataclass
class _Entry:
    """A scorer, given as a callable or lazily as ``"module:function"`` (no import until first use)."""

    target: Scorer | str
    batch: BatchScorer | str | None = None

    @staticmethod
    def _load(target):
        if not isinstance(target, str):
            return target
        module, _, name = target.partition(":")
        return getattr(importlib.import_module(module), name)

    def scorer(self) -> Scorer:
        self.target = self._load(self.target)
        return self.target

    def batch_scorer(self) -> BatchScorer | None:
        self.batch = self._load(self.batch)
        return self.batch


_EXACT: dict[str, _Entry] = {}
_KEYWORDS: dict[str, _Entry] = {}


def register_scorer(names: str | Sequence[str], scorer: Scorer | str, *, keywords: Sequence[str] = (),
                    batch: BatchScorer | str | None = None) -> None:
    """Route ``names`` (exact) and ``keywords`` (word-prefix rule) to ``scorer``.

    ``batch``, optional: ``fn(data_sources, solution_strs, ground_truths, extra_infos, **kwargs) -> list``
    used by :func:`compute_score_batch` to score a source's items together. A name or keyword already
    registered raises ``ValueError`` (two scorers for one source is a bug, not an override).
    """
    entry = _Entry(scorer, batch)
    names = [names] if isinstance(names, str) else list(names)
    for table, keys in ((_EXACT, names), (_KEYWORDS, keywords)):
        for key in keys:
            key = key.lower()
            if key in table:
                raise ValueError(f"data_source {key!r} is already registered")
            table[key] = entry


def register_result_key(key: str, default) -> None:
    """Declare an extra result key (with the value sources that lack it get)."""
    RESULT_DEFAULTS.setdefault(key, default)


def _entry_for(data_source) -> _Entry:
    full = str(data_source).strip().lower()
    base = full.rsplit("/", 1)[-1]
    for key in (full, base):
        if key in _EXACT:
            return _EXACT[key]
    for word in re.split(r"[^a-z0-9]+", base):
        # Longest keyword first, so a specific keyword beats a shorter one it starts with.
        for keyword in sorted(_KEYWORDS, key=len, reverse=True):
            if word.startswith(keyword):
                return _KEYWORDS[keyword]
    raise ValueError(
        f"unknown data_source {data_source!r}: expected one of {sorted(_EXACT)}, or a name whose last "
        f"'/' part has a word starting with one of {sorted(_KEYWORDS)}"
    )


def get_scorer(data_source) -> Scorer:
    """The scorer for ``data_source`` (raises ``ValueError`` naming the valid choices)."""
    return _entry_for(data_source).scorer()


def _complete(result) -> dict:
    if not isinstance(result, dict):
        score = float(result)
        result = {"score": score, "acc": score > 0}
    return {**RESULT_DEFAULTS, **result}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """verl's custom reward entry point: one response, scored by its source's scorer."""
    scorer = get_scorer(data_source)
    return _complete(scorer(data_source, solution_str, ground_truth, extra_info=extra_info, **kwargs))


def compute_score_batch(data_sources: Sequence, solution_strs: Sequence[str], ground_truths: Sequence,
                        extra_infos: Sequence | None = None, **kwargs) -> list[dict]:
    """Many responses at once; items of a source with a batch scorer are scored together (math: in
    parallel over the worker pool). Same order and keys as calling :func:`compute_score` per item."""
    n = len(solution_strs)
    if not len(data_sources) == len(ground_truths) == n:
        raise ValueError("data_sources, solution_strs and ground_truths must have the same length")
    extra_infos = list(extra_infos) if extra_infos is not None else [None] * n
    groups: dict[int, tuple[_Entry, list[int]]] = {}
    for i, source in enumerate(data_sources):
        entry = _entry_for(source)
        groups.setdefault(id(entry), (entry, []))[1].append(i)
    results: list[dict | None] = [None] * n
    for entry, idx in groups.values():
        batch = entry.batch_scorer()
        if batch is not None:
            out = batch([data_sources[i] for i in idx], [solution_strs[i] for i in idx],
                        [ground_truths[i] for i in idx], [extra_infos[i] for i in idx], **kwargs)
        else:
            scorer = entry.scorer()
            out = [scorer(data_sources[i], solution_strs[i], ground_truths[i], extra_info=extra_infos[i], **kwargs)
                   for i in idx]
        for i, result in zip(idx, out):
            results[i] = _complete(result)
    return results


register_scorer(MATH_SOURCES, "gapo.rewards.math.answer:compute_score", keywords=MATH_KEYWORDS,
                batch="gapo.rewards.math.answer:compute_score_batch")
# the smoke task, and its difficulty buckets' held-out rows in the study (gapo.smoke.task.bucket_source)
from gapo.smoke.task import DATA_SOURCE as _SMOKE, DIFFICULTY_BUCKETS as _BUCKETS, bucket_source  # noqa: E402 (light)

register_scorer((_SMOKE, *map(bucket_source, _BUCKETS)), "gapo.smoke.task:compute_score")
# the real-model arithmetic task of `make learn` (gapo.arithmetic), one source per difficulty bucket
from gapo.arithmetic import BUCKETS as _ARITH_BUCKETS, bucket_source as _arith_source  # noqa: E402 (light)

register_scorer(tuple(map(_arith_source, _ARITH_BUCKETS)), "gapo.arithmetic:compute_score")
# Code: stdin/stdout and function-call tests run in a bubblewrap sandbox (gapo/rewards/sandbox/client.py); importing
# gapo.rewards.code.score starts nothing (the sandbox executor starts on the first scored item).
from gapo.rewards.code.score import CODE_SOURCES, RESULT_KEYS as CODE_RESULT_KEYS  # noqa: E402

register_scorer(CODE_SOURCES, "gapo.rewards.code.score:compute_code_score",
                batch="gapo.rewards.code.score:compute_code_score_batch")
for _key, _default in CODE_RESULT_KEYS.items():
    register_result_key(_key, _default)

__all__ = ["RESULT_DEFAULTS", "compute_score", "compute_score_batch", "get_scorer", "register_result_key",
           "register_scorer"]


def is_known_data_source(data_source) -> bool:
    """Whether :func:`compute_score` has a scorer for ``data_source`` (the same rules; nothing is imported or
    scored). The training preflight (gapo.verl_plugin.preflight) checks every data_source of the data with it."""
    try:
        _entry_for(data_source)
    except ValueError:
        return False
    return True


def known_data_sources() -> tuple[list[str], list[str]]:
    """The registered (exact names, keywords), for messages."""
    return sorted(_EXACT), sorted(_KEYWORDS)


__all__ += ["is_known_data_source", "known_data_sources"]

"""Metrics the trainer logs besides GAPO's clip diagnostics (pure python): the reward function's extra fields per
step, and validation's pass@k and coverage per benchmark, alone and averaged over a window of validations.

    reward/<key>/mean                              `reward_extra_metrics`: mean of a numeric reward_extra_info field
    val-passk/<source>/{pass@k, coverage@t, ...}   `val_passk_metrics`: from validation's val_kwargs.n samples
    val-passk-window/<source>/<name>/{mean, std}   `ValidationWindow`: over the latest trainer.val_window validations

The estimators are `gapo.passk`'s (the evaluator's own, so training-time and offline numbers agree).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from gapo.passk import DEFAULT_COVERAGE_THRESHOLD, passk_metrics, spread

# The trainer's knob for validation's coverage threshold (configs/base/gapo.yaml, default 0.05); errors name it.
VAL_COVERAGE_KEY = "trainer.val_coverage_threshold"


def reward_extra_metrics(extra_fields: list) -> dict[str, float]:
    """Means of the reward function's numeric extra fields over the step's rollouts, as `reward/<key>/mean`.

    verl 0.9.1's v1 trainer logs them only at validation; training needs them too (format failures, timeouts).
    """
    values: dict[str, list[float]] = {}
    for fields in extra_fields:
        info = fields.get("reward_extra_info", {}) if isinstance(fields, dict) else {}
        for key, value in info.items():
            if isinstance(value, (bool, int, float, np.number)) and not isinstance(value, str):
                values.setdefault(key, []).append(float(value))
    return {f"reward/{key}/mean": float(np.mean(vals)) for key, vals in values.items()}


class ValidationWindow:
    """Mean and spread of validation's pass@k and coverage over the latest ``size`` validations.

    ``add(metrics)`` takes one validation's ``val-passk/<source>/{pass@k, coverage@t}`` values and returns
    ``val-passk-window/<source>/<name>/mean`` and ``.../std`` (sample standard deviation, n - 1, as ``python -m eval
    aggregate``; 0 with one value) over the values of that name in the window, and ``val-passk-window/size`` (how
    many validations it holds). The paper reports coverage as such an average late in training."""

    def __init__(self, size: int):
        self.history: deque[dict[str, float]] = deque(maxlen=size)

    def add(self, metrics: dict[str, float]) -> dict[str, float]:
        """Add one validation's ``val-passk/...`` pass@k and coverage; returns the window's mean, std and size."""
        kept = {k: float(v) for k, v in metrics.items()
                if k.startswith("val-passk/") and ("/pass@" in k or "/coverage@" in k)}
        self.history.append(kept)
        out = {"val-passk-window/size": float(len(self.history))}
        for key in kept:
            sp = spread([h[key] for h in self.history if key in h])  # eval's own mean and sample std
            name = key.replace("val-passk/", "val-passk-window/", 1)
            out[f"{name}/mean"], out[f"{name}/std"] = sp["mean"], sp["std"] or 0.0
        return out


def val_passk_metrics(data_sources, sample_uids, infos: dict, expected_counts: dict | None = None,
                      success_threshold: float = 0.5,
                      coverage_threshold: float = DEFAULT_COVERAGE_THRESHOLD) -> dict[str, float]:
    """pass@k (k = 1, 2, 4, ... <= n) and coverage per data_source from validation's per-sample lists.

    A sample is correct when the reward's `acc` says so, else when its reward exceeds `success_threshold`.
    Prompts are grouped by uid; sessions that failed (in `expected_counts`, keyed (data_source, uid),
    but absent) count as incorrect, as verl's own `acc` metrics do. Names: `val-passk/<source>/pass@<k>`,
    `.../coverage@<threshold %>` (problems with solve rate above `coverage_threshold`, the config's
    `trainer.val_coverage_threshold`, default 5%), `.../coverage_frac@<threshold %>`, `.../unsolved_frac`,
    `.../all_solved_frac`, `.../problems`.
    """
    if not 0 <= float(coverage_threshold) < 1:
        raise ValueError(f"{VAL_COVERAGE_KEY} must be a solve rate in [0, 1), got {coverage_threshold}")
    rewards = infos.get("reward", [])
    accs = infos.get("acc") or [None] * len(rewards)
    correct = [bool(a) if a is not None else float(r) > success_threshold for a, r in zip(accs, rewards, strict=True)]
    return passk_metrics(data_sources, sample_uids, correct, expected=expected_counts,
                         coverage_threshold=float(coverage_threshold))

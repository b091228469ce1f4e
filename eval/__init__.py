"""Evaluation: pass@k of a model or verl checkpoint on the paper's benchmarks (``python -m eval``).

Modules: :mod:`eval.checkpoint` (HF dir or verl checkpoint), :mod:`eval.data` (benchmarks), :mod:`eval.generate`
(HF / vLLM backends), :mod:`eval.records` (resumable JSONL), :mod:`eval.runner` (the loop),
:mod:`eval.report` (summary, tables, plots). The estimator and coverage are the library's
(:mod:`gapo.passk`, also used by the trainer's validation metrics): nothing under ``gapo/`` imports ``eval/``.
"""

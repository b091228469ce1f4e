"""Evaluation: pass@k of a model or verl checkpoint on the paper's benchmarks (``python -m eval``).

Modules: :mod:`eval.passk` (unbiased estimator, coverage; also used by the trainer's validation metrics),
:mod:`eval.checkpoint` (HF dir or verl checkpoint), :mod:`eval.data` (benchmarks), :mod:`eval.generate`
(HF / vLLM backends), :mod:`eval.records` (resumable JSONL), :mod:`eval.runner` (the loop),
:mod:`eval.report` (summary, tables, plots).
"""

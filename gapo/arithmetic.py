"""A seeded arithmetic task with a difficulty tail, for a real pretrained model on CPU (``make learn``).

Prompts: ``What is 7 + 8? Answer with just the number.`` (one user turn; the model's chat template is applied by
the trainer, the evaluator and TRL alike). Buckets (:data:`BUCKETS`), from easy to hard for SmolLM2-135M-Instruct
(base pass rates per prompt, 8 samples, 16 new tokens; docs/learn.md): ``add1`` one-digit addition, ``sub1``
one-digit subtraction with a result >= 0, ``mul1`` one-digit multiplication, ``add2`` two-digit addition (mostly 0:
the tail where GAPO's headroom is meant to matter). Train and held-out problems are drawn apart: every held-out
operand pair is excluded from training (:func:`make_splits`), so held-out pass@1 measures what carries over.

Grading, as the prompt asks (:func:`compute_score`): the whole response, stripped and without a final period, is the
answer; it must be a number, or an equation of arithmetic whose last side is a number (``7 + 8 = 15``); anything else
(prose, ``Update: 7 + 8 = 15``, the problem's own expression ``7 + 8`` or ``8 + 7``, a computation still to do) scores 0
with reason ``not_a_number``
before any parsing. What passes is graded by the project's math reward (:mod:`gapo.rewards.math.answer`: value
equality, a false equation ``7 + 8 = 16`` is wrong), so the task shares the math reward's guarantees. Responses over
:data:`MAX_RESPONSE_CHARS` characters score 0 (``too_long``). Data sources ``gapo_arith_<bucket>`` (registered in
:mod:`gapo.rewards`), so validation and the evaluator report pass@k per bucket.

This module imports nothing heavy at import time (the reward dispatcher imports it in every reward worker).
CLI: ``python -m gapo.arithmetic --out DIR`` writes ``train.parquet``, ``heldout.parquet`` and ``transfer.parquet``.
"""

from __future__ import annotations

import argparse
import random
import re
from pathlib import Path

DATA_SOURCE = "gapo_arith"
ABILITY = "arithmetic"
PROMPT = "What is {a} {op} {b}? Answer with just the number."
# bucket -> (operator, first operand range, second operand range); ranges inclusive
BUCKETS: dict[str, tuple[str, tuple[int, int], tuple[int, int]]] = {
    "add1": ("+", (0, 9), (0, 9)),
    "sub1": ("-", (0, 9), (0, 9)),
    "mul1": ("*", (1, 9), (1, 9)),
    "add2": ("+", (10, 99), (10, 99)),
}
HARD_BUCKET = "add2"
MAX_RESPONSE_CHARS = 64
_SYMBOL = {"+": "+", "-": "-", "*": "*"}
# what may stand as the final answer: an integer, optionally signed, or one written with thousands commas
_INTEGER = re.compile(r"[-+]?\d{1,12}")
# what may stand left of an ``=``: digits, arithmetic signs, brackets and spaces (``7 + 8 = 15``; not ``Update: 7 + 8``)
_ARITHMETIC = re.compile(r"[\d\s+\-*/()x\u00d7\u00f7\u00b7\u2212.]+")


def bucket_source(bucket: str) -> str:
    """The data_source of a bucket's rows: ``gapo_arith_<bucket>``."""
    if bucket not in BUCKETS:
        raise ValueError(f"unknown bucket {bucket!r}: expected one of {', '.join(BUCKETS)}")
    return f"{DATA_SOURCE}_{bucket}"


def _pairs(bucket: str) -> list[tuple[int, int]]:
    op, (lo_a, hi_a), (lo_b, hi_b) = BUCKETS[bucket]
    return [(a, b) for a in range(lo_a, hi_a + 1) for b in range(lo_b, hi_b + 1) if op != "-" or a >= b]


def _value(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def _row(bucket: str, a: int, b: int, split: str, index: int) -> dict:
    op = BUCKETS[bucket][0]
    question = PROMPT.format(a=a, op=_SYMBOL[op], b=b)
    return {"data_source": bucket_source(bucket), "prompt": [{"role": "user", "content": question}],
            "ability": ABILITY, "reward_model": {"style": "rule", "ground_truth": str(_value(op, a, b))},
            "extra_info": {"index": index, "split": split, "bucket": bucket, "problem": question}}


def make_splits(n_train: int = 256, n_heldout_per_bucket: int = 16, n_transfer_per_bucket: int = 16,
                seed: int = 0) -> dict[str, list[dict]]:
    """Rows of ``train`` (buckets in equal shares, shuffled), ``heldout`` and ``transfer``, verl's RL schema.

    Held-out and transfer pairs are drawn first from each bucket's operand pairs without replacement, apart from each
    other; training rows are drawn (with replacement where a bucket is small) only from the pairs left. Deterministic
    given ``seed``. Raises ``ValueError`` if a bucket has too few pairs for its held-out and transfer rows.
    """
    if n_train < 1 or n_heldout_per_bucket < 1 or n_transfer_per_bucket < 0:
        raise ValueError(f"need n_train >= 1, n_heldout_per_bucket >= 1, n_transfer_per_bucket >= 0; got "
                         f"{n_train}, {n_heldout_per_bucket}, {n_transfer_per_bucket}")
    rng = random.Random(f"gapo-arith/{seed}")
    names = list(BUCKETS)
    shares = [n_train // len(names) + (i < n_train % len(names)) for i in range(len(names))]
    splits: dict[str, list[dict]] = {"train": [], "heldout": [], "transfer": []}
    for bucket, share in zip(names, shares):
        pairs = _pairs(bucket)
        apart = n_heldout_per_bucket + n_transfer_per_bucket
        if apart >= len(pairs):
            raise ValueError(f"bucket {bucket} has {len(pairs)} problems: too few for {n_heldout_per_bucket} held-out "
                             f"and {n_transfer_per_bucket} transfer rows and any training rows")
        drawn = rng.sample(pairs, len(pairs))
        heldout, transfer, rest = (drawn[:n_heldout_per_bucket], drawn[n_heldout_per_bucket:apart], drawn[apart:])
        train = rng.sample(rest, share) if share <= len(rest) else [rng.choice(rest) for _ in range(share)]
        for split, chosen in (("heldout", heldout), ("transfer", transfer), ("train", train)):
            splits[split] += [_row(bucket, a, b, split, 0) for a, b in chosen]
    rng.shuffle(splits["train"])
    for rows in splits.values():
        for i, row in enumerate(rows):
            row["extra_info"]["index"] = i
    return splits


def write_splits(out_dir, seed: int = 0, **sizes) -> dict[str, Path]:
    """:func:`make_splits` written as ``<split>.parquet`` under ``out_dir``; their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, rows in make_splits(seed=seed, **sizes).items():
        if rows:
            paths[split] = out / f"{split}.parquet"
            pq.write_table(pa.Table.from_pylist(rows), paths[split])
    return paths


def final_answer(response: str) -> tuple[str, str]:
    """(answer text handed to the math reward, its final value's text), or ("", reason) if it is not an answer."""
    text = (response or "").strip()
    if len(text) > MAX_RESPONSE_CHARS:
        return "", "too_long"
    if text.endswith("."):
        text = text[:-1].rstrip()
    *sides, value = [side.strip() for side in text.split("=")]
    value = value.replace(",", "")
    if not _INTEGER.fullmatch(value) or not all(_ARITHMETIC.fullmatch(side) for side in sides):
        return "", "not_a_number"
    return text, value


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """verl custom reward for ``gapo_arith_*`` rows: 1.0 iff the response is the right number (module docstring)."""
    answer, why = final_answer(solution_str if isinstance(solution_str, str) else str(solution_str))
    if not answer:
        return {"score": 0.0, "acc": False, "pred": "", "format_error": True, "reason": why}
    from gapo.rewards.math.answer import score_math

    problem = extra_info.get("problem") if isinstance(extra_info, dict) else None
    return score_math(f"\\boxed{{{answer}}}", ground_truth, problem=problem)


def main(argv=None) -> None:
    """CLI entry: write the task's parquet files under --out and print their paths."""
    parser = argparse.ArgumentParser(prog="python -m gapo.arithmetic", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for train/heldout/transfer.parquet")
    parser.add_argument("--n-train", type=int, default=256)
    parser.add_argument("--n-heldout", type=int, default=16, help="held-out prompts per bucket")
    parser.add_argument("--n-transfer", type=int, default=16, help="transfer-check prompts per bucket")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for path in write_splits(args.out, seed=args.seed, n_train=args.n_train, n_heldout_per_bucket=args.n_heldout,
                             n_transfer_per_bucket=args.n_transfer).values():
        print(path)


if __name__ == "__main__":
    main()

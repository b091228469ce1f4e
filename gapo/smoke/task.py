"""Synthetic verifiable task for the CPU smoke run: "answer with one of these characters".

Each prompt lists an allowed set S of distinct characters drawn from the 36 digits and lowercase
letters, e.g. ``answer with one of: 3 a f k z``; the ground truth is S as a string (``"3afkz"``).
A response is correct iff its first non-whitespace character is in S. The check is exact on the
decoded text, so the reward is a rule (no model, no parsing heuristics).

Why this task: the tiny random model of :mod:`gapo.smoke.tiny_model` samples close to uniformly
over its 46-token vocabulary, so on a prompt with |S| = s it succeeds with probability about
s / 41 (40 printable non-space characters plus EOS compete for the first visible character).
Set sizes vary across prompts, which spreads per-prompt success rates over roughly 0.15..0.8:
groups of k = 4..8 rollouts are mostly mixed (0 < c < k), with different c per prompt, which is
what GAPO's success-count-dependent clipping needs to be exercised. The task is learnable: the
answer can be copied from the prompt, and even dropping punctuation / EOS raises success.

``compute_score`` has verl's custom reward signature; this file is loaded by verl from its path
(``reward.custom_reward_function.path``), so it imports nothing heavy at module level.

CLI: ``python -m gapo.smoke.task --out DIR`` writes ``train.parquet`` and ``val.parquet``.
"""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

from gapo.smoke.tiny_model import ALNUM_CHARS, CHAR_TOKENS, SPECIAL_TOKENS, WHITESPACE_CHARS

DATA_SOURCE = "gapo_smoke"
ABILITY = "char_choice"
PROMPT_PREFIX = "answer with one of: "
CHOICE_POOL = ALNUM_CHARS  # 36 chars; punctuation / whitespace are never correct
# |S| range: about 0.15 .. 0.78 success for the random model (s / 41, see module docstring).
MIN_SET_SIZE = 6
MAX_SET_SIZE = 32
# Chat-templated prompt length in tokens is 19 + len(content) <= 19 + 20 + 2*32 - 1 = 102.
MAX_PROMPT_TOKENS = 19 + len(PROMPT_PREFIX) + 2 * MAX_SET_SIZE - 1


def make_prompt(allowed: str) -> str:
    """User message for an allowed set, e.g. ``"3afkz"`` -> ``"answer with one of: 3 a f k z"``."""
    return PROMPT_PREFIX + " ".join(allowed)


# The characters by frequency rank when sets are drawn with a skew (`make_rows(skew=...)`): a fixed shuffle, so the most
# frequent character is not simply "0".
FREQUENCY_ORDER = tuple(random.Random("gapo-smoke/frequency").sample(CHOICE_POOL, len(CHOICE_POOL)))


def _skewed_sample(rng: random.Random, size: int, skew: float) -> list[str]:
    """`size` distinct characters drawn without replacement with weight 1 / rank^skew (rank 1 = FREQUENCY_ORDER[0]):
    each character's key u^(1/w) with u uniform, the `size` largest keys win (Efraimidis and Spirakis, 2006)."""
    keys = [(rng.random() ** (rank ** skew), char) for rank, char in enumerate(FREQUENCY_ORDER, 1)]
    return [char for _, char in sorted(keys, reverse=True)[:size]]


def make_rows(n: int, *, seed: int, split: str,
              min_size: int = MIN_SET_SIZE, max_size: int = MAX_SET_SIZE, data_source: str = DATA_SOURCE,
              bucket: str | None = None, skew: float = 0.0) -> list[dict]:
    """``n`` rows in verl's RL parquet schema; deterministic given (seed, split, bucket, skew).

    ``data_source`` is what verl groups validation metrics by (a difficulty bucket's source for the study's
    held-out rows); ``bucket``, when given, is kept in ``extra_info`` and salts the random stream. ``skew`` > 0 draws
    the allowed sets with Zipf weights 1 / rank^skew over FREQUENCY_ORDER (some answers are common, as in real
    tasks), which gives a policy something to learn that carries over to new prompts, the hard ones included; 0 (the
    default) draws every set uniformly."""
    if not 1 <= min_size <= max_size <= len(CHOICE_POOL):
        raise ValueError(f"need 1 <= min_size <= max_size <= {len(CHOICE_POOL)}")
    if not (isinstance(skew, int | float) and math.isfinite(skew) and skew >= 0):
        raise ValueError(f"skew must be a finite number >= 0 (0: uniform sets), got {skew!r}")
    # A string seed is hashed deterministically by random.Random (unlike hash()), and keeps the
    # train and val streams independent.
    rng = random.Random(f"{seed}/{split}" + (f"/{bucket}" if bucket else ""))
    rows = []
    for i in range(n):
        size = rng.randint(min_size, max_size)
        # Sorted so the same set always reads the same; the set itself is uniformly random.
        allowed = "".join(sorted(_skewed_sample(rng, size, skew) if skew else rng.sample(CHOICE_POOL, size)))
        rows.append({
            "data_source": data_source,
            "prompt": [{"role": "user", "content": make_prompt(allowed)}],
            "ability": ABILITY,
            "reward_model": {"style": "rule", "ground_truth": allowed},
            "extra_info": {"index": i, "split": split, **({"bucket": bucket} if bucket else {})},
        })
    return rows


# The study's difficulty buckets (recipe/studies/gspo_vs_gapo.py): |S| ranges and, for the random model,
# success ~ |S| / 41 with 8 new tokens (`expected_success_rate`): hard 2.4-9.8% (the tail where the paper says GAPO
# helps), mid 20-49%, easy 61-78%.
DIFFICULTY_BUCKETS = {"hard": (1, 4), "mid": (8, 20), "easy": (25, 32)}


def bucket_source(bucket: str) -> str:
    """data_source of a bucket's held-out rows (registered with the reward dispatcher): gapo_smoke_<bucket>."""
    return f"{DATA_SOURCE}_{bucket}"


def make_study_dataset(out_dir, n_train: int = 512, n_val_per_bucket: int = 12, seed: int = 0) -> dict[str, Path]:
    """The study's task: ``train.parquet`` with the buckets in equal shares and ``val.parquet`` with
    ``n_val_per_bucket`` held-out rows per bucket. Every row's data_source is its bucket's (`bucket_source`; the bucket
    is also in extra_info): validation's pass@k comes per bucket, and VIGOR's per-source allocation counts
    (`vigor/source/<data_source>/*`) per bucket of train prompts. Train and val streams are independent."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = list(DIFFICULTY_BUCKETS)
    shares = [n_train // len(names) + (i < n_train % len(names)) for i in range(len(names))]
    train = [row for name, n in zip(names, shares)
             for row in make_rows(n, seed=seed, split="train", min_size=DIFFICULTY_BUCKETS[name][0],
                                  max_size=DIFFICULTY_BUCKETS[name][1], data_source=bucket_source(name),
                                  bucket=name)]
    random.Random(f"{seed}/train/order").shuffle(train)
    for i, row in enumerate(train):
        row["extra_info"]["index"] = i
    val = [row for name in names
           for row in make_rows(n_val_per_bucket, seed=seed, split="val", min_size=DIFFICULTY_BUCKETS[name][0],
                                max_size=DIFFICULTY_BUCKETS[name][1], data_source=bucket_source(name), bucket=name)]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"train": out / "train.parquet", "val": out / "val.parquet"}
    for split, rows in (("train", train), ("val", val)):
        pq.write_table(pa.Table.from_pylist(rows), paths[split])
    return paths


def make_dataset(out_dir, n_train: int = 512, n_val: int = 64, seed: int = 0, **kw) -> dict[str, Path]:
    """Write ``train.parquet`` and ``val.parquet`` under ``out_dir``; return their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, n in (("train", n_train), ("val", n_val)):
        path = out / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(make_rows(n, seed=seed, split=split, **kw)), path)
        paths[split] = path
    return paths


def first_visible_char(text: str | None) -> str:
    """First non-whitespace character of ``text`` ("" if none)."""
    stripped = (text or "").lstrip()
    return stripped[:1]


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """verl custom reward: 1.0 iff the response's first visible character is allowed.

    ``**kwargs`` absorbs extras verl may pass (e.g. reward-router settings). Every call returns
    the same keys, as verl's reward_extra_info requires.
    """
    first = first_visible_char(solution_str)
    # `"" in s` is True in Python, so an empty response must be rejected explicitly.
    acc = bool(first) and first in str(ground_truth)
    return {"score": 1.0 if acc else 0.0, "acc": acc}


def expected_success_rate(ground_truth: str, max_new_tokens: int | None = None) -> float:
    """Success probability of a sampler that is exactly uniform over the tiny vocabulary.

    Each step draws one of V tokens: an allowed char (success), another visible char or EOS
    (failure), or whitespace / a special token that decodes to nothing (keep going). With
    ``max_new_tokens=None`` the response is unbounded. The random model is only near-uniform,
    so its measured rates scatter around this.
    """
    vocab = len(SPECIAL_TOKENS) + len(CHAR_TOKENS)
    allowed = len(set(ground_truth) & set(CHAR_TOKENS) - set(WHITESPACE_CHARS))
    # Non-deciding tokens: whitespace, and the specials other than EOS (skipped when decoding).
    p_skip = (len(WHITESPACE_CHARS) + len(SPECIAL_TOKENS) - 1) / vocab
    p_hit = allowed / vocab
    if max_new_tokens is None:
        return p_hit / (1.0 - p_skip)
    return p_hit * (1.0 - p_skip**max_new_tokens) / (1.0 - p_skip)


def main(argv: list[str] | None = None) -> None:
    """CLI entry: write the task's ``train.parquet`` and ``val.parquet`` under ``--out`` and print their paths."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--n-train", type=int, default=512)
    p.add_argument("--n-val", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for path in make_dataset(args.out, n_train=args.n_train, n_val=args.n_val, seed=args.seed).values():
        print(path)


if __name__ == "__main__":
    main()

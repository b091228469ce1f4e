"""Prepare the paper's math data as verl RL parquet files: one command per dataset, or all of them.

Datasets (``--dataset``; the same name is the output file stem and the rows' ``data_source``):

    deepscaler     agentica-org/DeepScaleR-Preview-Dataset  train  training set (~40k problems)
    aime24         HuggingFaceH4/aime_2024                   train  30 problems
    aime25         math-ai/aime25                            test   30
    amc23          math-ai/amc23                             test   40  (AMC 12 2023)
    amc22_23       AI-MO/aimo-validation-amc                 train  83  (AMC 12 2022 + 2023: DeepScaleR's AMC)
    math500        HuggingFaceH4/MATH-500                    test   500
    minerva        math-ai/minervamath                       test   272
    olympiadbench  math-ai/olympiadbench                     test   675 (text-only English math; answer column
                                                                    final_answer or answer)

Each row's prompt is the problem followed by DeepScaleR's instruction, " Let's think step by step and
output the final answer within \\boxed{}."; the ground truth is the answer string (``$...$`` unwrapped,
numbers without a trailing ``.0``, lists joined by ", "). Rows with an empty answer are dropped and
counted. Field mappings: ``gapo.data.math_datasets.DATASETS``. An optional column (solution, level,
subject, id) that the source lacks is written as null with a warning; a hub split whose row count is not
the expected one gets a warning too (another release of the dataset).

Usage:
    python -m gapo.data.prepare_math --dataset deepscaler            # -> $GAPO_DATA_DIR/math/deepscaler.parquet
                                                                      #    (default data/math)
    python -m gapo.data.prepare_math --dataset all --out data/math   # all eight
    python -m gapo.data.prepare_math --dataset aime24 --limit 5      # first 5 rows only

Offline (no hub access): download the dataset elsewhere (e.g. ``datasets.load_dataset(...).to_json(...)``)
and pass the file, which must have the hub dataset's columns:
    python -m gapo.data.prepare_math --dataset aime24 --source aime24.jsonl   # .jsonl, .json or .parquet
    python -m gapo.data.prepare_math --dataset all --source DIR   # DIR/<name>.jsonl|.json|.parquet each
``--source`` may also be another hub id with the same columns. The repo's fixtures run end to end:
    python -m gapo.data.prepare_math --dataset all --source tests/fixtures/math --out /tmp/math

Training then reads e.g. ``data.train_files=data/math/deepscaler.parquet`` and
``data.val_files=[data/math/aime24.parquet,data/math/math500.parquet]``: every file has the same schema.
"""

from __future__ import annotations

from gapo.data.cli import PrepareCLI
from gapo.data.math_datasets import DATASETS, get_spec, prepare

SUBDIR = "math"  # under the data root ($GAPO_DATA_DIR, default ./data)
CLI = PrepareCLI("gapo.data.prepare_math", __doc__, tuple(DATASETS), SUBDIR)


def main(argv: list[str] | None = None) -> list:
    """CLI entry: prepare the math datasets named by ``argv``; returns one summary per dataset."""
    p = CLI.parser()
    p.add_argument("--limit", type=int, default=None, help="write at most N rows per dataset")
    args = p.parse_args(argv)
    if args.limit is not None and args.limit < 0:
        p.error("--limit must be >= 0")
    return CLI.run(args, lambda name, source: prepare(get_spec(name), source=source, out_dir=args.out,
                                                      limit=args.limit))


if __name__ == "__main__":
    main()

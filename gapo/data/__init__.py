"""Data preparation: the paper's math datasets converted to verl's RL parquet format (see `prepare_math`)."""

from gapo.data.math_datasets import (
    DATASETS,
    INSTRUCTION,
    MathDatasetSpec,
    PrepareSummary,
    get_spec,
    load_rows,
    prepare,
    to_parquet,
)
from gapo.data.sources import HubUnavailableError

__all__ = [
    "DATASETS",
    "INSTRUCTION",
    "HubUnavailableError",
    "MathDatasetSpec",
    "PrepareSummary",
    "get_spec",
    "load_rows",
    "prepare",
    "to_parquet",
]

"""Prepared data on disk: where it lives (`data_root`, the one definition) and one parquet writer for every dataset
family (fixed schema, atomic rename)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

DATA_DIR_ENV = "GAPO_DATA_DIR"


def data_root() -> Path:
    """The data root: $GAPO_DATA_DIR, default ./data. The prepare CLIs write `<root>/math`, `<root>/code`; the
    configs read `${oc.env:GAPO_DATA_DIR,data}/...` and the evaluator resolves benchmark names under it."""
    return Path(os.environ.get(DATA_DIR_ENV) or "data")


def write_rows(rows: Iterable[dict], path: str | os.PathLike, schema, batch_rows: int = 64) -> Path:
    """Stream ``rows`` to ``path`` with ``schema`` in row groups of ``batch_rows`` (temp file renamed into place).

    Row groups keep each Arrow string chunk far below its 2 GiB offset limit and let readers (and
    ``datasets``' parquet loader) work a group at a time. No rows still gives a valid, empty file.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with pq.ParquetWriter(tmp, schema) as writer:
            batch: list[dict] = []
            for row in rows:
                batch.append(row)
                if len(batch) >= batch_rows:
                    writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                    batch = []
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path

"""Prepared data on disk: where it lives (`data_root`, the one definition), the one parquet row schema (`row_schema`:
verl's row, each family adding its extra_info fields) and one parquet writer for every dataset family (fixed schema,
atomic rename)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

DATA_DIR_ENV = "GAPO_DATA_DIR"


def data_root() -> Path:
    """The data root: $GAPO_DATA_DIR, default ./data. The prepare CLIs write `<root>/math`, `<root>/code`; the
    configs read `${oc.env:GAPO_DATA_DIR,data}/...` and the evaluator resolves benchmark names under it."""
    return Path(os.environ.get(DATA_DIR_ENV) or "data")


# Every family's extra_info starts with these: the row's role (train/test) and its position in the source.
EXTRA_INFO_COMMON = {"split": "string", "index": "int64"}


def row_schema(extra_info: Mapping[str, str]):
    """The Arrow schema of a prepared row, verl's RL format (read by ``verl.utils.dataset.rl_dataset.RLHFDataset``)::

        data_source   string
        prompt        list<struct<role: string, content: string>>
        ability       string
        reward_model  struct<style: string, ground_truth: string>
        extra_info    struct<split: string, index: int64, <extra_info>>

    ``extra_info`` maps the family's own fields, in order, to Arrow type aliases (``"string"``, ``"int64"``). One
    schema per family (every file of the family the same), so verl can concatenate the files."""
    import pyarrow as pa

    string = pa.string()
    fields = {**EXTRA_INFO_COMMON, **extra_info}
    if len(fields) != len(EXTRA_INFO_COMMON) + len(extra_info):
        raise ValueError(f"extra_info fields {sorted(extra_info)} repeat the common ones {sorted(EXTRA_INFO_COMMON)}")
    return pa.schema([
        ("data_source", string),
        ("prompt", pa.list_(pa.struct([("role", string), ("content", string)]))),
        ("ability", string),
        ("reward_model", pa.struct([("style", string), ("ground_truth", string)])),
        ("extra_info", pa.struct([(name, pa.type_for_alias(alias)) for name, alias in fields.items()])),
    ])


# A row group is flushed once its rows hold this many bytes of text, whatever their count: LiveCodeBench rows keep
# every test, and some carry payloads over 50 MB, so 64 of them would be GBs in memory at once.
BATCH_BYTES = 64 << 20


def row_bytes(value) -> int:
    """Bytes of text in a row (strings and bytes, nested in dicts and lists; UTF-8 counted as characters): what
    decides its memory in a row group. Linear in the row's number of values, not in its text's size."""
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, dict):
        return sum(row_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(row_bytes(v) for v in value)
    return 8


def write_rows(rows: Iterable[dict], path: str | os.PathLike, schema, batch_rows: int = 64,
               batch_bytes: int = BATCH_BYTES) -> Path:
    """Stream ``rows`` to ``path`` with ``schema`` in row groups of ``batch_rows`` rows or ``batch_bytes`` bytes of
    text, whichever comes first (temp file renamed into place).

    Row groups keep each Arrow string chunk far below its 2 GiB offset limit, bound the memory a few huge rows take
    while writing, and let readers (and ``datasets``' parquet loader) work a group at a time. No rows still gives a
    valid, empty file.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with pq.ParquetWriter(tmp, schema) as writer:
            batch: list[dict] = []
            size = 0
            for row in rows:
                batch.append(row)
                size += row_bytes(row)
                if len(batch) >= batch_rows or size >= batch_bytes:
                    writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                    batch, size = [], 0
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def iter_parquet_rows(path: str | os.PathLike, batch_rows: int = 64, batch_bytes: int = BATCH_BYTES):
    """Rows of a parquet file, one at a time, reading at most ``batch_rows`` rows and about ``batch_bytes`` bytes
    at once: the batch size of each row group follows its rows' mean size in the file's metadata, so a group of
    50 MB rows is read one row at a time."""
    import pyarrow.parquet as pq

    file = pq.ParquetFile(path)
    meta = file.metadata
    for group in range(meta.num_row_groups):
        info = meta.row_group(group)
        mean_row = info.total_byte_size / max(info.num_rows, 1)
        size = max(1, min(batch_rows, int(batch_bytes // max(mean_row, 1))))
        for batch in file.iter_batches(batch_size=size, row_groups=[group]):
            yield from batch.to_pylist()

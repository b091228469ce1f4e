"""Benchmarks: verl RL parquet files (``gapo.data.prepare_math`` / ``prepare_code``), named by path or by name.

A name resolves under ``$GAPO_DATA_DIR`` (default ``data``): ``<dir>/<name>.parquet``, then
``<dir>/math/<name>.parquet``, ``<dir>/code/<name>.parquet``, then any ``<dir>/*/<name>.parquet``.
The benchmark's name is the file's stem; each row keeps its own ``data_source`` (what the reward
dispatches on), ``prompt`` (chat messages, or a plain string), ``reward_model.ground_truth`` and
``extra_info``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gapo.data.parquet_io import data_root

SUBDIRS = ("math", "code")
SMOKE_VAL = "runs/smoke/data/val.parquet"  # the validation prompts `make smoke` (recipe/smoke.py) writes


def data_dir() -> Path:
    """The folder benchmark files are read from (`gapo.data` data root: $GAPO_DATA_DIR, default ./data)."""
    return data_root()


@dataclass
class Problem:
    """One row of a benchmark. ``index``: row number in the file (the resume key); ``id``: the row's
    ``extra_info.index`` when it has one, else the row number."""

    benchmark: str
    index: int
    id: str
    data_source: str
    prompt: list | str
    ground_truth: object
    extra_info: dict | None = None


@dataclass
class Benchmark:
    """One benchmark: its name, the file it was read from, and its problems."""
    name: str
    path: Path
    problems: list[Problem] = field(default_factory=list)
    total_rows: int = 0


def resolve_benchmark_path(spec: str, root: Path | None = None) -> Path:
    """A parquet path for ``spec`` (a path, or a name under ``root`` / ``$GAPO_DATA_DIR``)."""
    path = Path(spec).expanduser()
    if path.suffix == ".parquet" or path.exists():
        if not path.is_file():
            raise FileNotFoundError(f"benchmark file {spec} does not exist")
        return path
    root = root if root is not None else data_dir()
    candidates = [root / f"{spec}.parquet", *(root / sub / f"{spec}.parquet" for sub in SUBDIRS)]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    found = sorted(root.glob(f"*/{spec}.parquet")) if root.is_dir() else []
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise ValueError(f"benchmark name {spec!r} is ambiguous under {root}: {[str(f) for f in found]}; "
                         "pass a path")
    available = sorted({p.stem for p in root.glob("**/*.parquet")}) if root.is_dir() else []
    raise FileNotFoundError(
        f"no benchmark {spec!r}: looked for {', '.join(str(c) for c in candidates)} (GAPO_DATA_DIR={root}); "
        f"available there: {', '.join(available) or 'none'}. Write the files with `python -m gapo.data.prepare_math` "
        f"(or prepare_code), or pass a .parquet path, e.g. {SMOKE_VAL} after `make smoke` (`make eval-smoke` "
        "evaluates the smoke run on it)")


def load_benchmark(spec: str, limit: int | None = None, root: Path | None = None) -> Benchmark:
    """Read a benchmark file; ``limit`` keeps its first rows only."""
    import pyarrow.parquet as pq

    path = resolve_benchmark_path(spec, root)
    rows = pq.read_table(path).to_pylist()
    bench = Benchmark(name=path.stem, path=path.resolve(), total_rows=len(rows))
    for i, row in enumerate(rows if limit is None else rows[:limit]):
        missing = [key for key in ("data_source", "prompt", "reward_model") if row.get(key) is None]
        if missing:
            raise ValueError(f"{path} row {i}: missing {missing} (not a verl RL parquet file?)")
        extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else None
        ident = extra.get("index") if extra and extra.get("index") is not None else i
        bench.problems.append(Problem(benchmark=bench.name, index=i, id=str(ident), data_source=str(row["data_source"]),
                                      prompt=row["prompt"], ground_truth=row["reward_model"].get("ground_truth"),
                                      extra_info=extra))
    return bench


def load_benchmarks(specs: list[str], limit: int | None = None, root: Path | None = None) -> list[Benchmark]:
    """Benchmarks by name or file path (`--bench`), at most `limit` problems each; distinct names required."""
    benches = [load_benchmark(spec, limit, root) for spec in specs]
    names = [b.name for b in benches]
    dupes = sorted({name for name in names if names.count(name) > 1})
    if dupes:
        raise ValueError(f"two benchmark files share the name(s) {dupes}: results are keyed by file stem")
    return benches

"""The skeleton both data CLIs share (prepare_math, prepare_code): the --dataset/--source/--out options, one dataset
or all of them, sources resolved per name (gapo.data.sources), errors as one line."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gapo.data.parquet_io import data_root
from gapo.data.sources import HubUnavailableError, file_in_dir

PrepareOne = Callable[[str, str | Path | None], object]
SourceFor = Callable[[str, Path], Path | None]


def _file_for(name: str, directory: Path) -> Path:
    return file_in_dir(directory, name)


@dataclass(frozen=True)
class PrepareCLI:
    """One family's prepare CLI: ``parser()`` holds the options every family has (the family adds its own after),
    ``run(args, ...)`` prepares the dataset named, or every one of ``datasets`` for ``--dataset all``.

    Attributes:
        module: the CLI's module (``python -m <module>``).
        doc: the module docstring; its first line is the parser's description.
        datasets: the family's dataset names, in registry order (``--dataset all`` prepares them in this order).
        subdir: the family's folder under the data root, the default ``--out``.
        source_default: what no ``--source`` reads, for ``--help``.
    """

    module: str
    doc: str
    datasets: tuple[str, ...]
    subdir: str
    source_default: str = "the hub"

    def parser(self) -> argparse.ArgumentParser:
        """The ``--dataset``, ``--source`` and ``--out`` options every family has; the family adds its own after."""
        names = ", ".join(self.datasets)
        p = argparse.ArgumentParser(prog=f"python -m {self.module}", description=self.doc.splitlines()[0],
                                    epilog=f"valid datasets: {names}, all")
        p.add_argument("--dataset", required=True, choices=[*self.datasets, "all"], metavar="NAME",
                       help=f"one of: {names}, or all")
        p.add_argument("--source", default=None,
                       help="local .jsonl/.json/.parquet file (or another hub id) with the hub dataset's columns; "
                            "with --dataset all, a directory holding <name>.jsonl|.json|.parquet (default: "
                            f"{self.source_default})")
        p.add_argument("--out", default=None,
                       help=f"output directory (default: $GAPO_DATA_DIR/{self.subdir}, or data/{self.subdir} without "
                            "it; where the configs read)")
        return p

    def run(self, args: argparse.Namespace, prepare_one: PrepareOne, source_for: SourceFor = _file_for) -> list:
        """Set ``args.out`` (default: the family's folder under the data root), then :func:`prepare_datasets` over
        the names ``args.dataset`` selects; ``prepare_one`` may read ``args.out``."""
        args.out = args.out or str(data_root() / self.subdir)
        every = args.dataset == "all"
        names = list(self.datasets) if every else [args.dataset]
        return prepare_datasets(names, every, args.source, args.out, prepare_one, source_for)


def prepare_datasets(names: list[str], every: bool, source: str | None, out: str, prepare_one: PrepareOne,
                     source_for: SourceFor = _file_for) -> list:
    """Run ``prepare_one(name, source)`` for each name; with ``every`` (``--dataset all``) a ``source`` must be
    a directory, resolved per name by ``source_for``. Exits with ``error: ...`` on a bad source or dataset."""
    summaries = []
    try:
        if every and source is not None and not Path(source).is_dir():
            raise NotADirectoryError(f"with --dataset all, --source must be a directory: {source}")
        for name in names:
            summaries.append(prepare_one(name, source_for(name, Path(source)) if every and source else source))
    except (HubUnavailableError, FileNotFoundError, NotADirectoryError, KeyError, ValueError) as e:
        sys.exit(f"error: {e.args[0] if isinstance(e, KeyError) and e.args else e}")
    if len(summaries) > 1:
        print(f"done: {sum(s.rows_written for s in summaries)} rows in {len(summaries)} files under {out}")
    return summaries

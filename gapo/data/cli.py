"""The loop both data CLIs share: one dataset or all of them, sources resolved per name, errors as one line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from gapo.data.math_datasets import HubUnavailableError, file_in_dir


def prepare_datasets(names: list[str], every: bool, source: str | None, out: str,
                     prepare_one: Callable[[str, str | Path | None], object],
                     source_for: Callable[[str, Path], Path | None] = lambda name, d: file_in_dir(d, name)) -> list:
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

"""Where a dataset's raw rows come from, the same for every dataset family (math and code).

A *source* is what ``--source`` names, one of:

- a local file, ``.jsonl``, ``.json`` or ``.parquet`` (:data:`LOCAL_SUFFIXES`) with the hub dataset's columns: any
  path that exists, or that ends in one of those suffixes (so a mistyped file name fails as a missing file, not as
  an unknown hub dataset);
- a Hugging Face hub dataset id (``org/name``), loaded with ``datasets.load_dataset``: anything else;
- nothing (None): the dataset spec's own hub copy (or, for a code dataset with an offline default, its package).

:func:`is_local_source` makes that choice. With ``--dataset all`` the source is a directory instead, and each
dataset's file in it is ``<name>.jsonl|.json|.parquet``, the first that exists (:func:`file_in_dir`). A hub source
that cannot be loaded (offline, gated, renamed) raises :class:`HubUnavailableError`, built by
:func:`hub_unavailable` with the way out: download elsewhere and pass the file as ``--source PATH``.

Each family reads the resolved file its own way (math: whole, ``math_datasets.read_local_file``; code: streamed,
``code_datasets.iter_local_file``), both through :func:`local_file`'s checks.
"""

from __future__ import annotations

import os
from pathlib import Path

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


class HubUnavailableError(RuntimeError):
    """The hub dataset could not be loaded (offline, no access, renamed)."""


def is_local_source(source: str | os.PathLike) -> bool:
    """A local file if it exists or names one of the supported suffixes; a hub dataset id otherwise."""
    return Path(source).exists() or str(source).lower().endswith(LOCAL_SUFFIXES)


def file_in_dir(directory: Path, name: str) -> Path:
    """``directory/<name>.jsonl|.json|.parquet``, the first that exists (``--source DIR`` with ``--dataset all``)."""
    for suffix in LOCAL_SUFFIXES:
        path = Path(directory) / f"{name}{suffix}"
        if path.is_file():
            return path
    raise FileNotFoundError(f"no {name}{{{','.join(LOCAL_SUFFIXES)}}} in source directory {directory}")


def local_file(path: str | os.PathLike) -> Path:
    """``path`` as a local source file: FileNotFoundError if it is not a file, ValueError if its suffix is not one
    of :data:`LOCAL_SUFFIXES` (checked before any row is read)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"source file not found: {path}")
    if path.suffix.lower() not in LOCAL_SUFFIXES:
        raise ValueError(f"unsupported source file {path}: use one of {', '.join(LOCAL_SUFFIXES)}")
    return path


def hub_unavailable(name: str, split: str, error: Exception, config: str | None = None,
                    hint: str = "") -> HubUnavailableError:
    """The error for a hub dataset ``name`` whose ``split`` (of ``config``) failed to load with ``error``: what
    failed, and how to pass the data as a local file instead; ``hint`` is appended (another way to get it)."""
    where = f"split {split!r}" + (f", config {config!r}" if config else "")
    return HubUnavailableError(
        f"could not load {name!r} ({where}) from the Hugging Face hub: {type(error).__name__}: {error}\n"
        f"If this machine is offline, download the dataset elsewhere and pass it as a local file: "
        f"--source PATH ({'/'.join(LOCAL_SUFFIXES)}, with the hub dataset's columns).{hint}"
    )

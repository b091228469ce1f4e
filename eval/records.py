"""Per-sample records (JSONL), appended one whole problem at a time, and what a resumed run can skip.

One line per sample: ``benchmark``, ``problem`` (row in the benchmark file), ``id``, ``data_source``,
``sample``, ``seed``, ``response``, ``pred`` (extracted answer), ``correct``, ``score``, ``finish_reason``,
``response_tokens`` and the reward's other fields. Records are written in whole chunks (a problem, or with
large n a slice of its samples: see :mod:`eval.runner`), each with one ``write`` flushed to disk, so a
killed run leaves whole chunks plus at most one torn tail. On load, a torn last line is tolerated and a
problem without all its samples is dropped (rewritten out of the file), so the resumed run redoes exactly
the problems that were not finished.

Memory: the store keeps no record, only per-problem counts (:class:`ProblemStats`: samples, correct ones,
tokens, truncations, ...), which is all the reports need; the file is read and repaired line by line. So a
run of n = 256 samples per problem holds 256 x problems small counters, never the responses themselves.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

SAMPLES_FILE = "samples.jsonl"


@dataclass
class ProblemStats:
    """What the reports need of one problem's records: counts, never the responses."""

    n: int = 0  # samples
    correct: int = 0
    response_tokens: int = 0  # summed over samples
    truncated: int = 0  # finish_reason == "length"
    format_errors: int = 0
    timeouts: int = 0

    def add(self, rec: dict) -> None:
        """Count one record in."""
        self.n += 1
        self.correct += bool(rec.get("correct"))
        self.response_tokens += int(rec.get("response_tokens") or 0)
        self.truncated += rec.get("finish_reason") == "length"
        self.format_errors += bool(rec.get("format_error"))
        self.timeouts += bool(rec.get("timeout"))

    def merge(self, other: ProblemStats) -> None:
        """Add ``other``'s counts to these."""
        for field in ("n", "correct", "response_tokens", "truncated", "format_errors", "timeouts"):
            setattr(self, field, getattr(self, field) + getattr(other, field))

    @classmethod
    def of(cls, records: list[dict]) -> ProblemStats:
        """The counts of ``records``."""
        stats = cls()
        for rec in records:
            stats.add(rec)
        return stats


def read_records(path: Path) -> tuple[list[dict], bool]:
    """All parseable records, and whether the last line was torn (a run killed mid-write)."""
    if not path.exists():
        return [], False
    lines = path.read_bytes().split(b"\n")
    records, torn = [], False
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # no newline after it: the write was cut short
                torn = True
                continue
            raise ValueError(f"{path}:{i + 1}: corrupt record (not the last line, so not a torn write)") from None
    return records, torn


def complete_problems(records: list[dict], n: int) -> dict[tuple[str, int], list[dict]]:
    """``{(benchmark, problem): its n records sorted by sample}`` for problems with samples 0..n-1 all present."""
    by_problem: dict[tuple[str, int], dict[int, dict]] = defaultdict(dict)
    for rec in records:
        by_problem[(rec["benchmark"], int(rec["problem"]))][int(rec["sample"])] = rec
    return {key: [samples[i] for i in range(n)] for key, samples in by_problem.items()
            if set(samples) == set(range(n))}


class SampleStore:
    """The run's JSONL file: :meth:`load` (and repair) once, then :meth:`append` chunks of records.

    ``done``: ``{(benchmark, problem): ProblemStats}`` of the problems with all n samples recorded.
    """

    def __init__(self, out_dir: Path, n: int):
        """The store of ``out_dir``/samples.jsonl, ``n`` samples per problem; nothing is read before :meth:`load`."""
        self.path = Path(out_dir) / SAMPLES_FILE
        self.n = n
        self.done: dict[tuple[str, int], ProblemStats] = {}
        self._partial: dict[tuple[str, int], tuple[set[int], ProblemStats]] = {}

    def _scan(self) -> tuple[dict, bool, bool]:
        """One pass over the file: per problem, per sample, (line number, stats) of its last record; whether the
        tail was torn; how many records were read."""
        latest: dict[tuple[str, int], dict[int, tuple[int, ProblemStats]]] = defaultdict(dict)
        torn = False
        count = 0
        with open(self.path, "rb") as f:
            for i, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    if not line.endswith(b"\n"):  # the last line, without its newline: the write was cut short
                        torn = True
                        continue
                    raise ValueError(f"{self.path}:{i + 1}: corrupt record (not the last line, so not a torn "
                                     "write)") from None
                latest[(rec["benchmark"], int(rec["problem"]))][int(rec["sample"])] = (i, ProblemStats.of([rec]))
                count += 1
        return latest, torn, count

    def load(self) -> dict[tuple[str, int], ProblemStats]:
        """Read the file once: the problems with all n samples (``done``), after dropping from the file a torn tail,
        unfinished problems and repeated samples (each sample's last record is kept). Returns ``done``."""
        self.done, self._partial = {}, {}
        if not self.path.exists():
            return self.done
        latest, torn, count = self._scan()
        keep: set[int] = set()
        for key, samples in latest.items():
            if set(samples) != set(range(self.n)):
                continue
            stats = ProblemStats()
            for i in range(self.n):
                line_no, one = samples[i]
                keep.add(line_no)
                stats.merge(one)
            self.done[key] = stats
        if torn or len(keep) != count:  # drop the torn tail, unfinished problems and repeated samples
            self._rewrite(keep)
        return self.done

    def _rewrite(self, keep: set[int]) -> None:
        """Keep only the lines in ``keep`` (streamed to a temporary file, then renamed over the original)."""
        tmp = self.path.with_suffix(".jsonl.tmp")
        with open(self.path, "rb") as src, open(tmp, "wb") as dst:
            for i, line in enumerate(src):
                if i in keep:
                    dst.write(line if line.endswith(b"\n") else line + b"\n")
            dst.flush()
            os.fsync(dst.fileno())
        os.replace(tmp, self.path)

    def append(self, records: list[dict]) -> list[tuple[str, int]]:
        """Records (whole problems, or slices of their samples) in one write, flushed to disk; returns the
        problems this write completed."""
        if not records:
            return []
        payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        with open(self.path, "a") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        finished = []
        for rec in records:
            key = (rec["benchmark"], int(rec["problem"]))
            seen, stats = self._partial.setdefault(key, (set(), ProblemStats()))
            sample = int(rec["sample"])
            if sample in seen:
                raise ValueError(f"sample {sample} of problem {key} recorded twice")
            seen.add(sample)
            stats.add(rec)
            if len(seen) == self.n:
                self.done[key] = stats
                del self._partial[key]
                finished.append(key)
        return finished

"""Per-sample records (JSONL), appended one whole problem at a time, and what a resumed run can skip.

One line per sample: ``benchmark``, ``problem`` (row in the benchmark file), ``id``, ``data_source``,
``sample``, ``seed``, ``response``, ``pred`` (extracted answer), ``correct``, ``score``, ``finish_reason``,
``response_tokens`` and the reward's other fields. A problem's lines are written with one ``write`` and
flushed to disk, so a killed run leaves whole problems plus at most one torn tail. On load, a torn last
line is tolerated and a problem without all its samples is dropped (rewritten out of the file), so the
resumed run redoes exactly the problems that were not finished.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

SAMPLES_FILE = "samples.jsonl"


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
    """The run's JSONL file: :meth:`load` (and repair) once, then :meth:`append` whole problems."""

    def __init__(self, out_dir: Path, n: int):
        self.path = Path(out_dir) / SAMPLES_FILE
        self.n = n
        self.done: dict[tuple[str, int], list[dict]] = {}

    def load(self) -> dict[tuple[str, int], list[dict]]:
        records, torn = read_records(self.path)
        self.done = complete_problems(records, self.n)
        kept = sum(len(v) for v in self.done.values())
        if torn or kept != len(records):  # drop the torn tail and unfinished problems
            tmp = self.path.with_suffix(".jsonl.tmp")
            with open(tmp, "w") as f:
                for recs in self.done.values():
                    f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        return self.done

    def append(self, records: list[dict]) -> None:
        """One problem's records in one write, then flushed to disk."""
        payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        with open(self.path, "a") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        key = (records[0]["benchmark"], int(records[0]["problem"]))
        self.done[key] = sorted(records, key=lambda r: r["sample"])

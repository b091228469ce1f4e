"""Per-sample records (JSONL), appended one whole problem at a time, and what a resumed run can skip.

One line per sample: ``benchmark``, ``problem`` (row in the benchmark file), ``id``, ``data_source``,
``sample``, ``seed``, ``response``, ``pred`` (extracted answer), ``correct``, ``score``, ``finish_reason``,
``response_tokens``, ``entrance`` (the response's first move: a list of token ids, :mod:`gapo.entrance`; absent
in records written before it existed) and the reward's other fields. Records are written in whole chunks (a problem, or with
large n a slice of its samples: see :mod:`eval.runner`), each with one ``write`` flushed to disk, so a
killed run leaves whole chunks plus at most one torn tail. On load, a torn last line is tolerated and a
problem without all its samples is dropped (rewritten out of the file), so the resumed run redoes exactly
the problems that were not finished.

Memory: the store keeps no record, only per-problem counts (:class:`ProblemStats`: samples, correct ones,
tokens, truncations, ..., and per first move its samples and correct ones), which is all the reports need; the
file is read and repaired line by line. So a run of n = 256 samples per problem holds per problem a few counters
and at most 256 first moves (m token ids each), never the responses themselves.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from gapo.entrance import GroupEntrances, group_entrances, majority_entrance

SAMPLES_FILE = "samples.jsonl"


_COUNTS = ("n", "correct", "response_tokens", "truncated", "format_errors", "timeouts")


@dataclass
class ProblemStats:
    """What the reports need of one problem's records: counts, never the responses.

    ``moves``: per first move (a tuple of token ids, the record's ``entrance``) ``[samples, correct ones, lowest
    sample index]``; the index keeps :func:`gapo.entrance.majority_entrance`'s tie-break (first in sample order)
    whatever order the records came in. A record without ``entrance`` adds to the counts only.
    """

    n: int = 0  # samples
    correct: int = 0
    response_tokens: int = 0  # summed over samples
    truncated: int = 0  # finish_reason == "length"
    format_errors: int = 0
    timeouts: int = 0
    moves: dict[tuple, list[int]] = field(default_factory=dict)

    def add(self, rec: dict) -> None:
        """Count one record in."""
        sample = int(rec.get("sample", self.n))
        self.n += 1
        self.correct += bool(rec.get("correct"))
        self.response_tokens += int(rec.get("response_tokens") or 0)
        self.truncated += rec.get("finish_reason") == "length"
        self.format_errors += bool(rec.get("format_error"))
        self.timeouts += bool(rec.get("timeout"))
        if rec.get("entrance") is not None:
            self._count_move(tuple(int(t) for t in rec["entrance"]), 1, int(bool(rec.get("correct"))), sample)

    def _count_move(self, move: tuple, n: int, correct: int, first: int) -> None:
        seen = self.moves.setdefault(move, [0, 0, first])
        seen[0] += n
        seen[1] += correct
        seen[2] = min(seen[2], first)

    def merge(self, other: ProblemStats) -> None:
        """Add ``other``'s counts (first moves included) to these."""
        for name in _COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for move, (n, correct, first) in other.moves.items():
            self._count_move(move, n, correct, first)

    @property
    def has_entrances(self) -> bool:
        """Whether every sample was counted with its first move (False when some record had no ``entrance``)."""
        return self.n > 0 and sum(v[0] for v in self.moves.values()) == self.n

    def _expanded(self) -> tuple[list[tuple], list[bool]]:
        """One (move, success) per sample, the moves in order of their first sample: what
        :mod:`gapo.entrance` takes, with the same distinct moves, counts and first-in-sample-order tie-break."""
        moves, success = [], []
        for move, (n, correct, _first) in sorted(self.moves.items(), key=lambda kv: kv[1][2]):
            moves += [move] * n
            success += [True] * correct + [False] * (n - correct)
        return moves, success

    def entrances(self) -> GroupEntrances | None:
        """:func:`gapo.entrance.group_entrances` of this problem's samples (None without :attr:`has_entrances`)."""
        return group_entrances(*self._expanded()) if self.has_entrances else None

    def majority(self) -> tuple[int, int] | None:
        """``(n_maj, c_maj)``: samples sharing the most common first move (:func:`gapo.entrance.majority_entrance`,
        ties to the move seen first in sample order) and the correct ones among them; None without
        :attr:`has_entrances`."""
        if not self.has_entrances:
            return None
        moves, success = self._expanded()
        chosen = majority_entrance(moves)
        return len(chosen), sum(success[i] for i in chosen)

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

"""Peak memory of preparing LiveCodeBench rows with huge tests (issue: some lcbv5 rows carry payloads over 50 MB).

    python -m recipe.bench.code_prepare [--huge-rows 6] [--huge-mb 60] [--small-rows 200] [--max-peak-mb N]

Writes a synthetic DeepCoder-style ``livecodebench`` jsonl (``--huge-rows`` rows whose one stdin test carries
``--huge-mb`` MB of input, among ``--small-rows`` ordinary ones), runs ``python -m gapo.data.prepare_code --dataset
livecodebench --source FILE`` in a child process and prints its peak resident memory (``ru_maxrss`` of the child),
the rows written and the parquet's row groups. LCB rows keep every test (gapo/rewards/code/protocol.py), so the
prepared rows are as large as their tests; the writer flushes a row group every 64 MiB of text
(``gapo.data.parquet_io.BATCH_BYTES``), so the peak follows the largest rows, not their count. The real hub rows
cannot be fetched here (no hub access); the sizes are the ones reported for lcbv5's largest rows.
``--max-peak-mb`` makes it exit 1 above that peak (a benchmark target, not a test).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_source(path: Path, huge_rows: int, huge_mb: float, small_rows: int) -> int:
    """The synthetic source; returns the largest row's size in bytes."""
    largest = 0
    with path.open("w") as f:
        for i in range(huge_rows + small_rows):  # the huge rows first, together: the worst case for a row group
            size = int(huge_mb * 2**20) if i < huge_rows else 200
            tests = [{"input": "7\n" + "1 " * (size // 2), "output": "7\n", "testtype": "stdin", "metadata": {}}]
            line = json.dumps({"problem": f"Problem {i}: print the first number.", "tests": json.dumps(tests),
                               "metadata": "{}", "starter_code": ""})
            largest = max(largest, len(line))
            f.write(line + "\n")
    return largest


def main(argv=None) -> int:
    """CLI entry: prepare a synthetic source in a child process and print its peak RSS; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m recipe.bench.code_prepare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--huge-rows", type=int, default=6)
    parser.add_argument("--huge-mb", type=float, default=60.0)
    parser.add_argument("--small-rows", type=int, default=200)
    parser.add_argument("--max-peak-mb", type=float, default=None)
    args = parser.parse_args(argv)
    if args.huge_rows < 0 or args.small_rows < 0 or args.huge_mb <= 0:
        parser.error("--huge-rows and --small-rows must be >= 0 and --huge-mb > 0")

    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "livecodebench.jsonl"
        largest = write_source(src, args.huge_rows, args.huge_mb, args.small_rows)
        out = Path(tmp) / "out"
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "gapo.data.prepare_code", "--dataset", "livecodebench",
                               "--source", str(src), "--out", str(out)], capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            print(proc.stdout[-2000:], proc.stderr[-2000:], sep="\n")
            return proc.returncode
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # kB on Linux
        meta = pq.ParquetFile(out / "livecodebench.parquet").metadata
        groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        print(f"source: {src.stat().st_size / 2**20:.0f} MB, {args.huge_rows + args.small_rows} rows, largest row "
              f"{largest / 2**20:.1f} MB")
        print(f"prepare_code: {wall:.1f} s, peak RSS {peak_mb:.0f} MB; {meta.num_rows} rows written in "
              f"{len(groups)} row groups {groups}")
    if args.max_peak_mb is not None and peak_mb > args.max_peak_mb:
        print(f"FAIL: peak {peak_mb:.0f} MB > --max-peak-mb {args.max_peak_mb:.0f}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

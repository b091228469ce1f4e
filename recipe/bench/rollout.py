"""Benchmark: the two CPU rollout engines (HF generate, verl's vLLM) on the same smoke run, and the poll interval.

    python -m recipe.bench.rollout [--out runs/bench-rollout] [--steps 3] [--engines hf vllm]
        [--poll-intervals 0.05 2.0] [--json out.json]          (or `make bench-rollout`)

Runs `python -m recipe.smoke` once per (engine, poll interval), each in its own environment (hf: .venv, vllm:
.venv-vllm; both made by the Makefile), with the same steps, data, model and seeds, then prints one table from
the runs' own summaries (OUT/<name>/logs/summary.json) and metrics: wall time of the whole smoke run (train,
then resume), step 1 and the mean of later steps (`timing_s/step`), `timing_s/gen` and `timing_s/update_weights`
(means over steps), the largest rollout/actor log-prob gap, and the peak memory (PSS) of the run's process tree.
`trainer.v1.sampler.poll_interval` 2.0 is verl's default (every generation phase a multiple of 2 s); the CPU
presets use 0.05. Step times depend on the machine and its load: compare rows of one invocation only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHONS = {"hf": ROOT / ".venv" / "bin" / "python", "vllm": ROOT / ".venv-vllm" / "bin" / "python"}
INSTALL = {"hf": "make install", "vllm": "make install-vllm"}


def run_one(engine: str, poll: float, out: Path, steps: int) -> dict:
    """Run the smoke run with one engine and poll interval in that engine's venv; returns its summary.json. Exits on
    a missing venv or a failed run."""
    python = PYTHONS[engine]
    if not python.exists():
        sys.exit(f"{python} is missing: run `{INSTALL[engine]}` first (or `make bench-rollout`, which does)")
    cmd = [str(python), "-m", "recipe.smoke", "--out", str(out), "--steps", str(steps - 1), "--resume-steps", "1",
           "--rollout", engine, f"trainer.v1.sampler.poll_interval={poll}"]
    print(f"[bench.rollout] {engine}, poll_interval {poll}: {' '.join(cmd[1:])}", flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"[bench.rollout] {engine} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return json.loads((out / "logs" / "summary.json").read_text())


def row(engine: str, poll: float, summary: dict) -> dict:
    """One table row from a smoke run's summary: wall time, step times, generation and weight-sync means, log-prob gap,
    peak memory (GiB)."""
    steps = {int(k): m for k, m in summary["steps"].items()}
    later = [steps[s]["timing_s/step"] for s in sorted(steps)[1:]]
    mean = lambda key: statistics.fmean(m[key] for m in steps.values())  # noqa: E731
    return {"engine": engine, "poll_interval": poll, "wall_s": summary["wall_s"],
            "step1_s": steps[min(steps)]["timing_s/step"], "later_step_s": statistics.fmean(later) if later else None,
            "gen_s": mean("timing_s/gen"), "update_weights_s": mean("timing_s/update_weights"),
            "logp_gap_max": max(m["training/rollout_probs_diff_max"] for m in steps.values()),
            "peak_gib": max(r["peak_pss_bytes"] for r in summary["runs"]) / 2**30}


def table(rows: list[dict]) -> str:
    """The rows as a markdown table."""
    lines = ["| engine | poll_interval | smoke wall (s) | step 1 (s) | later steps (s) | gen (s) | update_weights (s) "
             "| log-prob gap max | peak memory (GiB) |", "|" + " --- |" * 9]
    for r in rows:
        later = f"{r['later_step_s']:.2f}" if r["later_step_s"] is not None else "-"
        lines.append(f"| {r['engine']} | {r['poll_interval']} | {r['wall_s']:.0f} | {r['step1_s']:.2f} | {later} | "
                     f"{r['gen_s']:.2f} | {r['update_weights_s']:.3f} | {r['logp_gap_max']:.1e} | {r['peak_gib']:.1f} |")
    return "\n".join(lines)


def main(argv=None):
    """CLI entry: one smoke run per (engine, poll interval), then the table (and ``--json``)."""
    parser = argparse.ArgumentParser(prog="python -m recipe.bench.rollout", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/bench-rollout", help="one smoke folder per row under it (wiped)")
    parser.add_argument("--steps", type=int, default=3, help="steps in all: the last one after a resume (>= 2)")
    parser.add_argument("--engines", nargs="+", choices=sorted(PYTHONS), default=["hf", "vllm"])
    parser.add_argument("--poll-intervals", nargs="+", type=float, default=[0.05, 2.0],
                        help="trainer.v1.sampler.poll_interval values (2.0 is verl's default)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error(f"--steps {args.steps}: at least 2 (one trained, one after the resume)")
    rows = []
    for engine in args.engines:
        for poll in args.poll_intervals:
            summary = run_one(engine, poll, Path(args.out) / f"{engine}-poll{poll}", args.steps)
            rows.append(row(engine, poll, summary))
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

"""CPU smoke run: train a tiny random model with GAPO through verl's real trainer, then resume from its checkpoint.

    python -m recipe.smoke [--out runs/smoke] [--steps 2] [--resume-steps 1]   (or `make smoke`)

1. builds the tiny model/tokenizer and the synthetic task's parquet files under OUT (offline, cached);
2. trains `--steps` steps with `python -m recipe.main_gapo --config-name smoke_cpu` (Ray, FSDP2 actor, HF
   rollout groups, reward, GAPO loss, a checkpoint every step);
3. runs again with `--resume-steps` more steps: verl resumes from the latest checkpoint;
4. checks that the run showed GAPO at work (mixed groups, several thresholds, clipping that binds,
   thresholds that reached the loss, the resumed run starting after the saved step) and prints a summary.
Logs: OUT/logs/run{1,2}.log (stdout+stderr) and run{1,2}.jsonl (metrics per step); checkpoints: OUT/checkpoints.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# CPU platform for verl (gapo.cpu): selected in the driver and inherited by every Ray worker.
CPU_ENV = {"VERL_PLATFORM": "cpu", "VERL_ENGINE_DEVICE": "cuda", "TOKENIZERS_PARALLELISM": "false",
           "RAY_DEDUP_LOGS": "0", "WANDB_MODE": "offline"}


class SmokeCheckError(RuntimeError):
    """The smoke run finished but did not show what it must (or did not finish)."""


def prepare(out: Path) -> None:
    """Tiny model and task data under OUT (the smoke_cpu preset reads them from GAPO_SMOKE_DIR)."""
    from gapo.smoke.task import make_dataset
    from gapo.smoke.tiny_model import build_tiny_model

    build_tiny_model(out / "model")
    make_dataset(out / "data")


def run_command(out: Path, run: str, total_steps: int, overrides: list[str]) -> tuple[list[str], dict, Path, Path]:
    """(command, environment, metrics file, log file) of one training run, as `train` starts it (with cwd ROOT).
    Also used by tests that start the run themselves (tests/test_kill_resume.py kills it)."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    metrics_file, log_file = logs / f"{run}.jsonl", logs / f"{run}.log"
    env = {**os.environ, **CPU_ENV, "GAPO_SMOKE_DIR": str(out), "VERL_FILE_LOGGER_PATH": str(metrics_file)}
    cmd = [sys.executable, "-m", "recipe.main_gapo", "--config-name", "smoke_cpu",
           f"trainer.total_training_steps={total_steps}", *overrides]
    return cmd, env, metrics_file, log_file


def train(out: Path, run: str, total_steps: int, overrides: list[str]) -> Path:
    """One training run; returns its metrics file. Raises SmokeCheckError with the log's tail on failure."""
    cmd, env, metrics_file, log_file = run_command(out, run, total_steps, overrides)
    print(f"[smoke] {run}: {' '.join(cmd[1:])}\n[smoke] log: {log_file}", flush=True)
    start = time.time()
    with open(log_file, "w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    print(f"[smoke] {run}: exit {proc.returncode} after {time.time() - start:.0f} s", flush=True)
    if proc.returncode != 0:
        tail = "".join(log_file.read_text(errors="replace").splitlines(keepends=True)[-40:])
        raise SmokeCheckError(f"{run} failed (exit {proc.returncode}); last lines of {log_file}:\n{tail}")
    return metrics_file


def read_metrics(path: Path) -> dict[int, dict]:
    """{step: metrics} from verl's file logger."""
    if not path.exists():
        raise SmokeCheckError(f"no metrics file {path}: the trainer logged nothing (is 'file' in trainer.logger?)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {row["step"]: row["data"] for row in rows}


def check(run1: dict[int, dict], run2: dict[int, dict], steps: int, resume_steps: int, ckpt_dir: Path) -> None:
    """What a smoke run must show; each failure says what was missing."""
    problems = []
    if sorted(run1) != list(range(1, steps + 1)):
        problems.append(f"first run logged steps {sorted(run1)}, expected 1..{steps}")
    if sorted(run2) != list(range(steps + 1, steps + resume_steps + 1)):
        problems.append(f"resumed run logged steps {sorted(run2)}, expected {steps + 1}..{steps + resume_steps} "
                        "(it must continue from the checkpoint, not start over)")
    tracker = ckpt_dir / "latest_checkpointed_iteration.txt"
    if not tracker.exists() or tracker.read_text().strip() != str(steps + resume_steps):
        problems.append(f"{tracker} should name step {steps + resume_steps}")
    every = {**run1, **run2}
    if not every:
        raise SmokeCheckError("no steps logged at all")
    if not all(m.get("gapo/groups/mixed_frac", 0) > 0 for m in every.values()):
        problems.append("a step had no mixed group (0 < c < k): all-right or all-wrong groups show nothing")
    if not any(m.get("gapo/eps_high/max", 0) > m.get("gapo/eps_high/min", 0) for m in every.values()):
        problems.append("no step used more than one threshold: the adaptive clip was never exercised")
    if not all("gapo/loss_eps_high_mean" in m for m in every.values()):
        problems.append("gapo/loss_eps_high_mean missing: per-rollout thresholds did not reach the loss")
    if not any(v > 0 for m in every.values() for k, v in m.items() if k.startswith("gapo/clipfrac_pos/")):
        problems.append("nothing was ever clipped: raise the learning rate or the number of mini-batches")
    if problems:
        raise SmokeCheckError("smoke run did not show GAPO at work:\n- " + "\n- ".join(problems))


def summary_lines(metrics: dict[int, dict]) -> list[str]:
    lines = ["step  reward  mixed  eps_high(min/mean/max)        clipfrac  clipfrac_pos by c"]
    for step in sorted(metrics):
        m = metrics[step]
        by_c = {int(k.rsplit("/c", 1)[1]): v for k, v in m.items() if k.startswith("gapo/clipfrac_pos/c")}
        per_c = " ".join(f"c{c}={by_c[c]:.2f}" for c in sorted(by_c))
        lines.append(
            f"{step:>4}  {m.get('critic/score/mean', float('nan')):6.3f}  {m.get('gapo/groups/mixed_frac', float('nan')):5.2f}  "
            f"{m.get('gapo/eps_high/min', float('nan')):.4f}/{m.get('gapo/eps_high/mean', float('nan')):.4f}/"
            f"{m.get('gapo/eps_high/max', float('nan')):.4f}   {m.get('actor/pg_clipfrac', float('nan')):8.3f}  {per_c}"
        )
    return lines


def run_smoke(out: Path, steps: int = 2, resume_steps: int = 1, overrides: list[str] | None = None) -> dict:
    """The whole smoke run; returns {"run1": metrics, "run2": metrics, "ckpt_dir": path}. Raises SmokeCheckError."""
    out = out.resolve()
    overrides = list(overrides or [])
    prepare(out)
    ckpt_dir = out / "checkpoints"
    run1 = read_metrics(train(out, "run1", steps, overrides))
    run2 = read_metrics(train(out, "run2", steps + resume_steps, overrides))
    check(run1, run2, steps, resume_steps, ckpt_dir)
    return {"run1": run1, "run2": run2, "ckpt_dir": ckpt_dir}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m recipe.smoke", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/smoke", help="folder for model, data, logs, checkpoints (wiped)")
    parser.add_argument("--steps", type=int, default=2, help="steps of the first run")
    parser.add_argument("--resume-steps", type=int, default=1, help="steps the resumed run adds")
    parser.add_argument("overrides", nargs="*", help="hydra overrides for both runs, e.g. actor_rollout_ref.rollout.n=4")
    args = parser.parse_args(argv)
    out = Path(args.out)
    for stale in ("checkpoints", "logs"):  # a smoke run starts from scratch; its second run is the resume
        subprocess.run(["rm", "-rf", str(out / stale)], check=True)
    start = time.time()
    try:
        result = run_smoke(out, args.steps, args.resume_steps, args.overrides)
    except SmokeCheckError as err:
        sys.exit(f"[smoke] FAILED: {err}")
    print(f"\n[smoke] OK in {time.time() - start:.0f} s")
    print(f"[smoke] logs: {out.resolve() / 'logs'}\n[smoke] checkpoints: {result['ckpt_dir']}")
    print("\n".join(summary_lines({**result["run1"], **result["run2"]})))


if __name__ == "__main__":
    main()

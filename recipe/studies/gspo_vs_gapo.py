"""Seeded GSPO-vs-GAPO study on CPU: fixed clips against GAPO's adaptive clip on a task with a hard tail.

    python -m recipe.studies.gspo_vs_gapo [--out runs/study] [--seeds 0 1 2] [--methods ...] [--steps 24] [--reduced]
    make study            (the full study, about 30 minutes on 2 cores)
    make study REDUCED=1  (one seed, two methods, 3 steps: what CI runs)

Every run goes through the same verl trainer as every other run (`recipe.main_gapo`, the CPU smoke preset
`configs/smoke_cpu.yaml`: the tiny random model, HF rollout, GAPO's loss plug-in), supervised like the smoke run
(`recipe.smoke.train`: hard wall-clock limit, nothing left behind). Only the data, the clip and the seeds differ:

- Task: the smoke task (`gapo.smoke.task`: answer with one of the listed characters) with difficulty buckets
  (`DIFFICULTY_BUCKETS`: the random model succeeds ~2-10% on "hard", 20-49% on "mid", 61-78% on "easy"). Train
  prompts are the buckets in equal shares; held-out prompts are separate per bucket, each its own data_source,
  so verl's validation (every `--val-every` steps and before training; `--val-n` samples per prompt at
  temperature 1) gives exact pass@k and coverage per bucket (`val-passk/gapo_smoke_<bucket>/...`).
- Methods (`METHODS`): the fixed clips as GAPO's `constant` schedule, which equals verl's own `gspo` loss at
  that clip (tests/test_gapo_loss.py::test_constant_schedule_equals_verl_fixed_clip) and also logs the per-c
  diagnostics: `gspo_symmetric` (eps_high = eps_low) and `gspo_clip_higher` (eps_high = GAPO's eps_high_max, the
  other end point); GAPO `gapo_linear` (the paper's Eq. 11) and `gapo_exp`.
- Seeds: `data.seed` (order of the train prompts) and `rollout.seed` (sampling) per seed, the same for every
  method; the base model is the same.

Outputs under OUT (all written by this command, from the runs' own metrics files):
`report.md` (setup, commands, tables with mean and spread across seeds, what the study shows and does not),
`report.json` (every number of the report, recomputed by the tests from the logs), `figures/curves.png`
(reward and validation per bucket, seed means per method), `figures/mechanism_<method>.png` (per-c clip fraction,
|ratio - 1| and their correlation with the advantage, seed means), `commands.sh` (each run's exact command),
`runs/<method>-s<seed>/logs/train.{jsonl,log}` (verl's file logger and the run's output). A run whose metrics file
already holds its last step is not run again (rerun the command to finish an interrupted study; `--fresh` wipes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from recipe.smoke import CPU_ENV, ROLLOUT_OVERRIDES, RUN_TIMEOUT_S, SmokeCheckError, read_metrics, run_command, train

LOSS = "actor_rollout_ref.actor.policy_loss"
# name -> (what it is, hydra overrides on top of the smoke preset's GAPO loss)
METHODS: dict[str, tuple[str, list[str]]] = {
    "gspo_symmetric": ("fixed clip, eps_high = eps_low (symmetric GSPO clip)",
                       [f"{LOSS}.schedule=constant",
                        f"{LOSS}.eps_high_max=${{actor_rollout_ref.actor.clip_ratio_low}}"]),
    "gspo_clip_higher": ("fixed clip, eps_high = eps_high_max for every rollout (GSPO clip-higher)",
                         [f"{LOSS}.schedule=constant"]),
    "gapo_linear": ("GAPO, linear schedule (paper Eq. 11)", [f"{LOSS}.schedule=linear"]),
    "gapo_exp": ("GAPO, exponential schedule", [f"{LOSS}.schedule=exp"]),
}
CLIP_METHODS = tuple(METHODS)  # the clip study's methods (`make study`)
# VIGOR's allocation (gapo.vigor; configs/vigor/) over two of the clips above: the 2x2 allocation x clip study
# (`make study-vigor`, recipe/studies/vigor_2x2.py) runs them beside their uniform twins gspo_clip_higher and
# gapo_linear
VIGOR_ON = ["vigor=enabled"]
METHODS.update({
    "vigor_gspo_clip_higher": ("VIGOR allocation (random tie-break), fixed clip-higher",
                               [*VIGOR_ON, *METHODS["gspo_clip_higher"][1]]),
    "vigor_gapo_linear": ("VIGOR allocation (random tie-break), GAPO linear", [*VIGOR_ON, *METHODS["gapo_linear"][1]]),
    "vigor_harder_gapo_linear": ("VIGOR allocation, harder-first tie-break, GAPO linear",
                                 [*VIGOR_ON, "vigor.tie_break=harder_first", *METHODS["gapo_linear"][1]]),
})
REDUCED_METHODS = ("gspo_clip_higher", "gapo_linear")
COUNTS = ("steps", "val_every", "val_n", "val_per_bucket", "n_train", "last", "jobs")  # settings that are counts >= 1


@dataclass
class StudySettings:
    """One study's size. The defaults are the full study (about 30 minutes on 2 cores)."""

    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    methods: list[str] = field(default_factory=lambda: list(CLIP_METHODS))
    steps: int = 24            # rollout batches of 8 prompts x 8 rollouts, 4 mini-batches each
    val_every: int = 8         # validation steps: 0 (before training), val_every, 2 val_every, ..., steps
    val_n: int = 8             # samples per held-out prompt (pass@1..pass@val_n)
    val_per_bucket: int = 12   # held-out prompts per difficulty bucket
    n_train: int = 512
    last: int = 6              # "late in training": averages over the last `last` steps (training metrics)
    timeout_s: float = RUN_TIMEOUT_S
    jobs: int = 1              # runs at once
    # actor learning rate: 4x the smoke preset's 5e-3, with which 24 steps left held-out pass@1 within noise in every
    # bucket (measured, docs/studies.md); at 2e-2 the hard and mid buckets rise within the same 24 steps
    lr: float = 2e-2
    rollout: str = "hf"        # hf (HF generate) or vllm (verl's vLLM rollout; the vLLM CPU environment)
    overrides: list[str] = field(default_factory=list)  # hydra overrides for every run (after the study's own)

    @classmethod
    def reduced(cls, methods=REDUCED_METHODS) -> StudySettings:
        """CI's reduced study: one seed, two methods (or `methods`), 3 steps, validation before and after."""
        return cls(seeds=[0], methods=list(methods), steps=3, val_every=3, val_n=4, val_per_bucket=4,
                   n_train=64, last=2)

    def validate(self) -> None:
        """Raise ValueError naming the flag when a setting is out of range (unknown method, counts < 1, steps not a
        multiple of val_every, last > steps, lr, rollout engine, repeated seeds)."""
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown method(s) {unknown}: choose from {list(METHODS)}")
        for name in COUNTS:
            if int(getattr(self, name)) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.steps % self.val_every:
            raise ValueError(f"--steps ({self.steps}) must be a multiple of --val-every ({self.val_every}) so that "
                             "the last step is validated (the report's final pass@k)")
        if self.last > self.steps:
            raise ValueError(f"--last ({self.last}) must be <= --steps ({self.steps})")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"--lr must be a finite number > 0, got {self.lr}")
        if self.rollout not in ROLLOUT_OVERRIDES:
            raise ValueError(f"--rollout {self.rollout!r}: choose from {sorted(ROLLOUT_OVERRIDES)}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"--seeds must be distinct and at least one, got {self.seeds}")


def run_name(method: str, seed: int) -> str:
    """A run's folder name, ``<method>-s<seed>``."""
    return f"{method}-s{seed}"


def run_overrides(out: Path, method: str, seed: int, s: StudySettings) -> list[str]:
    """Hydra overrides of one run on top of the smoke preset: the study's data and model, its clip, its seeds."""
    run_dir = out / "runs" / run_name(method, seed)
    return [
        f"data.train_files={out / 'data' / 'train.parquet'}", f"data.val_files={out / 'data' / 'val.parquet'}",
        f"actor_rollout_ref.model.path={out / 'model'}",
        f"data.seed={seed}", f"actor_rollout_ref.rollout.seed={seed}", f"vigor.seed={seed}",
        f"actor_rollout_ref.actor.optim.lr={s.lr}",
        "trainer.save_freq=-1", f"trainer.test_freq={s.val_every}", "trainer.val_before_train=true",
        f"actor_rollout_ref.rollout.val_kwargs.n={s.val_n}", "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        f"trainer.experiment_name=study_{run_name(method, seed)}",
        f"trainer.default_local_dir={run_dir / 'checkpoints'}",
        *ROLLOUT_OVERRIDES[s.rollout], *METHODS[method][1], *s.overrides,
    ]


def prepare(out: Path, s: StudySettings) -> None:
    """The tiny model and the bucketed task under OUT (shared by every run)."""
    from gapo.smoke.task import make_study_dataset
    from gapo.smoke.tiny_model import build_tiny_model

    build_tiny_model(out / "model")
    make_study_dataset(out / "data", n_train=s.n_train, n_val_per_bucket=s.val_per_bucket)


def _complete(metrics_file: Path, steps: int) -> bool:
    try:
        return max(read_metrics(metrics_file)) >= steps
    except (SmokeCheckError, ValueError, json.JSONDecodeError):
        return False


def run_all(out: Path, s: StudySettings, echo=print) -> dict[str, Path]:
    """Every (method, seed) run, in seed-major order (so a stopped study has whole seeds); returns
    {run name: metrics file}. Writes OUT/commands.sh first."""
    runs = [(m, seed) for seed in s.seeds for m in s.methods]
    lines = ["#!/usr/bin/env bash",
             "# The study's runs as recipe/studies/gspo_vs_gapo.py starts them, from the repo root (each run also",
             "# gets its own Ray temp dir: +ray_kwargs.ray_init._temp_dir=/tmp/gsm-...).",
             "set -euo pipefail"]
    for method, seed in runs:
        cmd, env, metrics_file, _ = run_command(out / "runs" / run_name(method, seed), "train", s.steps,
                                                run_overrides(out, method, seed, s))
        env_set = {k: env[k] for k in (*CPU_ENV, "GAPO_SMOKE_DIR", "VERL_FILE_LOGGER_PATH")}
        lines.append(" ".join(f"{k}={shlex.quote(v)}" for k, v in env_set.items()) + " "
                     + shlex.join(["python", *cmd[1:]]))
    (out / "commands.sh").write_text("\n".join(lines) + "\n")
    files = {run_name(m, seed): out / "runs" / run_name(m, seed) / "logs" / "train.jsonl" for m, seed in runs}

    def one(i: int, method: str, seed: int) -> None:
        name = run_name(method, seed)
        if _complete(files[name], s.steps):
            echo(f"[study] {i}/{len(runs)} {name}: done before, kept ({files[name]})")
            return
        shutil.rmtree(out / "runs" / name, ignore_errors=True)  # an incomplete run starts over
        start = time.time()
        echo(f"[study] {i}/{len(runs)} {name}: {METHODS[method][0]}")
        train(out / "runs" / name, "train", s.steps, run_overrides(out, method, seed, s), timeout_s=s.timeout_s)
        echo(f"[study] {i}/{len(runs)} {name}: {time.time() - start:.0f} s")

    # --jobs runs at once (each its own Ray cluster and temp dir; ~4 GiB each): start-up is mostly waiting
    with ThreadPoolExecutor(max_workers=s.jobs) as pool:
        for future in [pool.submit(one, i, m, seed) for i, (m, seed) in enumerate(runs, 1)]:
            future.result()  # the first failure stops the study (runs already started finish)
    return files


# ------------------------------------------------------------------ the report: every number from the metrics files
CLIPFRAC, RATIO_DEV, CORR = "gapo/clipfrac_pos/c", "gapo/ratio_dev_pos/c", "gapo/is_adv_corr"
REWARD = "critic/score/mean"
GROUP_FRACS = ("gapo/groups/all_wrong_frac", "gapo/groups/mixed_frac", "gapo/groups/all_correct_frac")
COVERAGE_THRESHOLD = "5%"  # trainer.val_coverage_threshold's default (configs/base/gapo.yaml)


def val_key(bucket: str, name: str) -> str:
    """verl validation's metric of one bucket (gapo.step_metrics.val_passk_metrics)."""
    from gapo.smoke.task import bucket_source

    return f"val-passk/{bucket_source(bucket)}/{name}"


def val_names(s: StudySettings) -> list[str]:
    """The validation numbers the report keeps per bucket: pass@1, pass@val_n, coverage (fraction of problems
    solved above the threshold)."""
    return ["pass@1", f"pass@{s.val_n}", f"coverage_frac@{COVERAGE_THRESHOLD}"]


def _spread(values: list[float]) -> dict:
    """Mean and sample standard deviation across seeds (eval's own `spread`), with the values."""
    from gapo.passk import spread

    sp = spread(values)
    return {"mean": sp["mean"], "std": sp["std"] or 0.0, "values": list(values)}


def _mean_over(metrics: dict[int, dict], steps, key: str) -> float | None:
    vals = [metrics[t][key] for t in steps if t in metrics and key in metrics[t]]
    return sum(vals) / len(vals) if vals else None


def summarize(metrics_by_run: dict[str, dict[int, dict]], s: StudySettings) -> dict:
    """report.json's numbers from each run's {step: metrics}: per method, across seeds (mean, sample std, values):
    validation per bucket before training (step 0) and at the last step; training reward and group fractions
    averaged over the last `s.last` steps; per-c clip fraction and |ratio - 1| and the correlation averaged over
    every step (a c absent in a step does not count there)."""
    from gapo.smoke.task import DIFFICULTY_BUCKETS

    late = range(s.steps - s.last + 1, s.steps + 1)
    out: dict = {"settings": {**s.__dict__}, "buckets": {b: list(r) for b, r in DIFFICULTY_BUCKETS.items()},
                 "methods": {}}
    for method in s.methods:
        runs = [metrics_by_run[run_name(method, seed)] for seed in s.seeds]
        res: dict = {"description": METHODS[method][0], "base": {}, "final": {}, "late": {}, "mechanism": {}}
        for phase, step in (("base", 0), ("final", s.steps)):
            for bucket in DIFFICULTY_BUCKETS:
                res[phase][bucket] = {name: _spread([m[step][val_key(bucket, name)] for m in runs])
                                      for name in val_names(s)}
        for key in (REWARD, *GROUP_FRACS):
            res["late"][key] = _spread([_mean_over(m, late, key) for m in runs])
        res["early"] = {REWARD: _spread([_mean_over(m, range(1, s.last + 1), REWARD) for m in runs])}
        every = range(1, s.steps + 1)
        for prefix in (CLIPFRAC, RATIO_DEV):
            cs = sorted({int(k[len(prefix):]) for m in runs for t in every for k in m.get(t, {})
                         if k.startswith(prefix)})
            per_c = {}
            for c in cs:
                vals = [_mean_over(m, every, f"{prefix}{c}") for m in runs]
                if all(v is not None for v in vals):  # c seen in every seed
                    per_c[str(c)] = _spread(vals)
            res["mechanism"][prefix.rstrip("c").rstrip("/")] = per_c
        corr = [_mean_over(m, every, CORR) for m in runs]
        res["mechanism"][CORR] = _spread(corr) if all(v is not None for v in corr) else None
        out["methods"][method] = res
    out["findings"] = findings(out, s)
    return out


def _fmt(sp: dict | None, digits: int = 3) -> str:
    if sp is None:
        return "n/a"
    return f"{sp['mean']:.{digits}f} ± {sp['std']:.{digits}f}"


def _distinguishable(a: dict, b: dict, draws: int | None = None) -> tuple[float, float, bool]:
    """(difference of seed means a - b, its standard error, |difference| > 2 standard errors).

    The standard error of each mean is the seeds' (sample std / sqrt(seeds)), but never below the sampling noise
    of the evaluation when `draws` (the 0/1 draws behind one seed's value: problems x samples for pass@1,
    problems for pass@k and coverage) is given: sqrt(p (1 - p) / (draws x seeds)). With three seeds the seeds'
    spread alone can be far too small (two runs can agree by chance). With one seed nothing is distinguishable."""
    def var_of_mean(x: dict) -> float:
        n = len(x["values"])
        floor = x["mean"] * (1 - x["mean"]) / (draws * n) if draws else 0.0
        return max(x["std"] ** 2 / n, floor)

    se = math.sqrt(var_of_mean(a) + var_of_mean(b))
    diff = a["mean"] - b["mean"]
    return diff, se, (min(len(a["values"]), len(b["values"])) > 1 and abs(diff) > 2 * se)


def findings(summary: dict, s: StudySettings) -> list[str]:
    """What the numbers show and what they do not, as sentences built from report.json's numbers (no number here
    is typed by hand; thresholds for wording are stated in the sentences)."""
    methods = summary["methods"]
    fixed = [m for m in methods if m.startswith("gspo")]
    adaptive = [m for m in methods if m.startswith("gapo")]
    out = []
    pooled = {b: sum(methods[m]["base"][b]["pass@1"]["mean"] for m in methods) / len(methods)
              for b in summary["buckets"]}
    out.append("Difficulty before training (pass@1 at step 0, pooled over methods): "
               + ", ".join(f"{b} {v:.3f}" for b, v in pooled.items())
               + f"; the buckets are meant to be ~0.02-0.10 (hard), 0.20-0.49 (mid), 0.61-0.78 (easy) for a uniform "
                 f"sampler, measured here on {s.val_per_bucket} prompts x {s.val_n} samples per bucket.")
    compared = 0
    for g in adaptive:
        for f in fixed:
            for bucket in ("hard",) + tuple(b for b in summary["buckets"] if b != "hard"):
                for name in ("pass@1", f"pass@{s.val_n}"):
                    compared += 1
                    draws = s.val_per_bucket * (s.val_n if name == "pass@1" else 1)
                    diff, se, sure = _distinguishable(methods[g]["final"][bucket][name],
                                                      methods[f]["final"][bucket][name], draws)
                    if bucket == "hard" or sure:
                        verdict = ("beyond 2 standard errors of seeds and evaluation noise" if sure else
                                   "within 2 standard errors: not distinguishable from noise" if len(s.seeds) > 1
                                   else "one seed: no spread to judge it by")
                        out.append(f"{g} - {f}, final {name} on {bucket}: {diff:+.3f} (standard error {se:.3f}; "
                                   f"{verdict}).")
    if compared and len(s.seeds) > 1:
        out.append(f"{compared} held-out comparisons of a GAPO method with a fixed clip were made (the hard bucket's "
                   f"are all listed above, the others only where they cross 2 standard errors); about "
                   f"{0.0455 * compared:.1f} of them would cross 2 standard errors by chance alone.")
    for f in fixed:
        c1 = methods[f]["mechanism"]["gapo/clipfrac_pos"].get("1")
        if c1 is None:
            out.append(f"{f}: no step had a success at c = 1 in every seed, so the clip at c = 1 (where GAPO gives the "
                       "most headroom) was never measured.")
        elif c1["mean"] < 0.01:
            out.append(f"{f}: clip fraction at c = 1 is {c1['mean']:.4f} (< 0.01): the fixed clip hardly binds on rare "
                       "successes, so GAPO's extra headroom there has little to act on (a null result is expected).")
        else:
            out.append(f"{f}: clip fraction at c = 1 is {_fmt(c1, 4)}: the fixed clip binds on rare successes, "
                       "which is the premise of GAPO.")
    for m in methods:
        dev = methods[m]["mechanism"]["gapo/ratio_dev_pos"]
        cs = sorted(dev, key=int)
        if len(cs) >= 2:
            diff, se, sure = _distinguishable(dev[cs[0]], dev[cs[-1]])
            verdict = ("larger at small c beyond 2 standard errors, as the paper says" if sure and diff > 0 else
                       "smaller at small c beyond 2 standard errors" if sure else
                       "no difference beyond 2 standard errors across seeds")
            out.append(f"{m}: mean |ratio - 1| of successes is {dev[cs[0]]['mean']:.4f} at c = {cs[0]} and "
                       f"{dev[cs[-1]]['mean']:.4f} at c = {cs[-1]} ({diff:+.4f}, standard error {se:.4f}: {verdict}); "
                       f"correlation with the advantage {_fmt(methods[m]['mechanism'][CORR])}.")
    draws_1 = s.val_per_bucket * s.val_n  # 0/1 draws behind one seed's pass@1 of a bucket
    for m in methods:  # did training move the policy at all (else nothing above can differ by method)
        late, early = methods[m]["late"][REWARD], methods[m]["early"][REWARD]
        changes, moved = [], []
        for bucket in summary["buckets"]:
            diff, se, sure = _distinguishable(methods[m]["final"][bucket]["pass@1"],
                                              methods[m]["base"][bucket]["pass@1"], draws_1)
            changes.append(f"{bucket} {diff:+.3f} (standard error {se:.3f})")
            moved += [bucket] if sure else []
        verdict = ("one seed: no spread to judge it by" if len(s.seeds) == 1 else
                   f"beyond 2 standard errors in {', '.join(moved)}" if moved else
                   "nowhere beyond 2 standard errors: more steps or a higher learning rate are needed before the "
                   "methods can differ")
        out.append(f"{m}: held-out pass@1 from step 0 to step {s.steps}: {'; '.join(changes)}; {verdict}. Training "
                   f"reward over the first {s.last} steps {early['mean']:.3f}, over the last {late['mean']:.3f} "
                   "(it follows each batch's mix of difficulties, the same prompt order for every method).")
    for m in methods:
        late = methods[m]["late"]
        out.append(f"{m}: over the last {s.last} steps {late[GROUP_FRACS[0]]['mean']:.3f} of groups were all wrong "
                   f"(no gradient: GAPO cannot act on c = 0) and {late[GROUP_FRACS[2]]['mean']:.3f} all right "
                   f"(saturated).")
    out.append(f"Scale: {len(s.seeds)} seed(s), {s.steps} steps of 8 prompts x 8 rollouts on a ~80k-parameter random "
               "model; a difference here says how the clip acts on this toy task, not how a 1.5B model trains.")
    return out


def render_markdown(summary: dict, s: StudySettings, wall_s: float | None, title: str = "",
                    sections: list[str] = ()) -> str:
    """report.md from report.json's numbers (mean ± sample std across seeds); `sections`: a preset's own markdown
    lines, placed before the findings."""
    methods, buckets = summary["methods"], list(summary["buckets"])
    names = val_names(s)
    lines = [f"# {title or CLIP_STUDY.title}", "",
             "Produced by `python -m recipe.studies.gspo_vs_gapo` (recipe/studies/gspo_vs_gapo.py); every number is "
             "computed from the runs' metrics files (report.json holds them with the per-seed values). Mean ± sample "
             "standard deviation across seeds.",
             "", "## Setup", "",
             f"- seeds {s.seeds} (data order and rollout sampling; the same for every method), {s.steps} steps of 8 "
             f"prompts x 8 rollouts (4 mini-batches per rollout batch, learning rate {s.lr:g}), {s.steps * 64} "
             "rollouts per run",
             f"- held-out prompts: {s.val_per_bucket} per bucket, {s.val_n} samples each at temperature 1, validated "
             f"before training and every {s.val_every} steps",
             "- buckets (allowed-set sizes): "
             + ", ".join(f"{b} {lo}-{hi}" for b, (lo, hi) in summary["buckets"].items()),
             "- methods:"]
    lines += [f"  - `{m}`: {r['description']}" for m, r in methods.items()]
    lines += ["- commands: `commands.sh`" + (f"; wall time of the whole study {wall_s:.0f} s" if wall_s else ""), ""]
    for phase, title in (("final", f"Held-out pass@k at the last step ({s.steps})"),
                         ("base", "Held-out pass@k before training (step 0)")):
        lines += [f"## {title}", "", "| method | " + " | ".join(f"{b} {n}" for b in buckets for n in names) + " |",
                  "|---|" + "---|" * (len(buckets) * len(names))]
        for m, r in methods.items():
            lines.append(f"| {m} | " + " | ".join(_fmt(r[phase][b][n]) for b in buckets for n in names) + " |")
        lines.append("")
    lines += [f"## Training, last {s.last} steps", "",
              "Fractions of the groups; the coverage of the train prompts is 1 - all wrong (a group with a success).",
              "", f"| method | reward | all wrong | mixed | all right | reward, first {s.last} steps |",
              "|---|---|---|---|---|---|"]
    for m, r in methods.items():
        lines.append(f"| {m} | " + " | ".join(_fmt(r["late"][k]) for k in (REWARD, *GROUP_FRACS))
                     + f" | {_fmt(r['early'][REWARD])} |")
    cs = sorted({c for r in methods.values() for c in r["mechanism"]["gapo/clipfrac_pos"]}, key=int)
    lines += ["", "## Mechanism: per success count c, positive-advantage successes, mean over steps", "",
              "| method | quantity | " + " | ".join(f"c = {c}" for c in cs) + " | corr(|ratio-1|, A) |",
              "|---|---|" + "---|" * (len(cs) + 1)]
    for m, r in methods.items():
        for key, label in (("gapo/clipfrac_pos", "clip fraction"), ("gapo/ratio_dev_pos", "|ratio - 1|")):
            corr = _fmt(r["mechanism"][CORR]) if key == "gapo/clipfrac_pos" else ""
            lines.append(f"| {m} | {label} | " + " | ".join(_fmt(r["mechanism"][key].get(c), 4) for c in cs)
                         + f" | {corr} |")
    lines += ["", *sections]
    lines += ["", "## What this shows and what it does not", ""] + [f"- {f}" for f in summary["findings"]]
    lines += ["", "## Figures", "", "- `figures/curves.png`: reward and held-out pass@1 / pass@k per bucket over "
              "steps (seed means per method)"]
    lines += [f"- `figures/mechanism_{m}.png`: clip fraction, |ratio - 1| by c and their correlation with the "
              "advantage (seed means)" for m in methods]
    return "\n".join(lines) + "\n"


def seed_mean_run(label: str, runs: list[dict[int, dict]], keep) -> object:
    """A recipe.plot_run.Run whose metrics are the seed means of each kept metric at each step, over the seeds that
    logged it there (a success count c appears in some seeds' steps only), so that the study's figures are drawn by
    plot_run's own panels."""
    from recipe.plot_run import Run

    steps: dict[int, dict[str, float]] = {}
    for step in sorted(set().union(*runs)):
        logged = [m[step] for m in runs if step in m]
        keys = {k for m in logged for k in m if keep(k)}
        vals = {k: sum(m[k] for m in logged if k in m) / sum(k in m for m in logged) for k in keys}
        if vals:
            steps[step] = vals
    return Run(label=label, path=Path(label), kind="seed mean", files=[], steps=steps)


def figures(metrics_by_run: dict[str, dict[int, dict]], s: StudySettings, out: Path) -> list[Path]:
    """Draw the seed-mean figures: reward and held-out pass@k of every method (curves.png) and each method's per-c
    mechanism (mechanism_<method>.png); returns their paths."""
    from recipe.plot_run import build_panels, draw

    fig_dir = out / "figures"
    by_method = {m: [metrics_by_run[run_name(m, seed)] for seed in s.seeds] for m in s.methods}
    kept_val = tuple(f"/{n}" for n in ("pass@1", f"pass@{s.val_n}"))
    curves = [seed_mean_run(m, runs, lambda k: k == REWARD or (k.startswith("val-passk/") and k.endswith(kept_val)))
              for m, runs in by_method.items()]
    panels, _ = build_panels(curves)
    paths = [draw(panels, list(by_method), fig_dir / "curves.png",
                  title=f"reward and held-out pass@k, mean of seeds {s.seeds}")]
    for m, runs in by_method.items():
        mean = seed_mean_run(m, runs, lambda k: k.startswith((CLIPFRAC, RATIO_DEV, CORR)))
        panels, _ = build_panels([mean])
        paths.append(draw([p for p in panels if not p.title.startswith("reward")], [m],
                          fig_dir / f"mechanism_{m}.png", title=f"{m}: {METHODS[m][0]} (mean of seeds {s.seeds})"))
    return paths


@dataclass(frozen=True)
class StudyPreset:
    """One study's command: its default methods, reduced methods, output folder and report title; `extra` (optional)
    adds report sections: an object with `summarize(metrics_by_run, s) -> dict` (stored in report.json under `key`),
    `findings(section, summary, s) -> list[str]` and `markdown(section, s) -> list[str]`, and flags of its own
    (`add_arguments(parser)`, and `from_args(args)` returning the object to use)."""

    prog: str
    description: str
    out: str
    methods: tuple[str, ...]
    reduced_methods: tuple[str, ...]
    title: str
    key: str = ""
    extra: object = None


CLIP_STUDY = StudyPreset(prog="python -m recipe.studies.gspo_vs_gapo", description=__doc__.splitlines()[0],
                         out="runs/study", methods=CLIP_METHODS, reduced_methods=REDUCED_METHODS,
                         title="GSPO vs GAPO on CPU: the seeded study")


def report(out: Path, s: StudySettings, files: dict[str, Path], wall_s: float | None = None,
           preset: StudyPreset = CLIP_STUDY) -> dict:
    """report.json, report.md and the figures, from the runs' metrics files."""
    metrics = {name: read_metrics(path) for name, path in files.items()}
    summary = summarize(metrics, s)
    sections: list[str] = []
    if preset.extra is not None:
        section = preset.extra.summarize(metrics, s)
        summary[preset.key] = section
        summary["findings"] += preset.extra.findings(section, summary, s)
        sections = preset.extra.markdown(section, s)
    summary["metrics_files"] = {name: str(path) for name, path in files.items()}
    summary["wall_s"] = wall_s
    (out / "report.json").write_text(json.dumps(summary, indent=1))
    (out / "report.md").write_text(render_markdown(summary, s, wall_s, preset.title, sections))
    summary["figures"] = [str(p) for p in figures(metrics, s, out)]
    return summary


def main(argv=None, preset: StudyPreset = CLIP_STUDY) -> None:
    """CLI entry of a study (``preset``): prepare, run every (method, seed) not yet finished, write the report."""
    p = argparse.ArgumentParser(prog=preset.prog, description=preset.description)
    d = StudySettings(methods=list(preset.methods))
    p.add_argument("--out", default=preset.out, help=f"folder for model, data, runs, report (default {preset.out})")
    p.add_argument("--reduced", action="store_true", help="CI's reduced study: seed 0, methods "
                   f"{' '.join(preset.reduced_methods)}, 3 steps (other flags then override it)")
    p.add_argument("--seeds", type=int, nargs="+", help=f"seeds (default {d.seeds})")
    p.add_argument("--methods", nargs="+", choices=list(METHODS), help=f"methods (default {list(preset.methods)})")
    for name, help_ in (("steps", "training steps per run"), ("val_every", "validate every this many steps"),
                        ("val_n", "samples per held-out prompt"), ("val_per_bucket", "held-out prompts per bucket"),
                        ("n_train", "train prompts"),
                        ("last", "training metrics average over the last this many steps")):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, help=f"{help_} (default {getattr(d, name)})")
    p.add_argument("--rollout", choices=sorted(ROLLOUT_OVERRIDES), help="rollout engine (default hf; vllm needs "
                   "the vLLM CPU environment, make install-vllm)")
    p.add_argument("--lr", type=float, help=f"actor learning rate (default {d.lr:g})")
    p.add_argument("--override", dest="overrides", action="append", metavar="KEY=VALUE",
                   help="a hydra override for every run, e.g. actor_rollout_ref.actor.optim.lr=1e-2 (repeatable)")
    p.add_argument("--jobs", type=int, help="runs at once (default 1; each takes ~4 GiB)")
    p.add_argument("--timeout", type=float, help=f"hard limit per run in seconds (default {d.timeout_s:.0f})")
    p.add_argument("--fresh", action="store_true", help="wipe OUT's runs first (default: keep finished runs)")
    p.add_argument("--report-only", action="store_true", help="only (re)write the report from the runs in OUT")
    if preset.extra is not None:
        preset.extra.add_arguments(p)
    args = p.parse_args(argv)
    s = StudySettings.reduced(preset.reduced_methods) if args.reduced else StudySettings(methods=list(preset.methods))
    for name in ("seeds", "methods", *COUNTS, "lr", "rollout", "overrides"):
        if getattr(args, name) is not None:
            setattr(s, name, getattr(args, name))
    if args.timeout is not None:
        s.timeout_s = args.timeout
    try:
        s.validate()
        if preset.extra is not None:
            preset = dataclasses.replace(preset, extra=preset.extra.from_args(args))
    except ValueError as err:
        p.error(str(err))
    out = Path(args.out).resolve()
    if args.fresh:
        shutil.rmtree(out / "runs", ignore_errors=True)
    start = time.time()
    try:
        if args.report_only:
            files = {run_name(m, seed): out / "runs" / run_name(m, seed) / "logs" / "train.jsonl"
                     for seed in s.seeds for m in s.methods}
            wall = None
        else:
            prepare(out, s)
            files = run_all(out, s)
            wall = time.time() - start
        summary = report(out, s, files, wall, preset)
    except (SmokeCheckError, KeyError) as err:
        sys.exit(f"[study] FAILED: {err!r}" if isinstance(err, KeyError) else f"[study] FAILED: {err}")
    print(f"\n[study] report: {out / 'report.md'}\n[study] numbers: {out / 'report.json'}")
    for path in summary["figures"]:
        print(f"[study] figure: {path}")
    print("\n".join(f"[study] {f}" for f in summary["findings"]))


if __name__ == "__main__":
    main()

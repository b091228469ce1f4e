"""The 2x2 VIGOR study on CPU: allocation (uniform, VIGOR) x clip (fixed clip-higher, GAPO linear), seeded.

    python -m recipe.studies.vigor_2x2 [--out runs/study-vigor] [--seeds 0 1 2] [--steps 24] [--reduced] [--target 0.3]
    make study-vigor             (5 methods x 3 seeds, about an hour on 2 cores; STUDY_JOBS=2 runs two at once)
    make study-vigor REDUCED=1   (seed 0, gspo_clip_higher, gapo_linear, vigor_gapo_linear, 3 steps: what CI runs)

The same machinery, task, model and trainer as `recipe.studies.gspo_vs_gapo` (its docstring): every run is
`recipe.main_gapo` on the CPU smoke preset, only the methods differ. Methods (`recipe.studies.gspo_vs_gapo.METHODS`):

    uniform allocation:  gspo_clip_higher (fixed clip)       gapo_linear (GAPO)
    VIGOR allocation:    vigor_gspo_clip_higher              vigor_gapo_linear
                         vigor_harder_gapo_linear (VIGOR with the harder-first tie-break, GAPO)

VIGOR runs `vigor=enabled` with its defaults (configs/vigor/disabled.yaml: m0 = 2, 4 rounds, keep 0.5, growth 2) and
`vigor.seed` = the run's seed; every run spends 8 prompts x 8 rollouts = 64 rollouts per step (checked from the logs).

The report is `recipe.studies.gspo_vs_gapo`'s (held-out pass@k per difficulty bucket, training, per-c mechanism,
figures) plus a section of its own, every number from the runs' metrics files (report.json, key `vigor_study`):

- rollouts to a target: the first step at which the trailing mean over SMOOTH (4) steps of
  `gapo/groups/success_rate_mean` (the batch's mean per-prompt success rate c / k, comparable between uniform and
  VIGOR runs; critic/score/mean is a mean over rollouts, which VIGOR weights toward the prompts it grew) reaches the
  target, times 64 rollouts per step. The default target is the highest such value that every run reaches
  (`--target` sets one; runs that never reach it are counted, not averaged);
- generation time: verl's `timing_s/gen` per step for every method, and VIGOR's per round (`vigor/round{t}/gen_s`);
- VIGOR per difficulty bucket (`vigor/source/<data_source>/*` counts summed over the steps): rollouts per prompt,
  prompts dropped after round 0, prompts whose m0 first rewards were all equal (0/2 on a hard prompt) and how many
  of those were dropped (starved: m0 rollouts, no variance, no gradient), prompts whose final group had no variance;
- GAPO's clip fraction per (group size, success rate) bucket (`gapo/clipfrac_pos_kr/*`, gapo.rate_buckets).
"""

from __future__ import annotations

import argparse
import math

from recipe.studies import gspo_vs_gapo as study
from recipe.studies.gspo_vs_gapo import (
    StudyPreset,
    StudySettings,
    _distinguishable,
    _fmt,
    _mean_over,
    _spread,
    run_name,
)

METHODS = ("gspo_clip_higher", "gapo_linear", "vigor_gspo_clip_higher", "vigor_gapo_linear",
           "vigor_harder_gapo_linear")
REDUCED_METHODS = ("gspo_clip_higher", "gapo_linear", "vigor_gapo_linear")
# (uniform twin, VIGOR method) pairs compared in the findings
PAIRS = (("gspo_clip_higher", "vigor_gspo_clip_higher"), ("gapo_linear", "vigor_gapo_linear"),
         ("gapo_linear", "vigor_harder_gapo_linear"))
PROMPTS_PER_STEP, ROLLOUT_N = 8, 8  # the smoke preset: data.train_batch_size, rollout.n
ROLLOUTS_PER_STEP = PROMPTS_PER_STEP * ROLLOUT_N  # VIGOR's budget is the same
SMOOTH = 4  # steps in the trailing mean of the success rate (one step's 8 prompts are too few)
SUCCESS_RATE = "gapo/groups/success_rate_mean"
GEN = "timing_s/gen"
SOURCE_COUNTS = ("prompts", "rollouts", "dropped_round1", "flat_round0", "flat_round0_dropped", "flat_final")
# (name in the report, numerator, denominator) of the per-bucket VIGOR ratios, over all steps of a run
SOURCE_RATIOS = (("rollouts_per_prompt", "rollouts", "prompts"),
                 ("dropped_round1_frac", "dropped_round1", "prompts"),
                 ("flat_round0_frac", "flat_round0", "prompts"),
                 ("dropped_if_flat_round0", "flat_round0_dropped", "flat_round0"),
                 ("starved_frac", "flat_round0_dropped", "prompts"),
                 ("flat_final_frac", "flat_final", "prompts"))
KR_PREFIX = "gapo/clipfrac_pos_kr/"


def is_vigor(method: str) -> bool:
    """Whether the method allocates rollouts with VIGOR (its name starts with ``vigor_``)."""
    return method.startswith("vigor_")


def smoothed(metrics: dict[int, dict], steps: int, width: int = SMOOTH) -> dict[int, float]:
    """{t: mean of SUCCESS_RATE over steps t - width + 1 .. t} for t >= width where all those steps logged it."""
    out = {}
    for t in range(width, steps + 1):
        window = [metrics.get(u, {}).get(SUCCESS_RATE) for u in range(t - width + 1, t + 1)]
        if all(v is not None for v in window):
            out[t] = sum(window) / width
    return out


def rollouts_to(curve: dict[int, float], target: float) -> int | None:
    """Rollouts spent until the first step whose smoothed success rate reaches `target` (None: never)."""
    for t in sorted(curve):
        if curve[t] >= target - 1e-12:
            return t * ROLLOUTS_PER_STEP
    return None


def _ratio_spread(runs: list[dict[int, dict]], prefix: str, num: str, den: str, steps) -> dict | None:
    """Per seed sum(num) / sum(den) over the steps, then mean and spread across seeds (None when a seed has den 0)."""
    vals = []
    for m in runs:
        n = sum(m.get(t, {}).get(prefix + num, 0.0) for t in steps)
        d = sum(m.get(t, {}).get(prefix + den, 0.0) for t in steps)
        if d <= 0:
            return None
        vals.append(n / d)
    return _spread(vals)


def summarize(metrics_by_run: dict[str, dict[int, dict]], s: StudySettings, target: float | None = None) -> dict:
    """report.json's `vigor_study`: the target (None: the highest smoothed success rate every run reaches) and each
    method's rollouts to it, success rate, generation time (per round for VIGOR), per-bucket allocation counts and the
    (k, rate) clip fractions (mean ± std across seeds)."""
    from gapo.smoke.task import DIFFICULTY_BUCKETS, bucket_source

    every = range(1, s.steps + 1)
    late = range(s.steps - s.last + 1, s.steps + 1)
    runs = {m: [metrics_by_run[run_name(m, seed)] for seed in s.seeds] for m in s.methods}
    width = min(SMOOTH, s.steps)  # a study shorter than SMOOTH steps (the reduced one) smooths over all of them
    curves = {m: [smoothed(r, s.steps, width) for r in rs] for m, rs in runs.items()}
    reached_by_all = [max(c.values()) for cs in curves.values() for c in cs if c]
    target_kind = "set by --target"
    if target is None:
        target = min(reached_by_all) if reached_by_all else None
        target_kind = "the highest value every run reaches"
    out: dict = {"target": target, "target_kind": target_kind, "smooth": width,
                 "rollouts_per_step": ROLLOUTS_PER_STEP, "methods": {}}
    for m, rs in runs.items():
        res: dict = {"vigor": is_vigor(m)}
        to_target = [rollouts_to(c, target) if target is not None else None for c in curves[m]]
        reached = [v for v in to_target if v is not None]
        res["rollouts_to_target"] = {"values": to_target, "reached": len(reached), "seeds": len(to_target),
                                     **({k: v for k, v in _spread(reached).items() if k != "values"}
                                        if reached else {"mean": None, "std": None})}
        res["success_rate_late"] = _spread([_mean_over(r, late, SUCCESS_RATE) for r in rs])
        res["success_rate_first"] = _spread([_mean_over(r, range(1, s.last + 1), SUCCESS_RATE) for r in rs])
        res["gen_s"] = _spread([_mean_over(r, every, GEN) for r in rs])
        res["budget_steps_off"] = 0 if not is_vigor(m) else sum(
            r.get(t, {}).get("vigor/rollouts") != ROLLOUTS_PER_STEP for r in rs for t in every)
        if is_vigor(m):
            rounds = sorted({int(k.split("/")[1][5:]) for r in rs for t in every for k in r.get(t, {})
                             if k.startswith("vigor/round") and k.endswith("/gen_s")})
            res["round_gen_s"] = {str(t): _spread([_mean_over(r, every, f"vigor/round{t}/gen_s") for r in rs])
                                  for t in rounds}
            res["round_rollouts"] = {str(t): _spread([_mean_over(r, every, f"vigor/round{t}/rollouts") for r in rs])
                                     for t in rounds}
            res["buckets"] = {}
            for bucket in DIFFICULTY_BUCKETS:
                prefix = f"vigor/source/{bucket_source(bucket)}/"
                res["buckets"][bucket] = {name: _ratio_spread(rs, prefix, num, den, every)
                                          for name, num, den in SOURCE_RATIOS}
        labels = sorted({k[len(KR_PREFIX):] for r in rs for t in every for k in r.get(t, {})
                         if k.startswith(KR_PREFIX)})
        kr = {}
        for label in labels:
            vals = [_mean_over(r, every, KR_PREFIX + label) for r in rs]
            if all(v is not None for v in vals):  # seen in every seed
                kr[label] = _spread(vals)
        res["clipfrac_kr"] = kr
        out["methods"][m] = res
    return out


def findings(section: dict, summary: dict, s: StudySettings) -> list[str]:
    """Sentences from the numbers (none typed by hand): budget, rollouts to target, held-out hard bucket, starvation
    and the tie-break, generation time."""
    methods = section["methods"]
    out = []
    for m, r in methods.items():
        if r["vigor"]:
            out.append(f"{m}: spent {ROLLOUTS_PER_STEP} rollouts in every step (the uniform budget)" if
                       r["budget_steps_off"] == 0 else
                       f"{m}: {r['budget_steps_off']} step(s) did NOT spend exactly {ROLLOUTS_PER_STEP} rollouts")
    target = section["target"]
    draws_1 = s.val_per_bucket * s.val_n
    for uniform, vigor in PAIRS:
        if uniform not in methods or vigor not in methods:
            continue
        a, b = methods[uniform]["rollouts_to_target"], methods[vigor]["rollouts_to_target"]
        if target is not None:
            line = (f"{vigor} vs {uniform}: rollouts to a smoothed success rate of {target:.3f}: "
                    f"{_count(b)} vs {_count(a)}")
            if a["reached"] == a["seeds"] and b["reached"] == b["seeds"] and a["mean"] and b["mean"]:
                diff, se, sure = _distinguishable(_as_spread(a), _as_spread(b))
                line += (f" (uniform / VIGOR = {a['mean'] / b['mean']:.2f}; uniform - VIGOR = {diff:+.0f} rollouts, "
                         f"standard error {se:.0f}: {'beyond' if sure else 'within'} 2 standard errors)")
            out.append(line + ".")
        # the hard bucket always (VIGOR's risk is there), the others where they cross 2 standard errors
        for bucket in ("hard",) + tuple(b for b in summary["buckets"] if b != "hard"):
            fa = summary["methods"][uniform]["final"][bucket]
            fb = summary["methods"][vigor]["final"][bucket]
            for name in ("pass@1", f"pass@{s.val_n}"):
                draws = draws_1 if name == "pass@1" else s.val_per_bucket
                diff, se, sure = _distinguishable(fb[name], fa[name], draws)
                if bucket != "hard" and not sure:
                    continue
                verdict = ("beyond 2 standard errors of seeds and evaluation noise" if sure else
                           "within 2 standard errors: not distinguishable from noise" if len(s.seeds) > 1
                           else "one seed: no spread to judge it by")
                out.append(f"{vigor} - {uniform}, final held-out {name} on the {bucket} bucket: {diff:+.3f} (standard "
                           f"error {se:.3f}; {verdict}).")
    for m, r in methods.items():
        hard = (r.get("buckets") or {}).get("hard")
        if not hard or hard["rollouts_per_prompt"] is None:
            continue
        starved, flat = hard["starved_frac"], hard["dropped_if_flat_round0"]
        out.append(f"{m}: a hard prompt got {hard['rollouts_per_prompt']['mean']:.2f} rollouts on average (uniform: "
                   f"{ROLLOUT_N}); {hard['flat_round0_frac']['mean']:.3f} of hard prompts showed equal "
                   f"rewards in their first {_m0()} (e.g. 0/{_m0()}), "
                   + (f"{flat['mean']:.3f} of those were dropped after round 0" if flat else "none of them occurred")
                   + f", so {starved['mean']:.3f} of hard prompts were starved (m0 rollouts, no gradient); "
                   f"{hard['flat_final_frac']['mean']:.3f} ended with no reward variance.")
    if "vigor_gapo_linear" in methods and "vigor_harder_gapo_linear" in methods:
        a = (methods["vigor_gapo_linear"].get("buckets") or {}).get("hard", {}).get("starved_frac")
        b = (methods["vigor_harder_gapo_linear"].get("buckets") or {}).get("hard", {}).get("starved_frac")
        if a and b:
            diff, se, sure = _distinguishable(b, a)
            out.append(f"Harder-first vs random tie-break, starved hard prompts: {b['mean']:.3f} vs {a['mean']:.3f} "
                       f"({diff:+.3f}, standard error {se:.3f}: {'beyond' if sure else 'within'} 2 standard errors).")
    for uniform, vigor in PAIRS[:2]:
        if uniform in methods and vigor in methods:
            gu, gv = methods[uniform]["gen_s"], methods[vigor]["gen_s"]
            rounds = methods[vigor].get("round_gen_s", {})
            out.append(f"Generation time per step: {vigor} {_fmt(gv, 2)} s ({len(rounds)} rounds: "
                       + ", ".join(f"{_fmt(v, 2)}" for v in rounds.values())
                       + f" s) vs {uniform} {_fmt(gu, 2)} s (verl's timing_s/gen; CPU, HF or vLLM rollout as run).")
    return out


def _m0() -> int:
    from gapo.vigor import VigorConfig

    return VigorConfig().m0


def _count(r: dict) -> str:
    if r["mean"] is None:
        return f"not reached ({r['reached']}/{r['seeds']} seeds)"
    tail = "" if r["reached"] == r["seeds"] else f", {r['reached']}/{r['seeds']} seeds reached it"
    return f"{r['mean']:.0f} ± {r['std'] or 0:.0f}{tail}"


def _as_spread(r: dict) -> dict:
    return {"mean": r["mean"], "std": r["std"] or 0.0, "values": [v for v in r["values"] if v is not None]}


def markdown(section: dict, s: StudySettings) -> list[str]:
    """The report's VIGOR sections (markdown lines): rollouts to the target and generation time, per-bucket allocation,
    and the (k, rate) clip fractions."""
    methods = section["methods"]
    target = section["target"]
    lines = ["## Allocation: rollouts to a target, generation time", "",
             f"Success rate = `{SUCCESS_RATE}` (mean over the batch's prompts of c / k), trailing mean over "
             f"{section['smooth']} steps; target {target if target is None else f'{target:.3f}'} "
             f"({section['target_kind']}); {ROLLOUTS_PER_STEP} rollouts per step.", "",
             f"| method | rollouts to target | success rate, first {s.last} steps | last {s.last} steps "
             "| gen s / step | gen s per round (VIGOR) |", "|---|---|---|---|---|---|"]
    for m, r in methods.items():
        rounds = " / ".join(_fmt(v, 2) for v in r.get("round_gen_s", {}).values()) or "-"
        lines.append(f"| {m} | {_count(r['rollouts_to_target'])} | {_fmt(r['success_rate_first'])} | "
                     f"{_fmt(r['success_rate_late'])} | {_fmt(r['gen_s'], 2)} | {rounds} |")
    vig = {m: r for m, r in methods.items() if r.get("buckets")}
    if vig:
        lines += ["", "## VIGOR per difficulty bucket (counts summed over the steps, then across seeds)", "",
                  "rollouts per prompt (uniform: 8); dropped after round 0; first m0 rewards all equal; dropped "
                  "among those; starved (both: m0 rollouts, no variance); final group without variance.", "",
                  "| method | bucket | " + " | ".join(name for name, _, _ in SOURCE_RATIOS) + " |",
                  "|---|---|" + "---|" * len(SOURCE_RATIOS)]
        for m, r in vig.items():
            for bucket, vals in r["buckets"].items():
                lines.append(f"| {m} | {bucket} | " + " | ".join(_fmt(vals[name]) for name, _, _ in SOURCE_RATIOS)
                             + " |")
    labels = sorted({label for r in methods.values() for label in r["clipfrac_kr"]},
                    key=lambda x: (int(x.split("/")[0][1:].split("-")[0]), x))
    if labels:
        lines += ["", "## Clip fraction per (group size k, success rate c / k) bucket, mean over steps", "",
                  "| method | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
        for m, r in methods.items():
            lines.append(f"| {m} | " + " | ".join(_fmt(r["clipfrac_kr"].get(label), 4) for label in labels) + " |")
    return lines


class VigorReport:
    """The VIGOR study's report sections for `recipe.studies.gspo_vs_gapo.report` (StudyPreset.extra), with its
    `--target` flag."""

    def __init__(self, target: float | None = None):
        self.target = target

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        """Add the study's ``--target`` flag to the parser."""
        p.add_argument("--target", type=float, help="success rate (0, 1] for 'rollouts to target' (default: the "
                       "highest smoothed success rate every run reaches)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> VigorReport:
        """The report for the parsed flags; ValueError when ``--target`` is not in (0, 1]."""
        if args.target is not None and not (math.isfinite(args.target) and 0 < args.target <= 1):
            raise ValueError(f"--target must be a success rate in (0, 1], got {args.target}")
        return cls(args.target)

    def summarize(self, metrics_by_run, s):
        """The ``vigor_study`` section of report.json (see :func:`summarize`), with this report's target."""
        return summarize(metrics_by_run, s, self.target)

    findings = staticmethod(findings)
    markdown = staticmethod(markdown)


VIGOR_STUDY = StudyPreset(
    prog="python -m recipe.studies.vigor_2x2", description=__doc__.splitlines()[0], out="runs/study-vigor",
    methods=METHODS, reduced_methods=REDUCED_METHODS,
    title="Uniform vs VIGOR allocation x fixed vs GAPO clip on CPU: the seeded 2x2 study", key="vigor_study",
    extra=VigorReport())


def main(argv=None) -> None:
    """CLI entry: the shared study (``recipe.studies.gspo_vs_gapo.main``) with the VIGOR preset."""
    study.main(argv, VIGOR_STUDY)


if __name__ == "__main__":
    main()

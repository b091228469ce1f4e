"""The exploration study's report (`recipe.studies.explore`): every number and sentence computed from the runs'
`heldout.jsonl` and `metrics.jsonl` (`recipe.studies.explore_run` writes them). Standard library only (and
matplotlib for the figure, when installed): it runs in either environment and on logs copied from elsewhere.

Per run (`run_outcomes`), with n held-out samples per prompt and c_i of them correct on prompt i:
- held-out, after the last step and before training (`@0`), per bucket and over all prompts (`all`):
  pass1 = mean_i c_i / n; pass8 = mean_i of the unbiased pass@8 (`gapo.passk`); coverage = share of prompts with
  c_i / n above 5%; distinct = mean_i of the number of distinct first visible characters among the n samples (the
  held-out entrance); pass1_change = pass1 - pass1@0; worst_drop = min over evaluated steps of pass1 - pass1@0;
- the clip diagnosis, over all training steps: clip_small = mean over the steps that logged a success with c in
  the design's small band (`Design.bands`: c = 1-2 in both tasks) of the mean of `gapo/clipfrac_pos/c{c}` over those
  c; clip_large the same over its large band (c = 6-7 in the tiny study, 4-7 on the real policy); clip_gap =
  clip_small - clip_large; dev_small, dev_large, dev_gap the same of `gapo/ratio_dev_pos/c{c}` (mean |ratio - 1|
  before clipping); corr = mean of `gapo/is_adv_corr` over the steps that logged it;
- live (the exploration instruments during training), mean over the last quarter of the steps (step > 3/4 of
  them) of the steps that logged each: reward, `gapo/explore/entrance_distinct`, `.../coverage_window_frac`,
  `.../entropy_success`, `.../entropy_failure`, `gapo/groups/mixed_frac`.
Across seeds (`recipe.studies.stats`): a method's mean with its 95% t interval; a comparison is the paired difference
a - b at the same seed, with its 95% interval and dz = mean / sd. A primary outcome's verdict is where its interval
lies; an interval inside (-MEANINGFUL, +MEANINGFUL) is reported as "no difference as large as the meaningful one".
"""

from __future__ import annotations

import json
from pathlib import Path

from recipe.studies import stats
from recipe.studies import explore_real
from recipe.studies.explore import LARGE_C, MEANINGFUL, PRIMARY, SMALL_C, Design, design, run_dir
from recipe.studies.explore_run import METHODS, REGIMES, RunSpec, StudySettings, eval_steps, task_regimes

ENGINE = ("TRL's GRPOTrainer with GAPO's loss (gapo.integrations.trl) on CPU; its loss, gradient and per-c clip "
          "diagnostics equal the verl plug-in's on a shared batch for each method as configured here "
          "(tests/trl_integration/test_study_explore.py)")
PER_C = tuple(range(1, 8))  # the success counts of a mixed group of 8
PASS_K = 8
COVERAGE_ABOVE = 0.05
# A run whose held-out samples start with fewer distinct characters than this, on average, after the last step has
# collapsed its entrance (nearly every sample begins the same way).
COLLAPSE_DISTINCT = 1.5
LIVE = {"reward": "reward", "live_distinct": "gapo/explore/entrance_distinct",
        "live_coverage": "gapo/explore/coverage_window_frac", "entropy_success": "gapo/explore/entropy_success",
        "entropy_failure": "gapo/explore/entropy_failure", "mixed_frac": "gapo/groups/mixed_frac"}
CLIPFRAC, RATIO_DEV, CORR = "gapo/clipfrac_pos/c", "gapo/ratio_dev_pos/c", "gapo/is_adv_corr"
LABEL = {"gspo_symmetric": "fixed symmetric", "gspo_clip_higher": "fixed clip-higher", "gapo_linear": "GAPO"}


def read_heldout(path: Path) -> dict[int, dict[str, dict]]:
    """{step: {bucket: {"n": n, "correct": [...], "distinct": [...]}}} from a run's heldout.jsonl."""
    out: dict[int, dict[str, dict]] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            entry = {"n": int(row["n"]), "correct": [int(c) for c in row["correct"]],
                     "distinct": [int(d) for d in row["distinct"]]}
            out.setdefault(int(row["step"]), {})[str(row["bucket"])] = entry
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{path}, line {number}: not a held-out record ({err})") from None
    return out


def heldout_numbers(buckets: dict[str, dict]) -> dict[str, float | None]:
    """pass1, pass8 (None with fewer than 8 samples), coverage, distinct per bucket and over all prompts (`all`) at
    one step."""
    from gapo.passk import mean_pass_at_k

    out = {}
    pooled = {"n": [], "correct": [], "distinct": []}
    for bucket, entry in sorted(buckets.items()):
        n, correct = entry["n"], entry["correct"]
        pooled["n"] += [n] * len(correct)
        pooled["correct"] += correct
        pooled["distinct"] += entry["distinct"]
        out.update(_heldout(bucket, [n] * len(correct), correct, entry["distinct"], mean_pass_at_k))
    out.update(_heldout("all", pooled["n"], pooled["correct"], pooled["distinct"], mean_pass_at_k))
    return out


def _heldout(name, ns, correct, distinct, mean_pass_at_k) -> dict[str, float]:
    return {f"pass1/{name}": sum(c / n for c, n in zip(correct, ns)) / len(correct),
            f"pass{PASS_K}/{name}": (mean_pass_at_k(list(zip(ns, correct)), PASS_K) if min(ns) >= PASS_K
                                     else None),  # fewer samples than k: no estimate
            f"coverage/{name}": sum(c / n > COVERAGE_ABOVE for c, n in zip(correct, ns)) / len(correct),
            f"distinct/{name}": sum(distinct) / len(distinct)}


def band_text(levels) -> str:
    """A band of success counts as the report writes it: (1, 2) -> "1-2", (4,) -> "4"."""
    return f"{levels[0]}-{levels[-1]}" if len(levels) > 1 else f"{levels[0]}"


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def clip_numbers(metrics: dict[int, dict[str, float]], bands=(SMALL_C, LARGE_C)) -> dict[str, float | None]:
    """clip_small/large/gap, dev_small/large/gap, corr over all steps (module docstring), with bands = (the small c,
    the large c) of the task's design; and per success count c: clip_c<c>, dev_c<c>, the mean over the steps that
    logged a success with that c (PER_C)."""
    out: dict[str, float | None] = {}
    for c in PER_C:
        out[f"clip_c{c}"] = _mean(row.get(f"{CLIPFRAC}{c}") for row in metrics.values())
        out[f"dev_c{c}"] = _mean(row.get(f"{RATIO_DEV}{c}") for row in metrics.values())
    for name, prefix in (("clip", CLIPFRAC), ("dev", RATIO_DEV)):
        for size, levels in zip(("small", "large"), bands):
            out[f"{name}_{size}"] = _mean(_mean(row.get(f"{prefix}{c}") for c in levels) for row in metrics.values())
        small, large = out[f"{name}_small"], out[f"{name}_large"]
        out[f"{name}_gap"] = None if small is None or large is None else small - large
    out["corr"] = _mean(row.get(CORR) for row in metrics.values())
    return out


def live_numbers(metrics: dict[int, dict[str, float]], steps: int) -> dict[str, float | None]:
    """The exploration instruments and reward over the last quarter of the steps (module docstring), and over each
    quarter j = 1..4 (steps in ((j-1)/4, j/4] of them) as `<name>@q<j>`: the same numbers over training."""
    out = {}
    for j in range(1, 5):
        rows = [row for step, row in metrics.items() if (j - 1) / 4 * steps < step <= j / 4 * steps]
        out.update({f"{name}@q{j}": _mean(row.get(key) for row in rows) for name, key in LIVE.items()})
    out.update({name: out[f"{name}@q4"] for name in LIVE})
    return out


def run_outcomes(path: Path, settings: StudySettings) -> dict[str, float | None]:
    """Every per-run number of the module docstring, from one run folder."""
    from recipe.plot_run import read_file_logger

    heldout = read_heldout(path / "heldout.jsonl")
    if 0 not in heldout or settings.steps not in heldout:
        raise ValueError(f"{path}/heldout.jsonl has no evaluation at step 0 and at step {settings.steps}")
    final, start = heldout_numbers(heldout[settings.steps]), heldout_numbers(heldout[0])
    out: dict[str, float | None] = dict(final)
    out.update({f"{key}@0": value for key, value in start.items()})
    for key in final:
        if key.startswith("pass1/"):  # pass1 always has a value
            out[key.replace("pass1/", "pass1_change/")] = final[key] - start[key]
            out[key.replace("pass1/", "worst_drop/")] = min(heldout_numbers(heldout[s])[key] - start[key]
                                                            for s in sorted(heldout))
    metrics = read_file_logger(path / "metrics.jsonl")
    out.update(clip_numbers(metrics, design(settings.task).bands))
    out.update(live_numbers(metrics, settings.steps))
    return out


def collect(out: Path, seeds, settings: StudySettings) -> tuple[dict, list[str]]:
    """({regime: {method: {seed: outcomes}}}, runs missing or unfinished) for the runs under OUT/runs."""
    from recipe.studies.explore import is_done

    found: dict = {}
    missing = []
    for regime in task_regimes(settings.task):
        for method in METHODS:
            for seed in seeds:
                spec = RunSpec(regime, method, seed)
                path = run_dir(out, spec)
                if not is_done(path, settings):
                    missing.append(spec.name)
                    continue
                found.setdefault(regime, {}).setdefault(method, {})[seed] = run_outcomes(path, settings)
    return found, missing


def method_summary(found: dict, regime: str, method: str, metric: str) -> dict | None:
    """A method's per-seed values of `metric` summarised (mean, 95% interval), or None when no run has it."""
    values = [o[metric] for o in found.get(regime, {}).get(method, {}).values() if o.get(metric) is not None]
    return stats.summary(values) if values else None


def comparison(found: dict, regime: str, metric: str, a: str, b: str | None) -> dict | None:
    """a - b paired by seed (the seeds where both have the metric), or a's own summary when b is None."""
    runs_a = found.get(regime, {}).get(a, {})
    if b is None:
        return method_summary(found, regime, a, metric)
    runs_b = found.get(regime, {}).get(b, {})
    seeds = sorted(s for s in runs_a if s in runs_b and runs_a[s].get(metric) is not None
                   and runs_b[s].get(metric) is not None)
    if not seeds:
        return None
    return stats.paired([runs_a[s][metric] for s in seeds], [runs_b[s][metric] for s in seeds])


def primary_verdict(result: dict | None) -> str:
    """The sentence ending of a primary outcome: where its interval lies, and whether it rules out the meaningful
    difference (a null result is said as one)."""
    if result is None:
        return "not measured (no finished runs)"
    where = stats.verdict(result)
    if where == "one seed":
        return "one seed: no interval"
    if where == "includes 0":
        if -MEANINGFUL < result["low"] and result["high"] < MEANINGFUL:
            return (f"the interval includes 0 and excludes differences of {MEANINGFUL} either way: no difference as "
                    f"large as the meaningful one (a null result)")
        return "the interval includes 0: no difference detected (a null result, not evidence of no effect)"
    return f"the interval lies {where}"


def fmt(value, digits: int = 3) -> str:
    """A number with `digits` decimals (a sign when negative), "-" for None."""
    return "-" if value is None else f"{value:+.{digits}f}" if value < 0 else f"{value:.{digits}f}"


def fmt_interval(result: dict | None) -> str:
    """"mean [low, high]" of a `stats.summary`, "mean (1 seed)" without an interval, "-" for None."""
    if result is None:
        return "-"
    if result["low"] is None:
        return f"{fmt(result['mean'])} (1 seed)"
    return f"{fmt(result['mean'])} [{fmt(result['low'])}, {fmt(result['high'])}]"


def primaries(found: dict, primary: dict = PRIMARY) -> dict[str, dict]:
    """Each pre-registered primary outcome's result (`comparison`), power and verdict (`primary`: the task's)."""
    out = {}
    for question, p in primary.items():
        result = comparison(found, p["regime"], p["metric"], p["a"], p["b"])
        power = None
        if result is not None and result["sd"] is not None and result["n"] >= 2:
            power = {"mde": stats.minimum_detectable(result["sd"], result["n"]),
                     "seeds_needed": stats.seeds_needed(result["sd"], MEANINGFUL) if result["sd"] > 0 else 2}
        out[question] = {**p, "result": result, "power": power, "verdict": primary_verdict(result)}
    return out


def over_training(out: Path, found: dict, settings: StudySettings, regime: str, method: str, bucket: str) -> dict:
    """{step: summary of held-out pass1 of `bucket` across the method's seeds} at every evaluated step."""
    table = {}
    for step in eval_steps(settings):
        values = []
        for seed in found.get(regime, {}).get(method, {}):
            heldout = read_heldout(run_dir(out, RunSpec(regime, method, seed)) / "heldout.jsonl")
            if step in heldout:
                values.append(heldout_numbers(heldout[step])[f"pass1/{bucket}"])
        if values:
            table[step] = stats.summary(values)
    return table


def stability(found: dict, regime: str, method: str, bucket: str) -> dict:
    """Runs of a method whose held-out pass1 fell by more than MEANINGFUL from step 0 (`drops`) and whose held-out
    entrance collapsed (`collapses`: distinct first characters below COLLAPSE_DISTINCT), of `runs`."""
    runs = found.get(regime, {}).get(method, {})
    return {"runs": len(runs),
            "drops": sum(o[f"pass1_change/{bucket}"] < -MEANINGFUL for o in runs.values()),
            "collapses": sum(o[f"distinct/{bucket}"] < COLLAPSE_DISTINCT for o in runs.values())}


DIAGNOSIS_METRICS = ("clip_small", "clip_large", "clip_gap", "dev_small", "dev_large", "dev_gap", "corr")
EFFECT_METRICS = ("pass1/hard", "pass1/mid", "pass1/easy", "pass1/all", f"pass{PASS_K}/hard", f"pass{PASS_K}/all",
                  "coverage/hard", "coverage/all", "distinct/hard", "distinct/all", "live_distinct", "live_coverage",
                  "entropy_success", "entropy_failure", "mixed_frac", "reward")
HIGH_METRICS = ("pass1@0/high", "pass1/high", "pass1_change/high", "worst_drop/high", f"pass{PASS_K}/high",
                "distinct/high", "live_distinct", "entropy_success", "entropy_failure", "reward")


def _metric_key(metric: str) -> str:
    # "pass1@0/high" names the step-0 value, stored as "pass1/high@0"
    if "@0/" in metric:
        name, bucket = metric.split("@0/")
        return f"{name}/{bucket}@0"
    return metric


OVER_TRAINING = ("reward", "live_distinct", "live_coverage", "entropy_success", "entropy_failure")


def quarter_rows(found: dict, regime: str) -> dict:
    """{metric: {method: [summary of quarter 1, .., 4]}}: the live instruments over training, per method."""
    return {metric: {m: [method_summary(found, regime, m, f"{metric}@q{j}") for j in range(1, 5)] for m in METHODS}
            for metric in OVER_TRAINING}


def block(found: dict, regime: str, metrics) -> dict:
    """{metric: each method's summary and the paired comparisons of GAPO with each fixed clip} in one regime."""
    rows = {}
    for metric in metrics:
        key = _metric_key(metric)
        rows[metric] = {"methods": {m: method_summary(found, regime, m, key) for m in METHODS},
                        "vs": {b: comparison(found, regime, key, "gapo_linear", b)
                               for b in ("gspo_clip_higher", "gspo_symmetric")}}
    return rows


def tables(found: dict) -> dict:
    """Per question: each method's summary and the paired comparisons of GAPO with each fixed clip."""
    return {"diagnosis": block(found, "tail", DIAGNOSIS_METRICS), "effect": block(found, "tail", EFFECT_METRICS),
            "high_pass": block(found, "high", HIGH_METRICS)}


def diagnosis_line(diagnosis: dict, bands) -> list[str]:
    """The diagnosis primary's sentence ([] when it could not be measured), naming the design's bands of c."""
    d = diagnosis["result"]
    if d is None:
        return []
    small, large = bands
    return [f"Diagnosis (primary): under the fixed symmetric clip, the clip fraction of successes at c = "
            f"{band_text(small)} minus that at c = {band_text(large)} was {fmt_interval(d)}: {diagnosis['verdict']}."]


def findings(result: dict) -> list[str]:
    """The report's sentences, each built from the numbers in `result` (write_report's)."""
    lines = []
    prim, tab = result["primary"], result["tables"]
    lines += diagnosis_line(prim["diagnosis"], design("smoke").bands)
    dev = tab["diagnosis"]["dev_gap"]["methods"]
    for method in ("gspo_symmetric", "gspo_clip_higher"):
        if dev[method] is not None:
            lines.append(f"Before clipping, |ratio - 1| of small-c successes minus large-c under the {LABEL[method]} "
                         f"clip: {fmt_interval(dev[method])} ({stats.verdict(dev[method])}).")
    for metric, what in (("clip_small", "small-c"), ("clip_large", "large-c")):
        vs = tab["diagnosis"][metric]["vs"]["gspo_symmetric"]
        if vs is not None:
            lines.append(f"GAPO minus the fixed symmetric clip, {what} clip fraction: {fmt_interval(vs)} "
                         f"({stats.verdict(vs)}).")
    e = prim["effect"]["result"]
    if e is not None:
        lines.append(f"Effect (primary): GAPO minus the fixed clip-higher in held-out hard-bucket pass@1 after the last "
                     f"step: {fmt_interval(e)} (dz {fmt(e['dz'], 2)}): {prim['effect']['verdict']}.")
    for metric in ("pass1/all", f"pass{PASS_K}/hard", "coverage/hard", "distinct/hard", "live_distinct",
                   "entropy_success"):
        parts = [f"vs {LABEL[b]} {fmt_interval(r)} ({stats.verdict(r)})"
                 for b, r in tab["effect"][metric]["vs"].items() if r is not None]
        if parts:
            lines.append(f"GAPO, {metric} (secondary): " + "; ".join(parts) + ".")
    h = prim["high_pass"]["result"]
    if h is not None:
        lines.append(f"High-pass regime (primary): GAPO minus the fixed clip-higher in held-out pass@1 after the last "
                     f"step: {fmt_interval(h)} (dz {fmt(h['dz'], 2)}): {prim['high_pass']['verdict']}.")
    for method, s in result["stability"].items():
        change = tab["high_pass"]["pass1_change/high"]["methods"][method]
        lines.append(f"High-pass regime, {LABEL[method]}: held-out pass@1 changed by {fmt_interval(change)} from step 0; "
                     f"{s['drops']} of {s['runs']} runs dropped by more than {MEANINGFUL}, {s['collapses']} collapsed "
                     f"their entrance (fewer than {COLLAPSE_DISTINCT} distinct first characters per prompt).")
    return lines


def _figure(out: Path, found: dict, settings: StudySettings) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    panels = [("tail", b) for b in REGIMES["tail"]] + [("high", b) for b in REGIMES["high"]]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2), squeeze=False)
    for ax, (regime, bucket) in zip(axes[0], panels):
        for method in METHODS:
            table = over_training(out, found, settings, regime, method, bucket)
            if not table:
                continue
            steps = sorted(table)
            means = [table[s]["mean"] for s in steps]
            ax.plot(steps, means, marker="o", ms=3, label=LABEL[method])
            if all(table[s]["low"] is not None for s in steps):
                ax.fill_between(steps, [table[s]["low"] for s in steps], [table[s]["high"] for s in steps], alpha=0.2)
        ax.set_title(f"{regime}: held-out pass@1, {bucket}")
        ax.set_xlabel("step")
    if axes[0][0].get_legend_handles_labels()[0]:
        axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path = out / "figures" / "heldout_pass1.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _table_md(block: dict, metrics) -> list[str]:
    head = ["| metric | " + " | ".join(LABEL[m] for m in METHODS) + " | GAPO - clip-higher | GAPO - symmetric |",
            "|---" * (len(METHODS) + 3) + "|"]
    for metric in metrics:
        row = block[metric]
        head.append(f"| {metric} | " + " | ".join(fmt_interval(row["methods"][m]) for m in METHODS) + " | "
                    + " | ".join(fmt_interval(row["vs"][b]) for b in ("gspo_clip_higher", "gspo_symmetric")) + " |")
    return head


def write_report(out: Path, seeds, settings: StudySettings, mode: str, wall_s: float | None) -> list[Path]:
    """report.json, report.md and figures/heldout_pass1.png under OUT from the runs there."""
    found, missing = collect(out, seeds, settings)
    result = {"mode": mode, "engine": ENGINE,
              "settings": {k: getattr(settings, k) for k in settings.__dataclass_fields__},
              "seeds": list(seeds), "missing": missing, "wall_s": wall_s, "meaningful": MEANINGFUL,
              "primary": primaries(found), "tables": tables(found),
              "stability": {m: stability(found, "high", m, "high") for m in METHODS if found.get("high", {}).get(m)},
              "quarters": {regime: quarter_rows(found, regime) for regime in REGIMES},
              "heldout_over_training": {
                  f"{regime}/{bucket}": {m: {str(step): r for step, r in
                                             over_training(out, found, settings, regime, m, bucket).items()}
                                         for m in METHODS}
                  for regime, bucket in (("tail", "hard"), ("high", "high"))},
              "runs": {r: {m: {str(s): o for s, o in by.items()} for m, by in ms.items()} for r, ms in found.items()}}
    result["findings"] = findings(result)
    paths = [out / "report.json", out / "report.md"]
    paths[0].write_text(json.dumps(result, indent=1, default=str) + "\n")
    figure = _figure(out, found, settings)
    paths[1].write_text(render(result, figure) + "\n")
    return paths + ([figure] if figure else [])


def _head(result: dict, title: str) -> list[str]:
    """A report's title, setup, missing runs, pre-registered primaries (with the power reached) and findings."""
    s = result["settings"]
    lines = [title, ""]
    if result["mode"] == "reduced":
        lines += ["Reduced mode: a check that the study's path works, not a result.", ""]
    lines += [f"Engine: {result['engine']}. Seeds {result['seeds']} per method and regime; {s['steps']} steps of "
              f"{s['prompts_per_generation']} prompts x k = {s['k']} per generation, {s['steps_per_generation']} "
              f"optimizer steps per generation, learning rate {s['learning_rate']}, clips eps_low {s['eps_low']}, "
              f"eps_high_max {s['eps_high_max']} (sequence level); held-out: {s['eval_prompts']} prompts per bucket x "
              f"{s['eval_samples']} samples every {s['eval_every']} steps. Meaningful difference {result['meaningful']}."
              + (f" Wall time {result['wall_s'] / 60:.1f} min." if result["wall_s"] else "")]
    if result["missing"]:
        lines += ["", f"Missing or unfinished runs (left out): {', '.join(result['missing'])}."]
    lines += ["", "## Pre-registered primary outcomes", "",
              "| question | outcome | estimate [95% interval] | dz | seeds | verdict | detectable (80% power) |",
              "|---|---|---|---|---|---|---|"]
    for question, p in result["primary"].items():
        r, power = p["result"], p["power"]
        lines.append(f"| {question} | {p['text']} | {fmt_interval(r)} | {fmt(r and r['dz'], 2)} | "
                     f"{r['n'] if r else 0} | {p['verdict']} | {fmt(power and power['mde'])} |")
    return lines + ["", "## What this shows", ""] + [f"- {line}" for line in result["findings"]]


def render(result: dict, figure: Path | None) -> str:
    """report.md from write_report's result: setup, primaries, findings, one table per question."""
    lines = _head(result, f"# Exploration study: GAPO vs fixed clips ({result['mode']})")
    lines += ["", "## 1. Diagnosis (tail regime; over all training steps)", ""]
    lines += _table_md(result["tables"]["diagnosis"], DIAGNOSIS_METRICS)
    lines += ["", "## 2. Effect (tail regime; held-out after the last step, live over the last quarter)", ""]
    lines += _table_md(result["tables"]["effect"], EFFECT_METRICS)
    lines += ["", "## 3. High-pass regime", ""]
    lines += _table_md(result["tables"]["high_pass"], HIGH_METRICS)
    lines += ["", "## Over training", "", "Held-out pass@1 at each evaluated step (seed mean [95% interval]):", ""]
    for name, by_method in result["heldout_over_training"].items():
        steps = sorted({int(step) for by_step in by_method.values() for step in by_step})
        lines += [f"| {name} | " + " | ".join(f"step {step}" for step in steps) + " |", "|---" * (len(steps) + 1) + "|"]
        for method, by_step in by_method.items():
            lines.append(f"| {LABEL[method]} | " + " | ".join(fmt_interval(by_step.get(str(step))) for step in steps)
                         + " |")
        lines.append("")
    lines += ["Live instruments by quarter of training (seed mean [95% interval]; quarter 4 is the tables' 'live'):", ""]
    for regime, by_metric in result["quarters"].items():
        lines += [f"| {regime} | method | quarter 1 | quarter 2 | quarter 3 | quarter 4 |", "|---|---|---|---|---|---|"]
        for metric, by_method in by_metric.items():
            for method, cells in by_method.items():
                lines.append(f"| {metric} | {LABEL[method]} | " + " | ".join(fmt_interval(c) for c in cells) + " |")
        lines.append("")
    lines += ["Each cell: mean across seeds [95% t interval]; comparisons are paired by seed. Secondary outcomes "
              "are exploratory: with this many of them, some intervals exclude 0 by chance."]
    if figure:
        lines += ["", f"![held-out pass@1 over training]({figure.relative_to(figure.parent.parent)})"]
    return "\n".join(lines)


def pilot_result(lr_dirs: dict[float, Path], seeds, settings: StudySettings, chosen: Design | None = None) -> dict:
    """The pilot's numbers: per learning rate, each method's change of hard-bucket pass1 from step 0 (does the study
    discriminate?) and each primary outcome's per-seed sd; the rule's choice of learning rate and seed count.
    `chosen`: the task's design (explore.design; the smoke study's by default)."""
    from dataclasses import replace

    chosen = chosen or design("smoke")
    (regime, bucket), min_seeds, max_seeds = chosen.hard, chosen.min_seeds, chosen.max_seeds
    per_lr = {}
    for lr, path in lr_dirs.items():
        found, missing = collect(path, seeds, replace(settings, learning_rate=lr))
        moves = {m: method_summary(found, regime, m, f"pass1_change/{bucket}") for m in METHODS}
        per_lr[lr] = {"missing": missing, "moves": moves, "primary": primaries(found, chosen.primary)}
    moving = [lr for lr in sorted(per_lr) if any(s is not None and s["mean"] >= MEANINGFUL and s["low"] is not None
                                                 and s["low"] > 0 for s in per_lr[lr]["moves"].values())]
    chosen = moving[0] if moving else max(per_lr)
    needed = {q: p["power"]["seeds_needed"] for q, p in per_lr[chosen]["primary"].items() if p["power"]}
    wanted = max([min_seeds, *[max_seeds + 1 if n is None else n for n in needed.values()]])
    return {"per_lr": per_lr, "moving": moving, "chosen_lr": chosen, "needed": needed,
            "seeds": min(wanted, max_seeds),
            "underpowered": sorted(q for q, n in needed.items() if n is None or n > max_seeds),
            "rule": f"the smallest learning rate at which some method's hard-bucket held-out pass@1 rose from step 0 "
                    f"by at least {MEANINGFUL} with its interval above 0; seeds = max({min_seeds}, the most any "
                    f"primary outcome needs to detect {MEANINGFUL} with 80% power at its pilot sd), at most "
                    f"{max_seeds} (what the study's time budget allows)"}


def write_pilot(out: Path, lr_dirs: dict[float, Path], seeds, settings: StudySettings, wall_s,
                chosen: Design | None = None) -> list[Path]:
    """pilot.json and pilot.md under OUT (`chosen`: the task's design; the smoke study's by default)."""
    chosen = chosen or design("smoke")
    min_seeds, max_seeds, primary = chosen.min_seeds, chosen.max_seeds, chosen.primary
    result = pilot_result(lr_dirs, seeds, settings, chosen)
    lines = [f"# Exploration study{'' if chosen.task == 'smoke' else ' on a real policy'}: the pilot", "",
             f"Seeds {list(seeds)}; learning rates {list(chosen.pilot_learning_rates)}; other settings the study's."
             + (f" Wall time {wall_s / 60:.1f} min." if wall_s else ""), "", f"Rule: {result['rule']}.", "",
             "| learning rate | method | hard pass@1 change from step 0 | "
             + " | ".join(f"{q} sd (mde at {min_seeds} / {max_seeds} seeds)" for q in primary) + " |",
             "|---" * (3 + len(primary)) + "|"]
    for lr, r in result["per_lr"].items():
        for method in METHODS:
            cells = []
            for q in primary:
                p = r["primary"][q]
                sd = p["result"]["sd"] if p["result"] else None
                cells.append("-" if sd is None else f"{sd:.3f} ({stats.minimum_detectable(sd, min_seeds):.3f} / "
                                                    f"{stats.minimum_detectable(sd, max_seeds):.3f})")
            lines.append(f"| {lr:g} | {LABEL[method]} | {fmt_interval(r['moves'][method])} | " + " | ".join(cells)
                         + " |")
    lines += ["", f"Moves the hard bucket: {', '.join(f'{lr:g}' for lr in result['moving']) or 'no learning rate'}. "
              f"Seeds each primary needs at the chosen rate: "
              + ", ".join(f"{q} {'more than 1000' if n is None else n}" for q, n in result["needed"].items())
              + f". Chosen: learning rate {result['chosen_lr']:g}, {result['seeds']} seeds"
              + (f"; underpowered (needs more than {max_seeds}): {', '.join(result['underpowered'])}"
                 if result["underpowered"] else "") + "."]
    paths = [out / "pilot.json", out / "pilot.md"]
    paths[0].write_text(json.dumps(result, indent=1, default=str) + "\n")
    paths[1].write_text("\n".join(lines) + "\n")
    return paths


# --- the study on a real policy (task arithmetic, recipe.studies.explore_real) ---------------------------------------

REAL_ENGINE = ENGINE.replace("on CPU", "on CPU, float32 (gapo.integrations.trl.on_cpu), with SmolLM2-135M-Instruct "
                                       "(gapo.real_model)")


def real_findings(result: dict) -> list[str]:
    """The real study's sentences, each built from the numbers in `result` (write_real_report's)."""
    lines = []
    prim, tab = result["primary"], result["tables"]
    lines += diagnosis_line(prim["diagnosis"], design(explore_real.TASK).bands)
    dev = tab["diagnosis"]["dev_gap"]["methods"]
    for method in ("gspo_symmetric", "gspo_clip_higher"):
        if dev[method] is not None:
            lines.append(f"Before clipping, |ratio - 1| of small-c successes minus large-c under the {LABEL[method]} "
                         f"clip: {fmt_interval(dev[method])} ({stats.verdict(dev[method])}).")
    e = prim["effect"]["result"]
    if e is not None:
        lines.append(f"Effect (primary): {prim['effect']['text']}: {fmt_interval(e)} (dz {fmt(e['dz'], 2)}): "
                     f"{prim['effect']['verdict']}.")
    hard = explore_real.HARD_BUCKET
    for metric in ("pass1/all", f"pass8/{hard}"):
        parts = [f"vs {LABEL[b]} {fmt_interval(r)} ({stats.verdict(r)})"
                 for b, r in tab["effect"][metric]["vs"].items() if r is not None]
        if parts:
            lines.append(f"GAPO, {metric} (secondary): " + "; ".join(parts) + ".")
    moved = tab["effect"]["pass1_change/all"]["methods"]
    for method, change in moved.items():
        if change is not None:
            lines.append(f"{LABEL[method]}: held-out pass@1 over all buckets changed by {fmt_interval(change)} from "
                         f"step 0 ({stats.verdict(change)}).")
    return lines


def write_real_report(out: Path, seeds, settings: StudySettings, mode: str, wall_s: float | None) -> list[Path]:
    """report.json and report.md of the real study (task arithmetic) under OUT from the runs there."""
    regime = explore_real.REGIME
    found, missing = collect(out, seeds, settings)
    per_c = tuple(f"{kind}_c{c}" for c in PER_C for kind in ("clip", "dev"))
    result = {"mode": mode, "engine": REAL_ENGINE, "task": settings.task,
              "settings": {k: getattr(settings, k) for k in settings.__dataclass_fields__},
              "seeds": list(seeds), "missing": missing, "wall_s": wall_s, "meaningful": explore_real.MEANINGFUL,
              "primary": primaries(found, explore_real.PRIMARY),
              "tables": {"diagnosis": block(found, regime, DIAGNOSIS_METRICS), "per_c": block(found, regime, per_c),
                         "effect": block(found, regime, (*explore_real.EFFECT_METRICS, "pass1_change/all"))},
              "heldout_over_training": {
                  bucket: {m: {str(step): r for step, r in
                               over_training(out, found, settings, regime, m, bucket).items()}
                           for m in METHODS} for bucket in (*task_regimes(settings.task)[regime], "all")},
              "runs": {r: {m: {str(s): o for s, o in by.items()} for m, by in ms.items()} for r, ms in found.items()}}
    result["findings"] = real_findings(result)
    lines = _head(result, f"# Exploration study on a real policy: GAPO vs fixed clips ({mode})")
    lines += ["", "## 1. Diagnosis (over all training steps)", ""]
    lines += _table_md(result["tables"]["diagnosis"], DIAGNOSIS_METRICS)
    lines += ["", "Per success count c (clip_c: clip fraction of successes; dev_c: their mean |ratio - 1| before "
                  "clipping):", ""]
    lines += _table_md(result["tables"]["per_c"], per_c)
    lines += ["", "## 2. Effect (held-out after the last step, live over the last quarter)", ""]
    lines += _table_md(result["tables"]["effect"], (*explore_real.EFFECT_METRICS, "pass1_change/all"))
    lines += ["", "## Held-out pass@1 before and after", ""]
    for bucket, by_method in result["heldout_over_training"].items():
        steps = sorted({int(step) for by_step in by_method.values() for step in by_step})
        lines += [f"| {bucket} | " + " | ".join(f"step {step}" for step in steps) + " |",
                  "|---" * (len(steps) + 1) + "|"]
        lines += [f"| {LABEL[m]} | " + " | ".join(fmt_interval(by_step.get(str(step))) for step in steps) + " |"
                  for m, by_step in by_method.items()]
        lines.append("")
    lines += ["Each cell: mean across seeds [95% t interval]; comparisons are paired by seed. Secondary outcomes "
              "are exploratory."]
    paths = [out / "report.json", out / "report.md"]
    paths[0].write_text(json.dumps(result, indent=1, default=str) + "\n")
    paths[1].write_text("\n".join(lines) + "\n")
    return paths

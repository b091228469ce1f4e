"""The powered exploration study (`make study-explore`): GAPO vs two fixed clips, 24 seeds each, on the smoke task's
hard tail and on prompts the base model mostly solves, through TRL's GRPOTrainer with GAPO's loss on CPU.

    python -m recipe.studies.explore [--out runs/study-explore] [--jobs 2] [--reduced] [--pilot] [--report-only]
                                     [--fresh] [--seeds 1 2 ...] [--steps N] [--lr X]
    make study-explore                 # the pre-registered study (144 runs, ~40 min on 2 cores)
    make study-explore REDUCED=1       # 2 seeds x 8 steps, small held-out sets: what CI runs (16 s)
    make study-explore PILOT=1         # the pilot that fixed the learning rate and the seed count (docs/studies.md)

The questions, the primary outcome of each, the meaningful difference and the methods are fixed here and in
docs/studies.md before the study runs (`PRIMARY`, `MEANINGFUL`); `recipe.studies.explore_report` computes every
number of the report from the runs' files. Runs go to OUT/runs/<regime>/<method>/seed<s>/ (`recipe.studies.
explore_run`); a rerun keeps every run whose `done.json` matches the current settings and reruns the others, so a
stopped study resumes where it stopped (`--fresh` wipes OUT/runs first).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from recipe.studies import explore_real
from recipe.studies.explore_run import METHODS, TASKS, RunSpec, StudySettings, task_regimes

# The study's seeds: 24 per method and regime, the pilot rule's answer (docs/studies.md: the larger of MIN_SEEDS and
# what the primaries need at the pilot's sd, at most MAX_SEEDS). The pilot's seeds are disjoint: the pilot chose the
# settings, the study's seeds answer the questions. Seed 0 is in neither: it was looked at while the code was written.
MIN_SEEDS = 12
SEEDS = tuple(range(1, 25))
PILOT_SEEDS = (101, 102, 103, 104)
# The pilot's grid: learning rates tried, each with every method and both regimes at the study's other settings
# (the uniform-set pilot before it tried 0.01 and 0.03; docs/studies.md).
PILOT_LEARNING_RATES = (3e-3, 1e-2)
# The most seeds the pilot's rule may ask for: 24 seeds x 3 methods x 2 regimes is ~45 minutes on 2 cores at the
# pilot's speed, inside the hour the study may take. A primary that needs more is reported as underpowered.
MAX_SEEDS = 24
# The smallest true difference worth detecting, in the primary outcomes' units (held-out pass@1 and clip fraction,
# both fractions): 0.05, about two thirds of the hard bucket's base pass@1 (~0.07).
MEANINGFUL = 0.05
# The diagnosis's bands of success counts c (of k = 8): rare successes (SMALL_C) against common ones (LARGE_C).
SMALL_C = (1, 2)
LARGE_C = (6, 7)
# The pre-registered primary outcome of each question (docs/studies.md): the regime, the metric (a per-run number,
# `recipe.studies.explore_report.run_outcomes`), and either a paired difference of two methods at the same seed
# (`a` - `b`) or one method's value against 0.
PRIMARY = {
    "diagnosis": {"regime": "tail", "metric": "clip_gap", "a": "gspo_symmetric", "b": None,
                  "text": "clip fraction of successes at small c (1-2) minus at large c (6-7), over training, under the "
                          "fixed symmetric clip"},
    "effect": {"regime": "tail", "metric": "pass1/hard", "a": "gapo_linear", "b": "gspo_clip_higher",
               "text": "held-out pass@1 on the hard bucket after the last step, GAPO minus the fixed clip-higher"},
    "high_pass": {"regime": "high", "metric": "pass1/high", "a": "gapo_linear", "b": "gspo_clip_higher",
                  "text": "held-out pass@1 after the last step where the base model passes most prompts, GAPO minus "
                          "the fixed clip-higher"},
}
# CI's reduced mode: every method and regime, 2 seeds, a few steps, small held-out sets. Not a result: it checks
# that the whole path (runs, resume, report) works.
REDUCED = {"seeds": (1, 2), "settings": {"steps": 8, "eval_every": 4, "eval_prompts": 4, "eval_samples": 8,
                                         "n_train": 64}}


@dataclass(frozen=True)
class Design:
    """One task's pre-registered study: its settings, seeds, pilot, power rule, primary outcomes, reduced mode, the
    (regime, bucket) whose held-out pass@1 the pilot watches, and its default output folder."""

    task: str
    settings: StudySettings
    seeds: tuple
    pilot_seeds: tuple
    pilot_learning_rates: tuple
    min_seeds: int
    max_seeds: int
    meaningful: float
    primary: dict
    reduced: dict
    hard: tuple[str, str]
    out: str
    bands: tuple[tuple[int, ...], tuple[int, ...]]  # the diagnosis's (small c, large c), clip_small / clip_large


def design(task: str = "smoke") -> Design:
    """The study of a task (TASKS): `smoke` (the constants above) or `arithmetic` (recipe.studies.explore_real)."""
    if task == "smoke":
        return Design(task, StudySettings(), SEEDS, PILOT_SEEDS, PILOT_LEARNING_RATES, MIN_SEEDS, MAX_SEEDS, MEANINGFUL,
                      PRIMARY, REDUCED, ("tail", "hard"), "runs/study-explore", (SMALL_C, LARGE_C))
    if task == "arithmetic":
        r = explore_real
        return Design(task, r.SETTINGS, r.SEEDS, r.PILOT_SEEDS, r.PILOT_LEARNING_RATES, r.MIN_SEEDS, r.MAX_SEEDS,
                      r.MEANINGFUL, r.PRIMARY, r.REDUCED, (r.REGIME, r.HARD_BUCKET), "runs/study-explore-real",
                      (r.SMALL_C, r.LARGE_C))
    raise ValueError(f"unknown task {task!r}: expected one of {', '.join(TASKS)}")


def run_dir(out: Path, spec: RunSpec) -> Path:
    """OUT/runs/<regime>/<method>/seed<s>: where a run writes its files."""
    return out / "runs" / spec.regime / spec.method / f"seed{spec.seed}"


def is_done(path: Path, settings: StudySettings) -> bool:
    """A run counts as done when its done.json exists and records the current settings."""
    return settings_differ(path, settings) == []


def settings_differ(path: Path, settings: StudySettings) -> list[str] | None:
    """None when the run has no done.json (not finished); else the settings its done.json records otherwise than
    `settings`, as "name: theirs (now ours)" ([] when it was trained with these)."""
    try:
        done = json.loads((path / "done.json").read_text())
    except (OSError, ValueError):
        return None
    # a setting a run's done.json lacks was added after that run, which ran at its default (StudySettings)
    theirs, ours = {**asdict(StudySettings()), **(done.get("settings") or {})}, asdict(settings)
    return [f"{name}: {theirs[name]} (now {ours[name]})" for name in ours if theirs[name] != ours[name]]


def specs(seeds, regimes=None, methods=tuple(METHODS), task: str = "smoke") -> list[RunSpec]:
    """Seed-major order: a study stopped part way has whole seeds (every method and regime) done. `regimes`: the
    task's (task_regimes) by default."""
    regimes = tuple(task_regimes(task)) if regimes is None else regimes
    return [RunSpec(regime, method, seed) for seed in seeds for regime in regimes for method in methods]


def _worker_init(threads: int) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import warnings

    warnings.filterwarnings("ignore")  # TRL's and transformers' per-run notices; failures still raise
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def _run(spec: RunSpec, out: str, model_dir: str, settings: StudySettings) -> dict:
    from recipe.studies.explore_run import run_one

    return run_one(spec, Path(out), Path(model_dir), settings)


def run_all(out: Path, run_specs: list[RunSpec], settings: StudySettings, jobs: int, echo=print) -> float:
    """Train every run of `run_specs` not already done into OUT/runs (jobs worker processes, each loading torch and
    TRL once); prints one line per run with an estimate of the time left. Returns the wall seconds spent. The model:
    the tiny one built under OUT (task smoke), or the real one prepared once (gapo.real_model; task arithmetic)."""
    settings.validate()
    import transformers

    transformers.logging.disable_progress_bar()
    if settings.task == "smoke":
        from gapo.smoke.tiny_model import build_tiny_model

        model_dir = build_tiny_model(out / "tiny")
    else:
        from gapo.real_model import prepare

        model_dir = prepare()
    todo = [s for s in run_specs if not is_done(run_dir(out, s), settings)]
    kept = len(run_specs) - len(todo)
    echo(f"[study-explore] {len(run_specs)} runs: {kept} done before (kept), {len(todo)} to train, {jobs} at once")
    start = time.perf_counter()
    if not todo:
        return 0.0
    finished = 0
    with ProcessPoolExecutor(max_workers=jobs, initializer=_worker_init, initargs=(settings.threads,)) as pool:
        futures = {pool.submit(_run, s, str(run_dir(out, s)), str(model_dir), settings): s for s in todo}
        for future in as_completed(futures):
            spec = futures[future]
            try:
                done = future.result()
            except Exception as err:  # the first failure stops the study; finished runs stay for the rerun
                for other in futures:
                    other.cancel()
                raise RuntimeError(f"run {spec.name} failed ({type(err).__name__}: {err}); its folder is "
                                   f"{run_dir(out, spec)}; a rerun keeps the {kept + finished} finished runs") from err
            finished += 1
            elapsed = time.perf_counter() - start
            left = elapsed / finished * (len(todo) - finished)
            echo(f"[study-explore] {kept + finished}/{len(run_specs)} {spec.name}: {done['wall_s']:.0f} s "
                 f"(elapsed {elapsed / 60:.1f} min, ~{left / 60:.1f} min left)")
    return time.perf_counter() - start


def study_settings(args) -> tuple[list[RunSpec], StudySettings, str]:
    """(runs, settings, mode) from the command line: the study, the reduced study or the pilot, of `--task`."""
    chosen = design(args.task)
    settings = chosen.settings
    if args.reduced:
        settings = replace(settings, **chosen.reduced["settings"])
    overrides = {name: getattr(args, name) for name in ("steps", "lr", "skew") if getattr(args, name) is not None}
    if "lr" in overrides:
        overrides["learning_rate"] = overrides.pop("lr")
    settings = replace(settings, **overrides)
    settings.validate()
    if args.pilot:
        return specs(args.seeds or chosen.pilot_seeds, task=args.task), settings, "pilot"
    seeds = args.seeds or (chosen.reduced["seeds"] if args.reduced else chosen.seeds)
    return specs(seeds, task=args.task), settings, "reduced" if args.reduced else "study"


def parser() -> argparse.ArgumentParser:
    """The command line of the module docstring."""
    p = argparse.ArgumentParser(prog="python -m recipe.studies.explore", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--task", choices=TASKS, default="smoke",
                   help="smoke: the tiny random model (default); arithmetic: the real model of make learn "
                        "(recipe.studies.explore_real)")
    p.add_argument("--out", type=Path, help="output folder (default runs/study-explore, or runs/study-explore-real "
                                             "with --task arithmetic; -reduced, -pilot)")
    p.add_argument("--jobs", type=int, default=2, help="runs trained at once, one CPU thread each (default 2)")
    p.add_argument("--reduced", action="store_true", help="CI's reduced mode (REDUCED): a check, not a result")
    p.add_argument("--pilot", action="store_true",
                   help=f"the pilot: learning rates {PILOT_LEARNING_RATES} x every method and regime x seeds "
                        f"{PILOT_SEEDS}; writes pilot.md with the power calculation")
    p.add_argument("--seeds", type=int, nargs="+", help=f"seeds (default {SEEDS[0]}..{SEEDS[-1]}; --task arithmetic "
                                                        f"{explore_real.SEEDS[0]}..{explore_real.SEEDS[-1]})")
    p.add_argument("--steps", type=int, help=f"optimizer steps per run (default {StudySettings.steps}; --task "
                                             f"arithmetic {explore_real.SETTINGS.steps})")
    p.add_argument("--lr", type=float, help=f"learning rate (default {StudySettings.learning_rate}; --task arithmetic "
                                            f"{explore_real.SETTINGS.learning_rate})")
    p.add_argument("--skew", type=float, help=f"Zipf skew of the allowed sets, 0 uniform (default {StudySettings.skew})")
    p.add_argument("--report-only", action="store_true", help="rewrite the report from the runs there, train nothing")
    p.add_argument("--fresh", action="store_true", help="delete OUT/runs first (default: keep finished runs)")
    return p


def main(argv=None) -> int:
    """Run the study, the reduced study or the pilot (resuming what is done), then write its report; 1 when a run
    failed (its name and folder printed; the finished runs stay for the rerun)."""
    args = parser().parse_args(argv)
    if args.jobs < 1:
        parser().error(f"--jobs must be >= 1, got {args.jobs}")
    if args.reduced and args.pilot:
        parser().error("--reduced and --pilot are two different studies: choose one")
    try:
        run_specs, settings, mode = study_settings(args)
    except (ValueError, TypeError) as err:
        parser().error(str(err))
    chosen = design(args.task)
    out = args.out or Path(chosen.out + {"study": "", "reduced": "-reduced", "pilot": "-pilot"}[mode])
    if args.fresh and not args.report_only:
        for folder in [out / "runs", *(out / f"lr{lr:g}" / "runs" for lr in chosen.pilot_learning_rates)]:
            shutil.rmtree(folder, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    try:
        paths = _train_and_report(args, out, run_specs, settings, mode, chosen)
    except RuntimeError as err:  # a failed run: named, with what a rerun keeps
        print(f"[study-explore] stopped: {err}", file=sys.stderr)
        return 1
    print("[study-explore] wrote " + ", ".join(str(p) for p in paths))
    return 0


def _train_and_report(args, out: Path, run_specs: list[RunSpec], settings: StudySettings, mode: str,
                      chosen: Design) -> list[Path]:
    wall = {}
    hard_regime = chosen.hard[0]
    if mode == "pilot":
        for lr in chosen.pilot_learning_rates:
            lr_settings = replace(settings, learning_rate=lr)
            lr_out = out / f"lr{lr:g}"
            lr_out.mkdir(parents=True, exist_ok=True)
            if not args.report_only:
                wall[lr] = run_all(lr_out, run_specs, lr_settings, args.jobs)
        from recipe.studies import explore_report

        paths = explore_report.write_pilot(out, {lr: out / f"lr{lr:g}" for lr in chosen.pilot_learning_rates},
                                           [s.seed for s in run_specs
                                            if s.regime == hard_regime and s.method == "gapo_linear"],
                                           settings, sum(wall.values()) if wall else None, chosen)
    else:
        if not args.report_only:
            wall["all"] = run_all(out, run_specs, settings, args.jobs)
        elif not any(is_done(run_dir(out, s), settings) for s in run_specs):
            other = next((d for d in (settings_differ(run_dir(out, s), settings) for s in run_specs) if d), None)
            tasks = [t for t in TASKS if t != settings.task
                     and any((out / "runs" / r).is_dir() for r in task_regimes(t))]
            parser().error(f"--report-only: none of the {len(run_specs)} runs under {out / 'runs'} finished with these "
                           "settings" + (f"; runs there were trained with other settings ({'; '.join(other)}): pass "
                                         "the same --steps / --lr / --skew / --reduced" if other else "")
                           + (f"; runs of task {tasks[0]} are there: pass --task {tasks[0]}" if tasks else ""))
        from recipe.studies import explore_report

        write = explore_report.write_report if chosen.task == "smoke" else explore_report.write_real_report
        paths = write(out, sorted({s.seed for s in run_specs}), settings, mode, wall.get("all"))
    return paths


if __name__ == "__main__":
    sys.exit(main())

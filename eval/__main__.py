"""Evaluate a model or a verl checkpoint: pass@k on the paper's benchmarks, with tables and plots.

    python -m eval --model MODEL --bench aime24 aime25 ... [--n 16] [--out DIR]   evaluate (resumable)
    python -m eval --run-dir CKPTS --steps 100:200[:20] --bench ... [--n 64] [--out DIR]   several checkpoints of
        one run, each evaluated as above into OUT/global_step_N, then mean and spread over them (aggregate.*)
    python -m eval aggregate RUN [RUN ...] --out DIR   mean and spread over finished evaluations
    python -m eval report RUN [RUN ...] [--out FILE.md]   rebuild a run's reports from its records; compare runs
    python -m eval plot RUN [RUN ...] --out FILE.png [--labels A B ...]   pass@k curves of runs side by side

MODEL: an HF model directory, or a verl checkpoint (``global_step_N``, its ``actor/``, or the checkpoint root:
latest step), converted once with verl's model merger into ``--cache-dir``; or a hub id ``org/name``, tried only when
no such path exists and ``org`` is no local folder (:func:`eval.checkpoint.is_hub_id`): any other missing path stops
at once with one line naming it and the folders and checkpoints near it.
Benchmarks: parquet paths, or names under ``$GAPO_DATA_DIR`` (``math/``, ``code/``), as written by
``python -m gapo.data.prepare_math``. Scored by the training reward (``gapo.rewards.compute_score_batch``).

Writes into OUT: ``samples.jsonl`` (one line per sample, appended per problem: rerunning the same command
skips finished problems), ``run.json`` (settings), ``summary.json`` (pass@k for k = 1, 2, 4, ..., n averaged
over problems, coverage, solve-rate histogram, and the ``entrance`` block: distinct first moves per problem and
pass@k over the samples sharing the most common first move, per benchmark), ``results.md`` (the paper-shaped
table) and ``passk.png``. A first move is a response's first ``--entrance-tokens`` M tokens (default 8), with
``--entrance-until-newline`` cut after its first newline (:mod:`gapo.entrance`).

Several checkpoints (``--run-dir``, a run's checkpoint folder holding ``global_step_N/``, and ``--steps``:
``START:END`` every checkpoint there with START <= N <= END, ``START:END:STRIDE`` those with (N - START) a
multiple of STRIDE, or a list ``100,150,200``): each checkpoint is evaluated (and resumed) on its own in
``OUT/global_step_N``, then ``OUT/aggregate.json`` and ``OUT/aggregate.md`` give, per benchmark, the mean,
sample standard deviation, min and max over the checkpoints of pass@k and of coverage (problems with solve
rate above ``--coverage-threshold``, default 0.05; with n < 64 a 5% threshold counts nearly any success, see
docs/evaluation.md).

Supervision: with ``--timeout`` or a backend that may be vLLM (``vllm``; ``auto`` where vLLM is installed), this
process runs the evaluation in a child process of its own session and waits for it: past ``--timeout`` seconds it
kills it (vLLM's engine core runs in processes of its own) and exits with ``EvalTimeout`` (code 124); whenever
the child ends (done, failed, timed out, interrupted), every process it left is killed and the /dev/shm segments
it leaked (vLLM's ``psm_*``) are removed. A vLLM engine that fails ends the evaluation with vLLM's error.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from eval.checkpoint import checkpoint_folders, is_hub_id, missing_path_message
from gapo.entrance import DEFAULT_ENTRANCE_TOKENS  # pure python, as this process may only supervise
from gapo.model_path import hub_unreachable_reason

SUBCOMMANDS = ("report", "plot", "aggregate")
STEP_PREFIX = "global_step_"
CHILD_ENV = "GAPO_EVAL_SUPERVISED"  # set in the supervised child process: it runs the evaluation itself
TIMEOUT_EXIT = 124  # exit code of a run past --timeout (as timeout(1))
_UNITS = {"": 1, "k": 1024, "kib": 1024, "m": 1024**2, "mib": 1024**2, "g": 1024**3, "gib": 1024**3}


def _bool_or_auto(value: str) -> str:
    value = value.lower()
    if value not in ("auto", "true", "false"):
        raise argparse.ArgumentTypeError("expected auto, true or false")
    return value


def _byte_size(value: str) -> int:
    """Bytes: an integer, optionally with a binary unit (K/KiB, M/MiB, G/GiB): 268435456, 256MiB, 1G."""
    text = value.strip().lower().replace(" ", "")
    digits = text.rstrip("kmgib")
    unit = text[len(digits):]
    if not digits.isdigit() or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"expected bytes, e.g. 268435456, 256MiB or 1GiB, got {value!r}")
    return int(digits) * _UNITS[unit]


def _fraction(value: str) -> float:
    x = float(value)
    if not 0 <= x < 1:
        raise argparse.ArgumentTypeError(f"expected a solve rate in [0, 1), got {value!r}")
    return x


def parse_steps(spec: str) -> tuple[int, int, int | None] | list[int]:
    """``START:END[:STRIDE]`` as (start, end, stride or None); ``N,N,...`` as a sorted list of steps."""
    text = spec.strip()
    try:
        if ":" in text:
            parts = [int(x) for x in text.split(":")]
            if len(parts) not in (2, 3) or parts[0] > parts[1] or min(parts) < 0 or (len(parts) == 3 and parts[2] < 1):
                raise ValueError
            return parts[0], parts[1], parts[2] if len(parts) == 3 else None
        steps = sorted({int(x) for x in text.split(",") if x.strip()})
        if not steps or min(steps) < 0:
            raise ValueError
        return steps
    except ValueError:
        raise ValueError(f"--steps {spec!r}: expected START:END, START:END:STRIDE (0 <= START <= END, STRIDE >= 1) "
                         "or a comma list of steps, e.g. 100:200:20 or 100,150,200") from None


def checkpoint_steps(run_dir: str | Path) -> dict[int, Path]:
    """``{N: run_dir/global_step_N}`` for the checkpoints present."""
    root = Path(run_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"--run-dir: {missing_path_message(str(run_dir), hub=False)}")
    found = {}
    for child in root.iterdir():
        suffix = child.name[len(STEP_PREFIX):]
        if child.is_dir() and child.name.startswith(STEP_PREFIX) and suffix.isdigit():
            found[int(suffix)] = child
    return dict(sorted(found.items()))


def select_checkpoints(run_dir: str | Path, spec: str) -> list[tuple[int, Path]]:
    """The checkpoints of ``run_dir`` that ``--steps`` names (see :func:`parse_steps`), in step order."""
    available = checkpoint_steps(run_dir)
    wanted = parse_steps(spec)
    listing = ", ".join(map(str, available)) or "none"
    if isinstance(wanted, list):
        missing = [s for s in wanted if s not in available]
        if missing:
            raise FileNotFoundError(f"--run-dir {run_dir} has no checkpoint for step(s) {missing}; it has: {listing}")
        return [(s, available[s]) for s in wanted]
    start, end, stride = wanted
    chosen = [(s, path) for s, path in available.items()
              if start <= s <= end and (stride is None or (s - start) % stride == 0)]
    if not chosen:
        below = "" if available else checkpoint_folders(Path(run_dir))
        raise FileNotFoundError(f"--run-dir {run_dir} has no checkpoint in --steps {spec}; it has: {listing}"
                                + (f"; verl checkpoint folders under it: {below}" if below else ""))
    return chosen


def _entrance_tokens(value: str) -> int:
    """``--entrance-tokens``: an integer >= 1 (argparse names the flag in front of the message)."""
    try:
        m = int(value)
    except ValueError:
        m = 0
    if m < 1:
        raise argparse.ArgumentTypeError(
            f"got {value!r}: a response's first move is its first M response tokens, so M must be an integer >= 1; "
            f"use e.g. --entrance-tokens {DEFAULT_ENTRANCE_TOKENS} (the default)")
    return m


def _positive_seconds(value: str) -> float:
    seconds = float(value)
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {value!r}")
    return seconds


def eval_parser() -> argparse.ArgumentParser:
    """The parser of `python -m eval` (one evaluation: a model or a run's checkpoints on benchmarks)."""
    p = argparse.ArgumentParser(prog="python -m eval", description=__doc__.splitlines()[0],
                                epilog="subcommands: `python -m eval report -h`, `python -m eval plot -h`")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="HF dir, verl checkpoint (global_step_N[/actor], or a run's checkpoint folder: "
                                       "its latest step), or hub id org/name (when no such path exists and org/ "
                                       "is no local folder)")
    what.add_argument("--run-dir", default=None,
                      help="a training run's checkpoint folder (holding global_step_N/): evaluate the checkpoints "
                           "--steps selects and aggregate over them")
    p.add_argument("--steps", default=None, metavar="START:END[:STRIDE] | N,N,...",
                   help="with --run-dir: checkpoints with START <= N <= END (every STRIDE-th step from START), "
                        "or a comma list of steps")
    p.add_argument("--bench", "--benchmarks", dest="benchmarks", nargs="+", required=True, metavar="BENCH",
                   help="parquet paths or names under $GAPO_DATA_DIR (e.g. aime24 math500)")
    p.add_argument("--out", default=None, help="output folder (default: runs/eval/<model label>)")
    p.add_argument("--n", type=int, default=16, help="samples per problem (default 16)")
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--max-new-tokens", type=int, default=32768, help="per response (default 32768)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="sequences per generate call (default: hf 16, vllm 4096)")
    p.add_argument("--backend", choices=("auto", "hf", "vllm"), default="auto",
                   help="auto: vllm if installed and a GPU is visible, else hf")
    p.add_argument("--seed", type=int, default=0, help="base seed; each (problem, sample) derives its own")
    p.add_argument("--limit", type=int, default=None, help="first N problems of each benchmark only")
    p.add_argument("--require-think", type=_bool_or_auto, default="auto",
                   help="score 0 without </think> (auto: when the chat template opens <think>, as R1-Distill)")
    p.add_argument("--coverage-threshold", type=_fraction, default=0.05,
                   help="coverage counts problems with solve rate above this (default 0.05; n >= 64 recommended "
                        "at 0.05: with n = 16 one success is 6.25%% and already counts)")
    p.add_argument("--dtype", default="auto", help="auto: bf16 on GPU, fp32 on CPU (hf); the model's (vllm)")
    p.add_argument("--tensor-parallel-size", "--tp", type=int, default=None, help="vllm: GPUs per engine (1)")
    p.add_argument("--data-parallel-size", "--dp", type=int, default=None,
                   help="vllm: engines (default: visible GPUs / tp)")
    p.add_argument("--max-model-len", type=int, default=None, help="vllm: context length (default: model's)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="vllm on GPUs: fraction of GPU memory for weights and KV cache (default 0.9); not used "
                        "by vLLM's CPU build (see --kv-cache-bytes)")
    p.add_argument("--kv-cache-bytes", type=_byte_size, default=None, metavar="BYTES",
                   help="vllm: KV cache size in bytes, e.g. 268435456 or 256MiB (vLLM's kv_cache_memory_bytes; "
                        "overrides --gpu-memory-utilization). Default: 256MiB with vLLM's CPU build (one engine, "
                        "tp = dp = 1, eager), unset on GPUs")
    p.add_argument("--timeout", type=_positive_seconds, default=None, metavar="SECONDS",
                   help="hard wall-clock limit of the whole run (default: none): past it the run and its child "
                        "processes are killed, leaked /dev/shm segments removed, and it exits with EvalTimeout "
                        f"(code {TIMEOUT_EXIT}); finished problems are kept (the same command resumes)")
    p.add_argument("--entrance-tokens", type=_entrance_tokens, default=DEFAULT_ENTRANCE_TOKENS, metavar="M",
                   help=f"a response's first move (entrance) is its first M tokens (default {DEFAULT_ENTRANCE_TOKENS}); "
                        "reported: distinct first moves per problem and "
                        "pass@k over the samples sharing the most common one (docs/evaluation.md)")
    p.add_argument("--entrance-until-newline", action="store_true",
                   help="the first move ends after its first token that decodes to a newline (at most M tokens)")
    p.add_argument("--cache-dir", default=None,
                   help="converted verl checkpoints (default $GAPO_EVAL_CACHE or ~/.cache/gapo/eval_models)")
    p.add_argument("--label", default=None, help="name of this run in tables and plots (default: OUT's name)")
    p.add_argument("--stop-after", type=int, default=None,
                   help="stop after recording N problems (time-boxed jobs); the same command resumes")
    p.add_argument("--overwrite", action="store_true", help="discard OUT's records and start over")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def _default_out(model: str) -> str:
    """runs/eval/<name>: ``<experiment>_global_step_N`` for a verl checkpoint, else the model's last path part."""
    parts = [part for part in Path(model).parts if part not in ("actor", "checkpoints", "/", ".", "..")]
    if len(parts) >= 2 and parts[-1].startswith("global_step_"):
        label = f"{parts[-2]}_{parts[-1]}"
    else:
        label = parts[-1] if parts else "model"
    return str(Path("runs/eval") / label)


# ------------------------------------------------------------------------------------ supervision
class EvalTimeout(RuntimeError):
    """The evaluation ran past ``--timeout`` and was killed."""


def _needs_supervision(args) -> bool:
    if args.timeout is not None or args.backend == "vllm":
        return True
    if args.backend == "auto":
        import importlib.util

        return importlib.util.find_spec("vllm") is not None
    return False


CHILD_MARKER = "GAPO_EVAL_MARKER"  # its own marker: a supervisor around this one still finds every process by its own


def run_supervised(cmd: list[str], timeout: float | None) -> int:
    """Run ``cmd`` (this evaluation, marked as the supervised child) under :class:`gapo.supervisor.SupervisedRun`:
    its own session, this terminal's stdin, stdout and stderr, a hard wall-clock limit. When it ends (or ``timeout``
    passes, or this process gets SIGINT, SIGTERM or SIGHUP), every process of it is killed and the /dev/shm segments
    it leaked are removed. Returns the child's exit code; raises :class:`EvalTimeout` past ``timeout``."""
    import signal

    from gapo.supervisor import RunTimedOut, SupervisedRun  # no torch in this waiting process (gapo/__init__.py)

    def interrupted(signum, _frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGTERM, signal.SIGHUP)}
    root = str(Path(__file__).resolve().parents[1])  # `-m eval` resolves to this package in the child too
    env = {**os.environ, CHILD_ENV: "1",
           "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    run = SupervisedRun(cmd, env, None, timeout_s=timeout, watch_patterns=False, sample_memory_s=1.0,
                        marker_env=CHILD_MARKER)
    try:
        result = run.wait(poll_s=0.5)
    except RunTimedOut:
        raise EvalTimeout(f"the evaluation exceeded its wall-clock limit of {timeout:g} s (--timeout) and was killed "
                          f"with its {run.killed} process(es); problems finished so far are kept in the records (the "
                          "same command resumes)") from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if result.leaked_shm_removed:
        print(f"[eval] removed {len(result.leaked_shm_removed)} /dev/shm segment(s) the run left: "
              f"{' '.join(result.leaked_shm_removed)}", file=sys.stderr, flush=True)
    code = result.returncode
    return code if code >= 0 else 128 - code  # killed by a signal: as a shell reports it


def run_eval(argv) -> int:
    """`python -m eval --model/--run-dir ...`: evaluate, print the results table; the exit status."""
    from eval.records import SAMPLES_FILE
    from eval.report import PLOT_FILE, SUMMARY_FILE, TABLE_FILE, results_table
    from eval.runner import evaluate

    parser = eval_parser()
    args = parser.parse_args(argv)
    if args.n < 1:
        sys.exit("error: --n must be >= 1")
    if (args.run_dir is None) != (args.steps is None):
        parser.error("--run-dir and --steps go together")
    checkpoints = None
    if args.run_dir is not None:
        try:
            checkpoints = select_checkpoints(args.run_dir, args.steps)
        except (FileNotFoundError, ValueError) as err:
            sys.exit(f"error: {err}")
    if args.limit is not None and args.limit < 1:
        sys.exit("error: --limit must be >= 1")
    if args.model is not None and not Path(args.model).expanduser().exists():
        if not is_hub_id(args.model):
            sys.exit(f"error: --model: {missing_path_message(args.model)}")  # before any folder is made or model loaded
        unreachable = hub_unreachable_reason(args.model)  # seconds, not transformers' ~50 s of retries
        if unreachable:
            sys.exit(f"error: --model: {unreachable}")
    if not os.environ.get(CHILD_ENV) and _needs_supervision(args):
        return run_supervised([sys.executable, "-m", "eval", *argv], args.timeout)
    if checkpoints is not None:
        return run_checkpoints(args, checkpoints)
    out = Path(args.out or _default_out(args.model))
    cfg = _config(args, args.model, str(out), args.label)
    try:
        summary = evaluate(cfg, overwrite=args.overwrite)
    except (FileNotFoundError, ValueError) as err:
        sys.exit(f"error: {err}")
    print(results_table(summary, title=summary["config"]["label"]))
    print(f"[eval] this table: {out / TABLE_FILE}; plot: {out / PLOT_FILE}; every number: {out / SUMMARY_FILE}; "
          f"samples: {out / SAMPLES_FILE}", flush=True)
    return 3 if summary.get("stopped") else 0


def _config(args, model: str, out: str, label: str | None):
    from eval.runner import EvalConfig

    return EvalConfig(
        model=model, benchmarks=args.benchmarks, out=out, n=args.n,
        temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size, backend=args.backend, seed=args.seed, limit=args.limit,
        require_think=args.require_think, coverage_threshold=args.coverage_threshold, dtype=args.dtype,
        tensor_parallel_size=args.tensor_parallel_size, data_parallel_size=args.data_parallel_size,
        max_model_len=args.max_model_len, gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_bytes=args.kv_cache_bytes, cache_dir=args.cache_dir, label=label, stop_after=args.stop_after,
        progress=not args.no_progress, entrance_tokens=args.entrance_tokens,
        entrance_until_newline=args.entrance_until_newline)


def run_checkpoints(args, checkpoints: list[tuple[int, Path]], evaluate_fn=None) -> int:
    """Evaluate each checkpoint into OUT/global_step_N (resumable, as one run each), then aggregate over them."""
    from eval.report import aggregate_runs, aggregate_table, write_aggregate
    from eval.runner import evaluate

    evaluate_fn = evaluate_fn or evaluate
    run_dir = Path(args.run_dir)
    folder = run_dir.resolve()  # runs/smoke/checkpoints is named smoke
    name = args.label or (folder.parent.name if folder.name == "checkpoints" else folder.name)
    out = Path(args.out or Path("runs/eval") / f"{name}_steps_{checkpoints[0][0]}-{checkpoints[-1][0]}")
    runs, stopped = [], False
    for step, path in checkpoints:
        label = f"{STEP_PREFIX}{step}"
        print(f"[eval] checkpoint {path} -> {out / label}", file=sys.stderr, flush=True)
        try:
            summary = evaluate_fn(_config(args, str(path), str(out / label), f"{name} step {step}"),
                                  overwrite=args.overwrite)
        except (FileNotFoundError, ValueError) as err:
            sys.exit(f"error: {err}")
        runs.append((label, summary))
        if summary.get("stopped"):
            stopped = True
            break
    if stopped:
        print(f"[eval] stopped early at {runs[-1][0]}; rerun to resume (no aggregate written yet)", file=sys.stderr)
        return 3
    paths = write_aggregate(out, runs, title=f"{name}: {len(runs)} checkpoints")
    print(aggregate_table(aggregate_runs(runs), title=f"{name}: {len(runs)} checkpoints"))
    print(f"[eval] wrote {paths['summary']} and {paths['table']}", file=sys.stderr)
    return 0


def run_aggregate(argv) -> int:
    """`python -m eval aggregate RUNS`: mean, std, min and max of pass@k and coverage over finished runs."""
    from eval.report import aggregate_runs, aggregate_table, load_run, rebuild_reports, write_aggregate

    p = argparse.ArgumentParser(prog="python -m eval aggregate",
                                description="Mean, sample std, min and max of pass@k and coverage over finished "
                                            "evaluations (e.g. several checkpoints of one run).")
    p.add_argument("runs", nargs="+", help="evaluation output folders (same n and coverage threshold)")
    p.add_argument("--out", default=None, help="write aggregate.json and aggregate.md into this folder")
    p.add_argument("--title", default=None)
    args = p.parse_args(argv)
    for run_dir in args.runs:
        rebuild_reports(run_dir)
    runs = [(Path(r).name, load_run(r)[1]) for r in args.runs]
    try:
        agg = aggregate_runs(runs)
    except ValueError as err:
        sys.exit(f"error: {err}")
    print(aggregate_table(agg, args.title))
    if args.out:
        write_aggregate(args.out, runs, args.title or f"{len(runs)} evaluations")
    return 0


def run_report(argv) -> int:
    """`python -m eval report RUNS`: rebuild the runs' reports from their samples and compare them."""
    from eval.report import comparison_tables, load_run, rebuild_reports, results_table

    p = argparse.ArgumentParser(prog="python -m eval report",
                                description="Rebuild runs' summary.json/results.md/passk.png from samples.jsonl "
                                            "(also of a stopped run); with several runs, print comparison tables.")
    p.add_argument("runs", nargs="+", help="evaluation output folders")
    p.add_argument("--labels", nargs="+", default=None, help="names of the runs (default: their labels)")
    p.add_argument("--ks", nargs="+", type=int, default=None,
                   help="k of the comparison tables (default: 1 and the largest k every run has)")
    p.add_argument("--out", default=None, help="also write the printed markdown to this file")
    args = p.parse_args(argv)
    for run_dir in args.runs:
        rebuild_reports(run_dir)
    loaded = [load_run(run_dir) for run_dir in args.runs]
    if args.labels:
        if len(args.labels) != len(loaded):
            sys.exit("error: give one label per run")
        loaded = [(label, s) for label, (_, s) in zip(args.labels, loaded)]
    text = (results_table(loaded[0][1], title=loaded[0][0]) if len(loaded) == 1 else comparison_tables(loaded, args.ks))
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


def run_plot(argv) -> int:
    """`python -m eval plot RUNS --out PNG`: pass@k curves of runs side by side."""
    from eval.report import load_run, plot_runs

    p = argparse.ArgumentParser(prog="python -m eval plot", description="pass@k curves of runs side by side")
    p.add_argument("runs", nargs="+", help="evaluation output folders (or their summary.json)")
    p.add_argument("--out", required=True, help="PNG to write")
    p.add_argument("--labels", nargs="+", default=None, help="names of the runs (default: their labels)")
    p.add_argument("--title", default=None)
    args = p.parse_args(argv)
    runs = [load_run(r) for r in args.runs]
    if args.labels:
        if len(args.labels) != len(runs):
            sys.exit("error: give one label per run")
        runs = [(label, s) for label, (_, s) in zip(args.labels, runs)]
    print(plot_runs(runs, args.out, args.title))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the subcommand (report, plot, aggregate) or to one evaluation; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "report":
        return run_report(argv[1:])
    if argv and argv[0] == "plot":
        return run_plot(argv[1:])
    if argv and argv[0] == "aggregate":
        return run_aggregate(argv[1:])
    try:
        return run_eval(argv)
    except EvalTimeout as err:
        print(f"error: EvalTimeout: {err}", file=sys.stderr, flush=True)
        return TIMEOUT_EXIT
    except KeyboardInterrupt as err:
        print(f"error: interrupted ({err or 'SIGINT'}); the run was stopped and cleaned up", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

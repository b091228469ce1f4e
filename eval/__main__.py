"""Evaluate a model or a verl checkpoint: pass@k on the paper's benchmarks, with tables and plots.

    python -m eval --model MODEL --bench aime24 aime25 ... [--n 16] [--out DIR]   evaluate (resumable)
    python -m eval report RUN [RUN ...] [--out FILE.md]   rebuild a run's reports from its records; compare runs
    python -m eval plot RUN [RUN ...] --out FILE.png [--labels A B ...]   pass@k curves of runs side by side

MODEL: an HF model directory or hub id, or a verl checkpoint (``global_step_N``, its ``actor/``, or the
checkpoint root: latest step), converted once with verl's model merger into ``--cache-dir``.
Benchmarks: parquet paths, or names under ``$GAPO_DATA_DIR`` (``math/``, ``code/``), as written by
``python -m gapo.data.prepare_math``. Scored by the training reward (``gapo.rewards.compute_score_batch``).

Writes into OUT: ``samples.jsonl`` (one line per sample, appended per problem: rerunning the same command
skips finished problems), ``run.json`` (settings), ``summary.json`` (pass@k for k = 1, 2, 4, ..., n averaged
over problems, coverage, solve-rate histogram, per benchmark), ``results.md`` (the paper-shaped table)
and ``passk.png``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SUBCOMMANDS = ("report", "plot")


def _bool_or_auto(value: str) -> str:
    value = value.lower()
    if value not in ("auto", "true", "false"):
        raise argparse.ArgumentTypeError("expected auto, true or false")
    return value


def eval_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eval", description=__doc__.splitlines()[0],
                                epilog="subcommands: `python -m eval report -h`, `python -m eval plot -h`")
    p.add_argument("--model", required=True, help="HF dir / hub id, or verl checkpoint (global_step_N[/actor])")
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
    p.add_argument("--coverage-threshold", type=float, default=0.05,
                   help="coverage counts problems with solve rate above this (default 0.05)")
    p.add_argument("--dtype", default="auto", help="auto: bf16 on GPU, fp32 on CPU (hf); the model's (vllm)")
    p.add_argument("--tensor-parallel-size", "--tp", type=int, default=None, help="vllm: GPUs per engine (1)")
    p.add_argument("--data-parallel-size", "--dp", type=int, default=None,
                   help="vllm: engines (default: visible GPUs / tp)")
    p.add_argument("--max-model-len", type=int, default=None, help="vllm: context length (default: model's)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
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


def run_eval(argv) -> int:
    from eval.report import results_table
    from eval.runner import EvalConfig, evaluate

    args = eval_parser().parse_args(argv)
    if args.n < 1:
        sys.exit("error: --n must be >= 1")
    if args.limit is not None and args.limit < 1:
        sys.exit("error: --limit must be >= 1")
    cfg = EvalConfig(
        model=args.model, benchmarks=args.benchmarks, out=args.out or _default_out(args.model), n=args.n,
        temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size, backend=args.backend, seed=args.seed, limit=args.limit,
        require_think=args.require_think, coverage_threshold=args.coverage_threshold, dtype=args.dtype,
        tensor_parallel_size=args.tensor_parallel_size, data_parallel_size=args.data_parallel_size,
        max_model_len=args.max_model_len, gpu_memory_utilization=args.gpu_memory_utilization,
        cache_dir=args.cache_dir, label=args.label, stop_after=args.stop_after, progress=not args.no_progress)
    try:
        summary = evaluate(cfg, overwrite=args.overwrite)
    except (FileNotFoundError, ValueError) as err:
        sys.exit(f"error: {err}")
    print(results_table(summary, title=summary["config"]["label"]))
    return 3 if summary.get("stopped") else 0


def run_report(argv) -> int:
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
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "report":
        return run_report(argv[1:])
    if argv and argv[0] == "plot":
        return run_plot(argv[1:])
    return run_eval(argv)


if __name__ == "__main__":
    sys.exit(main())

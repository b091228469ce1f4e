"""The evaluation loop: resolve the model, load benchmarks, skip finished problems, generate, score, record, report.

Generation runs in the calling thread; scoring (the training reward, :func:`gapo.rewards.compute_score_batch`)
and recording run in one background thread, so the code sandbox and math-verify work while the next
batch generates. Records are appended per problem (see :mod:`eval.records`); the reports are written at
the end, and ``python -m eval report OUT`` rebuilds them from the records at any time.

Memory does not grow with n x problems: each generate call holds at most ``batch_size`` samples (a problem
with n > batch_size is split into slices of ``batch_size`` samples, written as they are scored), at most two
scored-but-unwritten calls wait, and the store keeps per-problem counts only. Every sample keeps its own
seed (:func:`eval.generate.sample_seed`), and slices start at multiples of ``batch_size``, where the HF
backend starts a new generator chunk anyway: the records are the same as generating the problem whole.

Each record's ``entrance`` (its first move, :func:`gapo.entrance.first_move`) is cut here from the first
``entrance_tokens`` token ids the backend returns with each completion; with ``entrance_until_newline`` it ends
after the first token whose decoded text holds a newline (:func:`gapo.entrance.newline_token_ids`, once per run).
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from eval.checkpoint import resolve_model
from eval.data import Benchmark, Problem, load_benchmarks
from eval.generate import (
    Request,
    SamplingConfig,
    encode_prompt,
    make_backend,
    render_prompt,
    sample_seed,
)
from eval.records import SampleStore
from eval.report import RUN_FILE, summarize_run, write_reports
from gapo.entrance import DEFAULT_ENTRANCE_TOKENS, first_move, newline_token_ids
from gapo.passk import DEFAULT_COVERAGE_THRESHOLD, coverage_warning

# Settings that change what is sampled, how it is judged or what a record's first move is: a resumed run must use the
# same ones.
RESUME_KEYS = ("model", "n", "temperature", "top_p", "max_new_tokens", "seed", "require_think", "entrance_tokens",
               "entrance_until_newline")
# Recorded since first moves were: a run.json without them (an older run, whose records have no `entrance`) may be
# resumed; its benchmarks then report no entrance metrics (n/a) until rerun into a fresh folder.
LATER_KEYS = ("entrance_tokens", "entrance_until_newline")
THINK_OPEN = "<think>"


@dataclass
class EvalConfig:
    """One evaluation's settings: the model, benchmarks, output folder, and sampling (n, temperature, top_p, ...)."""
    model: str
    benchmarks: list[str]
    out: str
    n: int = 16
    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int = 32768
    batch_size: int | None = None  # sequences per generate call (default: hf 16, vllm 4096)
    backend: str = "auto"
    seed: int = 0
    limit: int | None = None
    require_think: str = "auto"  # auto | true | false
    coverage_threshold: float = DEFAULT_COVERAGE_THRESHOLD
    dtype: str = "auto"
    tensor_parallel_size: int | None = None
    data_parallel_size: int | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_bytes: int | None = None  # vllm: KV cache in bytes (vLLM's CPU build: default 256 MiB)
    cache_dir: str | None = None
    data_dir: str | None = None
    label: str | None = None
    stop_after: int | None = None  # stop after recording this many problems (time-boxed jobs; rerun resumes)
    progress: bool = True
    entrance_tokens: int = DEFAULT_ENTRANCE_TOKENS  # m: a response's first move is its first m tokens
    entrance_until_newline: bool = False  # the first move ends after its first newline-bearing token (at most m)

    def __post_init__(self):
        """Check the first-move length before anything loads.

        Raises:
            ValueError: ``entrance_tokens`` is not an integer >= 1.
        """
        m = self.entrance_tokens
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"entrance_tokens = {m!r} (--entrance-tokens): a response's first move needs at least one "
                             f"token; give an integer >= 1 (default {DEFAULT_ENTRANCE_TOKENS})")


class Stopped(Exception):
    """Raised inside the loop when ``stop_after`` problems were recorded."""


def _log(msg: str) -> None:
    """Print a progress line to stderr."""
    print(msg, file=sys.stderr, flush=True)


def _decide_require_think(setting: str, tokenizer, problems: list[Problem]) -> bool:
    """``auto``: true when the chat template opens ``<think>`` in the prompt (R1-Distill), as training sets it."""
    if setting in ("true", "false"):
        return setting == "true"
    sample = next((p.prompt for p in problems if not isinstance(p.prompt, str)), None)
    if sample is None:
        return False
    return render_prompt(tokenizer, sample).rstrip().endswith(THINK_OPEN)


def _check_resume(out: Path, run: dict) -> dict:
    """The folder's previous run.json (or {}); exits when its sampling settings differ from ``run``'s."""
    path = out / RUN_FILE
    if not path.is_file():
        return {}
    old = json.loads(path.read_text())
    diff = {k: (old.get(k), run.get(k)) for k in RESUME_KEYS
            if old.get(k) != run.get(k) and not (k in LATER_KEYS and k not in old)}
    if diff:
        lines = "\n".join(f"  {k}: recorded {a!r}, now {b!r}" for k, (a, b) in diff.items())
        raise SystemExit(f"error: {out} holds an evaluation with other settings:\n{lines}\n"
                         "use another --out, or --overwrite to start over")
    if old.get("backend") != run.get("backend"):
        _log(f"[eval] note: resuming a {old.get('backend')} run with the {run.get('backend')} backend")
    return old


def _records(problem: Problem, seeds: list[int], completions, results: list[dict], first: int = 0,
             move_of=None) -> list[dict]:
    """One JSONL record per completion of ``problem``, samples numbered from ``first``, with the reward's other scalar
    fields (anything else as its ``str``). ``move_of``: a completion's first token ids to its first move (the
    record's ``entrance``, a list of token ids); without it, or for a completion without ``head_ids``, no
    ``entrance``."""
    recs = []
    for i, (seed, comp, res) in enumerate(zip(seeds, completions, results, strict=True), start=first):
        rec = {"benchmark": problem.benchmark, "problem": problem.index, "id": problem.id,
               "data_source": problem.data_source, "sample": i, "seed": seed, "response": comp.text,
               "pred": res.get("pred", ""), "correct": bool(res.get("acc", False)),
               "score": float(res.get("score", 0.0)), "finish_reason": comp.finish_reason,
               "response_tokens": comp.tokens}
        if move_of is not None and getattr(comp, "head_ids", None) is not None:
            rec["entrance"] = list(move_of(comp.head_ids))
        for key, value in res.items():
            if key not in ("pred", "acc", "score") and key not in rec:
                rec[key] = value if isinstance(value, (bool, int, float, str, type(None))) else str(value)
        recs.append(rec)
    return recs


@dataclass
class Piece:
    """Samples ``first .. first + len(seeds) - 1`` of one problem: the unit of generation and of writing."""

    problem: Problem
    first: int
    seeds: list[int]


def plan_calls(problems: list[Problem], n: int, batch_size: int, seed: int) -> list[list[Piece]]:
    """Generate calls of at most ``batch_size`` samples each: whole problems packed together while they fit
    (as many as ``batch_size // n``), a problem with more samples than that in slices of ``batch_size``."""
    batch_size = max(1, int(batch_size))
    calls: list[list[Piece]] = []
    current: list[Piece] = []
    size = 0
    for p in problems:
        for first in range(0, n, batch_size):
            count = min(batch_size, n - first)
            if current and size + count > batch_size:
                calls.append(current)
                current, size = [], 0
            current.append(Piece(p, first, [sample_seed(seed, p.benchmark, p.index, i)
                                             for i in range(first, first + count)]))
            size += count
    if current:
        calls.append(current)
    return calls


def evaluate(cfg: EvalConfig, overwrite: bool = False, backend_factory=None) -> dict:
    """Run (or resume) an evaluation; returns the summary. Writes under ``cfg.out`` (see eval/__main__.py).

    ``backend_factory``, for tests: ``fn(name, model_path, sampling, **kwargs)`` used instead of
    :func:`eval.generate.make_backend`.
    """
    from transformers import AutoTokenizer

    from gapo.rewards import compute_score_batch

    start = time.time()
    out = Path(cfg.out)
    benches: list[Benchmark] = load_benchmarks(cfg.benchmarks, cfg.limit,
                                               Path(cfg.data_dir) if cfg.data_dir else None)
    resolved = resolve_model(cfg.model, cfg.cache_dir, log=_log)  # a wrong model leaves no output folder behind
    if overwrite and out.exists():
        for name in ("samples.jsonl", RUN_FILE, "summary.json", "results.md", "passk.png"):
            (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(resolved.path)
    problems = [p for b in benches for p in b.problems]
    require_think = _decide_require_think(cfg.require_think, tokenizer, problems)
    backend_name = cfg.backend
    if backend_name == "auto":
        from eval.generate import visible_gpus, vllm_available

        backend_name = "vllm" if vllm_available() and visible_gpus() else "hf"
    run = {"model": cfg.model, "model_path": resolved.path, "model_kind": resolved.kind, "step": resolved.step,
           "n": cfg.n, "temperature": cfg.temperature, "top_p": cfg.top_p, "max_new_tokens": cfg.max_new_tokens,
           "seed": cfg.seed, "require_think": require_think, "backend": backend_name,
           "coverage_threshold": cfg.coverage_threshold, "entrance_tokens": cfg.entrance_tokens,
           "entrance_until_newline": cfg.entrance_until_newline, "label": cfg.label or out.resolve().name}
    previous = _check_resume(out, run)
    # every benchmark this folder has records for, earlier runs' first (report rebuilds from this)
    run["benchmarks"] = {**previous.get("benchmarks", {}),
                         **{b.name: {"path": str(b.path), "problems_total": len(b.problems)} for b in benches}}
    run["limit"] = cfg.limit
    (out / RUN_FILE).write_text(json.dumps(run, indent=1) + "\n")

    store = SampleStore(out, cfg.n)
    done = store.load()
    todo = [p for p in problems if (p.benchmark, p.index) not in done]
    recorded_before = len(done)
    _log(f"[eval] {resolved.kind} model {resolved.path}; {len(problems)} problems in {len(benches)} benchmark(s), "
         f"{len(problems) - len(todo)} already recorded, {len(todo)} to run; n={cfg.n}, backend={backend_name}")
    warning = coverage_warning(cfg.n, cfg.coverage_threshold)
    if warning:
        _log(f"[eval] note: {warning}")
    gen_s = 0.0
    stopped = False
    if todo:
        newline_ids = newline_token_ids(tokenizer) if cfg.entrance_until_newline else None
        m = cfg.entrance_tokens

        def move_of(head_ids):
            return first_move(head_ids, m, newline_ids)

        batch_size = cfg.batch_size or (16 if backend_name == "hf" else 4096)
        sampling = SamplingConfig(cfg.temperature, cfg.top_p, cfg.max_new_tokens)
        factory = backend_factory or make_backend
        backend = factory(backend_name, resolved.path, sampling, batch_size=batch_size, dtype=cfg.dtype,
                          tp=cfg.tensor_parallel_size, dp=cfg.data_parallel_size, max_model_len=cfg.max_model_len,
                          gpu_memory_utilization=cfg.gpu_memory_utilization, seed=cfg.seed,
                          kv_cache_bytes=cfg.kv_cache_bytes, head_tokens=cfg.entrance_tokens)
        try:
            gen_s, stopped = _run_loop(cfg, backend, tokenizer, todo, store, batch_size, require_think,
                                       compute_score_batch, move_of)
        finally:
            backend.close()
    config = {k: v for k, v in run.items() if k != "benchmarks"}
    summary = summarize_run(store.done, config, run["benchmarks"])
    summary["timing"] = {"wall_s": round(time.time() - start, 2), "generate_s": round(gen_s, 2),
                         "problems_recorded": len(store.done) - recorded_before}
    paths = write_reports(out, summary, title=f"{run['label']}: pass@k")
    _log(f"[eval] {'stopped early; rerun to resume. ' if stopped else ''}wrote {paths['summary']}, "
         f"{paths['table']}, {paths['plot']} ({time.time() - start:.1f} s)")
    summary["stopped"] = stopped
    return summary


def _run_loop(cfg, backend, tokenizer, todo, store, batch_size, require_think, score_fn,
              move_of=None) -> tuple[float, bool]:
    """Generate, score and record ``todo``; returns (seconds spent generating, whether ``stop_after`` stopped it).

    Generation runs here; scoring and recording run in one background thread, at most two calls behind (bounded
    memory). A problem's prompt ids are encoded once even when its samples span several calls. ``Stopped`` from the
    scorer or the loop ends it and cancels what is still queued.
    """
    from tqdm import tqdm

    total = len(todo) * cfg.n
    bar_kw = {"total": total, "unit": "sample", "disable": not cfg.progress, "dynamic_ncols": True,
              "file": sys.stderr, "mininterval": 0.5 if sys.stderr.isatty() else 10.0}
    gen_bar = tqdm(desc="generate", position=0, **bar_kw)
    score_bar = tqdm(desc="score   ", position=1, **bar_kw)
    recorded = 0
    gen_s = 0.0
    encoded: dict[tuple[str, int], list[int]] = {}  # prompt ids of a problem split over several calls

    def stop_now() -> bool:
        return cfg.stop_after is not None and recorded >= cfg.stop_after

    def score_and_record(pieces, completions):
        nonlocal recorded
        if stop_now():
            raise Stopped
        flat = [(piece.problem, c) for piece, comps in zip(pieces, completions) for c in comps]
        results = score_fn([p.data_source for p, _ in flat], [c.text for _, c in flat],
                           [p.ground_truth for p, _ in flat], [p.extra_info for p, _ in flat],
                           require_think=require_think)
        pos = 0
        for piece, comps in zip(pieces, completions):
            if stop_now():
                raise Stopped
            finished = store.append(_records(piece.problem, piece.seeds, comps, results[pos:pos + len(comps)],
                                             piece.first, move_of))
            pos += len(comps)
            recorded += len(finished)
            score_bar.update(len(comps))

    def prompt_ids(p: Problem) -> list[int]:
        key = (p.benchmark, p.index)
        ids = encoded.pop(key, None) or encode_prompt(tokenizer, render_prompt(tokenizer, p.prompt))
        if cfg.n > batch_size:
            encoded[key] = ids  # more slices of this problem follow (dropped with its last slice)
        return ids

    pending: list[Future] = []
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="eval-score") as pool:
            for pieces in plan_calls(todo, cfg.n, batch_size, cfg.seed):
                if pending and pending[0].done():
                    pending.pop(0).result()  # surface scoring errors (and Stopped) early
                if stop_now():
                    raise Stopped
                reqs = []
                for piece in pieces:
                    reqs.append(Request(prompt_ids(piece.problem), piece.seeds))
                    if piece.first + len(piece.seeds) >= cfg.n:
                        encoded.pop((piece.problem.benchmark, piece.problem.index), None)
                t0 = time.time()
                completions = backend.generate(reqs)
                gen_s += time.time() - t0
                gen_bar.update(sum(len(c) for c in completions))
                while len(pending) >= 2:  # bound the memory held by unscored batches
                    pending.pop(0).result()
                pending.append(pool.submit(score_and_record, pieces, completions))
            while pending:
                pending.pop(0).result()
    except Stopped:
        for f in pending:
            f.cancel()
        return gen_s, True
    finally:
        gen_bar.close()
        score_bar.close()
    return gen_s, False

"""Summaries, markdown tables and pass@k plots from an evaluation's per-sample records.

- :func:`summarize_run`: ``summary.json``'s content, recomputed from the records alone (so ``report`` can
  rebuild it from ``samples.jsonl`` at any time, even from a stopped run), with each benchmark's ``entrance``
  block (:func:`entrance_summary`: breadth at the first move and pass@k below it);
- :func:`results_table`: one run, shaped like the paper's tables (benchmarks as columns, rows pass@k in %, each
  with pass@k over the majority entrance below it, then coverage, problems and the entrance rows);
  :func:`comparison_tables`: several runs, one table per k (runs as rows);
- :func:`plot_runs`: pass@k curves per benchmark (several runs side by side; dashed: over the majority entrance)
  over the solve-rate distribution, as a PNG (matplotlib, imported only here).
"""

from __future__ import annotations

import itertools
import json
import math
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

from gapo.passk import DEFAULT_COVERAGE_THRESHOLD, coverage_warning, default_ks, pass_at_k_exact, spread, summarize

SUMMARY_FILE, TABLE_FILE, PLOT_FILE, RUN_FILE = "summary.json", "results.md", "passk.png", "run.json"
AGGREGATE_FILE, AGGREGATE_TABLE_FILE = "aggregate.json", "aggregate.md"


def majority_pass_at_k(majorities: list[tuple[int, int]], k: int) -> float:
    """Mean over problems of the unbiased pass@k over each problem's majority-entrance samples, one ``(n_maj,
    c_maj)`` per problem, with k capped at n_maj: for k > n_maj it is pass@n_maj, "any majority-entrance sample
    correct" (1 if c_maj > 0, else 0). Summed as exact fractions, rounded once (NaN for no problem)."""
    if not majorities:
        return float("nan")
    exact = sum((pass_at_k_exact(n, c, min(k, n)) for n, c in majorities), Fraction(0))
    return float(exact / len(majorities))


def entrance_summary(stats: list, ks: list[int], settings: dict) -> dict | None:
    """A benchmark's ``entrance`` block from its problems' :class:`eval.records.ProblemStats` (None when some
    problem has samples without a recorded first move, e.g. records of an older run, or there is no problem).

    Per problem of n samples (:mod:`gapo.entrance`): distinct first moves / n; the majority entrance (the most
    common first move, ties to the first in sample order) with its n_maj samples and c_maj correct ones; and, with
    c >= 1 correct samples, the share of them whose first move no other sample took. Returned, JSON-ready:
    ``{"tokens", "until_newline"`` (the run's settings), ``"problems", "distinct_frac_mean", "majority_size_mean"``
    (mean n_maj / n), ``"majority_pass@k": {k: mean over problems of pass@min(k, n_maj) over the majority
    entrance}`` (:func:`majority_pass_at_k`), ``"unique_success_frac_mean"`` (over the ``"problems_with_success"``;
    None when there is none) ``}``.
    """
    if not stats or not all(s.has_entrances for s in stats):
        return None
    groups = [s.entrances() for s in stats]
    majorities = [s.majority() for s in stats]
    unique = [g.unique_success_frac for g in groups if g.successes]
    return {
        "tokens": settings.get("tokens"),
        "until_newline": settings.get("until_newline"),
        "problems": len(stats),
        "distinct_frac_mean": sum(g.distinct_frac for g in groups) / len(groups),
        "majority_size_mean": sum(n_maj / s.n for (n_maj, _), s in zip(majorities, stats)) / len(stats),
        "majority_pass@k": {str(k): majority_pass_at_k(majorities, k) for k in ks},
        "unique_success_frac_mean": sum(unique) / len(unique) if unique else None,
        "problems_with_success": len(unique),
    }


def benchmark_summary(problems: list, n: int, coverage_threshold: float, total_rows: int | None = None,
                      entrance: dict | None = None) -> dict:
    """One benchmark: pass@k etc. over its finished problems, each a :class:`eval.records.ProblemStats` (or a
    list of its n records); ``entrance``: the run's entrance settings (``tokens``, ``until_newline``) for the
    ``entrance`` block (:func:`entrance_summary`; absent when the records have no first moves)."""
    from eval.records import ProblemStats

    stats = [p if isinstance(p, ProblemStats) else ProblemStats.of(p) for p in problems]
    counts = [(s.n, s.correct) for s in stats]
    out = summarize(counts, default_ks(n), coverage_threshold) if counts else summarize([], None, coverage_threshold)
    out["problems_total"] = total_rows if total_rows is not None else len(stats)
    block = entrance_summary(stats, default_ks(n), entrance or {})
    if block is not None:
        out["entrance"] = block
    samples = sum(s.n for s in stats)

    def frac(field):
        return sum(getattr(s, field) for s in stats) / samples if samples else float("nan")

    out["samples_stats"] = {
        "response_tokens_mean": frac("response_tokens"),
        "truncated_frac": frac("truncated"),
        "format_error_frac": frac("format_errors"),
        "timeout_frac": frac("timeouts"),
    }
    return out


def summarize_run(done: dict, config: dict, benchmarks: dict[str, dict]) -> dict:
    """``summary.json``: the run's config plus, per benchmark, pass@k over its finished problems.

    Args:
        done: ``{(benchmark, problem): ProblemStats or records}`` (complete problems only, see :mod:`eval.records`).
        config: the run's settings (``n``, ``coverage_threshold``, ...), copied in.
        benchmarks: ``{name: {"path": ..., "problems_total": rows evaluated}}`` in report order.
    """
    n = int(config["n"])
    threshold = float(config.get("coverage_threshold", DEFAULT_COVERAGE_THRESHOLD))
    entrance = {"tokens": config.get("entrance_tokens"), "until_newline": config.get("entrance_until_newline")}
    by_bench: dict[str, list] = defaultdict(list)
    for (bench, problem), recs in sorted(done.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        by_bench[bench].append(recs)
    names = list(benchmarks) + sorted(set(by_bench) - set(benchmarks))
    results = {}
    for name in names:
        meta = benchmarks.get(name, {})
        results[name] = {"path": meta.get("path"),
                         **benchmark_summary(by_bench.get(name, []), n, threshold, meta.get("problems_total"),
                                             entrance)}
    complete = all(r["problems"] == r["problems_total"] for r in results.values())
    return {"config": config, "ks": default_ks(n), "complete": complete, "benchmarks": results}


def _pct(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def _mean(values):
    values = [v for v in values if v is not None and not math.isnan(v)]
    return sum(values) / len(values) if values else float("nan")


NA = "n/a"  # a table cell for a benchmark whose records have no first moves (an older run)


def _entrance_cell(bench: dict | None, key: str, k: int | None = None) -> float | None | str:
    """One number of a benchmark's ``entrance`` block (with ``k``: ``majority_pass@k`` at k), or :data:`NA`."""
    block = (bench or {}).get("entrance")
    if not block:
        return NA
    return block["majority_pass@k"].get(str(k)) if k is not None else block.get(key)


def _cells(values: list, avg: bool) -> list[str]:
    """Percent cells of one row, plus their mean when ``avg`` (n/a where a benchmark, or for the mean any, is)."""
    cells = [v if v == NA else _pct(v) for v in values]
    if avg:
        cells.append(NA if NA in values else _pct(_mean(values)))
    return cells


def results_table(summary: dict, title: str | None = None) -> str:
    """Markdown: benchmarks as columns (and their mean when there are several), rows pass@k in %, each followed by
    pass@k over the majority entrance, then coverage, problems and the entrance rows (n/a without first moves)."""
    benches = summary["benchmarks"]
    names = list(benches)
    avg = len(names) > 1
    cfg = summary.get("config", {})
    threshold = cfg.get("coverage_threshold", DEFAULT_COVERAGE_THRESHOLD)
    head = ["metric", *names, *(["avg"] if avg else [])]
    lines = []
    if title:
        lines += [f"## {title}", ""]
    lines += ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]

    def row(label, values):
        lines.append("| " + " | ".join([label, *_cells(values, avg)]) + " |")

    for k in summary["ks"]:
        row(f"pass@{k}", [benches[b]["pass@k"].get(str(k)) for b in names])
        row(f"pass@{k}, majority entrance", [_entrance_cell(benches[b], "majority_pass@k", k) for b in names])
    cov = [f"{benches[b]['coverage']['problems']} / {benches[b]['problems']}" for b in names]
    lines.append("| " + " | ".join([f"coverage (solve rate > {100 * threshold:g}%)", *cov, *([""] if avg else [])])
                 + " |")
    done = [f"{benches[b]['problems']}" + ("" if benches[b]["problems"] == benches[b]["problems_total"]
                                          else f" of {benches[b]['problems_total']}") for b in names]
    lines.append("| " + " | ".join(["problems", *done, *([""] if avg else [])]) + " |")
    row("entrance distinct (%)", [_entrance_cell(benches[b], "distinct_frac_mean") for b in names])
    row("majority entrance share (%)", [_entrance_cell(benches[b], "majority_size_mean") for b in names])
    row("unique-entrance successes (%)", [_entrance_cell(benches[b], "unique_success_frac_mean") for b in names])
    lines.append("")
    lines.append(_settings_line(cfg))
    lines += ["", _entrance_line(cfg)]
    warning = coverage_warning(int(cfg["n"]), threshold) if "n" in cfg else None
    if warning:
        lines += ["", f"Note: {warning}."]
    return "\n".join(lines) + "\n"


def _settings_line(cfg: dict) -> str:
    keys = ("n", "temperature", "top_p", "max_new_tokens", "seed", "backend")
    shown = ", ".join(f"{k}={cfg[k]}" for k in keys if k in cfg)
    return f"pass@k in %, unbiased estimator over problems ({shown}); model: `{cfg.get('model', '?')}`."


def _entrance_line(cfg: dict) -> str:
    """What the entrance rows mean, with the run's first-move setting."""
    m = cfg.get("entrance_tokens")
    move = ("first move: not recorded (an older run)" if m is None else
            ("first move = the first response token" if m == 1 else f"first move = the first {m} response tokens")
            + (", up to the first newline" if cfg.get("entrance_until_newline") else ""))
    return (f"Entrance ({move}): distinct = distinct first moves / n, averaged over problems; majority entrance = "
            "the samples sharing a problem's most common first move (ties: the first in sample order), share = "
            "their count / n; pass@k, majority entrance = pass@k over those samples alone, k capped at their count; "
            "unique-entrance successes = correct samples whose first move no other sample took / correct samples, "
            "over problems with a success. n/a: the records have no first moves.")


def histogram_table(summary: dict) -> str:
    """Markdown: how many problems were solved c times out of n, per benchmark."""
    benches = summary["benchmarks"]
    names = [b for b in benches if benches[b]["problems"]]
    if not names:
        return ""
    rows: dict[str, dict[str, int]] = defaultdict(dict)
    order: list[str] = []
    for b in names:
        for entry in benches[b]["solve_rate"]["histogram"]:
            key = f"{entry['solved']}/{entry['of']}"
            if key not in rows:
                order.append(key)
            rows[key][b] = entry["problems"]
    lines = ["| solved | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]
    for key in order:
        lines.append("| " + " | ".join([key, *(str(rows[key].get(b, 0)) for b in names)]) + " |")
    return "\n".join(lines) + "\n"


def results_markdown(summary: dict, title: str) -> str:
    """The run's results.md: ``title``, the pass@k table and, if there is one, the per-problem solve-rate histogram."""
    parts = [f"# {title}", "", results_table(summary)]
    hist = histogram_table(summary)
    if hist:
        parts += ["## Per-problem solve rates (problems solved c times out of n)", "", hist]
    return "\n".join(parts)


def comparison_tables(runs: list[tuple[str, dict]], ks: list[int] | None = None) -> str:
    """Several runs, as the paper compares methods: per k (default: 1 and the largest k all runs have), a table
    with runs as rows and benchmarks as columns, each run followed by its pass@k over the majority entrance; then
    coverage and entrance distinct (n/a for a run whose records have no first moves)."""
    names: list[str] = []
    for _label, s in runs:
        names += [b for b in s["benchmarks"] if b not in names]
    common = sorted(set.intersection(*(set(s["ks"]) for _, s in runs)))
    ks = [k for k in (ks or sorted({1, common[-1]} if common else set())) if k in common]
    avg = len(names) > 1
    out = []

    def row(label, values):
        out.append("| " + " | ".join([label, *_cells(values, avg)]) + " |")

    for k in ks:
        out += [f"## pass@{k} (%)", "", "| run | " + " | ".join(names + (["avg"] if avg else [])) + " |",
                "| --- |" + " ---: |" * (len(names) + avg)]
        for label, s in runs:
            row(label, [s["benchmarks"].get(b, {}).get("pass@k", {}).get(str(k)) for b in names])
            row(f"{label}, majority entrance",
                [_entrance_cell(s["benchmarks"].get(b), "majority_pass@k", k) for b in names])
        out.append("")
    threshold = runs[0][1].get("config", {}).get("coverage_threshold", DEFAULT_COVERAGE_THRESHOLD)
    out += [f"## coverage (problems with solve rate > {100 * threshold:g}%)", "",
            "| run | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]
    for label, s in runs:
        cells = [f"{s['benchmarks'][b]['coverage']['problems']} / {s['benchmarks'][b]['problems']}"
                 if b in s["benchmarks"] else "-" for b in names]
        out.append("| " + " | ".join([label, *cells]) + " |")
    out += ["", "## entrance distinct (%): distinct first moves / n, averaged over problems", "",
            "| run | first move | " + " | ".join(names + (["avg"] if avg else [])) + " |",
            "| --- | --- |" + " ---: |" * (len(names) + avg)]
    for label, s in runs:
        cfg = s.get("config", {})
        move = ("-" if cfg.get("entrance_tokens") is None else
                f"{cfg['entrance_tokens']} tokens" + (" or to a newline" if cfg.get("entrance_until_newline") else ""))
        out.append("| " + " | ".join([label, move, *_cells([_entrance_cell(s["benchmarks"].get(b),
                                                                            "distinct_frac_mean") for b in names],
                                                           avg)]) + " |")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ several checkpoints of one run
def aggregate_runs(runs: list[tuple[str, dict]]) -> dict:
    """Mean and spread over checkpoints (the paper's late-training averages) of each benchmark's pass@k and coverage.

    Args:
        runs: ``(label, summary)`` per checkpoint (e.g. ``("global_step_120", summary)``); all should share
            n and the coverage threshold (a mismatch raises ``ValueError``).

    Returns (JSON-ready): ``{"checkpoints": [labels], "n", "coverage_threshold", "ks", "benchmarks": {name:
    {"pass@k": {k: spread}, "coverage": spread of covered problems, "coverage_frac": spread, "problems":
    [per checkpoint], "complete": bool}}}``, a spread being :func:`gapo.passk.spread` (mean, sample std, min,
    max, count) plus ``values`` (one per checkpoint, None where that checkpoint lacks the benchmark).
    """
    if not runs:
        raise ValueError("no checkpoints to aggregate")
    configs = [s.get("config", {}) for _, s in runs]
    for key in ("n", "coverage_threshold"):
        seen = {c.get(key) for c in configs}
        if len(seen) > 1:
            raise ValueError(f"checkpoints evaluated with different {key}: {sorted(map(str, seen))}")
    ks = sorted(set.intersection(*(set(s["ks"]) for _, s in runs)))
    names: list[str] = []
    for _, s in runs:
        names += [b for b in s["benchmarks"] if b not in names]

    def with_values(values):
        return {**spread(values), "values": values}

    benchmarks = {}
    for name in names:
        per = [s["benchmarks"].get(name) for _, s in runs]
        got = [b for b in per if b and b["problems"]]
        benchmarks[name] = {
            "pass@k": {str(k): with_values([b["pass@k"][str(k)] if b and b["problems"] else None for b in per])
                       for k in ks},
            "coverage": with_values([b["coverage"]["problems"] if b and b["problems"] else None for b in per]),
            "coverage_frac": with_values([b["coverage"]["fraction"] if b and b["problems"] else None for b in per]),
            "problems": [b["problems"] if b else 0 for b in per],
            "complete": len(got) == len(per) and all(b["problems"] == b.get("problems_total", b["problems"])
                                                     for b in got),
        }
    return {"checkpoints": [label for label, _ in runs], "n": configs[0].get("n"),
            "coverage_threshold": configs[0].get("coverage_threshold", DEFAULT_COVERAGE_THRESHOLD), "ks": ks,
            "benchmarks": benchmarks}


def _num(x, pct: bool) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{100 * x:.1f}" if pct else f"{x:.2f}"


def aggregate_table(agg: dict, title: str | None = None) -> str:
    """Markdown of :func:`aggregate_runs`: per metric, mean ± std [min, max] over the checkpoints."""
    names = list(agg["benchmarks"])
    threshold = agg["coverage_threshold"]
    lines = [f"## {title}", ""] if title else []
    lines += [f"Mean ± sample std [min, max] over {len(agg['checkpoints'])} checkpoints "
              f"({', '.join(agg['checkpoints'])}); n = {agg['n']} samples per problem.", "",
              "| metric | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]

    def cell(sp, pct):
        if sp["mean"] is None:
            return "-"
        std = "" if sp["std"] is None else f" ± {_num(sp['std'], pct)}"
        return f"{_num(sp['mean'], pct)}{std} [{_num(sp['min'], pct)}, {_num(sp['max'], pct)}]"

    for k in agg["ks"]:
        lines.append("| " + " | ".join([f"pass@{k} (%)", *(cell(agg["benchmarks"][b]["pass@k"][str(k)], True)
                                                        for b in names)]) + " |")
    lines.append("| " + " | ".join([f"coverage (problems, solve rate > {100 * threshold:g}%)",
                                    *(cell(agg["benchmarks"][b]["coverage"], False) for b in names)]) + " |")
    lines.append("| " + " | ".join(["problems", *(" / ".join(map(str, agg["benchmarks"][b]["problems"]))
                                                  for b in names)]) + " |")
    warning = coverage_warning(int(agg["n"]), threshold) if agg.get("n") else None
    if warning:
        lines += ["", f"Note: {warning}."]
    incomplete = [b for b in names if not agg["benchmarks"][b]["complete"]]
    if incomplete:
        lines += ["", f"Incomplete (some checkpoint has unfinished problems): {', '.join(incomplete)}."]
    return "\n".join(lines) + "\n"


def write_aggregate(out_dir: str | Path, runs: list[tuple[str, dict]], title: str) -> dict[str, Path]:
    """``aggregate.json`` and ``aggregate.md`` in ``out_dir`` from the checkpoints' summaries."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    agg = aggregate_runs(runs)
    paths = {"summary": out_dir / AGGREGATE_FILE, "table": out_dir / AGGREGATE_TABLE_FILE}
    paths["summary"].write_text(json.dumps(_json_safe(agg), indent=1, allow_nan=False) + "\n")
    paths["table"].write_text(aggregate_table(agg, title))
    return paths


def load_run(path: str | Path) -> tuple[str, dict]:
    """(label, summary) of a run folder (or its summary.json)."""
    path = Path(path)
    file = path if path.is_file() else path / SUMMARY_FILE
    if not file.is_file():
        raise FileNotFoundError(f"no {SUMMARY_FILE} in {path}: run `python -m eval report {path}` to rebuild it")
    summary = json.loads(file.read_text())
    label = summary.get("config", {}).get("label") or file.parent.name
    return label, summary


def plot_runs(runs: list[tuple[str, dict]], out: str | Path, title: str | None = None, max_cols: int = 5) -> Path:
    """PNG: per benchmark, pass@k against k (log2 axis, one colour per run: solid over all samples, dashed over the
    majority-entrance samples where the records have first moves) above its solve-rate histogram; benchmarks fill
    rows of ``max_cols``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names: list[str] = []
    for _label, s in runs:
        names += [b for b in s["benchmarks"] if b not in names and s["benchmarks"][b]["problems"]]
    cols = min(max_cols, max(1, len(names)))
    grid_rows = max(1, math.ceil(len(names) / cols))
    fig, axes = plt.subplots(2 * grid_rows, cols, figsize=(3.0 * cols + 0.6, 4.6 * grid_rows + 0.8), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 2] * grid_rows})
    for j in range(len(names), grid_rows * cols):  # unused cells of the last row
        axes[2 * (j // cols)][j % cols].axis("off")
        axes[2 * (j // cols) + 1][j % cols].axis("off")
    width = 0.8 / max(1, len(runs))
    dashed = False  # some run has a majority-entrance curve
    for j, bench in enumerate(names):
        top, bottom = axes[2 * (j // cols)][j % cols], axes[2 * (j // cols) + 1][j % cols]
        for r, (label, s) in enumerate(runs):
            b = s["benchmarks"].get(bench)
            if not b or not b["problems"]:
                continue
            ks = sorted(int(k) for k in b["pass@k"])
            colour = f"C{r % 10}"  # the run's colour in every panel, also where an earlier run lacks the benchmark
            (line,) = top.plot(ks, [100 * b["pass@k"][str(k)] for k in ks], marker="o", ms=3, label=label,
                               color=colour)
            majority = (b.get("entrance") or {}).get("majority_pass@k")
            if majority:  # below the entrance: the same run's samples that share the most common first move
                mks = sorted(int(k) for k in majority)
                top.plot(mks, [100 * majority[str(k)] for k in mks], ls="--", marker="o", ms=2,
                         color=line.get_color(), mfc="none")
                dashed = True
            hist = b["solve_rate"]["histogram"]
            xs = [e["solved"] / e["of"] for e in hist]
            total = max(1, b["problems"])
            step = min((x2 - x1 for x1, x2 in itertools.pairwise(xs) if x2 > x1), default=1.0)
            bottom.bar([x + (r - (len(runs) - 1) / 2) * width * step for x in xs],
                       [100 * e["problems"] / total for e in hist], width=width * step, label=label, color=colour)
        top.set_xscale("log", base=2)
        all_ks = sorted({int(k) for _, s in runs if bench in s["benchmarks"] for k in s["benchmarks"][bench]["pass@k"]})
        top.set_xticks(all_ks, [str(k) for k in all_ks])
        top.minorticks_off()
        top.set_title(bench, fontsize=10)
        top.set_xlabel("k", fontsize=8)
        top.set_ylim(0, 100)
        top.grid(alpha=0.3)
        top.tick_params(labelsize=7)
        bottom.set_xlabel("per-problem solve rate", fontsize=8)
        bottom.set_xlim(-0.05, 1.05)
        bottom.tick_params(labelsize=7)
        if j % cols == 0:
            top.set_ylabel("pass@k (%)", fontsize=8)
            bottom.set_ylabel("problems (%)", fontsize=8)
    if not names:
        axes[0][0].text(0.5, 0.5, "no finished problems", ha="center", va="center")
    legend: dict = {}
    for row in axes[::2]:
        for ax in row:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                legend.setdefault(label, handle)
    if dashed:  # which line style is which (colour = run)
        from matplotlib.lines import Line2D

        legend["pass@k, all samples"] = Line2D([], [], color="0.3", marker="o", ms=3)
        legend["pass@k, majority entrance"] = Line2D([], [], color="0.3", ls="--", marker="o", ms=2, mfc="none")
    handles, labels = list(legend.values()), list(legend)
    if handles:
        ncol = min(4, len(labels), 2 * cols)  # about two entries per 3-inch column fit side by side
        legend_rows = math.ceil(len(labels) / ncol)
        fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.3 * legend_rows / fig.get_figheight() if handles else 0, 1, 1))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def rebuild_reports(run_dir: str | Path) -> dict | None:
    """Recompute a run folder's summary from ``samples.jsonl`` and ``run.json`` and rewrite its reports
    (None when the folder has no records, e.g. a copied summary.json only)."""
    from eval.records import SAMPLES_FILE, SampleStore

    run_dir = Path(run_dir)
    if not ((run_dir / RUN_FILE).is_file() and (run_dir / SAMPLES_FILE).is_file()):
        return None
    run = json.loads((run_dir / RUN_FILE).read_text())
    done = SampleStore(run_dir, int(run["n"])).load()
    summary = summarize_run(done, {k: v for k, v in run.items() if k != "benchmarks"}, run.get("benchmarks", {}))
    old = run_dir / SUMMARY_FILE
    if old.is_file():
        timing = json.loads(old.read_text()).get("timing")
        if timing:
            summary["timing"] = timing
    write_reports(run_dir, summary, title=f"{run.get('label') or run_dir.name}: pass@k")
    return summary


def _json_safe(value):
    """NaN (a benchmark without finished problems) as null: summary.json stays standard JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def write_reports(out_dir: Path, summary: dict, title: str) -> dict[str, Path]:
    """``summary.json``, ``results.md`` and ``passk.png`` in ``out_dir``."""
    out_dir = Path(out_dir)
    paths = {"summary": out_dir / SUMMARY_FILE, "table": out_dir / TABLE_FILE, "plot": out_dir / PLOT_FILE}
    tmp = paths["summary"].with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_json_safe(summary), indent=1, allow_nan=False) + "\n")
    tmp.replace(paths["summary"])
    paths["table"].write_text(results_markdown(summary, title))
    plot_runs([(summary["config"].get("label") or out_dir.name, summary)], paths["plot"], title)
    return paths

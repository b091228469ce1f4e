"""Benchmark: this project's math reward against verl's built-in math scorers, on one shared case table.

For each scorer, in one run: accuracy against the careful-grader verdicts of
:data:`gapo.rewards.math.cases.CASES`, items/second called one item at a time from the main thread,
and the same from a ``ThreadPoolExecutor`` (how verl's reward loop calls ``compute_score``), where
exceptions are counted as wrong verdicts. ``gapo batch`` is the batch API on the whole table at once.

verl's scorers take one string gold; a case whose gold lists several acceptable answers counts as
right for them if any item matches. None of them strips ``<think>``; that is part of what is measured.
The last row calls math-verify directly in the calling thread, as verl's wrapper did before it moved
to a process pool: from threads its alarms raise (counted as exceptions).

``--table hacks`` runs the same on :data:`gapo.rewards.math.cases.HACKS` (answers a policy could be
paid for without being right, next to right answers of the same shapes), kept apart from ``CASES`` so
that the default table stays comparable across versions.

    python -m recipe.bench.math_reward [--table cases|hacks] [--repeats 2] [--rounds 3] [--threads 8] [--verbose] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from gapo.rewards.math.cases import CASES, HACKS, MathCase

TABLES = {"cases": CASES, "hacks": HACKS}


def _golds(gold) -> list[str]:
    return [str(g) for g in gold] if isinstance(gold, (list, tuple)) else [str(gold)]


def _verl_scorers() -> dict[str, Callable[[MathCase], bool]]:
    """verl's math scorers as ``case -> verdict``, each imported as shipped with verl."""
    from verl.utils.reward_score import math_dapo, math_reward, math_verify, prime_math

    return {
        "verl math_verify": lambda c: any(math_verify.compute_score(c.response, g) > 0 for g in _golds(c.gold)),
        "verl prime_math": lambda c: any(bool(prime_math.compute_score(c.response, g)[0]) for g in _golds(c.gold)),
        "verl math_reward": lambda c: any(math_reward.compute_score(c.response, g) > 0 for g in _golds(c.gold)),
        "verl math_dapo": lambda c: any(bool(math_dapo.compute_score(c.response, g)["acc"]) for g in _golds(c.gold)),
    }


def _inprocess_math_verify(case: MathCase) -> bool:
    """math-verify called in the caller's thread, the pattern of verl's wrapper before it got a process
    pool (and of trl's): its signal alarms raise outside the main thread. Exceptions propagate here so
    the table counts them; those wrappers caught them and returned 0 for correct answers."""
    from math_verify import parse, verify

    pred = parse(case.response)
    return any(verify(parse("\\boxed{" + g + "}"), pred) for g in _golds(case.gold))


def _gapo_scorer() -> Callable[[MathCase], bool]:
    from gapo.rewards import compute_score

    return lambda c: compute_score("math", c.response, c.gold,
                                   extra_info={"require_think": c.require_think, "problem": c.problem})["acc"]


def _safe(fn, case) -> tuple[bool, bool]:
    """(verdict, raised)."""
    try:
        return bool(fn(case)), False
    except Exception:  # noqa: BLE001  any failure of a scorer is a wrong verdict, and counted
        return False, True


def _run(fn, items, threads: int, rounds: int = 1) -> tuple[list[bool], int, float]:
    """Verdicts and exception count of the last round; the fastest round's seconds (this machine is
    shared, so the best of a few rounds is the least noisy estimate)."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        if threads <= 1:
            out = [_safe(fn, c) for c in items]
        else:
            with ThreadPoolExecutor(threads) as ex:
                out = list(ex.map(lambda c: _safe(fn, c), items))
        best = min(best, time.perf_counter() - start)
    return [v for v, _ in out], sum(e for _, e in out), best


def _row(name, fn, items, threads, rounds, table=CASES) -> dict:
    # Warm-up, not timed: worker pools start (verl's math_verify starts its workers on demand, so only
    # a threaded pass starts all of them), parsers load.
    _run(fn, table, threads)
    seq, seq_err, seq_s = _run(fn, items, 1, rounds)
    thr, thr_err, thr_s = _run(fn, items, threads, rounds)
    n = len(table)
    truth = [c.correct for c in items]
    return {
        "scorer": name,
        "correct": sum(v == t for v, t in zip(seq[:n], truth[:n])),
        "n": n,
        "items_per_s": len(items) / seq_s,
        "correct_threads": sum(v == t for v, t in zip(thr[:n], truth[:n])),
        "errors_threads": thr_err,
        "errors": seq_err,
        "items_per_s_threads": len(items) / thr_s,
        "misses": [c.name for c, v in zip(table, seq[:n]) if v != c.correct],
        "threads_differ": [c.name for c, a, b in zip(table, seq[:n], thr[:n]) if a != b],
    }


def _batch_row(items, rounds, table=CASES) -> dict:
    from gapo.rewards.math.answer import score_math_batch

    def run():
        start = time.perf_counter()
        out = score_math_batch([c.response for c in items], [c.gold for c in items],
                               require_think=[c.require_think for c in items], problems=[c.problem for c in items])
        return [r["acc"] for r in out], time.perf_counter() - start

    run()  # warm-up
    timed = [run() for _ in range(rounds)]
    verdicts, seconds = timed[-1][0], min(t for _, t in timed)
    n = len(table)
    correct = sum(v == c.correct for v, c in zip(verdicts[:n], items[:n]))
    return {"scorer": "gapo batch", "correct": correct, "n": n, "items_per_s": len(items) / seconds,
            "correct_threads": None, "errors_threads": None, "errors": 0, "items_per_s_threads": None,
            "misses": [c.name for c, v in zip(table, verdicts[:n]) if v != c.correct], "threads_differ": []}


def _fmt(row) -> str:
    def cell(value, fmt):
        return "-" if value is None else format(value, fmt)

    thr = "-" if row["correct_threads"] is None else f"{row['correct_threads']}/{row['n']}"
    return (f"| {row['scorer']} | {row['correct']}/{row['n']} ({100 * row['correct'] / row['n']:.1f}%) "
            f"| {cell(row['items_per_s'], '.0f')} | {thr} | {cell(row['errors_threads'], 'd')} "
            f"| {cell(row['items_per_s_threads'], '.0f')} |")


def main(argv: list[str] | None = None) -> list[dict]:
    """CLI entry: score the case table with each scorer (1 thread, then ``--threads``); prints and returns the rows."""
    p = argparse.ArgumentParser(prog="python -m recipe.bench.math_reward", description=__doc__.splitlines()[0])
    p.add_argument("--table", choices=sorted(TABLES), default="cases", help="which case table to run")
    p.add_argument("--repeats", type=int, default=2, help="passes over the case table per timed round")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds; the fastest is reported")
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--verbose", action="store_true", help="list each scorer's missed cases")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)

    table = TABLES[args.table]
    items = list(table) * args.repeats
    scorers = {"gapo (this project)": _gapo_scorer(), **_verl_scorers(),
               "math-verify in caller's thread": _inprocess_math_verify}
    rows = [_row(name, fn, items, args.threads, args.rounds, table) for name, fn in scorers.items()]
    rows.insert(1, _batch_row(items, args.rounds, table))

    from gapo.rewards.math.verify_pool import get_pool

    print(f"{args.table}: {len(table)} cases x {args.repeats} repeats, best of {args.rounds} rounds, {os.cpu_count()} CPUs, "
          f"gapo workers: {get_pool().num_workers}, threads: {args.threads}")
    print("| scorer | correct (1 thread) | items/s (1 thread) | correct (threads) | exceptions (threads) "
          "| items/s (threads) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(_fmt(row))
    for row in rows:
        if args.verbose or row["threads_differ"]:
            print(f"{row['scorer']}: misses {row['misses']}; differs in threads {row['threads_differ']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()

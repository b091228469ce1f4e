"""Benchmark: cost of the GAPO loss against verl's gspo loss (forward + backward, same tensors).

    python -m recipe.bench.loss [--batch 64] [--tokens 4096] [--repeats 300] [--threads 1] [--json out.json]
                                [--max-ratio-diag 1.15] [--max-ratio-nodiag 1.05] [--max-op-ratio-diag 1.3]

Four variants, called through verl's registry (`get_policy_loss_fn`) with one actor config (clips
0.2 / 0.28, seq-mean-token-mean) as the actor update calls them: verl's `gspo`, `gapo` with its
diagnostics on and off, and `gapo_token` (diagnostics on). The batch is groups of k rollouts with c
successes each (1 <= c < k), GRPO advantages ((k - c) / k for a success, -c / k for a failure) and
responses of varying length.

Two figures per variant:

- Time. Noise control, for small shared machines: each round runs every variant once, in an order that
  rotates from round to round, and warm-up rounds are dropped; one torch thread, timed by this process's
  CPU time, which leaves out the time other processes take the core; freed memory stays in the process
  (as with a GPU's caching allocator), so calls do not pay page faults. The output's second line says
  which. Per variant: min and median ms (with the interquartile range), and the cost relative to gspo two
  ways: the ratio of minimums, and the median (IQR) of per-round paired ratios (variant / gspo in the same
  round, which cancels drifts in machine speed). The paired median is the robust figure, and the one the
  optional --max-ratio-* checks use (exit 1 above them).
- aten ops per call (`count_aten_ops`), the machine-independent figure. On a GPU this loss is
  launch-bound (tens of microseconds of arithmetic, one kernel launch per op), so the number of ops, not
  CPU time, sets its cost there. Counted: every event of `torch.profiler` (CPU activity) whose name
  starts with "aten::", nested ones included (an `aten::to` that copies counts with its `_to_copy`,
  `empty_strided` and `copy_`), over one call of the step that is timed (GAPO's group-statistics
  context for GAPO only, the loss through verl's registry, `loss.backward()` with the autograd engine's
  ops), after two warm-up calls, with one torch thread: a CPU reduction that several threads split adds
  ops of its own (verl's gspo sums whole (B, T) tensors for its metrics: 272 ops on two threads at
  64 x 4096 against 248 on one; GAPO's count does not move). So counted, the figure is the same on every
  run and machine, and at every shape, for a given torch version. It is a proxy for the kernel count,
  not that count: on CPU a tensor op with a Python float operand adds a 4-op cast of that scalar, and
  views and no-op casts count without launching anything (one H200, torch 2.11, 64 x 4096, before the
  count was added: aten ops 192 gspo / 418 gapo, CUDA kernels 90 / 158). --max-op-ratio-diag fails
  (exit 1) when gapo with diagnostics needs more than that many times gspo's ops.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import statistics
import sys
import time

import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.workers.config import FSDPActorConfig, PolicyLossConfig

from gapo.verl_plugin.config import GAPOPolicyLossConfig
from gapo.verl_plugin.losses import GAPO_LOSS_MODES, group_stats_context

BASE = "gspo"
# key -> (label, registered loss mode, policy-loss config)
VARIANTS = {
    "gspo": ("verl gspo", "gspo", lambda: PolicyLossConfig(loss_mode="gspo")),
    "gapo_diag": ("gapo, diagnostics on", "gapo", lambda: GAPOPolicyLossConfig(loss_mode="gapo")),
    "gapo_nodiag": ("gapo, diagnostics off", "gapo", lambda: GAPOPolicyLossConfig(loss_mode="gapo", diagnostics=False)),
    "gapo_token": ("gapo_token", "gapo_token", lambda: GAPOPolicyLossConfig(loss_mode="gapo_token")),
}


def _config(policy_loss, k):
    return FSDPActorConfig(strategy="fsdp2", rollout_n=k, ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=1,
                           clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode="seq-mean-token-mean",
                           policy_loss=policy_loss)


def _batch(b: int, t: int, k: int) -> dict:
    """Groups of k consecutive rollouts; in each, the first c succeed (c drawn from 1..k-1, so that every
    group has positive-advantage successes, which is where GAPO's adaptive clip applies)."""
    c = torch.randint(1, k, (b // k,)).repeat_interleave(k)
    success = torch.arange(b) % k < c
    adv = torch.where(success, (k - c) / k, -c / k).float()
    # Response lengths between a quarter and all of t, as in a real micro-batch.
    lengths = torch.randint(t // 4, t + 1, (b,))
    mask = torch.arange(t) < lengths[:, None]  # bool, as verl's ppo_loss passes it
    old = -torch.rand(b, t) * 3
    return {
        "old": old,
        "new": (old + torch.randn(b, t) * 0.05).requires_grad_(True),
        "adv": adv[:, None].expand(b, t).contiguous(),
        "mask": mask,
        "num_correct": c.float(),
        "group_size": torch.full((b,), float(k)),
        "success": success,
    }


def _step(loss_mode: str, config, x: dict):
    fn = get_policy_loss_fn(loss_mode)
    # GAPO's losses read the group statistics from a context (GAPOActorLoss sets it); verl's run without one
    if loss_mode in GAPO_LOSS_MODES:
        def context():
            return group_stats_context(x["num_correct"], x["group_size"], x["success"])
    else:
        context = contextlib.nullcontext

    def step():
        x["new"].grad = None
        with context():
            loss, _ = fn(old_log_prob=x["old"], log_prob=x["new"], advantages=x["adv"], response_mask=x["mask"],
                         loss_agg_mode=config.loss_agg_mode, config=config, rollout_is_weights=None)
        loss.backward()

    return step


def count_aten_ops(step, warmup: int = 2) -> int:
    """aten ops of one call of `step` (module docstring): the `torch.profiler` events (CPU activity) whose name
    starts with "aten::", nested ones included, with one torch thread, after `warmup` calls (the first ones build
    caches)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a reduction split over threads adds ops of its own
    try:
        for _ in range(warmup):
            step()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step()
    finally:
        torch.set_num_threads(threads)
    return sum(1 for event in prof.events() if event.name.startswith("aten::"))


def op_counts(batch: int = 16, tokens: int = 64, group_size: int = 8, seed: int = 0,
              variants: tuple[str, ...] = tuple(VARIANTS)) -> dict[str, int]:
    """aten ops per forward + backward call of each variant on the benchmark's inputs (`count_aten_ops`)."""
    torch.manual_seed(seed)
    x = _batch(batch, tokens, group_size)
    return {name: count_aten_ops(_step(VARIANTS[name][1], _config(VARIANTS[name][2](), group_size), x))
            for name in variants}


def _keep_freed_memory() -> bool:
    """Stop glibc from handing freed tensor memory back to the OS, so that each call does not pay (noisy)
    page faults to get it back; like a GPU's caching allocator. False where this is not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    # 32 MiB is glibc's ceiling for the mmap threshold on 64-bit: tensors below it come from the heap.
    return bool(libc.mallopt(m_mmap_threshold, 32 << 20) and libc.mallopt(m_trim_threshold, 1 << 62))


def _time_rounds(steps: dict, rounds: int, warmup: int, clock) -> dict[str, list[float]]:
    """Seconds per call, one list per variant, index = round. Each round runs every variant once; the
    order rotates so that no variant always runs first, when caches hold another variant's data least."""
    names = list(steps)
    times = {name: [] for name in names}
    gc.collect()
    gc.disable()  # a collection pause would land on whichever variant happens to be running
    try:
        for i in range(warmup + rounds):
            shift = i % len(names)
            for name in names[shift:] + names[:shift]:
                start = clock()
                steps[name]()
                elapsed = clock() - start
                if i >= warmup:
                    times[name].append(elapsed)
    finally:
        gc.enable()
    return times


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    q1, median, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, median, q3


def _summarize(times: dict[str, list[float]]) -> dict[str, dict]:
    base = times[BASE]
    out = {}
    for name, ts in times.items():
        ms = [s * 1e3 for s in ts]
        q1, median, q3 = _quartiles(ms)
        p1, pmed, p3 = _quartiles([s / b for s, b in zip(ts, base)])
        out[name] = {"label": VARIANTS[name][0], "min_ms": min(ms), "median_ms": median, "q1_ms": q1, "q3_ms": q3,
                     "ratio_of_min": min(ts) / min(base),
                     "paired_ratio_median": pmed, "paired_ratio_q1": p1, "paired_ratio_q3": p3}
    return out


def _op_summary(counts: dict[str, int]) -> dict[str, dict]:
    return {name: {"label": VARIANTS[name][0], "aten_ops": n, "ratio": n / counts[BASE]} for name, n in counts.items()}


def _print(summary: dict, setup: dict) -> None:
    print(f"loss forward+backward: {setup['batch']} rollouts x {setup['tokens']} tokens "
          f"({setup['response_tokens']} in responses), k={setup['group_size']}")
    print(f"{setup['rounds']} rounds after {setup['warmup']} warm-up, rotating order; {setup['threads']} torch "
          f"thread(s) (--threads); clock: {setup['clock']} (--clock); freed memory kept: {setup['memory_kept']}")
    print(f"  {'':<22} {'min ms':>8} {'median ms (IQR)':>24}   {'min/min':>7}   {'paired ratio (IQR)':>21}")
    for s in summary.values():
        spread = f"{s['median_ms']:.2f} ({s['q1_ms']:.2f}-{s['q3_ms']:.2f})"
        paired = f"{s['paired_ratio_median']:.3f} ({s['paired_ratio_q1']:.3f}-{s['paired_ratio_q3']:.3f})"
        print(f"  {s['label']:<22} {s['min_ms']:8.2f} {spread:>24}   {s['ratio_of_min']:7.3f}   {paired:>21}")
    print("ratios to verl gspo; paired ratio = median of per-round variant/gspo (the robust figure)")


def _print_ops(ops: dict) -> None:
    print("aten ops per forward+backward call (torch.profiler, CPU; nested ops included; the same on any machine):")
    for s in ops.values():
        print(f"  {s['label']:<22} {s['aten_ops']:8d}   {s['ratio']:7.3f}")


def _over_limits(summary: dict, limits: dict[str, float | None], key: str = "paired_ratio_median",
                 what: str = "paired ratio") -> list[str]:
    return [f"{summary[name]['label']}: {what} {summary[name][key]:.3f} > limit {limit}"
            for name, limit in limits.items()
            if limit is not None and summary[name][key] > limit]


def main(argv=None) -> int:
    """CLI entry: time the variants in rotating rounds, count their aten ops, print both; returns 1 if a limit
    (``--max-ratio-*``, ``--max-op-ratio-diag``) fails."""
    parser = argparse.ArgumentParser(prog="python -m recipe.bench.loss", description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=4096, help="padded response length; real lengths vary")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=300, help="timed rounds (each runs every variant once)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed rounds first")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads; 1 reduces noise")
    parser.add_argument("--clock", choices=("cpu", "wall"),
                        help="cpu: this process's CPU time (default with 1 thread); wall: elapsed (default otherwise)")
    parser.add_argument("--release-memory", action="store_true", help="let glibc return freed memory to the OS")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the numbers here")
    parser.add_argument("--max-ratio-diag", type=float, help="exit 1 if gapo (diagnostics on) paired ratio is above")
    parser.add_argument("--max-ratio-nodiag", type=float, help="exit 1 if gapo (diagnostics off) paired ratio is above")
    parser.add_argument("--max-op-ratio-diag", type=float,
                        help="exit 1 if gapo (diagnostics on) runs more than this many times gspo's aten ops per call")
    args = parser.parse_args(argv)
    if args.repeats < 2:
        parser.error("--repeats must be at least 2")
    if args.batch % args.group_size:
        parser.error(f"--batch {args.batch} is not a multiple of --group-size {args.group_size}")
    # With several threads, CPU time would count their spinning and hide the parallel speed-up.
    clock_name = args.clock or ("cpu" if args.threads == 1 else "wall")
    clock = time.process_time if clock_name == "cpu" else time.perf_counter

    memory_kept = not args.release_memory and _keep_freed_memory()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    k = args.group_size
    x = _batch(args.batch, args.tokens, k)
    steps = {name: _step(mode, _config(make_policy_loss(), k), x) for name, (_, mode, make_policy_loss)
             in VARIANTS.items()}
    summary = _summarize(_time_rounds(steps, args.repeats, args.warmup, clock))
    ops = _op_summary({name: count_aten_ops(step) for name, step in steps.items()})  # after the timing: untouched

    setup = {"batch": args.batch, "tokens": args.tokens, "response_tokens": int(x["mask"].sum()), "group_size": k,
             "rounds": args.repeats, "warmup": args.warmup, "threads": torch.get_num_threads(), "clock": clock_name,
             "memory_kept": memory_kept, "torch": torch.__version__}
    _print(summary, setup)
    _print_ops(ops)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"setup": setup, "variants": summary, "aten_ops": ops}, f, indent=1)

    failures = _over_limits(summary, {"gapo_diag": args.max_ratio_diag, "gapo_nodiag": args.max_ratio_nodiag})
    failures += _over_limits(ops, {"gapo_diag": args.max_op_ratio_diag}, key="ratio", what="aten-op ratio")
    for line in failures:
        print(f"FAIL {line}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

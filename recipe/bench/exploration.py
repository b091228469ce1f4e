"""Benchmark: the driver-side cost of the exploration instruments per training step, at the paper's scale.

    python -m recipe.bench.exploration [--prompts 256] [--group-size 8] [--max-tokens 24576] [--prompt-tokens 512]
                                       [--repeats 5] [--threads 1] [--max-ms 50] [--json out.json]

What verl's driver does with one step's TransferQueue fields in `gapo.verl_plugin.exploration.StepExploration.step`:
first moves from the jagged `responses`, prompt keys from the jagged `prompts` (one per group), entrance and coverage
sums per group, the entropy sums from the jagged `entropy` of the old-log-prob pass, the coverage window. The batch is
2,048 rollouts (256 prompts x 8) whose response lengths are drawn uniformly between a quarter of and all of 24k tokens
(R1-Distill's 24k stage; about 30M tokens). Not counted: fetching the fields from TransferQueue (verl fetches
`entropy` for its own `actor/entropy` in the same step, and the transfer's cost depends on the cluster).

Output: min and median ms per step (each repeat a whole step), torch threads; exit 1 when the median is above
--max-ms. The instruments add no op to the loss and no forward pass: there is nothing to time there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from gapo.exploration import ExplorationConfig
from gapo.groups import group_statistics
from gapo.verl_plugin.exploration import StepExploration


def _jagged(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def step_batch(prompts: int, k: int, max_tokens: int, prompt_tokens: int, seed: int = 0) -> dict:
    """One step's fields as TransferQueue returns them (jagged), and each row's (c, k, success) and key."""
    g = torch.Generator().manual_seed(seed)
    b = prompts * k
    lengths = torch.randint(max_tokens // 4, max_tokens + 1, (b,), generator=g)
    total = int(lengths.sum())
    values = torch.randint(0, 150_000, (total,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    responses = torch.nested.nested_tensor_from_jagged(values, offsets)
    entropy = torch.nested.nested_tensor_from_jagged(torch.rand(total, generator=g) * 2, offsets)
    prompt_rows = [torch.randint(0, 150_000, (prompt_tokens,), generator=g) for _ in range(prompts)]
    uids = [f"u{i // k}" for i in range(b)]
    success = torch.rand(b, generator=g) < 0.3
    return {
        "uids": uids,
        "fields": {"responses": responses, "prompts": _jagged([prompt_rows[i // k] for i in range(b)]),
                   "entropy": entropy},
        "keys": [f"{uid}_{i % k}_0" for i, uid in enumerate(uids)],
        "stats": group_statistics(uids, success),
        "tokens": total,
    }


def main(argv=None) -> int:
    """CLI entry: time StepExploration.step on a paper-scale step; returns 1 above --max-ms."""
    parser = argparse.ArgumentParser(prog="python -m recipe.bench.exploration", description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=24576, help="longest response; lengths from a quarter up")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--entrance-tokens", type=int, default=ExplorationConfig.entrance_tokens)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the driver is one process)")
    parser.add_argument("--max-ms", type=float, help="exit 1 if the median step is slower")
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    torch.set_num_threads(args.threads)
    batch = step_batch(args.prompts, args.group_size, args.max_tokens, args.prompt_tokens)
    fields = batch["fields"]
    real = torch.ones(len(batch["keys"]), dtype=torch.bool)
    instruments = StepExploration(ExplorationConfig(entrance_tokens=args.entrance_tokens))
    times = []
    for _ in range(args.repeats + 1):  # the first is a warm-up
        start = time.perf_counter()
        metrics = instruments.step(batch["keys"], batch["uids"], fields, batch["stats"], real, sessions=True, step=0)
        times.append(time.perf_counter() - start)
    ms = [t * 1e3 for t in times[1:]]
    out = {"rollouts": len(batch["keys"]), "response_tokens": batch["tokens"], "threads": torch.get_num_threads(),
           "min_ms": min(ms), "median_ms": statistics.median(ms), "metrics": len(metrics)}
    print(f"exploration instruments, driver side: {out['rollouts']} rollouts, {out['response_tokens']:,} response "
          f"tokens, {out['threads']} torch thread(s): min {out['min_ms']:.1f} ms, median {out['median_ms']:.1f} ms "
          f"a step ({out['metrics']} metrics)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if args.max_ms is not None and out["median_ms"] > args.max_ms:
        print(f"FAIL exploration instruments: median {out['median_ms']:.1f} ms > limit {args.max_ms} ms",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: cost of the GAPO loss against verl's gspo loss on the same tensors (forward + backward).

    python -m recipe.bench_loss [--batch 64] [--tokens 4096] [--repeats 20]

Both losses are called through verl's registry with the same actor config (clips 0.2 / 0.28,
seq-mean-token-mean), as the actor update calls them; GAPO additionally computes its thresholds from
the group statistics and, with diagnostics on, the per-c sums. Prints median milliseconds and the ratio.
"""

import argparse
import statistics
import time

import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.workers.config import FSDPActorConfig, PolicyLossConfig

from gapo.verl_plugin.config import GAPOPolicyLossConfig
from gapo.verl_plugin.losses import group_stats_context


def _config(policy_loss, k):
    return FSDPActorConfig(strategy="fsdp2", rollout_n=k, ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=1,
                           clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode="seq-mean-token-mean",
                           policy_loss=policy_loss)


def _time_interleaved(steps: dict, repeats: int) -> dict:
    """Median ms per step; the variants alternate within each repeat so that machine noise hits all alike."""
    times = {name: [] for name in steps}
    for i in range(repeats + 1):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            if i:  # the first round is warm-up
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) * 1e3 for name, ts in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m recipe.bench_loss", description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    b, t, k = args.batch, args.tokens, args.group_size
    old = -torch.rand(b, t) * 3
    new = (old + torch.randn(b, t) * 0.05).requires_grad_(True)
    adv = torch.randn(b, 1).expand(b, t).contiguous()
    mask = torch.ones(b, t)
    num_correct, group_size = torch.randint(0, k + 1, (b,)).float(), torch.full((b,), float(k))

    def run(loss_mode, config):
        fn = get_policy_loss_fn(loss_mode)

        def step():
            new.grad = None
            with group_stats_context(num_correct, group_size):  # ignored by gspo
                loss, _ = fn(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask,
                             loss_agg_mode=config.loss_agg_mode, config=config, rollout_is_weights=None)
            loss.backward()

        return step

    ms = _time_interleaved(
        {
            "verl gspo": run("gspo", _config(PolicyLossConfig(loss_mode="gspo"), k)),
            "gapo, diagnostics on": run("gapo", _config(GAPOPolicyLossConfig(loss_mode="gapo"), k)),
            "gapo, diagnostics off": run("gapo", _config(GAPOPolicyLossConfig(loss_mode="gapo", diagnostics=False), k)),
        },
        args.repeats,
    )
    base = ms["verl gspo"]
    print(f"loss forward+backward on {b} x {t} tokens, k={k}, median of {args.repeats}, {torch.get_num_threads()} threads")
    for name, value in ms.items():
        print(f"  {name:<24} {value:8.2f} ms   ratio to gspo {value / base:.2f}")


if __name__ == "__main__":
    main()

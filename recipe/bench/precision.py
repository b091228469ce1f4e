"""Measurement: how far bf16 autocast moves the sequence importance ratio, against how far one update moves it.

    python -m recipe.bench.precision [--model runs/models/SmolLM2-135M-Instruct] [--rows 32]   (part of `make bench`)

GAPO's clips on a real model are 3e-3 / 5e-3 (the learning preset) or 7e-5 / 3e-4 (R1's): a ratio must be computed
more finely than that. TRL's default on CPU was bf16 autocast (``GAPOTRLConfig`` now resolves an unset ``bf16`` to
False on CPU; docs/trl.md). For each model (the smoke run's tiny random Qwen2 and the prepared real model), the policy
after one Adam-like first step (every weight moved by lr x a random sign: lr 3e-3 for the tiny model, the studies'
rate; 1e-5 for the real one, the learning preset's) is compared with the policy before it on random token rows: the
ratio exp(mean over the last 16 tokens of log p_new - log p_old) in float32 (r32), and the same with both forwards
under CPU bf16 autocast (r16). Prints the median |r32 - 1| (how far the update moved the ratio) and the median and
90th percentile of |r16 - r32| (the rounding). Rounding above the clip means the clip cuts noise, not movement.
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

import torch

RESPONSE_TOKENS, ROW_TOKENS = 16, 56


def sequence_log_prob(model, ids: torch.Tensor, bf16: bool) -> torch.Tensor:
    """Mean log-probability of each row's last RESPONSE_TOKENS tokens (B,), the forward under bf16 autocast if asked."""
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(ids).logits[:, :-1]
    log_probs = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return log_probs[:, -RESPONSE_TOKENS:].mean(-1)


def ratio_errors(path: Path, lr: float, rows: int, seed: int = 0) -> dict:
    """The medians (and the rounding's 90th percentile) described in the module docstring, for one model."""
    from transformers import AutoModelForCausalLM

    generator = torch.Generator().manual_seed(seed)
    old = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    new = copy.deepcopy(old)
    with torch.no_grad():
        for param in new.parameters():
            param.add_(lr * torch.sign(torch.randn(param.shape, generator=generator)))
    ids = torch.randint(0, old.config.vocab_size, (rows, ROW_TOKENS), generator=generator)
    r32 = torch.exp(sequence_log_prob(new, ids, False) - sequence_log_prob(old, ids, False))
    r16 = torch.exp(sequence_log_prob(new, ids, True) - sequence_log_prob(old, ids, True))
    rounding = (r16 - r32).abs()
    return {"update_moves_ratio": float((r32 - 1).abs().median()), "bf16_rounding_median": float(rounding.median()),
            "bf16_rounding_p90": float(rounding.quantile(0.9))}


def main(argv=None) -> None:
    """CLI entry: the table of the module docstring for the tiny model and the prepared real model."""
    from gapo.real_model import DEFAULT_DIR, is_prepared
    from gapo.smoke.tiny_model import build_tiny_model

    parser = argparse.ArgumentParser(prog="python -m recipe.bench.precision", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_DIR,
                        help="the prepared real model (python -m gapo.real_model)")
    parser.add_argument("--rows", type=int, default=32)
    args = parser.parse_args(argv)
    if args.rows < 2:
        parser.error(f"--rows must be >= 2, got {args.rows}")
    if not is_prepared(args.model):
        parser.error(f"--model {args.model} is not a prepared model folder; run `python -m gapo.real_model --out "
                     f"{args.model}` (or `make real-model`) first")
    with tempfile.TemporaryDirectory() as tmp:
        models = [("tiny random Qwen2", build_tiny_model(Path(tmp) / "tiny"), 3e-3),
                  (args.model.name, args.model, 1e-5)]
        print("| model | lr | median abs(r32 - 1) | median abs(r16 - r32) | p90 abs(r16 - r32) |")
        print("| --- | --- | --- | --- | --- |")
        for name, path, lr in models:
            out = ratio_errors(path, lr, args.rows)
            print(f"| {name} | {lr:g} | {out['update_moves_ratio']:.4f} | {out['bf16_rounding_median']:.4f} | "
                  f"{out['bf16_rounding_p90']:.4f} |")


if __name__ == "__main__":
    main()

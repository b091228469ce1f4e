"""CPU smoke run of GAPO with Hugging Face TRL: the tiny offline model trains on the smoke task with TRL's real
`GRPOTrainer` and GAPO's loss (`gapo.integrations.trl`), in seconds.

    python -m recipe.trl_smoke [--out runs/smoke-trl] [--level sequence|token] [--steps 8] [--wandb]   (make smoke-trl)

1. builds the tiny model and tokenizer under OUT (offline, cached; `gapo.smoke.tiny_model`);
2. trains `--steps` optimizer steps, each generation of 8 prompts x 4 completions feeding 4 steps (off-policy, so the
   clip can bind), the reward of `gapo.smoke.task` (1 when the first visible character is one of the allowed ones);
3. prints, per step, the reward, the gapo/* diagnostics (per-c clip fraction, eps_high) and the exploration
   instruments (gapo/explore/*: entropy of successes and failures, distinct first moves, coverage and its window), and
   fails unless the adaptive clip bound at least once and every step logged its diagnostics and its instruments.
`--wandb` also logs to W&B offline under OUT/wandb (`make plot-run RUN_DIRS=OUT/wandb` draws its curves).
The clips are wide and the learning rate large (1e-2) so that a tiny model's ratios move in a few steps; the paper's
settings in TRL terms are in docs/trl.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# One allowed-set size per prompt: small sets make rare successes (low c), large ones common successes (high c).
PROMPT_SET_SIZES = (2, 12, 24, 36, 4, 20, 30, 35)
# (eps_low, eps_high_max) per level for the tiny model's run: wide enough that the bound's dependence on c shows
SMOKE_CLIPS = {"sequence": (0.02, 0.05), "token": (0.03, 0.08)}
# A first move of one token: the task's reward reads the first visible character, so the entrance decides success;
# with 8-token completions the default m (8) would make every completion its own entrance.
SMOKE_EXPLORATION = {"entrance_tokens": 1}
# Columns of the per-step table: (header, metric, format); `summarize` prints "-" where a step did not log one
EXPLORE_COLUMNS = (
    ("H_succ", "gapo/explore/entropy_success", "{:.3f}"),
    ("H_fail", "gapo/explore/entropy_failure", "{:.3f}"),
    ("distinct", "gapo/explore/entrance_distinct", "{:.3f}"),
    ("cover", "gapo/explore/coverage_frac", "{:.3f}"),
    ("window", "gapo/explore/coverage_window", "{:.0f}"),
)


def prompt_rows(sizes=PROMPT_SET_SIZES) -> list[dict]:
    """Conversational dataset rows of the smoke task, one per allowed-set size; `allowed` is the reward's answer."""
    from gapo.smoke.task import CHOICE_POOL, make_prompt

    return [{"prompt": [{"role": "user", "content": make_prompt(CHOICE_POOL[:size])}], "allowed": CHOICE_POOL[:size]}
            for size in sizes]


def completion_text(completion) -> str:
    """The text of one TRL completion (a list of messages for conversational prompts, else a string)."""
    return completion[0]["content"] if isinstance(completion, list) else completion


def smoke_reward(prompts, completions, allowed, **kwargs) -> list[float]:
    """TRL reward function: the smoke task's score (`gapo.smoke.task.compute_score`) of each completion."""
    from gapo.smoke.task import compute_score

    return [compute_score("gapo_smoke", completion_text(c), a)["score"] for c, a in zip(completions, allowed)]


def smoke_args(out: Path, level: str = "sequence", steps: int = 8, **overrides):
    """GAPOTRLConfig of the smoke run: 8 prompts x 4 completions per generation, split into 4 optimizer steps of 8
    completions (off-policy after the first), first moves of one token (SMOKE_EXPLORATION), W&B off."""
    from gapo.config import GAPOConfig
    from gapo.integrations.trl import GAPOTRLConfig

    eps_low, eps_high_max = SMOKE_CLIPS[level]
    settings = dict(output_dir=str(out / "trainer"), per_device_train_batch_size=8, num_generations=4,
                    steps_per_generation=4, gradient_accumulation_steps=1, max_completion_length=8, max_steps=steps,
                    learning_rate=1e-2, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", seed=0,
                    temperature=1.0, scale_rewards="none", importance_sampling_level=level, loss_type="grpo",
                    epsilon=eps_low, gapo=GAPOConfig(eps_high_max=eps_high_max), exploration=SMOKE_EXPLORATION)
    return GAPOTRLConfig(**{**settings, **overrides})


def smoke_trainer(model_dir: Path, args, reward=smoke_reward, sizes=PROMPT_SET_SIZES, model=None):
    """GAPOGRPOTrainer on the tiny model (`model`: one already loaded from model_dir) and the smoke task's prompts."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from gapo.integrations.trl import GAPOGRPOTrainer

    return GAPOGRPOTrainer(model=model if model is not None else str(model_dir), reward_funcs=reward, args=args,
                           train_dataset=Dataset.from_list(prompt_rows(sizes)),
                           processing_class=AutoTokenizer.from_pretrained(model_dir))


def summarize(log_history: list[dict]) -> tuple[list[str], list[str]]:
    """(lines of a per-step table, problems): each step's reward, mean eps_high, exploration instruments
    (EXPLORE_COLUMNS) and per-c clip fractions; a problem when a step logged no gapo/* diagnostics or none of the
    instruments, or the adaptive clip never bound.

    The entropies come from every step's loss; the entrance and coverage columns from the steps that generated (a
    generation feeds 4 steps), as TRL's reward."""
    header = f"{'step':>4} {'reward':>7} {'eps_high':>9} " + " ".join(f"{name:>8}" for name, _, _ in EXPLORE_COLUMNS)
    lines, problems, bound = [header + "  clip fraction of successes, by c"], [], False
    steps = [h for h in log_history if "loss" in h and "step" in h]
    for h in steps:
        clip = {int(k.rsplit("c", 1)[1]): v for k, v in h.items() if k.startswith("gapo/clipfrac_pos/c")}
        if "gapo/is_adv_corr_levels" not in h:
            problems.append(f"step {h['step']} logged no gapo/* diagnostics")
        if not any(metric in h for _, metric, _ in EXPLORE_COLUMNS):
            problems.append(f"step {h['step']} logged no gapo/explore/* instruments")
        bound |= any(v > 0 for v in clip.values())
        eps = h.get("gapo/loss_eps_high_mean")
        reward = h.get("reward")  # TRL logs it in the steps that generated
        explore = " ".join(f"{'-' if h.get(metric) is None else form.format(h[metric]):>8}"
                           for _, metric, form in EXPLORE_COLUMNS)
        lines.append(f"{h['step']:>4} {'-' if reward is None else f'{reward:.3f}':>7} "
                     f"{'-' if eps is None else f'{eps:.4f}':>9} {explore}  "
                     + " ".join(f"c{c}={v:.2f}" for c, v in sorted(clip.items())))
    if not steps:
        problems.append("no training step was logged")
    elif not bound:
        problems.append("the adaptive clip never bound (every gapo/clipfrac_pos/c* was 0)")
    return lines, problems


def main(argv: list[str] | None = None) -> None:
    """Command line: build, train, print the per-step table; exit 1 when `summarize` finds a problem."""
    parser = argparse.ArgumentParser(prog="python -m recipe.trl_smoke", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/smoke-trl"), help="model, trainer output, W&B folder")
    parser.add_argument("--level", choices=sorted(SMOKE_CLIPS), default="sequence",
                        help="importance_sampling_level: sequence (GSPO surrogate) or token (PPO surrogate)")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps (a generation feeds 4)")
    parser.add_argument("--wandb", action="store_true", help="log to W&B offline under OUT/wandb")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")

    from gapo.smoke.tiny_model import build_tiny_model

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.wandb:
        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ.setdefault("WANDB_DIR", str(args.out.resolve()))
        os.environ.setdefault("WANDB_PROJECT", "gapo-trl-smoke")
    model_dir = build_tiny_model(args.out / "tiny")
    trainer = smoke_trainer(model_dir, smoke_args(args.out, args.level, args.steps,
                                                  report_to=["wandb"] if args.wandb else []))
    trainer.train()
    lines, problems = summarize(trainer.state.log_history)
    print("\n".join(lines))
    if args.wandb:
        import wandb

        wandb.finish()
        print(f"W&B offline run under {args.out / 'wandb'}")
    if problems:
        print("FAILED: " + "; ".join(problems), file=sys.stderr)
        sys.exit(1)
    print(f"OK: GAPO trained {args.steps} steps with TRL's GRPOTrainer at {args.level} level")


if __name__ == "__main__":
    main()

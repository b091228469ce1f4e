"""CPU smoke run of GAPO with Hugging Face TRL: the tiny offline model trains on the smoke task with TRL's real
`GRPOTrainer` and GAPO's loss (`gapo.integrations.trl`), in seconds.

    python -m recipe.trl_smoke [--out runs/smoke-trl] [--level sequence|token] [--steps 8] [--wandb] [KEY=VALUE ...]
                                                        (make smoke-trl; make smoke-trl SMOKE_TRL_ARGS="KEY=VALUE ...")

1. builds the tiny model and tokenizer under OUT (offline, cached; `gapo.smoke.tiny_model`);
2. trains `--steps` optimizer steps, each generation of 8 prompts x 4 completions feeding 4 steps (off-policy, so the
   clip can bind), the reward of `gapo.smoke.task` (1 when the first visible character is one of the allowed ones);
3. prints, per step, the reward, the gapo/* diagnostics (per-c clip fraction, eps_high) and the exploration
   instruments (gapo/explore/*: entropy of successes and failures, distinct first moves, coverage and its window), and
   fails unless the adaptive clip bound at least once and every step logged its diagnostics and its instruments.
Every log of the run goes to OUT/logs/metrics.jsonl in verl's file-logger format (`gapo.integrations.trl.
MetricsFileCallback`), which `make plot-run RUN_DIRS=OUT` draws; the last line printed names it. `--wandb` also logs
to W&B offline under OUT/wandb (`make plot-run RUN_DIRS=OUT/wandb` draws that run).

KEY=VALUE: a setting of the run's GAPOTRLConfig over the smoke's own: a field of TRL's GRPOConfig
(`learning_rate=0.02`, `num_generations=8`, `loss_type=bnpo`), `gapo.<key>` for GAPOConfig's (`gapo.schedule=exp`)
and `exploration.<key>` for ExplorationConfig's (`exploration.coverage_window=4`). VALUE is read as JSON (numbers,
true/false, null, lists), else taken as text. An unknown key is refused naming the closest one; the keys the options
set (OWN_KEYS) are refused naming the option; a bad value stops the run with GAPOTRLConfig's or TRL's message.
The clips are wide and the learning rate large (1e-2) so that a tiny model's ratios move in a few steps; the paper's
settings in TRL terms are in docs/trl.md.
"""

from __future__ import annotations

import argparse
import json
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
# GAPOTRLConfig fields the options set, and the option to use instead of KEY=VALUE
OWN_KEYS = {"output_dir": "--out", "max_steps": "--steps", "importance_sampling_level": "--level",
            "report_to": "--wandb"}
# Settings held in a nested config: KEY=VALUE writes them as <name>.<key>
NESTED = ("gapo", "exploration")
# Where the run's metrics go under OUT (verl's file-logger format; recipe.plot_run reads it)
METRICS_FILE = Path("logs") / "metrics.jsonl"
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
    completions (off-policy after the first), first moves of one token (SMOKE_EXPLORATION), W&B off. `overrides`
    replace these settings; a dict for `gapo` or `exploration` adds its keys to the smoke's own."""
    from gapo.integrations.trl import GAPOTRLConfig

    eps_low, eps_high_max = SMOKE_CLIPS[level]
    settings = dict(output_dir=str(out / "trainer"), per_device_train_batch_size=8, num_generations=4,
                    steps_per_generation=4, gradient_accumulation_steps=1, max_completion_length=8, max_steps=steps,
                    learning_rate=1e-2, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", seed=0,
                    temperature=1.0, scale_rewards="none", importance_sampling_level=level, loss_type="grpo",
                    epsilon=eps_low, gapo={"eps_high_max": eps_high_max}, exploration=SMOKE_EXPLORATION)
    for name in NESTED:
        if isinstance(overrides.get(name), dict):
            overrides[name] = {**settings[name], **overrides[name]}
    return GAPOTRLConfig(**{**settings, **overrides})


def parse_overrides(pairs: list[str]) -> dict:
    """`KEY=VALUE` settings as smoke_args' overrides (`gapo.<key>` and `exploration.<key>` gathered into a dict each).
    VALUE is JSON, else text; by the type of a GRPOConfig field: always text for a text field, a number for a numeric
    one, true/false for a bool one (null where the field may be None). Raises ValueError naming the bad pair: not
    KEY=VALUE, a key the options set (OWN_KEYS), an unknown key (with the closest known one), a value of the wrong
    type."""
    import types
    import typing
    from dataclasses import fields

    from gapo.config import GAPOConfig
    from gapo.config_names import closest
    from gapo.exploration import ExplorationConfig
    from gapo.integrations.trl import GAPOTRLConfig

    def members(annotation) -> set:
        union = isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union
        return set(typing.get_args(annotation)) if union else {annotation}

    # the classes' annotations, not Field.type: transformers' HfArgumentParser rewrites Field.type in place (an
    # Optional field becomes its inner type), so after any parse of GRPOConfig in this process `null` would be refused
    hints = typing.get_type_hints(GAPOTRLConfig)
    top = {f.name: members(hints.get(f.name, f.type)) for f in fields(GAPOTRLConfig)}
    nested = {name: {f.name for f in fields(config)} for name, config in zip(NESTED, (GAPOConfig, ExplorationConfig))}
    known = [*top, *(f"{name}.{key}" for name, keys in nested.items() for key in keys)]
    out: dict = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"{pair!r} is not KEY=VALUE (e.g. learning_rate=0.02 or gapo.schedule=exp)")
        if key in OWN_KEYS:
            raise ValueError(f"{pair!r}: {key} is set by {OWN_KEYS[key]}; use that option")
        if key not in known:
            close = closest(key, known, n=1)
            hint = f"did you mean {close[0]}?" if close else "see python -m recipe.trl_smoke -h"
            raise ValueError(f"{pair!r}: {key} is not a setting of the TRL smoke run (a field of TRL's GRPOConfig, "
                             f"gapo.<GAPOConfig field> or exploration.<ExplorationConfig field>); {hint}")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        kinds = top.get(key, set())
        optional = type(None) in kinds and value is None
        kinds = kinds - {type(None)}
        if kinds == {str} and not optional:
            value = text
        elif kinds == {bool} and not (optional or isinstance(value, bool)):
            raise ValueError(f"{pair!r}: {key} takes true or false")
        elif kinds and kinds <= {int, float} and not optional and (
                isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"{pair!r}: {key} takes a number")
        name, dot, sub = key.partition(".")
        if dot:
            out.setdefault(name, {})[sub] = value
        else:
            out[key] = value
    return out


def smoke_trainer(model_dir: Path, args, reward=smoke_reward, sizes=PROMPT_SET_SIZES, model=None, callbacks=None):
    """GAPOGRPOTrainer on the tiny model (`model`: one already loaded from model_dir) and the smoke task's prompts;
    `callbacks` as Trainer's."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from gapo.integrations.trl import GAPOGRPOTrainer

    return GAPOGRPOTrainer(model=model if model is not None else str(model_dir), reward_funcs=reward, args=args,
                           train_dataset=Dataset.from_list(prompt_rows(sizes)),
                           processing_class=AutoTokenizer.from_pretrained(model_dir), callbacks=callbacks)


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
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="GAPOTRLConfig settings over the smoke's: TRL's GRPOConfig fields (learning_rate=0.02), "
                             "gapo.<key> (gapo.schedule=exp), exploration.<key>; VALUE as JSON, else text")
    args = parser.parse_intermixed_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    try:
        overrides = parse_overrides(args.overrides)
    except ValueError as err:
        parser.error(str(err))

    from gapo.integrations.trl import MetricsFileCallback
    from gapo.smoke.tiny_model import build_tiny_model

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.wandb:
        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ.setdefault("WANDB_DIR", str(args.out.resolve()))
        os.environ.setdefault("WANDB_PROJECT", "gapo-trl-smoke")
    try:
        settings = smoke_args(args.out, args.level, args.steps, report_to=["wandb"] if args.wandb else [], **overrides)
    except ValueError as err:  # GAPOTRLConfig's and TRL's checks name the setting
        parser.error(f"the settings do not make a run: {err}")
    model_dir = build_tiny_model(args.out / "tiny")
    metrics = args.out / METRICS_FILE
    trainer = smoke_trainer(model_dir, settings, callbacks=[MetricsFileCallback(metrics)])
    trainer.train()
    lines, problems = summarize(trainer.state.log_history)
    print("\n".join(lines))
    if args.wandb:
        import wandb

        wandb.finish()
        print(f"W&B offline run under {args.out / 'wandb'}")
    if problems:
        print("FAILED: " + "; ".join(problems) + f" (metrics: {metrics})", file=sys.stderr)
        sys.exit(1)
    print(f"OK: GAPO trained {args.steps} steps with TRL's GRPOTrainer at {args.level} level; metrics: {metrics} "
          f"(make plot-run RUN_DIRS={args.out})")


if __name__ == "__main__":
    main()

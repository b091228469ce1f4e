"""The learning run's training stage through TRL: SmolLM2-135M-Instruct, GAPO as GRPOTrainer's loss, the
arithmetic task (runs in ``.venv-trl``; ``python -m recipe.learn --engine trl`` starts it).

    python -m recipe.learn_trl --out DIR --model MODEL --train-file train.parquet [--steps 40] [KEY=VALUE ...]

The same settings as configs/learn_cpu.yaml in TRL terms (:data:`LEARN_SETTINGS`): sequence level, eps_low 3e-3,
eps_high_max 5e-3, lr 1e-5, 4 prompts x 8 completions per generation feeding 2 optimizer steps (the second
off-policy), 16 new tokens, temperature 1, no std normalisation; the reward is the training reward
(``gapo.rewards.compute_score`` on each row's data_source, ground truth and extra_info). KEY=VALUE: as in
``recipe.trl_smoke`` (TRL's GRPOConfig fields, ``gapo.<key>``, ``exploration.<key>``). Writes DIR/logs/metrics.jsonl
(verl's file-logger format), DIR/timing.json (each optimizer step's end, seconds since training began; `make bench`
reads it) and the trained model to DIR/model.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

LEARN_SETTINGS = dict(per_device_train_batch_size=16, num_generations=8, steps_per_generation=2,
                      gradient_accumulation_steps=1, max_completion_length=16, learning_rate=1e-5, logging_steps=1,
                      report_to=[], use_cpu=True, save_strategy="no", seed=0, temperature=1.0, top_p=1.0,
                      scale_rewards="none", importance_sampling_level="sequence", loss_type="grpo", epsilon=3e-3,
                      gapo={"eps_high_max": 5e-3}, beta=0.0)


def task_reward(prompts, completions, data_source, ground_truth, extra_info, **kwargs) -> list[float]:
    """TRL reward function: the training reward of each completion (gapo.rewards.compute_score)."""
    from gapo.rewards import compute_score
    from recipe.trl_smoke import completion_text

    return [float(compute_score(s, completion_text(c), g, e)["score"])
            for c, s, g, e in zip(completions, data_source, ground_truth, extra_info)]


def step_clock():
    """A TrainerCallback recording, at each optimizer step's end, the seconds since training began (``ends``)."""
    from transformers import TrainerCallback

    class _StepClock(TrainerCallback):
        def __init__(self):
            self.start, self.ends = time.monotonic(), []

        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(round(time.monotonic() - self.start, 3))

    return _StepClock()


def train_rows(train_file: Path) -> list[dict]:
    """TRL's conversational rows from verl's RL parquet: prompt, data_source, ground_truth, extra_info."""
    import pyarrow.parquet as pq

    rows = []
    for row in pq.read_table(train_file).to_pylist():
        rows.append({"prompt": row["prompt"], "data_source": row["data_source"],
                     "ground_truth": row["reward_model"]["ground_truth"], "extra_info": row["extra_info"]})
    return rows


def main(argv=None) -> None:
    """CLI entry: train, then save the model and tokenizer to OUT/model."""
    parser = argparse.ArgumentParser(prog="python -m recipe.learn_trl", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", type=Path, required=True, help="the prepared model folder (gapo.real_model)")
    parser.add_argument("--train-file", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps (a generation feeds 2)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = parser.parse_intermixed_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    from recipe.trl_smoke import parse_overrides

    try:
        overrides = parse_overrides(args.overrides)
    except ValueError as err:
        parser.error(str(err))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from datasets import Dataset
    from transformers import AutoTokenizer

    from gapo.integrations.trl import GAPOGRPOTrainer, GAPOTRLConfig, MetricsFileCallback

    settings = {**LEARN_SETTINGS, **overrides}
    if isinstance(overrides.get("gapo"), dict):
        settings["gapo"] = {**LEARN_SETTINGS["gapo"], **overrides["gapo"]}
    config = GAPOTRLConfig(output_dir=str(args.out / "trainer"), max_steps=args.steps, **settings)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    clock = step_clock()
    trainer = GAPOGRPOTrainer(model=str(args.model), reward_funcs=task_reward, args=config,
                              train_dataset=Dataset.from_list(train_rows(args.train_file)),
                              processing_class=tokenizer,
                              callbacks=[MetricsFileCallback(args.out / "logs" / "metrics.jsonl"), clock])
    trainer.train()
    (args.out / "timing.json").write_text(json.dumps({"step_end_s": clock.ends}))
    trainer.save_model(str(args.out / "model"))
    tokenizer.save_pretrained(str(args.out / "model"))
    print(f"[learn-trl] {args.steps} steps; model: {args.out / 'model'}")


if __name__ == "__main__":
    main()

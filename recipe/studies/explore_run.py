"""One run of the exploration study (`recipe.studies.explore`): the tiny model trained with TRL's `GRPOTrainer` and
GAPO's loss (`gapo.integrations.trl`) on one regime of the smoke task, or the real model of `make learn` on the
arithmetic task (`StudySettings.task`; recipe.studies.explore_real), with held-out sampling during training.

    run_one(RunSpec(regime="tail", method="gapo_linear", seed=3), out=Path("runs/study-explore/runs/..."),
            model_dir=..., settings=StudySettings())

What a run writes under `out` (read by `recipe.studies.explore`'s report, which needs neither torch nor trl):
- `metrics.jsonl`: every TRL log line (verl's file-logger format, `gapo.integrations.trl.MetricsFileCallback`): the
  reward, the per-c clip diagnostics `gapo/*`, the exploration instruments `gapo/explore/*`, the group fractions.
- `heldout.jsonl`: one line per held-out evaluation (before training, every `eval_every` steps, after the last):
  `{"step": s, "bucket": b, "n": n, "correct": [c_1, ...], "distinct": [d_1, ...]}`, per held-out prompt its count
  of correct samples out of n and of distinct first visible characters (the entrance, m = 1, of the held-out
  samples). Samples are drawn at temperature 1 from a generator seeded by (run seed, step) under
  `torch.random.fork_rng`, so they never move the training's random stream, and two methods at one seed sample their
  held-out prompts with the same random numbers (common random numbers: the paired difference has less noise).
- `done.json`: written last, with the run's settings and wall time; a run without it is rerun from the start.

Why TRL and not verl's trainer: one verl run of 24 steps takes ~3 minutes on 2 cores (its start-up alone ~1 minute),
so 72 runs cannot fit an hour; a TRL step of this size takes well under a second. The loss and the diagnostics are the
same code (`gapo.surrogate`, `gapo.threshold`, `gapo.clip_diagnostics`); tests/trl_integration/test_study_explore.py
checks the diagnostics against the verl adapter's on one shared batch.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# The methods: GAPO's schedule, and whether the upper clip of a success is eps_low (symmetric) or eps_high_max at its
# widest. The fixed clips run as GAPO's constant schedule, which equals a fixed clip and still logs the per-c
# diagnostics.
METHODS = {
    "gspo_symmetric": {"schedule": "constant", "symmetric": True},
    "gspo_clip_higher": {"schedule": "constant", "symmetric": False},
    "gapo_linear": {"schedule": "linear", "symmetric": False},
}
# The regimes: train and held-out prompts by allowed-set size. `tail`: the difficulty buckets of
# gapo.smoke.task in equal shares (a hard tail at ~2-10% success for the base model); `high`: sets of 28-36
# characters, which the base model answers correctly ~60-80% of the time (the regime the paper does not report).
REGIMES = {
    "tail": {"hard": (1, 4), "mid": (8, 20), "easy": (25, 32)},
    "high": {"high": (28, 36)},
}
# The tasks: `smoke`, the tiny random model on the regimes above; `arithmetic`, the real pretrained model of `make learn`
# (gapo.real_model) on gapo.arithmetic's buckets, one regime (recipe.studies.explore_real holds its design).
TASKS = ("smoke", "arithmetic")
ARITH_REGIME = "arith"


def task_regimes(task: str) -> dict[str, tuple[str, ...]]:
    """{regime: its buckets} of a task (TASKS)."""
    if task == "smoke":
        return {regime: tuple(buckets) for regime, buckets in REGIMES.items()}
    if task == "arithmetic":
        from gapo.arithmetic import BUCKETS

        return {ARITH_REGIME: tuple(BUCKETS)}
    raise ValueError(f"unknown task {task!r}: expected one of {', '.join(TASKS)}")


@dataclass(frozen=True)
class RunSpec:
    """One run: regime (REGIMES), method (METHODS), seed (TRL's seed: prompt order, sampling, held-out samples)."""

    regime: str
    method: str
    seed: int

    @property
    def name(self) -> str:
        """regime/method/seed<s>, as printed and as the run folder's path under OUT/runs."""
        return f"{self.regime}/{self.method}/seed{self.seed}"


@dataclass(frozen=True)
class StudySettings:
    """The study's training and held-out settings (one source of defaults; `recipe.studies.explore` documents why).

    Each generation is `prompts_per_generation` prompts x `k` completions, split into `steps_per_generation`
    optimizer steps (off-policy after the first, so the clip binds)."""

    steps: int = 200
    k: int = 8
    prompts_per_generation: int = 8
    steps_per_generation: int = 4
    learning_rate: float = 3e-3
    eps_low: float = 0.02
    eps_high_max: float = 0.05
    max_completion_length: int = 8
    eval_every: int = 25
    eval_prompts: int = 24
    eval_samples: int = 16
    n_train: int = 512
    skew: float = 1.0
    threads: int = 1
    task: str = "smoke"

    def validate(self) -> None:
        """Raise ValueError naming every bad setting and its value."""
        problems = []
        for name in ("steps", "k", "prompts_per_generation", "steps_per_generation", "max_completion_length",
                     "eval_every", "eval_prompts", "eval_samples", "n_train", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(f"{name} must be an integer >= 1, got {value!r}")
        if self.k < 2:
            problems.append(f"k must be >= 2 (a group of one has no advantage), got {self.k}")
        if (self.prompts_per_generation * self.k) % self.steps_per_generation:
            problems.append(f"prompts_per_generation x k ({self.prompts_per_generation * self.k}) must split into "
                            f"steps_per_generation ({self.steps_per_generation}) equal steps")
        if not 0 < self.eps_low <= self.eps_high_max:
            problems.append(f"need 0 < eps_low <= eps_high_max, got {self.eps_low} and {self.eps_high_max}")
        if not self.skew >= 0:
            problems.append(f"skew must be >= 0 (0: uniform allowed sets), got {self.skew}")
        if not self.learning_rate > 0:
            problems.append(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.task not in TASKS:
            problems.append(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if problems:
            raise ValueError("study settings: " + "; ".join(problems))


def eval_steps(settings: StudySettings) -> list[int]:
    """Steps after which the held-out prompts are sampled: 0 (before training), every eval_every, and the last."""
    return sorted({0, *range(settings.eval_every, settings.steps + 1, settings.eval_every), settings.steps})


def prompt_rows(regime: str, n: int, split: str, seed: int, skew: float = StudySettings.skew) -> list[dict]:
    """TRL conversational rows of a regime, its buckets in equal shares (held-out: `n` per bucket), each with its
    `allowed` set and `bucket`. Held-out rows do not depend on the run's seed (every run is scored on the same
    prompts); train rows do (their order and draw). `skew`: the allowed sets' Zipf skew (`gapo.smoke.task.make_rows`)."""
    import random

    from gapo.smoke.task import make_rows

    buckets = REGIMES[regime]
    shares = ([n] * len(buckets) if split == "val"
              else [n // len(buckets) + (i < n % len(buckets)) for i in range(len(buckets))])
    rows = []
    for (bucket, (low, high)), count in zip(buckets.items(), shares):
        for row in make_rows(count, seed=seed, split=f"explore-{regime}-{split}", min_size=low, max_size=high,
                             bucket=bucket, skew=skew):
            rows.append({"prompt": row["prompt"], "allowed": row["reward_model"]["ground_truth"], "bucket": bucket})
    random.Random(f"{seed}/{regime}/{split}/order").shuffle(rows)
    return rows


def arith_rows(split: str, settings: StudySettings) -> list[dict]:
    """TRL conversational rows of the arithmetic task (gapo.arithmetic.make_splits at its seed 0, so that every run
    trains on the same pool and is scored on the same held-out prompts, `eval_prompts` per bucket, drawn apart from
    training): prompt, data_source, ground_truth, extra_info, bucket. The run's seed orders the training rows (TRL's
    data_seed)."""
    from gapo.arithmetic import make_splits

    rows = make_splits(n_train=settings.n_train, n_heldout_per_bucket=settings.eval_prompts, n_transfer_per_bucket=0,
                       seed=0)[split]
    return [{"prompt": row["prompt"], "data_source": row["data_source"],
             "ground_truth": row["reward_model"]["ground_truth"], "extra_info": row["extra_info"],
             "bucket": row["extra_info"]["bucket"]} for row in rows]


def trl_args(spec: RunSpec, out: Path, settings: StudySettings):
    """GAPOTRLConfig of a run: sequence level (the GSPO surrogate, the paper's main variant), mean-centred advantages
    (scale_rewards none), the method's clip."""
    from gapo.integrations.trl import GAPOTRLConfig

    method = METHODS[spec.method]
    eps_high_max = settings.eps_low if method["symmetric"] else settings.eps_high_max
    return GAPOTRLConfig(
        output_dir=str(out / "trainer"), per_device_train_batch_size=settings.prompts_per_generation * settings.k
        // settings.steps_per_generation, num_generations=settings.k, steps_per_generation=settings.steps_per_generation,
        gradient_accumulation_steps=1, max_completion_length=settings.max_completion_length, max_steps=settings.steps,
        learning_rate=settings.learning_rate, lr_scheduler_type="constant", warmup_steps=0, logging_steps=1,
        report_to=[], use_cpu=True, save_strategy="no", seed=spec.seed, data_seed=spec.seed, temperature=1.0,
        scale_rewards="none", importance_sampling_level="sequence", loss_type="grpo", epsilon=settings.eps_low,
        gapo={"eps_high_max": eps_high_max, "schedule": method["schedule"]},
        exploration={"entrance_tokens": 1}, disable_tqdm=True, log_level="warning")


# sequences per generate call of the arithmetic task's held-out sampling: the real model's per-token cost is paid once
# per call, not per prompt (recipe.learn's evaluation batches the same way)
EVAL_BATCH = 64


def _samples_per_prompt(model, tokenizer, texts: list[str], settings: StudySettings) -> list[list[str]]:
    """`eval_samples` completions of each prompt text, one generate call per prompt (the tiny model's study: its
    random draws, and so its published numbers, depend on this order)."""
    out = []
    for text in texts:
        ids = tokenizer(text, return_tensors="pt")
        tokens = model.generate(**ids, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                max_new_tokens=settings.max_completion_length,
                                num_return_sequences=settings.eval_samples, pad_token_id=tokenizer.pad_token_id)
        out.append(tokenizer.batch_decode(tokens[:, ids["input_ids"].shape[1]:], skip_special_tokens=True))
    return out


def _samples_batched(model, tokenizer, texts: list[str], settings: StudySettings) -> list[list[str]]:
    """`eval_samples` completions of each prompt text, EVAL_BATCH sequences per generate call (left padding)."""
    per_call = max(1, EVAL_BATCH // settings.eval_samples)
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    out = []
    try:
        for first in range(0, len(texts), per_call):
            ids = tokenizer(texts[first:first + per_call], return_tensors="pt", padding=True)
            tokens = model.generate(**ids, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                    max_new_tokens=settings.max_completion_length,
                                    num_return_sequences=settings.eval_samples, pad_token_id=tokenizer.pad_token_id)
            decoded = tokenizer.batch_decode(tokens[:, ids["input_ids"].shape[1]:], skip_special_tokens=True)
            out += [decoded[i:i + settings.eval_samples] for i in range(0, len(decoded), settings.eval_samples)]
    finally:
        tokenizer.padding_side = side
    return out


def _correct(task: str, row: dict, sample: str) -> bool:
    """Whether a held-out sample is paid: the smoke task's score, or the arithmetic task's training reward."""
    if task == "smoke":
        from gapo.smoke.task import compute_score

        return compute_score("gapo_smoke", sample, row["allowed"])["score"] > 0
    from gapo.rewards import compute_score

    return compute_score(row["data_source"], sample, row["ground_truth"], row["extra_info"])["score"] > 0


def heldout_callback(rows: list[dict], tokenizer, steps: list[int], settings: StudySettings, seed: int, path: Path):
    """A TrainerCallback writing one `heldout.jsonl` line per bucket at each step of `steps` (module docstring)."""
    import torch
    from transformers import TrainerCallback

    from gapo.smoke.task import first_visible_char

    texts = [tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True) for row in rows]
    sample = _samples_per_prompt if settings.task == "smoke" else _samples_batched

    def evaluate(model, step: int) -> None:
        was_training = model.training
        model.eval()
        per_bucket: dict[str, dict] = {}
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed * 100_003 + step)
            samples = sample(model, tokenizer, texts, settings)
        for row, drawn in zip(rows, samples):
            entry = per_bucket.setdefault(row["bucket"], {"correct": [], "distinct": []})
            entry["correct"].append(int(sum(_correct(settings.task, row, s) for s in drawn)))
            entry["distinct"].append(len({first_visible_char(s) for s in drawn}))
        if was_training:
            model.train()
        with path.open("a") as f:
            for bucket, entry in per_bucket.items():
                f.write(json.dumps({"step": step, "bucket": bucket, "n": settings.eval_samples, **entry}) + "\n")

    class HeldOut(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if 0 in steps:
                evaluate(model, 0)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step in steps and state.global_step > 0:
                evaluate(model, state.global_step)

    return HeldOut()


def run_one(spec: RunSpec, out: Path, model_dir: Path, settings: StudySettings) -> dict:
    """Train one run into `out` (module docstring); returns what `done.json` holds. A partial `out` is cleared first."""
    import shutil

    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, PrinterCallback

    from gapo.integrations.trl import GAPOGRPOTrainer, MetricsFileCallback
    from recipe.learn_trl import task_reward
    from recipe.trl_smoke import smoke_reward

    settings.validate()
    if spec.regime not in task_regimes(settings.task):
        raise ValueError(f"regime {spec.regime!r} is not one of task {settings.task!r}'s: "
                         f"{', '.join(task_regimes(settings.task))}")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    torch.set_num_threads(settings.threads)
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if settings.task == "smoke":
        train = prompt_rows(spec.regime, settings.n_train, "train", spec.seed, settings.skew)
        heldout = prompt_rows(spec.regime, settings.eval_prompts, "val", 0, settings.skew)
        reward = smoke_reward
    else:
        train, heldout, reward = arith_rows("train", settings), arith_rows("heldout", settings), task_reward
    callbacks = [MetricsFileCallback(out / "metrics.jsonl"),
                 heldout_callback(heldout, tokenizer, eval_steps(settings), settings, spec.seed, out / "heldout.jsonl")]
    trainer = GAPOGRPOTrainer(model=str(model_dir), reward_funcs=reward, args=trl_args(spec, out, settings),
                              train_dataset=Dataset.from_list(train), processing_class=tokenizer, callbacks=callbacks)
    trainer.remove_callback(PrinterCallback)  # TRL would print every log line; they are in metrics.jsonl
    trainer.train()
    shutil.rmtree(out / "trainer", ignore_errors=True)
    done = {"run": spec.name, **asdict(spec), "settings": asdict(settings), "wall_s": round(time.perf_counter() - start, 2)}
    (out / "done.json").write_text(json.dumps(done, indent=1) + "\n")
    return done

"""The exploration study on a real policy (`make study-explore TASK=arithmetic`): its pre-registered design.

SmolLM2-135M-Instruct (`gapo.real_model`, the model of `make learn`) on `gapo.arithmetic`'s task (buckets add1, sub1,
mul1 and the hard tail add2, two-digit addition), trained through TRL's GRPOTrainer with GAPO's loss on CPU at the
learning run's settings (recipe.learn_trl.LEARN_SETTINGS: sequence level, lr 1e-5, 4 prompts x 8 completions per
generation feeding 2 optimizer steps, 16 new tokens) but the tiny study's clips (eps_low 0.02, eps_high_max 0.05; see
SETTINGS for why). The three methods of the tiny-model
study (recipe.studies.explore_run.METHODS). The questions are the tiny study's, asked where a prior exists:

- diagnosis: under the fixed symmetric clip, are successes of rare-success groups (c = 1-2 of 8) clipped more often
  than those of groups where half or more succeed (c = 4-7)? The paper's mechanism; a random model cannot show it.
- effect: does GAPO raise held-out pass@1 on the hard bucket (add2) over the fixed clip-higher?

Everything here is fixed before the study runs (docs/studies.md, "A real policy"); recipe.studies.explore_report
computes the report from the runs' files. This module holds constants only (both the runner and the report read it).
"""

from __future__ import annotations

from dataclasses import replace

from gapo.arithmetic import BUCKETS, HARD_BUCKET
from recipe.studies.explore_run import StudySettings

TASK = "arithmetic"
REGIME = "arith"
# The real study's settings: the learning run's, held-out 12 prompts per bucket (48, drawn apart from training by
# gapo.arithmetic.make_splits) x 8 samples before training and after the last step, 14 steps (7 generations) a run.
# Measured with 2 runs at once on 2 cores (one thread each): a generation and its 2 optimizer steps ~47 s, one held-out
# evaluation of 64 prompts x 8 samples ~2 minutes; so a run of 8 generations and 64 held-out prompts took ~10.5 minutes
# and 3 methods x 8 seeds would not fit the 2 hours the study may take; these settings: ~9 minutes a run, ~105 minutes.
# The clips: the tiny study's (eps_low 0.02, eps_high_max 0.05), not the learning run's 3e-3 / 5e-3. The first pilot
# (seed 101 at 3e-3 / 5e-3, runs/study-explore-real-pilot-clips3e-3) clipped every success of every off-policy step
# under both fixed clips (clip fraction 1.0 there at every c; the two runs were identical, step for step), with
# |ratio - 1| before clipping 0.017-0.088 at c = 1 and 0.012-0.014 at c = 6: a clip that binds on everything cannot
# show which successes it cuts, nor give any headroom. 0.02 / 0.05 lies inside that range.
SETTINGS = replace(StudySettings(), task=TASK, steps=14, k=8, prompts_per_generation=4, steps_per_generation=2,
                   learning_rate=1e-5, eps_low=0.02, eps_high_max=0.05, max_completion_length=16, eval_every=14,
                   eval_prompts=12, eval_samples=8, n_train=256)
# Seeds: the floor of 8, or more where the pilot's power calculation asks for more within the budget
# (MAX_SEEDS). The pilot's seeds are disjoint from the study's.
MIN_SEEDS = 8
MAX_SEEDS = 8
SEEDS = tuple(range(1, MIN_SEEDS + 1))
PILOT_SEEDS = (101, 102, 103)
PILOT_LEARNING_RATES = (SETTINGS.learning_rate,)  # the learning run's pilot chose it (docs/learn.md)
# The smallest true difference worth detecting (held-out pass@1 and clip fraction, both fractions).
MEANINGFUL = 0.05
# The diagnosis's bands of success counts c (of k = 8): a quarter or fewer of the group succeeded (SMALL_C) against
# half or more (LARGE_C). Not the tiny study's c = 6-7: in the pilot no group reached c = 6-7 under the symmetric clip
# at seeds 102 and 103 (the hard task keeps success counts low in 7 generations), so its diagnosis could not be
# measured there, while every pilot seed had successes at c = 4 (runs/study-explore-real-pilot; docs/studies.md).
# c = 3 is in neither band. Fixed before the study's seeds ran.
SMALL_C = (1, 2)
LARGE_C = (4, 5, 6, 7)
PRIMARY = {
    "diagnosis": {"regime": REGIME, "metric": "clip_gap", "a": "gspo_symmetric", "b": None,
                  "text": f"clip fraction of successes at small c ({SMALL_C[0]}-{SMALL_C[-1]}) minus at large c "
                          f"({LARGE_C[0]}-{LARGE_C[-1]}), over training, under the fixed symmetric clip"},
    "effect": {"regime": REGIME, "metric": f"pass1/{HARD_BUCKET}", "a": "gapo_linear", "b": "gspo_clip_higher",
               "text": f"held-out pass@1 on the hard bucket ({HARD_BUCKET}) after the last step, GAPO minus the fixed "
                       "clip-higher"},
}
# CI's reduced mode: every method, 2 seeds, 2 steps (one generation), 2 held-out prompts per bucket x 8 samples.
REDUCED = {"seeds": (1, 2), "settings": {"steps": 2, "eval_every": 2, "eval_prompts": 2, "n_train": 16}}
EFFECT_METRICS = (*(f"pass1/{b}" for b in BUCKETS), "pass1/all", f"pass8/{HARD_BUCKET}", "pass8/all",
                  f"coverage/{HARD_BUCKET}", "distinct/all", "entropy_success", "entropy_failure", "mixed_frac",
                  "reward")

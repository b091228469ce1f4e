"""GAPO as TRL's GRPOTrainer loss (gapo.integrations.trl): the same loss and gradients as the verl path on identical
tensors, each completion's (c, k, success) through TRL's shuffle and split, the exploration instruments and group
metrics recounted from the generations and the loss's entropies (training at world size 2, and evaluation), the errors
and warnings of a misconfigured run, the import without verl, and a real training run of the smoke task's tiny model."""

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl", reason="trl is not installed: tests/trl_integration run in .venv-trl (make install-trl, make test-trl)")

from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from gapo.config import GAPOConfig  # noqa: E402
from gapo.entrance import first_move  # noqa: E402
from gapo.exploration import (  # noqa: E402
    CoverageWindow,
    ExplorationConfig,
    add_sums,
    exploration_metrics,
    rollout_sums,
)
from gapo.groups import group_metrics, group_statistics  # noqa: E402
from gapo.integrations.trl import (  # noqa: E402
    GROUP_SIZE_KEY,
    NUM_CORRECT_KEY,
    SUCCESS_KEY,
    GAPOGRPOTrainer,
    GAPOTRLConfig,
    completion_group_statistics,
    completion_success,
    exploration_settings,
    gapo_settings,
)
from gapo.threshold import adaptive_eps_high  # noqa: E402
from gapo.smoke.task import first_visible_char  # noqa: E402
from gapo.smoke.tiny_model import build_tiny_model  # noqa: E402
from recipe.trl_smoke import (  # noqa: E402
    PROMPT_SET_SIZES,
    SMOKE_CLIPS,
    completion_text,
    smoke_args,
    smoke_reward,
    smoke_trainer,
    summarize,
)
from tests.test_gapo_loss import actor_config, call  # noqa: E402

EPS_LOW, EPS_MAX, K = 0.2, 0.28, 4
REPO = Path(__file__).resolve().parents[2]


def trl_args(tmp_path, **overrides):
    """The smoke run's configuration (off-policy: each generation feeds 4 optimizer steps) with clips 0.2 / 0.28."""
    base = dict(epsilon=EPS_LOW, epsilon_high=EPS_MAX, gapo=GAPOConfig(), learning_rate=1e-3, max_steps=4)
    return smoke_args(tmp_path, **{**base, **overrides})


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("trl") / "tiny")


def make_trainer(tiny_model, args, reward=smoke_reward, sizes=(2, 12, 24, 36), model=None):
    return smoke_trainer(tiny_model, args, reward=reward, sizes=sizes, model=model)


# --- the loss on identical tensors: TRL's _compute_loss with GAPO's bounds == the verl plug-in's loss ---------------

# Six completions of groups of 4 (T = 5 tokens, different lengths): (c, success, advantage, target ratio).
# Bounds: c = 1 -> 0.28, c = 2 -> 0.25333, c = 3 -> 0.22667, not a success -> 0.2 (EPS_LOW).
ROWS = [
    (1, True, 0.75, 1.25),   # rare success: inside 1.28 (TRL's fixed 0.28 too)
    (3, True, 0.25, 1.25),   # common success: GAPO clips at 1.2267, fixed 0.28 does not
    (2, True, 0.5, 1.26),    # GAPO clips at 1.2533, fixed 0.28 does not
    (2, False, -0.5, 0.7),   # failure, negative advantage: the lower clip 0.8 binds (the same for both)
    (1, False, 0.1, 1.25),   # partial credit below the threshold, A > 0: keeps eps_low (0.2), so GAPO clips
    (1, True, 0.75, 1.35),   # rare success past 1.28: clipped by both
]
LENGTHS = [5, 3, 4, 2, 5, 1]
EXPECTED_EPS = [0.28, 0.2 + 0.08 / 3, 0.2 + 0.16 / 3, 0.2, 0.2, 0.28]


def loss_case(level):
    b, t = len(ROWS), 5
    mask = torch.zeros(b, t)
    for i, n in enumerate(LENGTHS):
        mask[i, :n] = 1
    old = -1.0 - torch.arange(b * t, dtype=torch.float32).reshape(b, t) / 40
    # per-token deviations around each row's target ratio: some tokens cross their bound at token level
    offsets = torch.tensor([0.03, -0.05, 0.08, -0.02, 0.0])
    log_ratio = torch.log(torch.tensor([r[3] for r in ROWS])).unsqueeze(-1) + (offsets if level == "token" else 0)
    new = old + log_ratio
    adv = torch.tensor([r[2] for r in ROWS])
    stats = {NUM_CORRECT_KEY: torch.tensor([float(r[0]) for r in ROWS]), GROUP_SIZE_KEY: torch.full((b,), float(K)),
             SUCCESS_KEY: torch.tensor([r[1] for r in ROWS])}
    return old, new, adv, mask, stats


def trl_loss(trainer, monkeypatch, old, new, adv, mask, stats, plain=False):
    """TRL's _compute_loss (GAPO's, or plain TRL's with `plain`) on given log-probs: (loss, grad, bounds TRL saw)."""
    log_prob = new.clone().requires_grad_(True)
    seen = {}

    def fake_logps(self, model, input_ids, attention_mask, logits_to_keep, **kwargs):
        seen["eps_high"] = self.epsilon_high
        return log_prob, torch.zeros_like(log_prob), None

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", fake_logps)
    b, t = mask.shape
    inputs = {"prompt_ids": torch.zeros(b, 1, dtype=torch.long), "prompt_mask": torch.ones(b, 1, dtype=torch.long),
              "completion_ids": torch.zeros(b, t, dtype=torch.long), "completion_mask": mask.long(),
              "advantages": adv, "old_per_token_logps": old, "num_items_in_batch": mask.sum(), **stats}
    loss = (GRPOTrainer._compute_loss if plain else GAPOGRPOTrainer._compute_loss)(trainer, trainer.model, inputs)
    loss.backward()
    return loss.detach(), log_prob.grad, seen["eps_high"]


@pytest.fixture(scope="module")
def loss_trainer(tiny_model, tmp_path_factory):
    trainer = make_trainer(tiny_model, trl_args(tmp_path_factory.mktemp("loss")))
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


@pytest.mark.parametrize("level, loss_type, verl_mode, agg", [
    ("sequence", "grpo", "gapo", "seq-mean-token-mean"),   # GSPO: TRL's grpo == verl's seq-mean-token-mean
    ("token", "bnpo", "gapo_token", "token-mean"),          # TRL's bnpo == verl's token-mean over the micro-batch
    ("token", "grpo", "gapo_token", "seq-mean-token-mean"),
])
def test_trl_loss_and_gradients_equal_the_verl_plugin(loss_trainer, monkeypatch, level, loss_type, verl_mode, agg):
    trainer = loss_trainer
    monkeypatch.setattr(trainer, "importance_sampling_level", level)
    monkeypatch.setattr(trainer, "loss_type", loss_type)
    trainer._gapo_sums["train"].clear()
    old, new, adv, mask, stats = loss_case(level)
    loss, grad, bounds = trl_loss(trainer, monkeypatch, old, new, adv, mask, stats)

    # every completion's own bound reached TRL's clamp
    torch.testing.assert_close(bounds.squeeze(-1), torch.tensor(EXPECTED_EPS))
    assert trainer.epsilon_high == EPS_MAX and trainer.epsilon_low == EPS_LOW  # restored after the loss
    ref_loss, ref_grad, ref = call(verl_mode, actor_config(verl_mode, lo=EPS_LOW, hi=EPS_MAX, agg=agg, rollout_n=K),
                                   old, new, adv.unsqueeze(-1).expand_as(mask).contiguous(), mask,
                                   stats[NUM_CORRECT_KEY], stats[GROUP_SIZE_KEY], stats[SUCCESS_KEY])
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)
    # the diagnostic sums are the verl loss's, key by key
    verl_sums = {key.split("/", 1)[1]: value for key, value in ref.items() if key.startswith("gapo_sums/")}
    assert set(trainer._gapo_sums["train"]) == set(verl_sums)
    for key, value in verl_sums.items():
        assert trainer._gapo_sums["train"][key] == pytest.approx(value, abs=1e-5), key
    assert verl_sums["c3/clipped"] > 0 and verl_sums["c2/clipped"] > 0  # GAPO's narrower bounds bind

    # plain TRL (fixed 0.28 for every completion) on the same tensors gives another loss and gradient
    plain_loss, plain_grad, plain_bounds = trl_loss(trainer, monkeypatch, old, new, adv, mask, stats, plain=True)
    assert plain_bounds == EPS_MAX
    assert abs(plain_loss.item() - loss.item()) > 1e-3
    assert not torch.allclose(plain_grad, grad)


def test_constant_schedule_is_plain_trl(loss_trainer, monkeypatch):
    """schedule='constant' gives every success with A > 0 eps_high_max: with binary rewards (success <=> A > 0) that
    is exactly TRL's fixed asymmetric clip; a failure with A > 0 (partial credit, row 4) keeps eps_low under GAPO."""
    trainer = loss_trainer
    monkeypatch.setattr(trainer, "gapo", GAPOConfig(schedule="constant"))
    monkeypatch.setattr(trainer, "importance_sampling_level", "token")
    monkeypatch.setattr(trainer, "loss_type", "grpo")
    old, new, adv, mask, stats = loss_case("token")
    plain_loss, plain_grad, _ = trl_loss(trainer, monkeypatch, old, new, adv, mask, stats, plain=True)
    loss, grad, _ = trl_loss(trainer, monkeypatch, old, new, adv, mask, {**stats, SUCCESS_KEY: adv > 0})
    torch.testing.assert_close(loss, plain_loss)
    torch.testing.assert_close(grad, plain_grad)
    loss, grad, bounds = trl_loss(trainer, monkeypatch, old, new, adv, mask, stats)
    assert bounds.squeeze(-1).tolist() == pytest.approx([EPS_MAX, EPS_MAX, EPS_MAX, EPS_LOW, EPS_LOW, EPS_MAX])
    assert not torch.allclose(grad[4], plain_grad[4]) and torch.allclose(grad[:4], plain_grad[:4])


# --- the group statistics -----------------------------------------------------------------------------------------

def test_success_is_the_weighted_reward_above_the_threshold_and_unscored_fails():
    nan = float("nan")
    rewards = torch.tensor([[1.0, 0.0], [0.4, 0.4], [nan, 0.9], [nan, nan], [0.2, nan], [0.6, -1.0]])
    weights = torch.tensor([1.0, 0.5])
    # weighted sums: 1.0, 0.6, 0.45, unscored, 0.2, 0.1
    assert completion_success(rewards, weights, 0.5).tolist() == [True, True, False, False, False, False]
    assert completion_success(rewards, weights, 0.15).tolist() == [True, True, True, False, True, False]


def test_groups_are_contiguous_blocks_of_num_generations():
    success = torch.tensor([1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0], dtype=torch.bool)
    stats = completion_group_statistics(success, 4)
    assert stats.num_correct.tolist() == [1] * 4 + [3] * 4 + [0] * 4
    assert stats.group_size.tolist() == [4] * 12
    assert stats.success.tolist() == success.tolist()
    with pytest.raises(ValueError, match="num_generations=5"):
        completion_group_statistics(success, 5)


def graded_reward(log):
    """A reward that is not 0/1 and depends on the completion's text only (identical completions score alike):
    allowed letter 1.0, allowed digit 0.7 (a success at 0.5), another digit 0.4 (partial credit, a failure), nothing
    visible None (unscored: a failure), anything else 0."""
    def reward(prompts, completions, allowed, **kwargs):
        out = []
        for completion, ok in zip(completions, allowed):
            first = first_visible_char(completion_text(completion))
            if not first:
                out.append(None)
            elif first in ok:
                out.append(0.7 if first.isdigit() else 1.0)
            else:
                out.append(0.4 if first.isdigit() else 0.0)
        log.append(out)
        return out
    return reward


def row_key(batch, i):
    return tuple(batch["prompt_ids"][i].tolist()), tuple(batch["completion_ids"][i].tolist())


def test_each_completion_keeps_its_groups_counts_through_trls_shuffle_and_split(tiny_model, tmp_path):
    """Two generation batches of 4 prompts x 4 completions, each shuffled and split into steps_per_generation = 4
    micro-batches by TRL: every micro-batch row carries the (c, k, success) of its own prompt's group, recounted here
    from the rewards grouped by prompt (not by TRL's block layout)."""
    rewards_log, generations, micro_batches = [], [], []
    trainer = make_trainer(tiny_model, trl_args(tmp_path, max_steps=8, per_device_train_batch_size=4),
                           reward=graded_reward(rewards_log),
                           sizes=(1, 10, 24, 36, 3, 16, 30, 35))
    generate, compute = trainer._generate_and_score_completions, trainer._compute_loss

    def spy_generate(inputs):
        out = generate(inputs)
        generations.append({key: out[key].clone() for key in ("prompt_ids", "prompt_mask", "completion_ids")})
        generations[-1]["rewards"] = list(rewards_log[-1])
        return out

    def spy_compute(model, inputs):
        micro_batches.append({key: inputs[key].clone() for key in
                              ("prompt_ids", "completion_ids", NUM_CORRECT_KEY, GROUP_SIZE_KEY, SUCCESS_KEY)})
        return compute(model, inputs)

    trainer._generate_and_score_completions, trainer._compute_loss = spy_generate, spy_compute
    trainer.train()

    assert len(generations) == 2 and len(micro_batches) == 8
    counts_seen, shuffled, scores = set(), False, set()
    for g, gen in enumerate(generations):
        n = len(gen["rewards"])
        assert n == 16
        success = [r is not None and r > 0.5 for r in gen["rewards"]]
        scores |= {r for r in gen["rewards"]}
        prompt_of = [tuple(gen["prompt_ids"][i][gen["prompt_mask"][i].bool()].tolist()) for i in range(n)]
        expected = {}
        for i in range(n):
            members = [j for j in range(n) if prompt_of[j] == prompt_of[i]]
            value = (sum(success[j] for j in members), len(members), success[i])
            assert expected.setdefault(row_key(gen, i), value) == value  # duplicates agree (same text, same reward)
            counts_seen.add(value[0])
        order = []
        for mb in micro_batches[4 * g: 4 * g + 4]:
            assert mb[NUM_CORRECT_KEY].shape[0] == 4
            for i in range(4):
                key = row_key(mb, i)
                got = (mb[NUM_CORRECT_KEY][i].item(), mb[GROUP_SIZE_KEY][i].item(), bool(mb[SUCCESS_KEY][i]))
                assert got == expected[key], (g, i)
                order.append(key)
        shuffled |= order != [row_key(gen, i) for i in range(n)]
    assert shuffled, "TRL's shuffle left every row in place: the test did not exercise it"
    assert len(counts_seen) >= 3, counts_seen  # groups with different success counts
    assert scores & {0.4, 0.7}, scores  # rewards that are not 0/1 (partial credit under and over the threshold)


# --- configuration errors and warnings ----------------------------------------------------------------------------

@pytest.mark.parametrize("loss_type, why", [("cispo", "cap on the importance weight"), ("sapo", "soft gate"),
                                             ("vespo", "no clip")])
def test_loss_types_that_give_epsilon_another_meaning_are_refused(tmp_path, loss_type, why):
    with pytest.raises(ValueError, match=rf"loss_type='{loss_type}'.*{why}.*grpo, bnpo, dr_grpo, dapo, luspo"):
        trl_args(tmp_path, loss_type=loss_type)


@pytest.mark.parametrize("overrides, source", [
    ({"gapo": GAPOConfig(eps_high_max=0.1)}, r"gapo.eps_high_max=0.1 .*below epsilon=0.2"),
    ({"gapo": {"eps_high_max": None}, "epsilon_high": 0.15}, r"epsilon_high=0.15 .*below epsilon=0.2"),
])
def test_eps_high_max_below_the_lower_clip_is_refused(tmp_path, overrides, source):
    with pytest.raises(ValueError, match=source):
        trl_args(tmp_path, **overrides)


@pytest.mark.parametrize("gapo, match", [
    ({"eps_hi": 0.3}, r"unknown keys \['eps_hi'\].*eps_high_max"),
    ("{not json", "is not JSON"),
    ({"schedule": "cosine"}, "not a GAPO schedule"),
    ({"mask_truncated": True}, "mask_truncated_completions=True"),
    (7, "pass a gapo.GAPOConfig"),
])
def test_bad_gapo_settings_name_the_value_and_the_fix(tmp_path, gapo, match):
    with pytest.raises(ValueError, match=match):
        trl_args(tmp_path, gapo=gapo)


@pytest.mark.parametrize("exploration, match", [
    ({"entrance_tokens": 0}, r"exploration.entrance_tokens=0: .*integer >= 1; set e.g. exploration.entrance_tokens=8"),
    ({"coverage_window": 0}, r"exploration.coverage_window=0: .*integer >= 1; set e.g. exploration.coverage_window=20"),
    ({"coverage_threshold": 1.0}, r"exploration.coverage_threshold=1.0: a solve rate in \[0, 1\).*"
                                  r"set e.g. exploration.coverage_threshold=0.05"),
    ('{"coverage_threshold": -0.1}', r"exploration.coverage_threshold=-0.1: .*set e.g."),
    ({"entrance_token": 4}, r"unknown keys \['entrance_token'\]; the exploration settings are \['entrance_tokens', "
                            r"'entrance_until_newline', 'coverage_window', 'coverage_threshold'\]"),
    ("{not json", "is not JSON"),
    (7, "pass a gapo.exploration.ExplorationConfig"),
])
def test_bad_exploration_settings_name_the_key_and_the_fix(tmp_path, exploration, match):
    with pytest.raises(ValueError, match=match):
        trl_args(tmp_path, exploration=exploration)


def test_gapo_settings_from_a_command_line_and_to_wandb(tmp_path):
    from transformers import HfArgumentParser

    (args,) = HfArgumentParser(GAPOTRLConfig).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--use_cpu", "--num_generations", "4", "--per_device_train_batch_size", "4",
         "--steps_per_generation", "4", "--epsilon_high", "0.3",
         "--gapo", '{"schedule": "exp", "success_threshold": 0.9}',
         "--exploration", '{"entrance_tokens": 4, "coverage_window": 5}'])
    assert args.gapo == GAPOConfig(schedule="exp", success_threshold=0.9)
    assert args.exploration == ExplorationConfig(entrance_tokens=4, coverage_window=5)
    recorded = json.loads(args.to_json_string())  # what W&B records serialises
    assert recorded["gapo"]["schedule"] == "exp" and recorded["exploration"]["entrance_tokens"] == 4
    assert gapo_settings(None) == GAPOConfig() and exploration_settings(None) == ExplorationConfig()


def test_on_policy_setup_warns_that_no_clip_can_bind(tmp_path):
    with pytest.warns(UserWarning, match="on-policy setup.*ratio is exactly 1"):
        trl_args(tmp_path, steps_per_generation=None, gradient_accumulation_steps=2)  # TRL's default: spg = GA
    with pytest.warns(UserWarning, match="on-policy"):
        trl_args(tmp_path, steps_per_generation=2, gradient_accumulation_steps=4)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        trl_args(tmp_path, steps_per_generation=2, gradient_accumulation_steps=1, num_iterations=1)
        trl_args(tmp_path, steps_per_generation=2, gradient_accumulation_steps=2, num_iterations=2)


def test_a_plain_grpo_config_is_refused_with_the_fix(tiny_model, tmp_path):
    with pytest.raises(TypeError, match="GAPOTRLConfig"):
        GAPOGRPOTrainer(model=str(tiny_model), reward_funcs=smoke_reward,
                        args=GRPOConfig(output_dir=str(tmp_path), use_cpu=True, num_generations=4,
                                        per_device_train_batch_size=4))


def test_bf16_log_probs_and_small_clips_warn(tiny_model, tmp_path):
    import warnings

    from transformers import AutoModelForCausalLM

    args = dict(epsilon=3e-3, epsilon_high=None, gapo=GAPOConfig(eps_high_max=5e-3),
                importance_sampling_level="sequence", loss_type="grpo")

    def bf16_model():
        return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16)

    with pytest.warns(UserWarning, match="bfloat16.*cast_lm_head_to_fp32=True"):
        make_trainer(tiny_model, trl_args(tmp_path, **args), model=bf16_model())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        make_trainer(tiny_model, trl_args(tmp_path, cast_lm_head_to_fp32=True, **args), model=bf16_model())
        # clips of 0.2 / 0.28 are coarser than bf16's spacing: no warning
        make_trainer(tiny_model, trl_args(tmp_path), model=bf16_model())


def test_cpu_training_runs_in_float32_unless_bf16_is_asked_for(tiny_model, tmp_path, monkeypatch):
    import gapo.integrations.trl as integration

    assert trl_args(tmp_path).bf16 is False  # TRL alone resolves an unset bf16 to True, on CPU too
    assert GRPOConfig(output_dir=str(tmp_path), use_cpu=True, num_generations=4,
                      per_device_train_batch_size=4).bf16 is True  # (what the default replaces)
    asked = trl_args(tmp_path, bf16=True, epsilon=3e-3, epsilon_high=None, gapo=GAPOConfig(eps_high_max=5e-3),
                     importance_sampling_level="sequence", loss_type="grpo")
    assert asked.bf16 is True
    # a float32 model under bf16 autocast computes its LM head's tiles in bf16: too coarse for clips of 3e-3
    with pytest.warns(UserWarning, match="bfloat16.*bf16=False"):
        make_trainer(tiny_model, asked)
    assert integration.on_cpu(argparse.Namespace(use_cpu=True))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not integration.on_cpu(argparse.Namespace(use_cpu=False))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if getattr(torch, "xpu", None) is not None:
        monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert integration.on_cpu(argparse.Namespace(use_cpu=False))


def test_imports_without_verl():
    code = ("import sys; sys.modules['verl'] = None\n"  # any `import verl` now fails
            "import gapo.integrations.trl as m\n"
            "assert not [name for name in sys.modules if name.startswith('verl.')], 'verl was imported'\n"
            "print(m.GAPOGRPOTrainer.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0 and "GAPOGRPOTrainer" in out.stdout, out.stderr[-3000:]


# --- exploration instruments and group metrics, recounted ----------------------------------------------------------

def expected_generation(rows, m, newline_ids, threshold=0.05, success_threshold=0.5):
    """One generation batch's sums and groups, recounted from its rows [prompt ids, completion ids, reward, advantage]
    (every process's, in any order): groups by prompt (not TRL's block layout), first moves from the full completion.
    Returns (entrance and coverage sums, prompts seen, prompts covered, prompts, success, positive)."""
    prompts = [tuple(prompt) for prompt, *_ in rows]
    success = [reward is not None and reward > success_threshold for _, _, reward, _ in rows]
    moves = [first_move(completion, m, newline_ids) for _, completion, _, _ in rows]
    include = [True] * len(rows)
    sums, seen, above = rollout_sums(prompts, prompts, moves, success, include, threshold)
    return sums, seen, above, prompts, success, [adv > 0 for *_, adv in rows]


def expected_group_metrics(generations, clips, schedule="linear"):
    """`group_metrics` over the groups of several generation batches at once (each batch's prompts its own groups)."""
    uids, success, positive = [], [], []
    for g, (_, _, _, prompts, ok, pos) in enumerate(generations):
        uids += [(g, p) for p in prompts]
        success += ok
        positive += pos
    stats = group_statistics(uids, torch.tensor(success))
    thresholds = lambda c, k: adaptive_eps_high(c, k, *clips, schedule)  # noqa: E731
    return group_metrics(stats, torch.tensor(positive), torch.ones(len(uids), dtype=torch.bool), thresholds)


def expected_entropy(micro_batches):
    """{entropy_success, entropy_failure, entropy_success/c{c}} over the rows [..., c, k, success, entropies] of the
    micro-batches (every process's), token-weighted, in float64."""
    sums: dict[str, list[float]] = {}
    for rows in micro_batches:
        for *_, c, _, ok, entropies in rows:
            for key in (["success", f"success/c{int(c)}"] if ok else ["failure"]):
                sums.setdefault(key, []).extend(entropies)
    return {f"gapo/explore/entropy_{key}": math.fsum(v) / len(v) for key, v in sums.items() if v}


# float32 values (the loss's entropies, row by row; eps_high, which group_metrics averages in float32); the others are
# ratios of counts, in float64
FLOAT32_METRICS = ("gapo/explore/entropy", "gapo/eps_high/")


def assert_logged(logged: dict, expected: dict, prefix=""):
    """Every expected metric is logged (under `prefix`) with its value (to float32's or float64's rounding,
    FLOAT32_METRICS), and no other metric of their families is."""
    for name, value in expected.items():
        rel = 1e-6 if name.startswith(FLOAT32_METRICS) else 1e-12
        assert logged.get(prefix + name) == pytest.approx(value, rel=rel, abs=rel), name
    families = tuple(prefix + f for f in ("gapo/explore/", "gapo/groups/", "gapo/eps_high/")
                     if any(name.startswith(f) for name in expected))
    extra = [k for k in logged if k.startswith(families) and k[len(prefix):] not in expected]
    assert not extra, extra


def test_evaluation_logs_exploration_and_group_metrics_recounted(tiny_model, tmp_path):
    """trainer.evaluate() on 8 prompts x num_generations_eval = 2 (two eval batches of 4 prompts; first moves of 2
    tokens ending at a newline, every token one here; coverage above c / k = 0.5; top_k=3, so first moves repeat):
    eval_gapo/explore/* (entrance, coverage, window, entropy), eval_gapo/groups/* and eval_gapo/eps_high/* equal a
    recount over both batches' generations and the loss's entropies; the diagnostics are logged too."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from recipe.trl_smoke import prompt_rows

    log, generations, micro_batches, entropies = [], [], [], []
    args = trl_args(tmp_path, num_generations_eval=2, per_device_eval_batch_size=8, top_k=3,
                    exploration={"entrance_tokens": 2, "entrance_until_newline": True, "coverage_threshold": 0.5})
    trainer = make_trainer(tiny_model, args, reward=graded_reward(log))
    assert trainer._gapo_newline_ids == frozenset(AutoTokenizer.from_pretrained(tiny_model).encode("\n"))
    # the tiny model seldom writes a newline: let every id end a first move, which then is the first token alone
    every_id = frozenset(range(len(trainer.processing_class)))
    trainer._gapo_newline_ids = every_id
    generate, compute, forward = (trainer._generate_and_score_completions, trainer._compute_loss,
                                  trainer._get_per_token_logps_and_entropies)

    def real_ids(batch, key, i):
        mask = batch["prompt_mask" if key == "prompt_ids" else "completion_mask"][i].bool()
        return batch[key][i][mask].tolist()

    def spy_generate(inputs):
        out = generate(inputs)
        generations.append([[real_ids(out, "prompt_ids", i), real_ids(out, "completion_ids", i), log[-1][i],
                             out["advantages"][i].item()] for i in range(out["completion_ids"].shape[0])])
        return out

    def spy_forward(*a, **kw):
        out = forward(*a, **kw)
        if kw.get("compute_entropy"):
            entropies.append(out[1].clone())
        return out

    def spy_compute(model, inputs):
        loss = compute(model, inputs)
        (entropy,) = entropies
        entropies.clear()
        real = inputs["completion_mask"].bool()
        micro_batches.append([[inputs[NUM_CORRECT_KEY][i].item(), inputs[GROUP_SIZE_KEY][i].item(),
                               bool(inputs[SUCCESS_KEY][i]), entropy[i][real[i]].tolist()]
                              for i in range(real.shape[0])])
        return loss

    trainer._generate_and_score_completions, trainer._compute_loss = spy_generate, spy_compute
    trainer._get_per_token_logps_and_entropies = spy_forward
    metrics = trainer.evaluate(eval_dataset=Dataset.from_list(prompt_rows((1, 10, 24, 36, 3, 16, 30, 35))))

    assert [len(g) for g in generations] == [8, 8]  # two eval batches of 4 prompts x 2
    assert all(k == 2 for rows in micro_batches for _, k, _, _ in rows)
    recount = [expected_generation(rows, 2, every_id, threshold=0.5) for rows in generations]
    two_tokens = [expected_generation(rows, 2, None, threshold=0.5)[0] for rows in generations]
    assert sum(s["entrance/distinct_frac"] for s in two_tokens) > sum(s["entrance/distinct_frac"] for s, *_ in recount)
    window = CoverageWindow(20)
    for _, seen, above, *_ in recount:
        expected_window = window.add(seen, above)
    sums: dict = {}
    for part, *_ in recount:
        add_sums(sums, part)
    expected = {**exploration_metrics(sums), **expected_window, **expected_entropy(micro_batches)}
    expected.update(expected_group_metrics(recount, (EPS_LOW, EPS_MAX)))
    assert_logged(metrics, expected, prefix="eval_")
    assert {"eval_gapo/explore/entrance_distinct", "eval_gapo/explore/coverage_frac", "eval_gapo/groups/mixed_frac",
            "eval_gapo/explore/entropy_failure", "eval_gapo/explore/coverage_window"} <= set(metrics)
    assert "eval_gapo/is_adv_corr_levels" in metrics  # the clip diagnostics of evaluation, beside them
    assert not any(k.startswith("gapo/") for k in metrics)  # nothing under the training names
    # not trivial: groups with successes, and a threshold (c / k above 0.5) that leaves c = 1 of 2 uncovered
    assert metrics["eval_gapo/groups/mixed_frac"] + metrics["eval_gapo/groups/all_correct_frac"] > 0
    assert metrics["eval_gapo/groups/size_mean"] == 2


# --- end to end: TRL's real trainer on the smoke task ------------------------------------------------------------

def test_tiny_model_trains_with_trl_and_logs_gapo_metrics_to_wandb(tiny_model, tmp_path, monkeypatch):
    """The smoke task's tiny model, TRL's real trainer, W&B offline: at both levels the adaptive clip binds at least
    once (its per-c clip fraction is above 0 in a logged step), and the gapo/* metrics reach TRL's logs and W&B."""
    import wandb

    from recipe.plot_run import main as plot_run
    from recipe.plot_run import read_wandb_run
    from tests.test_plot_run import wait_for_exit_record

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "gapo-trl-test")
    try:
        for level, eps in SMOKE_CLIPS.items():
            monkeypatch.setenv("WANDB_RUN_ID", f"trl{level}")
            args = smoke_args(tmp_path / level, level, steps=8, report_to=["wandb"], run_name=f"trl-{level}")
            trainer = make_trainer(tiny_model, args, sizes=PROMPT_SET_SIZES)
            trainer.train()
            assert summarize(trainer.state.log_history)[1] == [], level
            logged = [h for h in trainer.state.log_history if "gapo/is_adv_corr_levels" in h]
            assert len(logged) == 8, level  # every optimizer step (logging_steps=1)
            clipfracs = [v for h in logged for k, v in h.items() if k.startswith("gapo/clipfrac_pos/c")]
            assert max(clipfracs) > 0, (level, clipfracs)
            bounds = [h["gapo/loss_eps_high_mean"] for h in logged if "gapo/loss_eps_high_mean" in h]
            assert len(bounds) >= 6 and all(eps[0] <= b <= eps[1] for b in bounds), bounds
            for h in logged:
                assert all(0 <= v <= 1 for k, v in h.items() if k.startswith("gapo/clipfrac_pos"))
            assert any("gapo/is_adv_corr_window_points" in h for h in logged)
            wandb.finish()
            wandb.teardown()  # then wait for the log's closing record (wandb-core may still be writing it)
            (run_file,) = tmp_path.glob(f"wandb/offline-run-*-trl{level}/run-trl{level}.wandb")
            wait_for_exit_record(run_file)
            steps, info = read_wandb_run(run_file)  # re-keyed by TRL's optimizer step, without train/
            assert info["name"] == f"trl-{level}" and sorted(steps) == list(range(1, 9))
            assert max(v for m in steps.values() for k, v in m.items() if k.startswith("gapo/clipfrac_pos/c")) > 0
            assert all(not math.isnan(v) for m in steps.values() for v in m.values() if isinstance(v, float))
            png = tmp_path / f"{level}.png"
            plot_run([str(run_file.parent), "--out", str(png)])
            assert png.stat().st_size > 10_000
    finally:
        wandb.teardown()


def test_trl_smoke_cli_trains_and_checks(tmp_path):
    """The CLI (make smoke-trl SMOKE_TRL_ARGS=...): a KEY=VALUE setting reaches TRL (lr_scheduler_type=constant: the
    logged learning rate stays 1e-2; TRL's default decays it), every logged step lands in OUT/logs/metrics.jsonl, which
    the last line names and recipe.plot_run reads (the same steps and values as the printed table, TRL's reward in the
    reward panel)."""
    from recipe.plot_run import REWARD_KEY, load_run
    from recipe.plot_run import main as plot_run

    out = subprocess.run([sys.executable, "-m", "recipe.trl_smoke", "--out", str(tmp_path), "--level", "token",
                          "lr_scheduler_type=constant", "--steps", "4"],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = tmp_path / "logs" / "metrics.jsonl"
    assert out.stdout.splitlines()[-1] == (f"OK: GAPO trained 4 steps with TRL's GRPOTrainer at token level; metrics: "
                                           f"{metrics} (make plot-run RUN_DIRS={tmp_path})")
    table = [line for line in out.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert len(table) == 4 and any("c" in line and "=0." in line for line in table), out.stdout
    assert "H_succ" in out.stdout  # the exploration columns (summarize fails a step that logged none)
    assert table[0].split()[5] != "-" and table[0].split()[7] != "-"  # the generating step's entrance and window

    run = load_run(tmp_path)
    assert run.kind == "file logger" and run.files == [metrics] and sorted(run.steps) == [1, 2, 3, 4]
    assert all(run.steps[step]["learning_rate"] == 1e-2 for step in run.steps)
    for line in table:  # the file holds what the table printed
        step, reward, eps_high, *_ = line.split()
        m = run.steps[int(step)]
        assert f"{m['gapo/loss_eps_high_mean']:.4f}" == eps_high
        assert (f"{m[REWARD_KEY]:.3f}" if REWARD_KEY in m else "-") == reward
        by_c = {f"c{k.rsplit('c', 1)[1]}={v:.2f}" for k, v in m.items() if k.startswith("gapo/clipfrac_pos/c")}
        assert by_c == {cell for cell in line.split() if cell.startswith("c") and "=" in cell}
    png = tmp_path / "curves.png"
    plot_run([str(tmp_path), "--out", str(png)])
    assert png.stat().st_size > 10_000


def test_trl_smoke_settings_from_key_value_pairs(tmp_path):
    """KEY=VALUE: TRL's fields typed by their defaults, gapo.<key> and exploration.<key> added to the smoke's own
    settings (its eps_high_max and one-token first moves stay); refusals name the fix."""
    from recipe.trl_smoke import SMOKE_EXPLORATION, parse_overrides

    overrides = parse_overrides(["learning_rate=5e-3", "num_generations=8", "loss_type=bnpo", "run_name=7",
                                 "use_cpu=true", "gapo.schedule=exp", "exploration.coverage_window=4",
                                 "epsilon_high=null", "per_device_train_batch_size=16"])
    assert overrides == {"learning_rate": 5e-3, "num_generations": 8, "loss_type": "bnpo", "run_name": "7",
                         "use_cpu": True, "gapo": {"schedule": "exp"}, "exploration": {"coverage_window": 4},
                         "epsilon_high": None, "per_device_train_batch_size": 16}
    args = smoke_args(tmp_path, "sequence", **overrides)
    assert (args.learning_rate, args.num_generations, args.loss_type, args.run_name) == (5e-3, 8, "bnpo", "7")
    assert args.gapo == GAPOConfig(eps_high_max=SMOKE_CLIPS["sequence"][1], schedule="exp")
    assert args.exploration == ExplorationConfig(**{**SMOKE_EXPLORATION, "coverage_window": 4})

    for pairs, match in [
        (["learnig_rate=0.1"], "learnig_rate is not a setting of the TRL smoke run.*did you mean learning_rate"),
        (["gapo.shedule=exp"], "did you mean gapo.schedule"),
        (["max_steps=3"], "max_steps is set by --steps"),
        (["output_dir=/tmp/x"], "output_dir is set by --out"),
        (["learning_rate=fast"], "learning_rate takes a number"),
        (["use_cpu=1"], "use_cpu takes true or false"),
        (["learning_rate"], "is not KEY=VALUE"),
    ]:
        with pytest.raises(ValueError, match=match):
            parse_overrides(pairs)
    # values TRL's own checks would divide by (ZeroDivisionError, TypeError): refused by GAPOTRLConfig with the fix
    for setting, match in [({"num_generations": 0}, "num_generations must be >= 2"),
                           ({"num_generations": None}, "num_generations must be >= 2"),
                           ({"steps_per_generation": 0}, "steps_per_generation must be >= 1"),
                           ({"gapo": {"eps_high_max": "abc"}}, "eps_high_max must be a finite number >= 0 or null"),
                           ({"gapo": {"success_threshold": "x"}}, "success_threshold must be finite")]:
        with pytest.raises(ValueError, match=match):
            smoke_args(tmp_path, "sequence", **setting)


def test_trl_smoke_cli_refuses_bad_settings_before_it_trains(tmp_path):
    for argv, message in [(["learnig_rate=0.1"], "did you mean learning_rate"),
                          (["gapo.schedule=cosine"], "the settings do not make a run: GAPOTRLConfig.gapo: "
                                                     "policy_loss.schedule='cosine' is not a GAPO schedule")]:
        proc = subprocess.run([sys.executable, "-m", "recipe.trl_smoke", "--out", str(tmp_path), *argv],
                              capture_output=True, text=True, cwd=REPO, timeout=300)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "tiny").exists()  # nothing was built


def test_metrics_file_callback_writes_verls_file_logger_format(tmp_path):
    """One {"step", "data"} line per log: numbers only, NaN/inf as null; the first log starts the file afresh, later
    ones append; other processes write nothing."""
    from types import SimpleNamespace

    from gapo.integrations.trl import MetricsFileCallback
    from recipe.plot_run import is_file_logger_file, read_file_logger

    path = tmp_path / "logs" / "metrics.jsonl"
    path.parent.mkdir()
    path.write_text("stale\n")
    callback = MetricsFileCallback(path)
    main, other = SimpleNamespace(is_world_process_zero=True, global_step=1), SimpleNamespace(is_world_process_zero=0)
    callback.on_log(None, main, None, logs={"loss": 0.5, "gapo/clipfrac_pos/c1": float("nan"), "note": "text",
                                            "flag": True, "grad_norm": float("inf")})
    callback.on_log(None, other, None, logs={"loss": 9.0})
    main.global_step = 2
    callback.on_log(None, main, None, logs={"loss": 0.25, "reward": 0.75})
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == [{"step": 1, "data": {"loss": 0.5, "gapo/clipfrac_pos/c1": None, "grad_norm": None}},
                    {"step": 2, "data": {"loss": 0.25, "reward": 0.75}}]
    assert is_file_logger_file(path) and read_file_logger(path) == {1: {"loss": 0.5}, 2: {"loss": 0.25, "reward": 0.75}}


def test_summary_fails_a_run_whose_clip_never_bound_or_that_logged_no_diagnostics():
    steps = [{"step": 1, "loss": 0.1, "reward": 0.5, "gapo/is_adv_corr_levels": 2.0, "gapo/clipfrac_pos/c1": 0.0,
              "gapo/explore/entropy_success": 3.25, "gapo/explore/entropy_failure": 3.5,
              "gapo/explore/entrance_distinct": 0.75, "gapo/explore/coverage_frac": 0.5,
              "gapo/explore/coverage_window": 6.0},
             {"step": 2, "loss": 0.1, "reward": 0.5, "gapo/is_adv_corr_levels": 1.0, "gapo/clipfrac_pos/c3": 0.0,
              "gapo/explore/entropy_failure": 3.125}]
    assert summarize(steps)[1] == ["the adaptive clip never bound (every gapo/clipfrac_pos/c* was 0)"]
    steps[1]["gapo/clipfrac_pos/c3"] = 0.25
    lines, problems = summarize(steps)
    assert problems == [] and "c3=0.25" in lines[2]
    assert lines[0].split()[3:8] == ["H_succ", "H_fail", "distinct", "cover", "window"]
    assert lines[1].split()[3:8] == ["3.250", "3.500", "0.750", "0.500", "6"]
    assert lines[2].split()[3:8] == ["-", "3.125", "-", "-", "-"]  # a step that did not generate: its entropy only
    del steps[0]["gapo/is_adv_corr_levels"]
    assert summarize(steps)[1] == ["step 1 logged no gapo/* diagnostics"]
    del steps[1]["gapo/explore/entropy_failure"]
    assert summarize(steps)[1] == ["step 1 logged no gapo/* diagnostics", "step 2 logged no gapo/explore/* instruments"]
    assert summarize([])[1] == ["no training step was logged"]


def test_the_trl_environment_is_installed_by_make_and_pinned():
    makefile = (REPO / "Makefile").read_text()
    assert "$(TRL_PY) -m pip install -q -e '.[trl,dev]'" in makefile
    assert "-e '.[dev]'" in makefile and "-e '.[dev,trl]'" not in makefile  # .venv stays without trl
    assert 'trl = ["trl==1.16.0"]' in (REPO / "pyproject.toml").read_text()
    from importlib.metadata import version

    assert version("trl") == "1.16.0"


def test_verl_cannot_build_its_actor_where_trl_1_is_installed_and_preflight_says_so(tiny_model):
    """Why TRL has its own environment: verl 0.9.1's apply_monkey_patch imports trl's AutoModelForCausalLMWithValueHead
    whenever trl is importable, and trl 1.16.0 has none. The verl driver's preflight stops such a run first. If a verl
    upgrade stops importing it, this test fails: TRL could then share the default environment."""
    from transformers import AutoModelForCausalLM
    from verl.models.transformers.monkey_patch import apply_monkey_patch

    from gapo.verl_plugin.preflight import check_trl_conflict

    with pytest.raises(ImportError, match="AutoModelForCausalLMWithValueHead"):
        apply_monkey_patch(model=AutoModelForCausalLM.from_pretrained(tiny_model))
    (problem,) = check_trl_conflict()
    assert problem.startswith("trl 1.16.0 is installed here") and "make install-trl" in problem


def test_two_processes_carry_the_global_groups_and_reduce_the_sums(tiny_model, tmp_path):
    """World size 2 (torchrun, gloo on CPU): TRL gathers the rewards of both processes and each keeps its own rows.
    Every micro-batch row on either rank carries the (c, k, success) of its prompt's group counted over both ranks'
    rewards (a rank that took the other's slice, or counted its own rows only, fails), and the logged gapo/* values,
    reduced over the processes, are the same on both ranks.

    The exploration instruments after TRL's shuffle and split: each step's gapo/explore/entropy_* equal a recount from
    the entropies of the loss's forward pass on both ranks' micro-batches of that step; in the steps that generated,
    the entrance (first moves of 2 tokens, ending at a newline), coverage and window metrics, gapo/groups/* and
    gapo/eps_high/* equal a recount over both ranks' generation records (before the shuffle), grouped by prompt."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = REPO / "tests" / "trl_integration" / "trl_world_size_run.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false",
           "WANDB_MODE": "disabled"}
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                          "127.0.0.1", "--master_port", str(port), str(script), str(tmp_path), str(tiny_model)],
                         capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert len(ranks[0]["generations"]) == len(ranks[1]["generations"]) == 2  # 4 steps, a generation every 2
    counts = set()
    for g in range(2):
        rows = ranks[0]["generations"][g] + ranks[1]["generations"][g]
        assert len(rows) == 16  # 4 prompts x 4 completions over both ranks, 8 each
        success = [reward is not None and reward > 0.5 for _, _, reward, _ in rows]
        members: dict[tuple, list[int]] = {}
        for i, (prompt, *_) in enumerate(rows):
            members.setdefault(tuple(prompt), []).append(i)
        expected = {}
        for i, (prompt, completion, *_) in enumerate(rows):
            group = members[tuple(prompt)]
            value = (sum(success[j] for j in group), len(group), success[i])
            assert expected.setdefault((tuple(prompt), tuple(completion)), value) == value
            counts.add(value[0])
        for rank in ranks:
            for batch in rank["micro_batches"][2 * g: 2 * g + 2]:
                assert len(batch) == 4
                for prompt, completion, c, k, ok, _ in batch:
                    assert (c, k, ok) == expected[(tuple(prompt), tuple(completion))]
    assert len(counts) >= 2, counts
    assert ranks[0]["logged"] and ranks[0]["logged"] == ranks[1]["logged"]

    # the exploration instruments and group metrics, step by step (logging_steps=1; a generation every 2 steps)
    from transformers import AutoTokenizer

    newline_ids = AutoTokenizer.from_pretrained(tiny_model).encode("\n")
    assert len(newline_ids) == 1 and ranks[0]["newline_ids"] == newline_ids  # the tiny vocabulary's one newline
    logged = ranks[0]["logged"]
    assert [h["step"] for h in logged] == [1, 2, 3, 4]
    window = CoverageWindow(20)
    for step, h in enumerate(logged, start=1):
        expected = expected_entropy([rank["micro_batches"][step - 1] for rank in ranks])
        if step % 2 == 1:  # this step's batch was generated: its entrance, coverage, window and group metrics
            rows = ranks[0]["generations"][step // 2] + ranks[1]["generations"][step // 2]
            recount = expected_generation(rows, 2, set(newline_ids))
            expected.update(exploration_metrics(recount[0]))
            expected.update(window.add(recount[1], recount[2]))
            expected.update(expected_group_metrics([recount], SMOKE_CLIPS["token"]))
            assert "gapo/explore/coverage_window_seen" in h and "gapo/groups/success_rate_mean" in h
        else:
            assert not any(k.startswith(("gapo/groups/", "gapo/eps_high/")) for k in h), h
        assert_logged(h, expected)
    assert logged[2]["gapo/explore/coverage_window_steps"] == 2  # the window pools both generation batches
    # not trivial: the run samples with top_k=3, so first moves repeat within groups (a grouping error would show)
    assert min(h["gapo/explore/entrance_distinct"] for h in logged[::2]) < 1

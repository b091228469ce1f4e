"""GAPO inside verl's real FSDP actor update on CPU with the tiny model, without Ray or the full trainer.

The helper (tests/actor_update_cpu_run.py) runs in a fresh process (the CPU platform's env vars must be set
before `import verl`), builds the actor as verl's trainer workers do (`ActorRolloutRefWorker(role="actor")
.init_model()`: TrainingWorker, FSDP2 engine, AdamW), installs `GAPOActorLoss` with `set_loss_fn` and runs real
actor updates (`update_actor` -> `train_mini_batch` -> `train_batch`); the worker's metrics go through what the
trainer does with them (verl's `rename_dict` + `reduce_metrics`, then `diagnostics_from_sums`).

Behaviour cases: every rollout gets the same ratio shift (1.15) and a positive advantage; half the rollouts
come from c = 1 groups, half from c = k - 1 = 7 groups (k = 8). With eps_low = 0.02 and eps_high_max = 0.3,
GAPO's linear schedule gives c = 1 the bound 1.3 and c = 7 the bound 1.06, so 1.15 must be clipped for c = 7
only. The fixed clip (schedule=constant) treats both groups alike, whatever its value.

Exact-diagnostics cases (`ROWS` in the helper): every rollout has its own c, success flag, advantage, ratio
and (prompt, response) lengths, lr = 0 so the update cannot move a ratio, and the 8 rollouts form two
mini-batches of 4 (in order). The expected per-c sums, clip fractions, ratio deviations, mean advantages and
their correlation (gapo/is_adv_corr) are computed here from the row table alone,
and compared with verl's output for fixed micro-batches, dynamic batch sizes (one
micro-batch in mini-batch 1, four in mini-batch 2: the case where the old MEAN aggregation was biased) and
remove-padding (packed sequences), for loss modes gapo and gapo_token.
"""

import json
import math
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from gapo.smoke.tiny_model import build_tiny_model
from gapo.threshold import adaptive_eps_high
from tests.actor_update_cpu_run import (
    EXACT_LOSS_MODES,
    EXACT_MAX_TOKENS,
    EXACT_MICRO,
    EXACT_MINI_BATCH,
    ROWS,
    VARIANTS,
)

ROOT = Path(__file__).resolve().parents[1]
HELPER = ROOT / "tests" / "actor_update_cpu_run.py"
K, EPS_LOW, EPS_HIGH_MAX, RATIO = 8, 0.02, 0.3, 1.15
RATIO_TOL = 1e-5  # the update's forward vs the scoring forward, float32 on CPU (observed <= 3e-7)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    model = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    env = dict(
        os.environ, VERL_PLATFORM="cpu", VERL_ENGINE_DEVICE="cuda", TOKENIZERS_PARALLELISM="false",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1",
        LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", WANDB_MODE="disabled",
        # the helper imports this checkout's gapo (as this process does), not whichever one is installed
        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    proc = subprocess.run([sys.executable, str(HELPER), str(model)], cwd=ROOT, env=env, check=False,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"helper failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1][len("RESULT "):])


# --- behaviour cases -----------------------------------------------------------------------------------------

def test_premise_thresholds_and_engine(run):
    """The ratio sits between the two groups' bounds, and the update ran in verl's FSDP2 engine."""
    bound_c1, bound_c7 = (1 + float(adaptive_eps_high(c, K, EPS_LOW, EPS_HIGH_MAX)) for c in (1, K - 1))
    assert bound_c7 < RATIO < bound_c1
    assert run["delta_ratio"] == pytest.approx(RATIO)
    assert run["engine"].endswith("fsdp.transformer_impl.FSDPEngineWithLMHead")
    assert run["module"].startswith("FSDP")  # FSDP2's fully_shard wraps the HF class
    for case in run["cases"].values():
        assert case["config"]["rollout_n"] == K and case["config"]["clip_ratio_low"] == EPS_LOW
        metrics, diag = case["metrics"], case["diagnostics"]
        # Every rollout really had ratio 1.15 in the update: the train forward matches the scoring forward.
        assert metrics["actor/ppo_kl"] == pytest.approx(-math.log(RATIO), abs=RATIO_TOL)
        assert diag["gapo/ratio_dev_pos/c1"] == pytest.approx(RATIO - 1, abs=RATIO_TOL)
        assert diag["gapo/ratio_dev_pos/c7"] == pytest.approx(RATIO - 1, abs=RATIO_TOL)
        # Both groups reached the loss with their tokens; no other success count was reported.
        assert metrics["actor/gapo_sums/c1/tokens"] > 0 and metrics["actor/gapo_sums/c7/tokens"] > 0
        assert all(metrics[f"actor/gapo_sums/c{c}/tokens"] == 0 for c in (*range(2, K - 1), K))
        assert metrics["actor/gapo_sums/positive_rollouts"] > 0


@pytest.mark.parametrize("case", ["gapo_linear", "gapo_token_linear"])
def test_gapo_clips_c7_but_not_c1_under_the_same_ratio_shift(run, case):
    result = run["cases"][case]
    metrics, diag = result["metrics"], result["diagnostics"]
    assert result["config"]["schedule"] == "linear" and result["config"]["eps_high_max"] == EPS_HIGH_MAX
    # Rare successes (c = 1) keep their gradient; common ones (c = 7) are clipped, token for token.
    assert metrics["actor/gapo_sums/c1/clipped"] == 0
    assert metrics["actor/gapo_sums/c7/clipped"] == metrics["actor/gapo_sums/c7/tokens"] > 0
    assert diag["gapo/clipfrac_pos/c1"] == 0.0 and diag["gapo/clipfrac_pos/c7"] == 1.0
    assert 0 < metrics["actor/pg_clipfrac"] < 1  # verl's own clip fraction: exactly the c = 7 tokens
    # The loss used both thresholds (mean of 0.3 and 0.06 over equally many positive rollouts).
    assert diag["gapo/loss_eps_high_mean"] == pytest.approx((EPS_HIGH_MAX + EPS_LOW + (EPS_HIGH_MAX - EPS_LOW) / 7) / 2)
    # Gradient flowed (only c = 1 rollouts can carry it) and the weights moved: the c = 1 responses got likelier.
    assert metrics["actor/grad_norm"] > 0
    assert result["max_abs_logprob_change"]["c1"] > 1e-2


def test_fixed_clip_treats_both_groups_alike(run):
    """schedule=constant is the fixed asymmetric clip: the c-dependence disappears, at either bound."""
    narrow, wide = run["cases"]["constant_narrow"], run["cases"]["constant_wide"]
    assert narrow["config"]["schedule"] == wide["config"]["schedule"] == "constant"

    # Fixed clip at c = 7's GAPO bound (0.06): both groups clipped, so no gradient and no weight change at all.
    m, d = narrow["metrics"], narrow["diagnostics"]
    assert d["gapo/clipfrac_pos/c1"] == d["gapo/clipfrac_pos/c7"] == 1.0
    assert m["actor/gapo_sums/c1/clipped"] == m["actor/gapo_sums/c1/tokens"] > 0
    assert m["actor/pg_clipfrac"] == 1.0 and m["actor/grad_norm"] == 0.0
    assert narrow["max_abs_logprob_change"]["c1"] < 1e-6 and narrow["max_abs_logprob_change"]["c7"] < 1e-6

    # Fixed clip at c = 1's GAPO bound (0.3): neither group clipped; c = 7 rollouts now move as much as c = 1.
    m, d = wide["metrics"], wide["diagnostics"]
    assert d["gapo/clipfrac_pos/c1"] == d["gapo/clipfrac_pos/c7"] == 0.0
    assert m["actor/pg_clipfrac"] == 0.0 and m["actor/grad_norm"] > 0
    assert wide["max_abs_logprob_change"]["c7"] > 1e-2


def test_update_without_gapo_fields_fails_naming_the_fix(run):
    # GAPOActorLoss installed, but the batch lacks all of gapo_num_correct / gapo_group_size / gapo_success.
    err = run["missing_fields_gapo_loss_fn"]
    assert err["raised"] and err["chain"][0]["type"] == "RuntimeError", err
    message = err["chain"][0]["message"]
    assert all(key in message for key in ("gapo_num_correct", "gapo_group_size", "gapo_success")), message
    assert "trainer_mode=gapo" in message
    # Only the success flag missing (e.g. statistics written by an older trainer): named alone.
    err = run["missing_success_gapo_loss_fn"]
    assert err["raised"] and err["chain"][0]["type"] == "RuntimeError", err
    message = err["chain"][0]["message"]
    assert "gapo_success" in message and "gapo_num_correct" not in message and "gapo_group_size" not in message
    # verl's own loss fn (what init_model installs) with loss_mode=gapo: the registered loss stops with the fix.
    err = run["missing_fields_verl_loss_fn"]
    assert err["raised"] and err["chain"][0]["type"] == "RuntimeError", err
    assert "trainer.v1.trainer_mode=gapo" in err["chain"][0]["message"]


# --- exact diagnostics: the hand computation from the row table ------------------------------------------------

MINI_BATCHES = [list(range(i, i + EXACT_MINI_BATCH)) for i in range(0, len(ROWS), EXACT_MINI_BATCH)]
SUM_NAMES = ("clipped", "ratio_dev", "tokens", "rollouts", "advantage")


def bound(row) -> tuple[bool, float]:
    """(adaptive, eps_high): the adaptive bound only for a success with a positive advantage."""
    adaptive = row.success and row.advantage > 0
    return adaptive, float(adaptive_eps_high(row.num_correct, K, EPS_LOW, EPS_HIGH_MAX)) if adaptive else EPS_LOW


def clipped(row) -> bool:
    """Whether the clipped branch is active (for every token: token ratio = sequence ratio here)."""
    _, eps = bound(row)
    return row.ratio > 1 + eps if row.advantage > 0 else row.ratio < 1 - EPS_LOW


# (group size, success rate) buckets (gapo.rate_buckets), by hand for k = 8: k buckets 1 | 2 | 3-4 | 5-8 (ids
# 1 + 4 j + r), so every group here is in the k5-8 bucket (j = 3) and c / k in quarters: c = 1-2 | 3-4 | 5-6 | 7-8
KR_BUCKETS = 16
KR_RATES = ("0-0.25", "0.25-0.5", "0.5-0.75", "0.75-1")


def kr_id(c: int) -> int:
    return 1 + 4 * 3 + (c + 1) // 2 - 1


def expected_sums(rows) -> dict[str, float]:
    """The loss's raw sums (names without the `gapo_sums/` prefix) over `rows`, every c in 1..k reported, and every
    (k, rate) bucket's clipped and token counts."""
    sums = {f"c{c}/{name}": 0.0 for c in range(1, K + 1) for name in SUM_NAMES}
    sums.update({f"kr{b}/{name}": 0.0 for b in range(1, KR_BUCKETS + 1) for name in ("clipped", "tokens")})
    sums["eps_high_sum"] = sums["positive_rollouts"] = 0.0
    for row in rows:
        adaptive, eps = bound(row)
        if not adaptive:
            continue
        n = row.response_len
        sums[f"c{row.num_correct}/clipped"] += n * clipped(row)
        sums[f"c{row.num_correct}/ratio_dev"] += n * abs(row.ratio - 1)
        sums[f"c{row.num_correct}/tokens"] += n
        sums[f"c{row.num_correct}/rollouts"] += 1
        sums[f"c{row.num_correct}/advantage"] += n * row.advantage
        sums[f"kr{kr_id(row.num_correct)}/clipped"] += n * clipped(row)
        sums[f"kr{kr_id(row.num_correct)}/tokens"] += n
        sums["eps_high_sum"] += eps
        sums["positive_rollouts"] += 1
    return sums


def expected_diagnostics(rows) -> dict[str, float]:
    sums = expected_sums(rows)
    out = {"gapo/loss_eps_high_mean": sums["eps_high_sum"] / sums["positive_rollouts"]}
    for c in range(1, K + 1):
        if sums[f"c{c}/tokens"]:
            out[f"gapo/clipfrac_pos/c{c}"] = sums[f"c{c}/clipped"] / sums[f"c{c}/tokens"]
            out[f"gapo/ratio_dev_pos/c{c}"] = sums[f"c{c}/ratio_dev"] / sums[f"c{c}/tokens"]
            out[f"gapo/adv_pos/c{c}"] = sums[f"c{c}/advantage"] / sums[f"c{c}/tokens"]
    for r, rate in enumerate(KR_RATES):
        tokens = sums[f"kr{13 + r}/tokens"]
        if tokens:
            out[f"gapo/clipfrac_pos_kr/k5-8/rate{rate}"] = sums[f"kr{13 + r}/clipped"] / tokens
    # the paper's correlation across the c present (stdlib Pearson, independent of gapo.diagnostics)
    levels = [c for c in range(1, K + 1) if sums[f"c{c}/tokens"]]
    out["gapo/is_adv_corr_levels"] = float(len(levels))
    out["gapo/is_adv_corr"] = statistics.correlation([out[f"gapo/ratio_dev_pos/c{c}"] for c in levels],
                                                     [out[f"gapo/adv_pos/c{c}"] for c in levels])
    return out


def micro_mean(calls, per_call) -> list[float]:
    """verl's MEAN aggregation: per mini-batch the mean over its micro-batches, one value per mini-batch."""
    out = []
    for mini in MINI_BATCHES:
        values = [per_call(call) for call in calls if set(call["rows"]) <= set(mini)]
        out.append(sum(values) / len(values))
    return out


def token_mean(rows, value) -> float:
    """Token-weighted mean of value(row) over rows (what ppo_loss's per-micro-batch metrics compute)."""
    return sum(value(r) * r.response_len for r in rows) / sum(r.response_len for r in rows)


def test_exact_case_table_premise():
    """The table makes every rollout's (c, success, A) matter: margins to the bounds, and r7's eps_low."""
    eps = {c: float(adaptive_eps_high(c, K, EPS_LOW, EPS_HIGH_MAX)) for c in (1, 2, 3, 5, 7)}
    assert eps == pytest.approx({1: 0.30, 2: 0.26, 3: 0.22, 5: 0.14, 7: 0.06})
    for row in ROWS:
        _, e = bound(row)
        edge = 1 + e if row.advantage > 0 else 1 - EPS_LOW
        assert abs(row.ratio - edge) > 0.01, row  # far from the bound compared with RATIO_TOL
    # Row 0 (c = 1) and row 1 (c = 3) have the same ratio on opposite sides of their bounds; row 7 (a failure
    # with A > 0 in a c = 2 group) is clipped under eps_low but would not be under c = 2's bound.
    assert ROWS[0].ratio == ROWS[1].ratio and not clipped(ROWS[0]) and clipped(ROWS[1])
    assert clipped(ROWS[7]) and ROWS[7].ratio < 1 + eps[2] and not ROWS[7].success
    # The hand values: c1 6/7, c3 1 (2 tokens), c5 5/6, c7 1 (7 tokens), no c2 (its only rollout failed).
    exp = expected_diagnostics(ROWS)
    assert exp["gapo/clipfrac_pos/c1"] == pytest.approx(6 / 7)
    assert exp["gapo/ratio_dev_pos/c1"] == pytest.approx((1 * 0.25 + 6 * 0.35) / 7)
    assert exp["gapo/clipfrac_pos/c3"] == 1.0 and expected_sums(ROWS)["c3/tokens"] == 2
    assert exp["gapo/clipfrac_pos/c5"] == pytest.approx(5 / 6)
    assert exp["gapo/ratio_dev_pos/c5"] == pytest.approx((1 * 0.1 + 5 * 0.2) / 6)
    assert exp["gapo/clipfrac_pos/c7"] == 1.0 and expected_sums(ROWS)["c7/tokens"] == 7
    assert "gapo/clipfrac_pos/c2" not in exp
    assert exp["gapo/loss_eps_high_mean"] == pytest.approx((0.30 + 0.22 + 0.14 + 0.30 + 0.06 + 0.14) / 6)
    # One advantage per c here, (k - c) / k; the ratio deviations fall with c, so the correlation is high.
    assert [exp[f"gapo/adv_pos/c{c}"] for c in (1, 3, 5, 7)] == pytest.approx([0.875, 0.625, 0.375, 0.125])
    assert exp["gapo/is_adv_corr_levels"] == 4 and exp["gapo/is_adv_corr"] > 0.95
    # Mini-batch 1 is 12 tokens (one dynamic micro-batch), mini-batch 2 is 4 x 10 (four).
    assert [sum(ROWS[i].prompt_len + ROWS[i].response_len for i in mini) for mini in MINI_BATCHES] == [12, 40]
    assert max(r.prompt_len + r.response_len for r in ROWS) <= EXACT_MAX_TOKENS


def exact_result(run, variant, mode):
    result = run["exact"][variant]
    if "error" in result:  # every variant runs on CPU (remove-padding too, eager attention): an error is a failure
        pytest.fail(f"{variant} variant failed: {result['error']}\n{result['traceback']}")
    return result, result["modes"][mode]


# micro-batches of each mini-batch: fixed size 2 -> 2 + 2; dynamic (12 tokens) -> 1 + 4
EXPECTED_MICRO_COUNTS = {"fixed": [2, 2], "dynamic": [1, 4], "remove_padding": [1, 4]}
EXACT_CASES = [(v, m) for v in VARIANTS for m in EXACT_LOSS_MODES]


def test_exact_variants_cover_the_issue():
    assert set(VARIANTS) == set(EXPECTED_MICRO_COUNTS) and set(EXACT_LOSS_MODES) == {"gapo", "gapo_token"}


@pytest.mark.parametrize(("variant", "mode"), EXACT_CASES)
def test_exact_micro_batching_and_ratios(run, variant, mode):
    """The setting really happened: lr = 0, the variant's engine flags, the micro-batch partition, each row's
    ratio (verl's ppo_kl per micro-batch) and row 7's eps_low clip (verl's pg_clipfrac)."""
    variant_result, case = exact_result(run, variant, mode)
    cfg = case["config"]
    assert cfg["loss_mode"] == mode and cfg["lr"] == 0 and cfg["rollout_n"] == K and cfg["schedule"] == "linear"
    assert cfg["use_dynamic_bsz"] == (variant != "fixed")
    assert cfg["use_remove_padding"] == variant_result["engine_use_remove_padding"] == (variant == "remove_padding")
    if variant == "fixed":
        assert cfg["ppo_micro_batch_size_per_gpu"] == EXACT_MICRO
    else:
        assert cfg["ppo_max_token_len_per_gpu"] == EXACT_MAX_TOKENS
    assert case["max_abs_logprob_change"] == 0.0  # lr = 0: mini-batch 2 saw the ratios the test set

    calls = case["calls"]
    # One loss call per micro-batch, mini-batch 1's first (no shuffle); every row exactly once.
    counts = [sum(set(call["rows"]) <= set(mini) for call in calls) for mini in MINI_BATCHES]
    assert counts == EXPECTED_MICRO_COUNTS[variant], [call["rows"] for call in calls]
    assert len(calls) == sum(counts)
    assert [set(call["rows"]) <= set(MINI_BATCHES[0]) for call in calls] == [True] * counts[0] + [False] * counts[1]
    assert sorted(r for call in calls for r in call["rows"]) == list(range(len(ROWS)))
    if variant == "fixed":
        assert [call["rows"] for call in calls] == [[0, 1], [2, 3], [4, 5], [6, 7]]

    # verl's own per-micro-batch metrics, MEAN-aggregated: ppo_kl = -token-mean log ratio, pg_clipfrac counts
    # every clipped token, row 7's under eps_low (1.02) too.
    def rows(call):
        return [ROWS[i] for i in call["rows"]]

    kl = micro_mean(calls, lambda call: token_mean(rows(call), lambda r: -math.log(r.ratio)))
    clip = micro_mean(calls, lambda call: token_mean(rows(call), clipped))
    assert case["worker_metrics"]["actor/ppo_kl"] == pytest.approx(kl, abs=RATIO_TOL)
    assert case["worker_metrics"]["actor/pg_clipfrac"] == pytest.approx(clip, abs=1e-6)
    assert clip[1] == 1.0  # mini-batch 2 all clipped only because row 7 got eps_low, not c = 2's 0.26


@pytest.mark.parametrize(("variant", "mode"), EXACT_CASES)
def test_exact_per_c_diagnostics(run, variant, mode):
    """Per-c sums per micro-batch and mini-batch, and the trainer's diagnostics, equal the hand computation."""
    _, case = exact_result(run, variant, mode)

    # The trainer's view: exact ratios over the step; no entry for c = 2 (its rollout is a failure) or absent c.
    expected = expected_diagnostics(ROWS)
    assert set(case["diagnostics"]) == set(expected)
    for key, value in expected.items():
        # ratios carry the forward passes' float32 noise (RATIO_TOL); r inherits it, magnified by 1 / spread of x
        tol = RATIO_TOL if "ratio_dev" in key else 10 * RATIO_TOL if key == "gapo/is_adv_corr" else 1e-7
        assert case["diagnostics"][key] == pytest.approx(value, abs=tol), key
    assert case["diagnostics"]["gapo/clipfrac_pos/c1"] == pytest.approx(6 / 7)

    # Each loss call reported the sums of exactly its rows, as SUM-aggregated verl Metrics.
    for call in case["calls"]:
        expected = expected_sums([ROWS[i] for i in call["rows"]])
        got = {k[len("gapo_sums/"):]: v for k, v in call["metrics"].items() if k.startswith("gapo_sums/")}
        assert set(got) == set(expected)
        assert got == pytest.approx(expected, abs=RATIO_TOL * 10), call["rows"]
        assert all(call["aggregation"][f"gapo_sums/{k}"] == "AggregationType.SUM" for k in expected)

    # The worker's output: one value per mini-batch, the sum over its micro-batches.
    for mini_index, mini in enumerate(MINI_BATCHES):
        expected = expected_sums([ROWS[i] for i in mini])
        got = {k: case["worker_metrics"][f"gapo_sums/{k}"][mini_index] for k in expected}
        assert got == pytest.approx(expected, abs=RATIO_TOL * 10), mini


@pytest.mark.parametrize(("variant", "mode"), EXACT_CASES)
def test_mean_aggregation_of_the_same_sums_would_be_biased(run, variant, mode):
    """What the previous MEAN Metrics gave from the very same per-micro-batch sums: verl averages a mini-batch's
    micro-batches, then the mini-batches, so mini-batch 1 (one micro-batch) outweighs mini-batch 2 (four). Under
    fixed micro-batches (2 + 2) the bias cancels, so only the dynamic cases discriminate."""
    _, case = exact_result(run, variant, mode)
    calls, exact = case["calls"], expected_diagnostics(ROWS)["gapo/clipfrac_pos/c1"]

    def mean_aggregated(name):
        return sum(micro_mean(calls, lambda call: call["metrics"][f"gapo_sums/c1/{name}"])) / len(MINI_BATCHES)

    old = mean_aggregated("clipped") / mean_aggregated("tokens")
    reported = case["diagnostics"]["gapo/clipfrac_pos/c1"]
    if EXPECTED_MICRO_COUNTS[variant][0] == EXPECTED_MICRO_COUNTS[variant][1]:
        assert old == pytest.approx(exact)
    else:
        # Hand value: mini-batch 1 = row 0 (1 token, unclipped) alone, mini-batch 2 = row 4 (6 clipped) among 4
        # micro-batches: (0 + 6/4) / (1 + 6/4) = 0.6 instead of 6/7.
        assert old == pytest.approx((0 + 6 / 4) / (1 + 6 / 4))
        assert abs(old - exact) > 0.2
    assert reported == pytest.approx(exact)


def test_remove_padding_packs_without_leaking_across_sequences(run):
    """Packed sequences on CPU (eager attention): the packed forward's log-probs equal the padded forward's, so
    no token attended to another rollout (transformers builds the block mask from the packed position ids)."""
    result = run["exact"]["remove_padding"]
    assert "error" not in result, f"remove-padding update failed: {result.get('error')}\n{result.get('traceback')}"
    assert result["engine_use_remove_padding"]
    packed = result["modes"]["gapo"]["log_probs"]
    padded = run["exact"]["fixed"]["modes"]["gapo"]["log_probs"]
    for row, (a, b) in enumerate(zip(packed, padded)):
        n = ROWS[row].response_len
        assert a[:n] == pytest.approx(b[:n], abs=1e-5), row

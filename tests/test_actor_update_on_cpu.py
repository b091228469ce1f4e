"""GAPO inside verl's real FSDP actor update on CPU with the tiny model, without Ray or the full trainer.

The helper (tests/actor_update_cpu_run.py) runs in a fresh process (the CPU platform's env vars must be set
before `import verl`), builds the actor as verl's trainer workers do (`ActorRolloutRefWorker(role="actor")
.init_model()`: TrainingWorker, FSDP2 engine, AdamW), installs `GAPOActorLoss` with `set_loss_fn` and runs one
real actor update per case (`update_actor` -> `train_mini_batch` -> `train_batch`, two micro-batches).

Every rollout gets the same ratio shift, old_log_probs = current - DELTA (ratio 1.15), and a positive advantage;
half the rollouts come from c = 1 groups, half from c = k - 1 = 7 groups (k = 8). With eps_low = 0.02 and
eps_high_max = 0.3, GAPO's linear schedule gives c = 1 the bound 1.3 and c = 7 the bound 1.06, so 1.15 must be
clipped for c = 7 only. The fixed clip (schedule=constant) treats both groups alike, whatever its value.
"""

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gapo.smoke.tiny_model import build_tiny_model
from gapo.threshold import adaptive_eps_high

ROOT = Path(__file__).resolve().parents[1]
HELPER = ROOT / "tests" / "actor_update_cpu_run.py"
K, EPS_LOW, EPS_HIGH_MAX, RATIO = 8, 0.02, 0.3, 1.15


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
    )
    proc = subprocess.run([sys.executable, str(HELPER), str(model)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"helper failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1][len("RESULT "):])


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
        assert metrics["actor/ppo_kl"] == pytest.approx(-math.log(RATIO), abs=1e-5)
        assert diag["gapo/ratio_dev_pos/c1"] == pytest.approx(RATIO - 1, abs=1e-5)
        assert diag["gapo/ratio_dev_pos/c7"] == pytest.approx(RATIO - 1, abs=1e-5)
        # Both groups reached the loss with their tokens; no other success count was reported.
        assert metrics["gapo_sums/c1/tokens"] > 0 and metrics["gapo_sums/c7/tokens"] > 0
        assert all(metrics[f"gapo_sums/c{c}/tokens"] == 0 for c in range(2, K - 1))
        assert metrics["gapo_sums/positive_rollouts"] > 0


@pytest.mark.parametrize("case", ["gapo_linear", "gapo_token_linear"])
def test_gapo_clips_c7_but_not_c1_under_the_same_ratio_shift(run, case):
    result = run["cases"][case]
    metrics, diag = result["metrics"], result["diagnostics"]
    assert result["config"]["schedule"] == "linear" and result["config"]["eps_high_max"] == EPS_HIGH_MAX
    # Rare successes (c = 1) keep their gradient; common ones (c = 7) are clipped, token for token.
    assert metrics["gapo_sums/c1/clipped"] == 0
    assert metrics["gapo_sums/c7/clipped"] == metrics["gapo_sums/c7/tokens"] > 0
    assert diag["gapo/clipfrac_pos/c1"] == 0.0 and diag["gapo/clipfrac_pos/c7"] == 1.0
    assert 0 < metrics["actor/pg_clipfrac"] < 1  # verl's own clip fraction: exactly the c = 7 tokens
    # The loss used both thresholds (mean of 0.3 and 0.06 over equally many positive rollouts).
    assert diag["gapo/loss_eps_high_mean"] == pytest.approx((EPS_HIGH_MAX + EPS_LOW + (EPS_HIGH_MAX - EPS_LOW) / 7) / 2)
    # Gradient flowed (only c = 1 rollouts can carry it) and the weights moved: the c = 1 responses got likelier.
    assert metrics["grad_norm"] > 0
    assert result["max_abs_logprob_change"]["c1"] > 1e-2


def test_fixed_clip_treats_both_groups_alike(run):
    """schedule=constant is the fixed asymmetric clip: the c-dependence disappears, at either bound."""
    narrow, wide = run["cases"]["constant_narrow"], run["cases"]["constant_wide"]
    assert narrow["config"]["schedule"] == wide["config"]["schedule"] == "constant"

    # Fixed clip at c = 7's GAPO bound (0.06): both groups clipped, so no gradient and no weight change at all.
    m, d = narrow["metrics"], narrow["diagnostics"]
    assert d["gapo/clipfrac_pos/c1"] == d["gapo/clipfrac_pos/c7"] == 1.0
    assert m["gapo_sums/c1/clipped"] == m["gapo_sums/c1/tokens"] > 0
    assert m["actor/pg_clipfrac"] == 1.0 and m["grad_norm"] == 0.0
    assert narrow["max_abs_logprob_change"]["c1"] < 1e-6 and narrow["max_abs_logprob_change"]["c7"] < 1e-6

    # Fixed clip at c = 1's GAPO bound (0.3): neither group clipped; c = 7 rollouts now move as much as c = 1.
    m, d = wide["metrics"], wide["diagnostics"]
    assert d["gapo/clipfrac_pos/c1"] == d["gapo/clipfrac_pos/c7"] == 0.0
    assert m["actor/pg_clipfrac"] == 0.0 and m["grad_norm"] > 0
    assert wide["max_abs_logprob_change"]["c7"] > 1e-2


def test_update_without_gapo_fields_fails_naming_the_fix(run):
    # GAPOActorLoss installed, but the batch lacks gapo_num_correct / gapo_group_size.
    err = run["missing_fields_gapo_loss_fn"]
    assert err["raised"] and err["chain"][0]["type"] == "RuntimeError", err
    assert "gapo_num_correct" in err["chain"][0]["message"] and "trainer_mode=gapo" in err["chain"][0]["message"]
    # verl's own loss fn (what init_model installs) with loss_mode=gapo: the registered loss stops with the fix.
    err = run["missing_fields_verl_loss_fn"]
    assert err["raised"] and err["chain"][0]["type"] == "RuntimeError", err
    assert "trainer.v1.trainer_mode=gapo" in err["chain"][0]["message"]

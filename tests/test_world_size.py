"""One optimizer step of verl's real FSDP actor at world size 2 equals the step at world size 1 (CPU, gloo, no Ray).

The helper (tests/actor_update_world_size_run.py) runs once with one process and once with two (each rank holds
half the batch, as verl's dispatch gives it: rank 0 the short rollouts, rank 1 the long ones, so the ranks hold
16 and 76 response tokens; rank 0's rows would fit one dynamic micro-batch, rank 1's need several) with plain SGD and no gradient clipping, for GAPO
at sequence level, at token level and verl's own gspo loss (the fixed-clip baseline). What must hold:

- the weights after the step agree to float32 rounding (measured: 1.2e-7 at most, for steps of 0.04 to 0.15):
  a loss normalised per rank instead of over the global batch, a gradient counted twice or a mini-batch split
  differently would move them by a fraction of the step itself;
- GAPO's per-c diagnostics at world size 2 are the hand computation over the rows of both ranks (rank 0's rows alone
  give other values), and verl hands every micro-batch's loss the global token and row counts;
- padding rows (verl's: one response token, empty response mask) get no gradient and no per-c entry: at token level
  (token-mean) the padded step equals the step of the real rows alone; at sequence level (seq-mean-token-mean) verl
  0.9.1 divides by the configured mini-batch size, padding rows included, so the padded step is the real rows' step
  scaled by real / (real + padding) = 14 / 16, GAPO and verl's gspo alike (docs/cluster.md).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gapo.smoke.tiny_model import build_tiny_model
from tests.actor_update_world_size_run import LEFT_OUT, MAX_TOKENS, MODES, PAD, ROWS, VARIANTS
from tests.test_actor_update_on_cpu import expected_diagnostics

ROOT = Path(__file__).resolve().parents[1]
HELPER = ROOT / "tests" / "actor_update_world_size_run.py"
WEIGHT_TOL = 1e-6  # float32 all-reduce vs single-process sums (measured <= 1.2e-7)
MIN_STEP = 1e-2  # the step must move the weights far more than the tolerance (measured 0.04 - 0.15)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(model: Path, out: Path, world: int) -> dict:
    """The helper on `world` ranks (one process each); returns {"ranks": [rank0.json, ...], "weights": {case: ...}}."""
    port = str(_free_port())
    procs = []
    for rank in range(world):
        env = dict(os.environ, VERL_PLATFORM="cpu", VERL_ENGINE_DEVICE="cuda", TOKENIZERS_PARALLELISM="false",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), WANDB_MODE="disabled",
                   PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
        log = open(out.parent / f"{out.name}-rank{rank}.log", "w")
        procs.append((subprocess.Popen([sys.executable, str(HELPER), str(model), str(out)], cwd=ROOT, env=env,
                                       stdout=log, stderr=subprocess.STDOUT), log))
    for proc, log in procs:
        try:
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
            log.close()
    for rank, (proc, _) in enumerate(procs):
        text = (out.parent / f"{out.name}-rank{rank}.log").read_text(errors="replace")
        assert proc.returncode == 0, f"world size {world}, rank {rank} failed (exit {proc.returncode}):\n{text[-6000:]}"
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    weights = {p.stem: torch.load(p) for p in out.glob("*.pt")}
    return {"ranks": ranks, "weights": weights}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("world_size")
    model = build_tiny_model(root / "model")
    return {world: _run(model, root / f"ws{world}", world) for world in (1, 2)}


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _step(weights: dict) -> dict:
    return {k: weights["after"][k] - weights["before"][k] for k in weights["after"]}


@pytest.mark.parametrize("variant", ["full", "padded"])
@pytest.mark.parametrize("mode", list(MODES))
def test_one_step_at_world_size_2_gives_the_weights_of_world_size_1(runs, mode, variant):
    one, two = runs[1]["weights"][f"{mode}-{variant}"], runs[2]["weights"][f"{mode}-{variant}"]
    assert _max_diff(one["before"], two["before"]) == 0  # the same start
    step = max(v.abs().max().item() for v in _step(one).values())
    assert step > MIN_STEP, f"the step hardly moved the weights ({step}): the comparison would prove nothing"
    assert _max_diff(one["after"], two["after"]) < WEIGHT_TOL
    m1, m2 = (runs[w]["ranks"][0]["cases"][f"{mode}-{variant}"]["metrics"] for w in (1, 2))
    assert m2["actor/grad_norm"] == pytest.approx(m1["actor/grad_norm"], rel=1e-5)  # a scaled gradient shows here


@pytest.mark.parametrize("mode", list(MODES))
def test_the_ranks_hold_different_tokens_and_verl_passes_global_counts(runs, mode):
    ranks = runs[2]["ranks"]
    calls = [rank["cases"][f"{mode}-full"]["calls"] for rank in ranks]
    # every row on exactly one rank, in verl's contiguous chunks
    assert sorted(r for rank in calls for call in rank for r in call["rows"]) == list(range(len(ROWS)))
    assert [sorted({r for call in rank for r in call["rows"]}) for rank in calls] == [list(range(8)),
                                                                                     list(range(8, 16))]
    # rank 0's rows would fit one micro-batch; verl gives it as many as rank 1 needs (a collective per micro-batch)
    assert sum(r.prompt_len + r.response_len for r in ROWS[:8]) <= MAX_TOKENS
    assert len(calls[0]) == len(calls[1]) > 1
    tokens = sum(r.response_len for r in ROWS)
    for call in calls[0] + calls[1]:
        assert call["global"] == {"dp_size": 2, "batch_num_tokens": tokens, "global_batch_size": len(ROWS)}


@pytest.mark.parametrize("mode", ["gapo", "gapo_token"])
def test_diagnostics_at_world_size_2_count_the_rows_of_both_ranks(runs, mode):
    full = runs[2]["ranks"][0]["cases"][f"{mode}-full"]["diagnostics"]
    expected = expected_diagnostics(ROWS)
    assert full.keys() == expected.keys()
    for name, value in expected.items():
        assert full[name] == pytest.approx(value, rel=1e-5, abs=1e-7), name
    rank0_only = expected_diagnostics(ROWS[:8])
    assert any(rank0_only.get(name) != pytest.approx(value, rel=1e-3) for name, value in expected.items())
    # the same at world size 1
    one = runs[1]["ranks"][0]["cases"][f"{mode}-full"]["diagnostics"]
    assert one == pytest.approx(full, rel=1e-6, abs=1e-8)


@pytest.mark.parametrize("mode", ["gapo", "gapo_token"])
def test_padding_rows_have_no_success_count_and_no_place_in_the_diagnostics(runs, mode):
    real = [ROWS[i] for i in VARIANTS["real14"]]
    for world in (1, 2):
        padded = runs[world]["ranks"][0]["cases"][f"{mode}-padded"]["diagnostics"]
        assert padded == pytest.approx(expected_diagnostics(real), rel=1e-5, abs=1e-7)
        rows = [r for rank in runs[world]["ranks"] for call in rank["cases"][f"{mode}-padded"]["calls"]
                for r in call["rows"]]
        assert rows.count(PAD) == len(LEFT_OUT)  # the loss saw them, and they added nothing


@pytest.mark.parametrize("mode", list(MODES))
def test_padding_rows_get_no_gradient(runs, mode):
    """Token-mean: the padded step is the real rows' step. seq-mean-token-mean: verl divides by the mini-batch size
    it was given (padding rows included), so the same step scaled by 14 / 16."""
    scale = 1.0 if MODES[mode] == "token-mean" else len(VARIANTS["real14"]) / len(VARIANTS["padded"])
    for world in (1, 2):
        weights = runs[world]["weights"]
        padded, real = _step(weights[f"{mode}-padded"]), _step(weights[f"{mode}-real14"])
        assert _max_diff(weights[f"{mode}-padded"]["before"], weights[f"{mode}-real14"]["before"]) == 0
        assert _max_diff(padded, {k: scale * v for k, v in real.items()}) < WEIGHT_TOL, (world, scale)
        if scale != 1.0:  # the scale is real: the unscaled step is far off
            assert _max_diff(padded, real) > 100 * WEIGHT_TOL

"""The threshold schedules against hand-computed tables, their edge cases, bad input and the CLI."""

import math
import subprocess
import sys

import pytest
import torch

import gapo
from gapo.threshold import adaptive_eps_high, threshold_table


def _table(k, lo, hi, schedule="linear"):
    return [row["eps_high"] for row in threshold_table(k, lo, hi, schedule)]


# Eq. 11 by hand: eps_low + (eps_high_max - eps_low) * (k - c) / (k - 1), c = 1..k.
HAND_LINEAR = {
    (8, 0.2, 0.28): [0.28, 0.2 + 0.08 * 6 / 7, 0.2 + 0.08 * 5 / 7, 0.2 + 0.08 * 4 / 7, 0.2 + 0.08 * 3 / 7,
                     0.2 + 0.08 * 2 / 7, 0.2 + 0.08 / 7, 0.2],
    (8, 7e-5, 3e-4): [3e-4, 7e-5 + 2.3e-4 * 6 / 7, 7e-5 + 2.3e-4 * 5 / 7, 7e-5 + 2.3e-4 * 4 / 7,
                      7e-5 + 2.3e-4 * 3 / 7, 7e-5 + 2.3e-4 * 2 / 7, 7e-5 + 2.3e-4 / 7, 7e-5],
    (2, 0.2, 0.28): [0.28, 0.2],
    (4, 0.2, 0.28): [0.28, 0.2 + 0.08 * 2 / 3, 0.2 + 0.08 / 3, 0.2],
    (16, 3e-3, 5e-3): [3e-3 + 2e-3 * (16 - c) / 15 for c in range(1, 17)],
}


@pytest.mark.parametrize("key", list(HAND_LINEAR))
def test_linear_table_matches_hand_values(key):
    k, lo, hi = key
    assert _table(k, lo, hi) == pytest.approx(HAND_LINEAR[key], rel=1e-6, abs=1e-9)


def test_table_rows_carry_the_advantage():
    rows = threshold_table(8, 0.2, 0.28)
    assert [r["c"] for r in rows] == list(range(1, 9))
    assert rows[0]["advantage"] == pytest.approx(7 / 8) and rows[-1]["advantage"] == 0.0


def test_spot_values_k16():
    # c = 9 of 16: 3e-3 + 2e-3 * 7/15 = 3.9333...e-3
    assert float(adaptive_eps_high(9, 16, 3e-3, 5e-3)) == pytest.approx(3.933333e-3, rel=1e-6)


def test_exp_schedule_same_ends_geometric_inside():
    for k, lo, hi in [(8, 0.2, 0.28), (8, 7e-5, 3e-4), (16, 3e-3, 5e-3)]:
        eps = _table(k, lo, hi, "exp")
        assert eps[0] == pytest.approx(hi, rel=1e-6) and eps[-1] == pytest.approx(lo, rel=1e-6)
        # 1 + eps is geometric in u = (k - c)/(k - 1): consecutive ratios are all equal
        ratios = [(1 + a) / (1 + b) for a, b in zip(eps, eps[1:])]
        assert max(ratios) - min(ratios) < 1e-6
        # and convexity puts it below the linear schedule strictly inside
        lin = _table(k, lo, hi)
        assert all(e < l for e, l in zip(eps[1:-1], lin[1:-1]))
    # c = 4 of 8, (0.2, 0.28) by hand: 1.2 * (1.28 / 1.2) ** (4/7) - 1
    assert _table(8, 0.2, 0.28, "exp")[3] == pytest.approx(1.2 * (1.28 / 1.2) ** (4 / 7) - 1, rel=1e-6)


def test_constant_schedule_is_the_fixed_clip():
    assert _table(8, 0.2, 0.28, "constant") == pytest.approx([0.28] * 8)


def test_zero_successes_clamp_to_one_and_tensor_inputs():
    c = torch.tensor([[0, 1], [7, 8]])
    out = gapo.adaptive_eps_high(c, 8, 0.2, 0.28)
    assert out.dtype == torch.float32 and out.shape == (2, 2)
    assert out[0, 0] == pytest.approx(0.28) and out[0, 1] == pytest.approx(0.28)
    assert out[1, 0] == pytest.approx(0.2 + 0.08 / 7) and out[1, 1] == pytest.approx(0.2)
    # per-rollout group sizes (uneven groups): c = 2 in a group of 4 vs one of 8
    mixed = adaptive_eps_high(torch.tensor([2, 2]), torch.tensor([4, 8]), 0.2, 0.28)
    assert mixed.tolist() == pytest.approx([0.2 + 0.08 * 2 / 3, 0.2 + 0.08 * 6 / 7])
    # a 0-d tensor for two ints; a group of one takes the c = 1 end
    assert adaptive_eps_high(1, 1, 0.2, 0.28).shape == () and float(adaptive_eps_high(1, 1, 0.2, 0.28)) == pytest.approx(0.28)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_correct=1, group_size=8, eps_low=0.3, eps_high_max=0.28), "eps_high_max .* must be >= eps_low"),
        (dict(num_correct=1, group_size=8, eps_low=0.2, eps_high_max=0.28, schedule="cosine"), "unknown GAPO schedule 'cosine'"),
        (dict(num_correct=9, group_size=8, eps_low=0.2, eps_high_max=0.28), "num_correct must lie in"),
        (dict(num_correct=-1, group_size=8, eps_low=0.2, eps_high_max=0.28), "num_correct must lie in"),
        (dict(num_correct=0, group_size=0, eps_low=0.2, eps_high_max=0.28), "group_size must be >= 1"),
        (dict(num_correct=1, group_size=8, eps_low=-0.1, eps_high_max=0.28), "eps_low must be"),
        (dict(num_correct=1, group_size=8, eps_low=0.2, eps_high_max=math.nan), "eps_high_max"),
    ],
)
def test_bad_input_names_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        adaptive_eps_high(**kwargs)


def test_cli_prints_the_table_and_rejects_bad_values():
    run = lambda *a: subprocess.run([sys.executable, "-m", "gapo.threshold", *a], capture_output=True, text=True)
    ok = run("--group-size", "8", "--eps-low", "0.2", "--eps-high-max", "0.28")
    assert ok.returncode == 0, ok.stderr
    lines = [l.split() for l in ok.stdout.splitlines()[2:]]
    assert len(lines) == 8 and lines[0][:3] == ["1", "0.8750", "0.28"] and lines[-1][:3] == ["8", "0.0000", "0.2"]
    bad = run("--group-size", "8", "--eps-low", "0.3", "--eps-high-max", "0.28")
    assert bad.returncode == 2 and "eps_high_max (0.28) must be >= eps_low (0.3)" in bad.stderr
    one = run("--group-size", "1", "--eps-low", "0.2", "--eps-high-max", "0.28")
    assert one.returncode == 2 and "--group-size must be >= 2" in one.stderr


def test_cli_defaults_are_the_training_configs_own():
    """`python -m gapo.threshold` with no flags prints the default training run's k, eps_low and eps_high_max (the
    composed trainer config, i.e. configs/base/gapo.yaml) and GAPOConfig's schedule: no second copy of the numbers."""
    from gapo.config import GAPOConfig
    from tests.test_config_and_plugin import compose_cfg

    ref = compose_cfg().actor_rollout_ref
    out = subprocess.run([sys.executable, "-m", "gapo.threshold"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == (
        f"GAPO thresholds: k={ref.rollout.n} eps_low={ref.actor.clip_ratio_low:g} "
        f"eps_high_max={ref.actor.policy_loss.eps_high_max:g} schedule={GAPOConfig().schedule}")
    rows = [line.split() for line in out.stdout.splitlines()[2:]]
    assert len(rows) == ref.rollout.n
    assert float(rows[0][2]) == pytest.approx(ref.actor.policy_loss.eps_high_max)
    assert float(rows[-1][2]) == pytest.approx(ref.actor.clip_ratio_low)


def test_cli_reads_its_defaults_from_the_base_config_file(tmp_path, monkeypatch, capsys):
    """The defaults follow the file (a changed base config changes them), each flag replaces only its own value, and
    without the file the error names the flags to pass."""
    import gapo.config
    from gapo.threshold import main

    base = tmp_path / "gapo.yaml"
    base.write_text("actor_rollout_ref:\n  rollout:\n    n: 4\n  actor:\n    clip_ratio_low: 0.01\n"
                    "    policy_loss:\n      eps_high_max: 0.04\n      schedule: linear\n")
    monkeypatch.setattr(gapo.config, "BASE_CONFIG", base)
    main([])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "GAPO thresholds: k=4 eps_low=0.01 eps_high_max=0.04 schedule=linear" and len(lines) == 6
    main(["--eps-high-max", "0.07", "--schedule", "exp"])
    assert capsys.readouterr().out.splitlines()[0] == "GAPO thresholds: k=4 eps_low=0.01 eps_high_max=0.07 schedule=exp"
    monkeypatch.setattr(gapo.config, "BASE_CONFIG", tmp_path / "absent.yaml")
    with pytest.raises(SystemExit) as exit_:
        main(["--group-size", "8"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "absent.yaml" in err and "pass --group-size, --eps-low, --eps-high-max and --schedule" in err
    main(["-k", "2", "--eps-low", "0.2", "--eps-high-max", "0.28", "--schedule", "linear"])  # every flag: no file read
    header = capsys.readouterr().out.splitlines()[0]
    assert header == "GAPO thresholds: k=2 eps_low=0.2 eps_high_max=0.28 schedule=linear"


def test_make_table_passes_only_the_values_the_user_set():
    """`make table` hard-codes no clip: unset variables pass no flag (the CLI's defaults are the config's)."""
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ("K", "EPS_LOW", "EPS_HIGH_MAX", "SCHEDULE")}

    def dry(*assignments):
        out = subprocess.run(["make", "-n", "table", "PY=python", *assignments], cwd=root, env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        (line,) = [line for line in out.stdout.splitlines() if "-m gapo.threshold" in line]
        return line.split()

    assert dry() == ["python", "-m", "gapo.threshold"]
    assert dry("EPS_LOW=0.01", "K=4") == ["python", "-m", "gapo.threshold", "--group-size", "4", "--eps-low", "0.01"]
    assert dry("EPS_HIGH_MAX=0.3", "SCHEDULE=exp")[3:] == ["--eps-high-max", "0.3", "--schedule", "exp"]

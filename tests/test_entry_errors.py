"""A new user's first mistakes with `python -m recipe.main_gapo` end within seconds in one message that names the bad
value and the fix, with no traceback (issue 32): an unknown experiment, a misspelt override (plain or with hydra's
`+`), a missing data file (with the CPU preset run without its env vars), and none of verl's optional-engine or
platform chatter before it. Unit tests of the suggestions (gapo.config_names) and of the command-line check
(gapo.verl_plugin.validate.command_line_problem) in this process; one subprocess of the real entry point per mistake."""

from __future__ import annotations

import logging
import os
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from gapo.config_names import closest, experiments, one_of, unknown_experiment, unknown_key
from gapo.verl_plugin.preflight import CHECKS, check_platform_env, skip_hint
from gapo.verl_plugin.quiet import PLATFORM_LOGGER, quiet_verl_startup
from gapo.verl_plugin.validate import GAPOConfigError, check_gapo_node_keys, command_line_problem

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = str(ROOT / "configs")
# The entry point's bounds. In CPU seconds (its own and its children's): it takes 6-8 here (verl's imports), 60 is 8x
# that, and a busy machine does not inflate CPU time (a trainer or a Ray start would spend more). In wall seconds, for
# waits that spend no CPU (a hub retry): 180 s, over 15x the 7-11 s it takes here beside another test run (the wall
# bound was 60 s, which load alone can use up).
ENTRY_CPU_LIMIT_S = 60
ENTRY_WALL_LIMIT_S = 180
NOISE = ("engine is not available", "No supported accelerator detected", "is registered but not available",
         "Platform override from VERL_PLATFORM")


# ------------------------------------------------------------------------------------------------ suggestions
def test_closest_names_the_near_misses_best_first():
    keys = ["eps_high_max", "schedule", "success_threshold", "diagnostics", "loss_mode"]
    assert closest("eps_hgh_max", keys) == ["eps_high_max"]
    assert closest("schedul", keys)[0] == "schedule"
    assert closest("sucess_threshold", keys) == ["success_threshold"]
    assert closest("zzz", keys) == []
    assert closest("schedule", keys + ["schedules"]) == ["schedule"]  # an exact match alone
    assert len(closest("clip_ratio", [f"clip_ratio_{s}" for s in "abcdef"], n=3)) == 3


def test_unknown_key_names_the_closest_keys_in_full_or_else_all_of_them():
    msg = unknown_key("actor_rollout_ref.actor.policy_loss.eps_hgh_max", ["eps_high_max", "schedule"])
    assert msg == ("actor_rollout_ref.actor.policy_loss.eps_hgh_max is not a config key: did you mean "
                   "actor_rollout_ref.actor.policy_loss.eps_high_max?")
    msg = unknown_key("exploration.zzz", ["entrance_tokens", "coverage_window"], addable=True)
    assert "the keys under exploration are coverage_window, entrance_tokens" in msg
    assert "write +exploration.zzz=<value>" in msg
    assert one_of(["a"]) == "a" and one_of(["a", "b", "c"]) == "a, b or c"


# ------------------------------------------------------------------------------------------------ experiments
def test_experiments_are_the_yaml_files_with_a_top_level_hydra_key(tmp_path):
    (tmp_path / "math").mkdir()
    (tmp_path / "base").mkdir()
    (tmp_path / "run.yaml").write_text("hydra:\n  searchpath: []\n")
    (tmp_path / "math" / "a.yaml").write_text("# a run\nhydra:\n  searchpath: []\ndefaults: []\n")
    (tmp_path / "base" / "group.yaml").write_text("trainer:\n  hydra: not at the top\n")
    assert experiments(tmp_path) == ["math/a", "run"]
    assert unknown_experiment("math/a", tmp_path) is None and unknown_experiment("math/a.yaml", tmp_path) is None
    assert "base/group.yaml has no top-level hydra: key: a config group" in unknown_experiment("base/group", tmp_path)


def test_the_repositorys_experiments_and_the_message_for_a_misspelt_one():
    names = experiments(CONFIGS)
    assert {"gapo_trainer", "smoke_cpu", "math/r1_1.5b_gapo", "code/r1_1.5b_gapo_token"} <= set(names)
    assert not [n for n in names if n.split("/")[0] in ("base", "model", "platform", "vigor", "deepcoder")]
    msg = unknown_experiment("math/r1_1.5b_gapoo", CONFIGS)
    assert msg.startswith("unknown experiment 'math/r1_1.5b_gapoo' (no ")
    assert "Did you mean math/r1_1.5b_gapo, " in msg
    assert msg.split("Available experiments:\n")[1].splitlines() == [f"  {n}" for n in names]


def test_submit_sh_uses_the_same_definition():
    """launch/submit.sh asks gapo.config_names (stdlib only) through the module's command line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = [sys.executable, "-m", "gapo.config_names", "experiment", CONFIGS]
    bad = subprocess.run([*run, "math/r1_1.5b_gapoo"], capture_output=True, text=True, env=env, check=False)
    assert bad.returncode == 1 and bad.stdout.strip() == unknown_experiment("math/r1_1.5b_gapoo", CONFIGS)
    good = subprocess.run([*run, "smoke_cpu"], capture_output=True, text=True, env=env, check=False)
    assert good.returncode == 0 and good.stdout == ""
    assert "-m gapo.config_names experiment" in (ROOT / "launch" / "submit.sh").read_text()


# ------------------------------------------------------------------------------------------- the command line
@pytest.mark.parametrize("argv", [["--config-name", "math/r1_1.5b_gapoo"], ["--config-name=math/r1_1.5b_gapoo"],
                                  ["-cn", "math/r1_1.5b_gapoo"], ["-cn=math/r1_1.5b_gapoo", "trainer.nnodes=2"]])
def test_every_form_of_the_config_name_is_checked(argv):
    assert command_line_problem(argv, CONFIGS, "gapo_trainer") == unknown_experiment("math/r1_1.5b_gapoo", CONFIGS)


def test_misspelt_overrides_each_name_the_closest_keys():
    problem = command_line_problem(
        ["-cn", "smoke_cpu", "actor_rollout_ref.actor.policy_loss.eps_hgh_max=0.1", "trainer.total_epoch=3",
         "actor_rollout_ref.actr.policy_loss.eps_high_max=0.1", "platfrm=cpu", "trainer.nnodes=1"],
        CONFIGS, "gapo_trainer")
    assert problem.splitlines() == [
        ("actor_rollout_ref.actor.policy_loss.eps_hgh_max is not a config key: did you mean "
         "actor_rollout_ref.actor.policy_loss.eps_high_max? (override actor_rollout_ref.actor.policy_loss.eps_hgh_max=0.1)"),
        "trainer.total_epoch is not a config key: did you mean trainer.total_epochs? (override trainer.total_epoch=3)",
        ("actor_rollout_ref.actr is not a config key: did you mean actor_rollout_ref.actor? "
         "(override actor_rollout_ref.actr.policy_loss.eps_high_max=0.1)"),
        "platfrm is not a config key: did you mean platform? (override platfrm=cpu)",  # a config group
    ]


def test_a_plus_key_that_a_dataclass_lacks_names_its_fields():
    verl = command_line_problem(["-cn", "smoke_cpu", "+actor_rollout_ref.actor.clip_ratio_hgh=0.3"], CONFIGS, "x")
    assert verl.startswith("actor_rollout_ref.actor.clip_ratio_hgh is not a key of FSDPActorConfig")
    assert "did you mean actor_rollout_ref.actor.clip_ratio_high" in verl
    ours = command_line_problem(["-cn", "smoke_cpu", "+actor_rollout_ref.actor.policy_loss.eps_hgh_max=0.1"],
                                CONFIGS, "x")
    assert "is not a key of GAPOPolicyLossConfig" in ours and "policy_loss.eps_high_max?" in ours


@pytest.mark.parametrize("line", ["=5", "+=5", "~="])
def test_an_override_with_no_key_is_named(line):
    """hydra's parser takes `=5` (key ''); its composition then fails with a traceback that names no override."""
    problem = command_line_problem(["-cn", "smoke_cpu", "trainer.nnodes=1", line], CONFIGS, "gapo_trainer")
    assert problem == f"override {line!r} names no key: write KEY=VALUE (e.g. trainer.nnodes=1)"


@pytest.mark.parametrize("argv", [
    ["-cn", "smoke_cpu", "actor_rollout_ref.actor.policy_loss.schedule=exp", "hydra.run.dir=/tmp/x"],
    ["-cn", "smoke_cpu", "+actor_rollout_ref.model.override_config.rope_theta=1e6"],  # a free-form dict: + is right
    ["-cn", "smoke_cpu", "++ray_kwargs.ray_init.num_cpus=null", "platform=cpu_vllm"],  # launch/submit.sh's ++
    ["--help"], ["-cn", "smoke_cpu", "--info", "defaults"], ["-m", "-cn", "smoke_cpu", "trainer.nnodes=1,2"],
    ["-cn", "smoke_cpu", "trainer.nnodes"],  # hydra's own parse error: hydra says it
    ["--config-dir", "/elsewhere", "-cn", "mine"],  # another search path: hydra finds (or not) the config
])
def test_valid_lines_and_hydras_own_modes_pass_through(argv):
    assert command_line_problem(argv, CONFIGS, "gapo_trainer") is None


def test_gapo_nodes_refuse_keys_their_dataclass_lacks():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose("smoke_cpu", ["+actor_rollout_ref.actor.policy_loss.diag_corr_windw=3"])
    with pytest.raises(GAPOConfigError, match=r"policy_loss.diag_corr_windw is not a key of GAPOPolicyLossConfig .*"
                                              r"did you mean actor_rollout_ref.actor.policy_loss.diag_corr_window\?"):
        check_gapo_node_keys(cfg)


# ------------------------------------------------------------------------------------ preflight hint, platform env
def test_the_skip_hint_lists_every_check():
    assert skip_hint().startswith(f"GAPO_SKIP_PREFLIGHT={','.join(CHECKS)} ")
    assert "packages" in CHECKS and "or all" in skip_hint()


def test_the_cpu_preset_needs_its_env_vars():
    need = {"VERL_PLATFORM": "cpu", "VERL_ENGINE_DEVICE": "cuda"}
    assert check_platform_env("cpu", need) == [] and check_platform_env("gpu_8", {}) == []
    assert check_platform_env(None, {}) == []
    [msg] = check_platform_env("cpu_vllm", {"VERL_PLATFORM": "cpu"})
    assert "VERL_ENGINE_DEVICE is unset" in msg and "VERL_PLATFORM=cpu VERL_ENGINE_DEVICE=cuda python -m" in msg


# --------------------------------------------------------------------------------------------- verl's chatter
def test_only_the_named_verl_messages_are_lowered(monkeypatch):
    monkeypatch.delenv("VERL_LOGGING_LEVEL", raising=False)
    monkeypatch.setattr(sys, "warnoptions", [])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_verl_startup()
        for message in ("megatron engine is not available: ModuleNotFoundError('megatron')", "a real problem"):
            warnings.warn_explicit(message, UserWarning, "engine/__init__.py", 1, module="verl.workers.engine")
        warnings.warn_explicit("torchtitan engine is not available: x", UserWarning, "elsewhere.py", 1,
                               module="someone.else")
    assert [str(w.message) for w in caught] == ["a real problem", "torchtitan engine is not available: x"]
    logger = logging.getLogger(PLATFORM_LOGGER)
    kept = [r for r in (logging.LogRecord(PLATFORM_LOGGER, logging.WARNING, "f", 1, msg, args, None) for msg, args in (
        ("No supported accelerator detected. Registered: %s. Falling back to 'nvidia'.", ("x",)),
        ("Replacing already-initialised platform '%s' with '%s'", ("a", "b")))) if logger.filter(r)]
    assert [r.getMessage() for r in kept] == ["Replacing already-initialised platform 'a' with 'b'"]


# ------------------------------------------------------------------------------------- the real entry point
def _entry(args, tmp_path, **env_extra) -> tuple[subprocess.CompletedProcess, float]:
    drop = ("RAY_ADDRESS", "VERL_PLATFORM", "VERL_ENGINE_DEVICE", "VERL_LOGGING_LEVEL", "GAPO_SKIP_PREFLIGHT",
            "PYTHONWARNINGS", "HYDRA_FULL_ERROR")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(GAPO_SMOKE_DIR=str(tmp_path / "smoke"), GAPO_DATA_DIR=str(tmp_path / "data"), **env_extra)
    start, before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-m", "recipe.main_gapo", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=240, stdin=subprocess.DEVNULL, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return proc, (cpu_s, time.monotonic() - start)


def _assert_one_message(proc, cost):
    """``cost``: (CPU seconds, wall seconds) of the entry point, as ``_entry`` returns them."""
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Traceback" not in out, out
    assert not [n for n in NOISE if n in out], out
    cpu_s, wall_s = cost
    assert cpu_s < ENTRY_CPU_LIMIT_S and wall_s < ENTRY_WALL_LIMIT_S, cost
    return out


def test_entry_point_unknown_experiment(tmp_path):
    proc, cost = _entry(["--config-name", "math/r1_1.5b_gapoo"], tmp_path)
    out = _assert_one_message(proc, cost)
    assert "GAPO config error: unknown experiment 'math/r1_1.5b_gapoo'" in proc.stderr
    assert "Did you mean math/r1_1.5b_gapo, " in proc.stderr and "\n  smoke_cpu\n" in proc.stderr
    assert "Cannot find primary config" not in out


def test_entry_point_misspelt_override(tmp_path):
    proc, cost = _entry(["--config-name", "smoke_cpu", "actor_rollout_ref.actor.policy_loss.eps_hgh_max=0.1"],
                           tmp_path)
    out = _assert_one_message(proc, cost)
    assert ("GAPO config error: actor_rollout_ref.actor.policy_loss.eps_hgh_max is not a config key: did you mean "
            "actor_rollout_ref.actor.policy_loss.eps_high_max?") in proc.stderr
    assert "To append to your config use +" not in out  # hydra's advice, which leads to the next mistake


def test_entry_point_misspelt_plus_override(tmp_path):
    proc, cost = _entry(["-cn=smoke_cpu", "+actor_rollout_ref.actor.policy_loss.eps_hgh_max=0.1"], tmp_path)
    _assert_one_message(proc, cost)
    assert "actor_rollout_ref.actor.policy_loss.eps_hgh_max is not a key of GAPOPolicyLossConfig" in proc.stderr
    assert "did you mean actor_rollout_ref.actor.policy_loss.eps_high_max?" in proc.stderr
    assert "unexpected keyword argument" not in proc.stderr


def test_entry_point_missing_data_on_the_cpu_preset_without_its_env(tmp_path):
    """The brief's command: the CPU preset without VERL_PLATFORM (which would fail after a minute in verl's workers)
    and a data file that is not there, both listed in one preflight message, with every check in the skip hint and
    no line of verl's import chatter before it."""
    proc, cost = _entry(["--config-name", "smoke_cpu", "data.train_files=/nonexistent.parquet",
                            f"hydra.run.dir={tmp_path / 'hydra'}"], tmp_path)
    out = _assert_one_message(proc, cost)
    assert f"GAPO preflight failed ({skip_hint()}):" in proc.stderr
    assert "- platform=cpu (the CPU preset; --config-name smoke_cpu selects it) needs VERL_PLATFORM=cpu" in out
    assert "- data.train_files='/nonexistent.parquet': no such file" in out
    assert "ray init kwargs" not in out  # before Ray
    print(f"{len(out.splitlines())} lines, {cost[0]:.1f} CPU s, {cost[1]:.1f} s:\n{out}")

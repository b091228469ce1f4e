"""Preflight checks (gapo.verl_plugin.preflight): a run without its data, model or GPUs fails within seconds,
naming the key and the fix, instead of waiting silently. Unit tests on tiny parquet files and fake Ray node
lists; one subprocess run of the real entry point (missing data file); one local Ray (logical resources)
showing the task runner's GPU error reaches the driver through ray.get."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from gapo.verl_plugin.preflight import (
    SKIP_ENV,
    PreflightError,
    check_cluster_gpus,
    check_data_files,
    check_model_path,
    check_resume_world_size,
    check_trl_conflict,
    run_driver_checks,
    skipped_checks,
    uses_gapo_reward,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_skip(monkeypatch):
    monkeypatch.delenv(SKIP_ENV, raising=False)


def _rows(n=3, source="gapo_smoke"):
    return [{"data_source": source, "prompt": [{"role": "user", "content": f"q{i}"}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(i)}} for i in range(n)]


def _write(path: Path, rows) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def _config(train, val, model="Qwen/Qwen2.5-Math-1.5B", reward_path="pkg://gapo.rewards", **data):
    return OmegaConf.create({
        "data": {"train_files": train, "val_files": val, "prompt_key": "prompt", "custom_cls": {"path": None},
                 **data},
        "reward": {"custom_reward_function": {"path": reward_path, "name": "compute_score"},
                   "reward_model": {"enable_resource_pool": False, "nnodes": 0, "n_gpus_per_node": 0}},
        "distillation": {"enabled": False, "nnodes": 0, "n_gpus_per_node": 0},
        "actor_rollout_ref": {"model": {"path": model, "tokenizer_path": None}},
        "trainer": {"nnodes": 1, "n_gpus_per_node": 8},
        "ray_kwargs": {"ray_init": {"num_cpus": None}},
    })


@pytest.fixture
def good(tmp_path):
    return _write(tmp_path / "train.parquet", _rows()), _write(tmp_path / "val.parquet", _rows(2))


@pytest.fixture
def hub_answers(monkeypatch):
    """The hub reachable from here (this machine has no network): hub ids pass the model check."""
    import gapo.verl_plugin.preflight as preflight

    monkeypatch.setattr(preflight, "hub_unreachable_reason", lambda name: None)


def test_good_data_and_hub_model_pass(good, tmp_path, hub_answers):
    train, val = good
    assert check_data_files(_config(train, [val, val])) == []
    assert check_model_path(_config(train, val)) == []  # a hub id passes where the hub answers
    run_driver_checks(_config(train, val))


def test_a_hub_id_the_hub_cannot_give_is_named_within_seconds(good, monkeypatch):
    """Offline clusters are common: a hub id that is neither in the HF cache nor reachable fails the preflight in one
    line (transformers' own download retried ~50 s, then two tracebacks)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    train, val = good
    start = time.monotonic()
    [problem] = check_model_path(_config(train, val))
    assert time.monotonic() - start < 30  # a connect of at most 3 s; 30 leaves room for a loaded machine
    assert problem.startswith("actor_rollout_ref.model.path: ") and "HF_HUB_OFFLINE is set" in problem
    assert "local model folder" in problem


def test_missing_data_file_names_the_key_and_the_fix(good, tmp_path):
    val = good[1]
    problems = check_data_files(_config(str(tmp_path / "nope.parquet"), [val, "data/math/aime24.parquet"]))
    assert problems[0].startswith(f"data.train_files='{tmp_path}/nope.parquet': no such file")
    assert problems[1].startswith("data.val_files[1]='data/math/aime24.parquet': no such file (relative to ")
    assert "gapo.data.prepare_math" in problems[-1] and "GAPO_DATA_DIR" in problems[-1]
    with pytest.raises(PreflightError, match="data.train_files"):
        run_driver_checks(_config(str(tmp_path / "nope.parquet"), val))


def test_folder_unknown_format_and_unreadable_parquet_are_refused(tmp_path):
    (tmp_path / "bad.parquet").write_text("not parquet")
    (tmp_path / "rows.csv").write_text("a,b\n")
    problems = check_data_files(_config([str(tmp_path), str(tmp_path / "rows.csv")], str(tmp_path / "bad.parquet")))
    assert "data.train_files[0]" in problems[0] and "is a folder" in problems[0]
    assert "data.train_files[1]" in problems[1] and "reads only .parquet, .json, .jsonl" in problems[1]
    assert problems[2].startswith(f"data.val_files='{tmp_path}/bad.parquet' is not a readable parquet file")


def test_remote_data_uri_is_skipped_with_a_note(good, capsys):
    train = good[0]
    assert check_data_files(_config(["hdfs://nn/data/train.parquet", train], "s3://bucket/val.parquet")) == []
    assert "remote: not checked" in capsys.readouterr().out


@pytest.mark.parametrize("drop, expect", [
    ("data_source", "no column 'data_source'"),
    ("reward_model", "no column 'reward_model'"),
    ("ground_truth", "column reward_model (struct<style: string>) has no field 'ground_truth'"),
    ("prompt", "no column 'prompt' (data.prompt_key=prompt"),
])
def test_missing_reward_or_prompt_columns_are_named(tmp_path, good, drop, expect):
    rows = _rows()
    for row in rows:
        if drop == "ground_truth":
            del row["reward_model"]["ground_truth"]
        else:
            del row[drop]
    path = _write(tmp_path / "cols.parquet", rows)
    problems = check_data_files(_config(path, good[1]))
    assert len(problems) == 1 and problems[0].startswith(f"data.train_files='{path}'") and expect in problems[0]


def test_prompt_key_is_read_from_the_config(tmp_path, good):
    rows = [{**{k: v for k, v in r.items() if k != "prompt"}, "question": r["prompt"]} for r in _rows()]
    path = _write(tmp_path / "q.parquet", rows)
    assert check_data_files(_config(path, path, prompt_key="question")) == []
    assert "set data.prompt_key=<the prompt column>" in check_data_files(_config(path, good[1]))[0]


def test_unknown_data_source_is_refused_only_for_gapos_reward(tmp_path, good):
    rows = _rows(source="gsm8k") + _rows(2, source="HuggingFaceH4/MATH-500") + _rows(4, source="my_new_task")
    rows += _rows(1, source="deepcoder_taco")
    path = _write(tmp_path / "mixed.parquet", rows)
    problems = check_data_files(_config(good[0], path))
    assert len(problems) == 1
    assert problems[0].startswith(f"data.val_files='{path}': data_source 'my_new_task' (4 rows) unknown to the reward")
    assert "gapo.rewards.register_scorer" in problems[0] and "reward.custom_reward_function" in problems[0]
    # another reward function decides for itself which sources it knows
    assert check_data_files(_config(good[0], path, reward_path="/somewhere/my_reward.py")) == []
    assert uses_gapo_reward(_config(good[0], path, reward_path=str(ROOT / "gapo/rewards/__init__.py")))


def test_known_data_source_helper():
    from gapo.rewards import is_known_data_source, known_data_sources

    assert all(map(is_known_data_source, ["gapo_smoke", "lighteval/MATH", "AI-MO/aimo-validation-aime",
                                          "humanevalplus", "OlympiadBench"]))
    assert not is_known_data_source("my_new_task") and not is_known_data_source(None)
    exact, keywords = known_data_sources()
    assert "gapo_smoke" in exact and "math" in keywords


@pytest.mark.parametrize("path", ["/nonexistent/model", "./model", "~/nope/model", "runs/smoke/model", "model"])
def test_missing_local_model_path_names_the_key(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths: not the checkout, where `make smoke` leaves runs/smoke/model
    problems = check_model_path(_config("x", "x", model=path))
    assert len(problems) == 1
    assert problems[0].startswith(f"actor_rollout_ref.model.path='{path}': no such local folder")
    assert "hub id org/name" in problems[0] and "recipe.smoke" in problems[0]


def test_a_typo_of_a_local_folder_is_not_sent_to_the_hub(tmp_path, monkeypatch, hub_answers):
    """The rule `python -m eval --model` follows (gapo.model_path.is_hub_id): org/name is a hub id only when org/ is
    no local folder; with runs/ here, runs/nothere is a mistyped local path, named as such."""
    monkeypatch.chdir(tmp_path)
    assert check_model_path(_config("x", "x", model="runs/nothere")) == []  # no runs/ here: a hub id, checked there
    (tmp_path / "runs").mkdir()
    problems = check_model_path(_config("x", "x", model="runs/nothere"))
    assert len(problems) == 1 and "no such local folder" in problems[0], problems
    assert "runs/ is a local folder, so it is not taken as a hub id" in problems[0]
    assert check_model_path(_config("x", "x", model="Qwen/Qwen2.5-Math-1.5B")) == []
    [problem] = check_model_path(_config("x", "x", model="ckpts/global_step_5"))  # no ckpts/ here: not "a local folder"
    assert "is a local folder" not in problem and "and not a hub id org/name" in problem


def test_model_folder_needs_config_json(tmp_path):
    assert "has no config.json" in check_model_path(_config("x", "x", model=str(tmp_path)))[0]
    (tmp_path / "config.json").write_text("{}")
    assert check_model_path(_config("x", "x", model=str(tmp_path))) == []


# ------------------------------------------------------------------------------------------------- GPUs
def _nodes(*gpus):
    return [{"Alive": True, "Resources": {"CPU": 16.0, **({"GPU": float(g)} if g else {})}} for g in gpus]


def test_too_few_gpus_names_both_numbers_and_the_keys():
    cfg = _config("x", "x")
    with pytest.raises(PreflightError) as err:
        check_cluster_gpus(cfg, nodes=_nodes(0), available={"CPU": 16.0}, resource="GPU")
    msg = str(err.value)
    assert "trainer.nnodes x trainer.n_gpus_per_node = 1 x 8: 8 GPUs requested, but the Ray cluster has 0" in msg
    assert "--config-name smoke_cpu" in msg and f"{SKIP_ENV}=gpu" in msg


def test_gpus_split_over_nodes_that_cannot_hold_a_node_of_workers():
    cfg = _config("x", "x")  # 1 node x 8 GPUs, the cluster has 2 nodes x 4: verl's placement group never fits
    with pytest.raises(PreflightError, match=r"only 0 node\(s\) have 8 GPUs .*wait forever"):
        check_cluster_gpus(cfg, nodes=_nodes(4, 4), available={"GPU": 8.0}, resource="GPU")
    cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node = 2, 4
    check_cluster_gpus(cfg, nodes=_nodes(4, 4, 0), available={"GPU": 8.0}, resource="GPU")


def test_reward_pool_gpus_count_and_busy_gpus_are_reported():
    cfg = _config("x", "x")
    cfg.reward.reward_model.update(enable_resource_pool=True, nnodes=1, n_gpus_per_node=2)
    with pytest.raises(PreflightError, match=r"reward.reward_model.nnodes x reward.reward_model.n_gpus_per_node = "
                                             r"1 x 2: 10 GPUs requested, but the Ray cluster has 8"):
        check_cluster_gpus(cfg, nodes=_nodes(8), available={"GPU": 8.0}, resource="GPU")
    cfg.reward.reward_model.enable_resource_pool = False
    with pytest.raises(PreflightError, match="has 8 but only 2 free"):
        check_cluster_gpus(cfg, nodes=_nodes(8), available={"GPU": 2.0}, resource="GPU")
    check_cluster_gpus(cfg, nodes=_nodes(8), available={"GPU": 8.0}, resource="GPU")


def test_skip_env(monkeypatch):
    assert skipped_checks({SKIP_ENV: "gpu, data"}) == {"gpu", "data"}
    assert skipped_checks({SKIP_ENV: "all"}) == {"data", "model", "checkpoint", "packages", "gpu"}
    with pytest.raises(PreflightError, match="unknown check"):
        skipped_checks({SKIP_ENV: "gpus"})
    monkeypatch.setenv(SKIP_ENV, "gpu")
    check_cluster_gpus(_config("x", "x"), nodes=_nodes(0), available={}, resource="GPU")


def test_task_runner_gpu_error_reaches_the_driver_within_seconds(monkeypatch):
    """GAPOTaskRunner (a Ray actor) checks the cluster before verl's trainer starts; its PreflightError arrives
    in the driver through ray.get, as run_ppo waits for it (a local Ray with one logical GPU; 8 asked)."""
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # a fresh local Ray, never a cluster of the caller's

    from recipe.main_gapo import GAPOTaskRunner

    cfg = _config("x", "x")
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    try:
        runner = GAPOTaskRunner.remote()
        ray.get(runner.__ray_ready__.remote(), timeout=180)  # the actor's start (imports verl) is not the check
        start = time.monotonic()
        with pytest.raises(PreflightError) as err:
            ray.get(runner.run.remote(cfg), timeout=120)
        elapsed = time.monotonic() - start
    finally:
        ray.shutdown()
    cause = err.value.cause  # what recipe.main_gapo prints
    assert isinstance(cause, PreflightError) and len(cause.problems) == 1
    assert "1 x 8: 8 GPUs requested, but the Ray cluster has 1" in cause.problems[0]
    # the check answers in ~0.015 s here, its actor already up: 30 s is a bound no load reaches, far below what
    # waiting for verl's trainer to start (minutes) would take
    assert elapsed < 30, elapsed


def test_entry_point_fails_fast_on_a_missing_data_file():
    """The real entry point: the error names the key, the process exits non-zero, and Ray never starts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "VERL_PLATFORM", SKIP_ENV))}
    env["GAPO_DATA_DIR"] = "/nonexistent-gapo-data"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "recipe.main_gapo", "--config-name", "math/r1_1.5b_gapo",
                           "data.train_files=/nonexistent.parquet"], check=False, cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=240, stdin=subprocess.DEVNULL)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert "GAPO preflight failed" in proc.stderr
    assert "- data.train_files='/nonexistent.parquet': no such file" in proc.stderr
    assert "data.val_files[0]='/nonexistent-gapo-data/math/aime24.parquet': no such file" in proc.stderr
    assert "ray init kwargs" not in proc.stdout + proc.stderr  # failed before run_ppo started Ray
    print(f"entry point failed after {elapsed:.1f} s")


# ------------------------------------------------------------------------------ resume at another world size
def _checkpoint(root: Path, step: int, world: int, ranks=None) -> Path:
    """A verl 0.9.1 checkpoint folder as its FSDP manager writes it: one model/optim/extra_state shard per rank."""
    actor = root / f"global_step_{step}" / "actor"
    actor.mkdir(parents=True)
    for rank in (range(world) if ranks is None else ranks):
        for kind in ("model", "optim", "extra_state"):
            (actor / f"{kind}_world_size_{world}_rank_{rank}.pt").write_bytes(b"")
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    return actor.parent


def _resume_config(root, nnodes=1, per_node=1, mode="auto", path=None):
    cfg = _config("x", "x")
    cfg.trainer = {"nnodes": nnodes, "n_gpus_per_node": per_node, "resume_mode": mode,
                   "default_local_dir": str(root), "resume_from_path": path}
    return cfg


def test_resume_at_the_world_size_of_the_checkpoint_passes(tmp_path, capsys):
    _checkpoint(tmp_path, 1, world=1)
    _checkpoint(tmp_path, 2, world=2)  # the tracker names step 2: the one verl would load
    assert check_resume_world_size(_resume_config(tmp_path, per_node=2)) == []
    assert "written at world size 2, as this run" in capsys.readouterr().out
    assert check_resume_world_size(_resume_config(tmp_path, nnodes=2, per_node=1)) == []  # 2 nodes x 1 is 2 too


@pytest.mark.parametrize("written, nnodes, per_node", [(1, 1, 2), (2, 1, 1), (2, 1, 8), (8, 2, 8)])
def test_resume_at_another_world_size_names_both_sizes_and_the_fix(tmp_path, written, nnodes, per_node):
    folder = _checkpoint(tmp_path, 3, world=written)
    problems = check_resume_world_size(_resume_config(tmp_path, nnodes=nnodes, per_node=per_node))
    assert len(problems) == 1
    text = problems[0]
    assert f"the checkpoint {folder} was written at world size {written} " in text
    assert f"this run has world size {nnodes * per_node} (trainer.nnodes={nnodes} x " \
           f"trainer.n_gpus_per_node={per_node})" in text
    assert "cannot reshard on load" in text
    assert f"verl.model_merger merge --backend fsdp --local_dir {folder / 'actor'}" in text
    assert "trainer.resume_mode=disable" in text
    # run_driver_checks raises it (what recipe.main_gapo prints, before run_ppo starts Ray)
    with pytest.raises(PreflightError) as err:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(SKIP_ENV, "data,model")
            run_driver_checks(_resume_config(tmp_path, nnodes=nnodes, per_node=per_node))
    assert text in err.value.problems


def test_resume_path_mode_checks_the_named_folder_not_the_latest(tmp_path):
    old = _checkpoint(tmp_path, 1, world=1)
    _checkpoint(tmp_path, 2, world=2)
    cfg = _resume_config(tmp_path, per_node=2, mode="resume_path", path=str(old))
    problems = check_resume_world_size(cfg)
    assert len(problems) == 1 and problems[0].startswith(f"trainer.resume_from_path: the checkpoint {old} was "
                                                         "written at world size 1")
    missing = _resume_config(tmp_path, mode="resume_path", path=str(tmp_path / "global_step_9"))
    assert "no actor checkpoint folder" in check_resume_world_size(missing)[0]


def test_an_incomplete_copy_names_the_missing_ranks(tmp_path):
    _checkpoint(tmp_path, 1, world=4, ranks=[0, 2])
    problems = check_resume_world_size(_resume_config(tmp_path, per_node=4))
    assert len(problems) == 1 and "lacks the model shards of rank(s) [1, 3] of world size 4" in problems[0]


def test_nothing_to_resume_or_resume_off_is_not_checked(tmp_path):
    assert check_resume_world_size(_resume_config(tmp_path / "empty")) == []  # no tracker: training from scratch
    _checkpoint(tmp_path, 1, world=1)
    assert check_resume_world_size(_resume_config(tmp_path, per_node=2, mode="disable")) == []
    # a relative default_local_dir is taken against the cwd, as verl does
    cfg = _resume_config(os.path.relpath(tmp_path), per_node=2)
    assert len(check_resume_world_size(cfg)) == 1


def test_skip_env_turns_the_checkpoint_check_off(tmp_path, monkeypatch):
    _checkpoint(tmp_path, 1, world=1)
    monkeypatch.setenv(SKIP_ENV, "data,model,checkpoint")
    run_driver_checks(_resume_config(tmp_path, per_node=2))  # nothing raised
    monkeypatch.setenv(SKIP_ENV, "data,model")
    with pytest.raises(PreflightError, match="written at world size 1"):
        run_driver_checks(_resume_config(tmp_path, per_node=2))


def _fake_trl(root: Path, body: str, ppo: str | None = None) -> None:
    """A package named trl under root (its __init__ is `body`; `ppo`: the body of trl/experimental/ppo)."""
    (root / "trl").mkdir(parents=True)
    (root / "trl" / "__init__.py").write_text(body)
    if ppo is not None:
        (root / "trl" / "experimental" / "ppo").mkdir(parents=True)
        (root / "trl" / "experimental" / "__init__.py").write_text("")
        (root / "trl" / "experimental" / "ppo" / "__init__.py").write_text(ppo)


@pytest.mark.parametrize("body, ppo, conflict", [
    ("", None, True),                                                 # trl 1.x: the value-head model is gone
    ("", "AutoModelForCausalLMWithValueHead = object", False),        # where verl looks first
    ("AutoModelForCausalLMWithValueHead = object", None, False),      # older trl: at the top level
])
def test_a_trl_that_verls_actor_cannot_build_with_stops_the_run(tmp_path, monkeypatch, body, ppo, conflict):
    """verl 0.9.1 imports trl's AutoModelForCausalLMWithValueHead whenever trl is importable: a trl without it stops
    the run in the driver, naming the fix (tests/trl_integration/test_trl_integration.py shows verl's failure with the real one)."""
    import importlib

    assert check_trl_conflict() == []  # this environment has no trl
    _fake_trl(tmp_path, body, ppo)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "trl" or m.startswith("trl.")]:
        monkeypatch.delitem(sys.modules, name)
    importlib.invalidate_caches()
    try:
        problems = check_trl_conflict()
    finally:
        for name in [m for m in sys.modules if m == "trl" or m.startswith("trl.")]:
            del sys.modules[name]
    if conflict:
        assert len(problems) == 1 and "make install-trl" in problems[0] and "AutoModelForCausalLMWithValueHead" in \
            problems[0]
    else:
        assert problems == []

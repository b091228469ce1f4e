"""The evaluation's model resolution (eval/checkpoint.py): HF folders, verl checkpoints, hub names, and the rule
that tells a hub id from a mistyped local path (is_hub_id)."""

from __future__ import annotations

import pytest


def test_model_resolution(tmp_path):
    from eval.checkpoint import find_actor_dir, resolve_model

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"")
    assert resolve_model(hf).kind == "hf"
    actor = tmp_path / "ckpt" / "global_step_7" / "actor"
    actor.mkdir(parents=True)
    (actor / "model_world_size_1_rank_0.pt").write_bytes(b"")
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("7\n")
    for named in (actor, actor.parent, tmp_path / "ckpt"):
        assert find_actor_dir(named) == actor
    with pytest.raises(ValueError, match="fsdp_config.json"):  # a shard but no FSDP metadata
        resolve_model(actor.parent, cache_dir=tmp_path / "cache")
    assert resolve_model("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B").kind == "hub"
    with pytest.raises(FileNotFoundError):
        resolve_model(str(tmp_path / "missing" / "global_step_3"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="neither"):
        resolve_model(tmp_path / "empty", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


# Hub ids of the paper's models and a few more: tried on the hub when no such path exists
HUB_IDS = ["deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "Qwen/Qwen2.5-Math-1.5B", "meta-llama/Llama-3.2-3B-Instruct",
           "agentica-org/DeepCoder-1.5B-Preview", "org/name_with.dots-and_1"]
# Local-looking names (a local prefix, a first part that is a local folder, two slashes, a checkpoint step, no org,
# characters a hub id cannot have): a mistake when they do not exist, never a hub lookup
LOCAL = ["runs/nothere", "runs/smoke/checkpoints/global_step_9", "./nothere", "../gapo-nothere/model",
         "/gapo-nothere/model", "~/gapo-nothere", "a/b/c", "ckpt/global_step_3", "base_model", "gpt2", "org/na me",
         "-org/name", "org/", "/org/name"]


def _smoke_like(root):
    ckpt = root / "runs" / "smoke" / "checkpoints"
    (ckpt / "global_step_1" / "actor").mkdir(parents=True)
    (ckpt / "global_step_2").mkdir()
    (root / "runs" / "smoke-trl").mkdir()
    return ckpt


def test_hub_ids_pass_through_untouched(tmp_path, monkeypatch):
    from eval.checkpoint import ResolvedModel, is_hub_id, resolve_model

    monkeypatch.chdir(tmp_path)
    _smoke_like(tmp_path)
    for name in HUB_IDS:
        assert is_hub_id(name), name
        assert resolve_model(name, cache_dir=tmp_path / "cache") == ResolvedModel(name, "hub", name)
    assert not (tmp_path / "cache").exists()


def test_local_looking_missing_paths_are_named_with_what_exists(tmp_path, monkeypatch):
    from eval.checkpoint import is_hub_id, missing_path_message, resolve_model

    monkeypatch.chdir(tmp_path)
    _smoke_like(tmp_path)
    for name in LOCAL:
        assert not is_hub_id(name), name
        with pytest.raises(FileNotFoundError) as err:
            resolve_model(name, cache_dir=tmp_path / "cache")
        assert str(err.value).startswith(f"no such local folder: {name}; ") and "\n" not in str(err.value), name
    msg = missing_path_message("runs/nothere")
    assert "; runs/ has: smoke, smoke-trl;" in msg
    assert "verl checkpoints there: runs/smoke/checkpoints (global_step_1..2)" in msg
    assert msg.endswith("(runs/ is a local folder, so this is not taken as a hub id org/name)")
    assert "(closest: smoke, smoke-trl)" in missing_path_message("runs/smok")
    assert "./ has: runs;" in missing_path_message("base_model")
    assert missing_path_message("base_model").endswith("(a hub id has the form org/name)")
    assert "global_step_1, global_step_2" in missing_path_message("runs/smoke/checkpoints/global_step_9")
    # an org that is a local folder makes org/name a local path
    (tmp_path / "Qwen").mkdir()
    assert not is_hub_id("Qwen/Qwen2.5-Math-1.5B")
    with pytest.raises(FileNotFoundError, match="Qwen/ is a local folder"):
        resolve_model("Qwen/Qwen2.5-Math-1.5B")


def test_existing_local_folders_resolve_whatever_their_name(tmp_path, monkeypatch):
    """A folder named like a hub id, relative paths, a verl checkpoint by its step folder or its run's root: local;
    an existing folder that is no model names the checkpoints under it."""
    from eval.checkpoint import find_actor_dir, resolve_model

    monkeypatch.chdir(tmp_path)
    hf = tmp_path / "my-org" / "model"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"")
    assert resolve_model("my-org/model").path == str(hf) and resolve_model("my-org/model").kind == "hf"
    ckpt = _smoke_like(tmp_path)
    (ckpt / "global_step_1" / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("1\n")
    for named in ("runs/smoke/checkpoints", "runs/smoke/checkpoints/global_step_1", "./runs/smoke/checkpoints"):
        assert find_actor_dir(tmp_path / named) == ckpt / "global_step_1" / "actor"
        with pytest.raises(ValueError, match="fsdp_config.json"):  # reached the verl conversion, not the hub
            resolve_model(named, cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match=r"verl checkpoints under it: runs/smoke/checkpoints \(global_step_1..2\)"):
        resolve_model("runs/smoke", cache_dir=tmp_path / "cache")

"""The evaluation's model resolution (eval/checkpoint.py): HF folders, verl checkpoints, hub names."""

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

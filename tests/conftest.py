"""Shared fixtures; also makes sure `tests` is this project's folder, not the one verl installs."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def started_sandbox(config):
    """A started code sandbox for a module-scoped fixture (yield it, then close it); skips where none works."""
    import pytest

    from gapo.rewards.sandbox import Sandbox, SandboxUnavailable

    sandbox = Sandbox(config)
    try:
        sandbox.start()
    except SandboxUnavailable as exc:
        pytest.skip(f"no sandbox here: {exc}")
    return sandbox


def load_with_verl(files, tmp_path, max_prompt_length):
    """verl's own RLHFDataset over prepared parquet files, with the tiny char-level tokenizer (which drops
    characters it does not know, so prompts are short)."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from gapo.smoke.tiny_model import build_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "tiny"))
    config = OmegaConf.create({
        "prompt_key": "prompt",
        "max_prompt_length": max_prompt_length,
        "filter_overlong_prompts": True,
        "filter_overlong_prompts_workers": 1,
        "truncation": "error",
        "cache_dir": str(tmp_path / "cache"),
    })
    return RLHFDataset(data_files=[str(f) for f in files], tokenizer=tokenizer, config=config)

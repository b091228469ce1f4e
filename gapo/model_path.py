"""Whether a model name that is no existing path is a Hugging Face hub id or a mistyped local path.

One rule for every entry point that takes a model (``python -m eval --model``, the training preflight's
``actor_rollout_ref.model.path``): a typo of a local folder must be named as such within milliseconds, not sent to
the hub (a lookup of ``runs/nothere`` took five retries, about 50 s, then a long traceback).
"""

from __future__ import annotations

import re
from pathlib import Path

# org/name: one slash, each part a letter or digit then letters, digits, `_`, `-`, `.`
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*", re.ASCII)


def is_hub_id(name: str) -> bool:
    """Whether ``name``, when no such path exists, is tried as a Hugging Face hub id.

    Only a name of the hub's form, ``org/name`` (one slash; each part a letter or digit followed by letters,
    digits, ``_``, ``-``, ``.``), that does not look local: it does not start with ``/``, ``./``, ``../`` or ``~``
    (the form excludes them), has no second slash, names no ``global_step_``, and its first part is not an existing
    local folder (with ``runs/`` present, ``runs/nothere`` is a missing local path, not a hub id). Relative paths are
    against the current folder. ``gpt2``-style ids without an org are local paths here; name them ``org/name``
    (``openai-community/gpt2``).
    """
    if not HUB_ID.fullmatch(name) or "global_step_" in name:
        return False
    return not Path(name.split("/", 1)[0]).is_dir()


HUB_PROBE_TIMEOUT_S = 3.0
_TRUE = ("1", "true", "yes", "on")


def _in_hf_cache(name: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    return isinstance(try_to_load_from_cache(name, "config.json"), str)


def hub_unreachable_reason(name: str, timeout_s: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """``None`` if hub id ``name`` can be loaded (it is in the local HF cache, or the hub answers a TCP connect
    within ``timeout_s``), else one line saying why not and what to do. The probe takes at most ``timeout_s``
    (a name lookup that fails answers at once), where transformers' own retries took ~50 s before failing."""
    import os
    import socket
    from urllib.parse import urlparse

    if _in_hf_cache(name):
        return None
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    fix = "give a local model folder, or download it where the hub is reachable (HF_ENDPOINT for a mirror)"
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in _TRUE:
        return f"{name!r} is no local path and not in the HF cache, and HF_HUB_OFFLINE is set: {fix}"
    url = urlparse(endpoint)
    host, port = url.hostname or endpoint, url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as err:
        return (f"{name!r} is no local path, so it was taken as a hub id, but the hub ({host}:{port}) is not "
                f"reachable from here ({type(err).__name__}: {err}): {fix}")
    return None

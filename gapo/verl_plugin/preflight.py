"""Preflight checks of a training run: fail within seconds, naming the key and the fix, before GPU time is spent.

Without them verl finds a missing data file or model only after Ray, TransferQueue and the tokenizer have
started, and on a machine without the requested GPUs it could wait silently (observed: still waiting after
150 s). Two stages:

- in the driver, before ``run_ppo`` (no Ray): :func:`check_data_files` (``data.train_files`` /
  ``data.val_files`` exist, are readable parquet with the columns the reward needs, and, when the reward is
  this project's ``pkg://gapo.rewards``, every ``data_source`` in them has a scorer),
  :func:`check_model_path` (``actor_rollout_ref.model.path`` exists when it is a local path) and
  :func:`check_resume_world_size` (the checkpoint a resume would load was written at this run's world size:
  verl 0.9.1 keeps one shard per rank and cannot reshard on load), :func:`check_trl_conflict` (no trl that
  verl 0.9.1's FSDP actor cannot build with) and :func:`check_platform_env` (a CPU preset has its env vars; not
  skippable);
- in the task runner (a Ray actor, the process where verl builds its resource pools, so the platform's Ray
  resource name is the one verl will ask for), before verl's trainer starts: :func:`check_cluster_gpus`.

``GAPO_SKIP_PREFLIGHT=data,model,checkpoint,packages,gpu`` (any of them, or ``all``) skips checks: ``gpu`` on an
autoscaling cluster (nodes that join only once verl asks for them), ``data``/``model``/``checkpoint`` where the
driver's machine does not see the files the Ray workers see.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence

from omegaconf import DictConfig, ListConfig

from gapo.model_path import HUB_ID, hub_unreachable_reason, is_hub_id

SKIP_ENV = "GAPO_SKIP_PREFLIGHT"
CHECKS = ("data", "model", "checkpoint", "packages", "gpu")
OUR_REWARD_PATHS = ("pkg://gapo.rewards", "pkg://gapo/rewards")
OUR_REWARD_FUNCTIONS = ("compute_score", "compute_score_batch")
DATA_SUFFIXES = (".parquet", ".json", ".jsonl")  # what verl's RLHFDataset reads
# A URI with a scheme (hdfs://, s3://, gs://, ...): not checked here (verl copies hdfs:// to a local cache).
_REMOTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

DATA_FIX = (
    "prepare the data first (math: `python -m gapo.data.prepare_math --dataset all`, code: "
    "`python -m gapo.data.prepare_code --dataset all`, written under $GAPO_DATA_DIR, default ./data; smoke: "
    "`python -m recipe.smoke` builds $GAPO_SMOKE_DIR), or point the key at an existing file"
)


class PreflightError(RuntimeError):
    """A run that cannot start: each line names the config key and the fix."""

    def __init__(self, problems: Sequence[str] | str):
        """`problems`: one problem or a list of them, kept as `self.problems`; the message lists each on a line."""
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(f"- {p}" for p in self.problems))

    def __reduce__(self):  # pickled from the task runner to the driver: keep the list, not the joined text
        return type(self), (self.problems,)


def skip_hint() -> str:
    """How to skip checks, from CHECKS itself: what a failed preflight prints beside its problems."""
    return f"{SKIP_ENV}={','.join(CHECKS)} (any of them, or all) skips checks"


def skipped_checks(environ=None) -> set[str]:
    """The checks ``GAPO_SKIP_PREFLIGHT`` (comma or space separated: data, model, checkpoint, packages, gpu, all)
    turns off."""
    raw = (os.environ if environ is None else environ).get(SKIP_ENV, "")
    words = {w for w in re.split(r"[\s,]+", raw.strip().lower()) if w}
    if "all" in words:
        return set(CHECKS)
    unknown = words - set(CHECKS)
    if unknown:
        raise PreflightError(f"{SKIP_ENV}={raw!r}: unknown check(s) {sorted(unknown)}; use a comma-separated "
                             f"subset of {', '.join(CHECKS)}, or all")
    return words


def _note(msg: str) -> None:
    print(f"[gapo preflight] {msg}", flush=True)


def _as_list(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple, ListConfig)):
        return [str(v) for v in value]
    return [str(value)]


# ------------------------------------------------------------------------------------------------ data
def uses_gapo_reward(config: DictConfig) -> bool:
    """True when the reward is this project's dispatcher (``reward.custom_reward_function`` -> gapo.rewards)."""
    fn = (config.get("reward") or {}).get("custom_reward_function") or {}
    path, name = fn.get("path"), fn.get("name")
    if not path or name not in OUR_REWARD_FUNCTIONS:
        return False
    path = str(path).rstrip("/")
    if path in OUR_REWARD_PATHS:
        return True
    import gapo.rewards

    return os.path.realpath(os.path.expanduser(path)) == os.path.realpath(gapo.rewards.__file__)


def _ground_truth_ok(field_type) -> bool:
    import pyarrow as pa

    if pa.types.is_struct(field_type):
        return field_type.get_field_index("ground_truth") >= 0
    return pa.types.is_map(field_type)  # keys unknown until read: verl indexes it like a dict


def _check_parquet(key: str, path: str, prompt_key: str, check_sources: bool) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pfile = pq.ParquetFile(path)
        schema = pfile.schema_arrow
    except (pa.ArrowException, OSError) as err:
        return [f"{key}={path!r} is not a readable parquet file ({err}): {DATA_FIX}"]
    names = schema.names
    problems = []
    needed = [("data_source", "the reward dispatches on it"), (prompt_key, f"data.prompt_key={prompt_key}")]
    for column, why in needed:
        if column not in names:
            problems.append(
                f"{key}={path!r} has no column {column!r} ({why}; columns: {names}): re-prepare the data"
                + (", or set data.prompt_key=<the prompt column>" if column == prompt_key else "")
            )
    if "reward_model" not in names:
        problems.append(f"{key}={path!r} has no column 'reward_model' (the reward reads reward_model.ground_truth; "
                        f"columns: {names}): re-prepare the data")
    elif not _ground_truth_ok(schema.field("reward_model").type):
        problems.append(f"{key}={path!r}: column reward_model ({schema.field('reward_model').type}) has no field "
                        "'ground_truth', which the reward reads: re-prepare the data")
    if check_sources and "data_source" in names:
        problems += _check_sources(key, path, pfile.read(columns=["data_source"]).column(0).to_pylist())
    return problems


def _check_sources(key: str, path: str, values: Iterable) -> list[str]:
    from gapo.rewards import is_known_data_source, known_data_sources

    counts = Counter(values)
    unknown = Counter({v: n for v, n in counts.items() if not is_known_data_source(v)})
    if not unknown:
        return []
    exact, keywords = known_data_sources()
    shown = ", ".join(f"{v!r} ({n} rows)" for v, n in unknown.most_common(5))
    more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
    message = (f"{key}={path!r}: data_source {shown}{more} unknown to the reward (reward.custom_reward_function "
               f"-> gapo.rewards knows {exact}, or a name whose last '/' part has a word starting with one of "
               f"{keywords}): fix the data's data_source column, register a scorer "
               "(gapo.rewards.register_scorer), or point reward.custom_reward_function at your own function")
    return [message]


def check_data_files(config: DictConfig) -> list[str]:
    """Problems of ``data.train_files`` / ``data.val_files`` (empty when fine). Reads parquet schemas and the
    data_source column only."""
    data = config.data
    prompt_key = data.get("prompt_key", "prompt") or "prompt"
    custom_cls = (data.get("custom_cls") or {}).get("path")
    check_sources = uses_gapo_reward(config)
    problems, missing = [], False
    for base in ("train_files", "val_files"):
        files = _as_list(data.get(base))
        if not files:
            problems.append(f"data.{base} is empty: set data.{base}=<parquet file or list of files>")
        for i, path in enumerate(files):
            key = f"data.{base}" if len(files) == 1 and not isinstance(data.get(base), (list, ListConfig)) \
                else f"data.{base}[{i}]"
            if _REMOTE.match(path):
                _note(f"{key}={path!r} is remote: not checked (verl copies it when the dataset loads)")
                continue
            local = os.path.expanduser(path)
            if not os.path.exists(local):
                where = "" if os.path.isabs(local) else f" (relative to {os.getcwd()})"
                problems.append(f"{key}={path!r}: no such file{where}")
                missing = True
            elif os.path.isdir(local):
                problems.append(f"{key}={path!r} is a folder: verl reads files; list them, "
                                f"e.g. {key.split('[')[0]}=[{path.rstrip('/')}/a.parquet,...]")
            elif not os.access(local, os.R_OK):
                problems.append(f"{key}={path!r} is not readable by this user: fix its permissions")
            elif not local.endswith(DATA_SUFFIXES):
                if not custom_cls:
                    problems.append(f"{key}={path!r}: verl's dataset reads only {', '.join(DATA_SUFFIXES)} files: "
                                    "convert it to parquet")
            elif custom_cls or not local.endswith(".parquet"):
                why = "data.custom_cls is set" if custom_cls else "not parquet"
                _note(f"{key}={path!r}: columns not checked ({why})")
            else:
                problems += _check_parquet(key, path, prompt_key, check_sources)
    if missing:
        data_dir = os.environ.get("GAPO_DATA_DIR")
        problems.append(f"fix for the missing files: {DATA_FIX} ($GAPO_DATA_DIR is "
                        + (f"{data_dir!r})" if data_dir else "unset)"))
    return problems


# ----------------------------------------------------------------------------------------------- model
def check_model_path(config: DictConfig) -> list[str]:
    """Problems of ``actor_rollout_ref.model.path`` (and ``.tokenizer_path`` when set): a local path must be a
    folder with config.json; a hub id ``org/name`` passes if it is in the local HF cache or the hub answers from the
    driver (``gapo.model_path.hub_unreachable_reason``: a TCP connect of at most 3 s), else it is named with the fix."""
    model = config.actor_rollout_ref.model
    problems = []
    for field, need_config in (("path", True), ("tokenizer_path", False)):
        value = model.get(field)
        if value is None and field == "tokenizer_path":
            continue
        key = f"actor_rollout_ref.model.{field}"
        fix = (f"set {key}=<a local model folder with config.json> or a Hugging Face hub id org/name "
               "(the smoke preset's tiny model: `python -m recipe.smoke` builds it under $GAPO_SMOKE_DIR)")
        path = "" if value is None else str(value)
        if not path:
            problems.append(f"{key} is not set: {fix}")
            continue
        if _REMOTE.match(path):
            _note(f"{key}={path!r} is remote: not checked")
            continue
        local = os.path.expanduser(path)
        if os.path.exists(local):
            if need_config and os.path.isdir(local) and not os.path.exists(os.path.join(local, "config.json")):
                problems.append(f"{key}={path!r} has no config.json: not a Hugging Face model folder; {fix}")
            continue
        if is_hub_id(path):  # org/name whose org is no local folder (gapo.model_path, as python -m eval)
            unreachable = hub_unreachable_reason(path)  # seconds at most, where the download retried for ~50 s
            if unreachable:
                problems.append(f"{key}: {unreachable}")
            else:
                _note(f"{key}={path!r}: no such local folder, taken as a hub id (the hub answers from here)")
            continue
        where = "" if os.path.isabs(local) else f" (relative to {os.getcwd()})"
        first = path.split("/", 1)[0]
        why = (f"{first}/ is a local folder, so it is not taken as a hub id org/name"
               if HUB_ID.fullmatch(path) and os.path.isdir(first) else "not a hub id org/name")
        problems.append(f"{key}={path!r}: no such local folder{where}, and {why}: {fix}")
    return problems


# ------------------------------------------------------------------------------------------ checkpoint
# verl 0.9.1's FSDP checkpoint manager (utils/checkpoint/fsdp_checkpoint_manager.py) writes and reads
# f"{kind}_world_size_{W}_rank_{r}.pt" per rank, kind in model / optim / extra_state
_SHARD = re.compile(r"^(model|optim|extra_state)_world_size_(\d+)_rank_(\d+)\.pt$")


def resume_folder(config: DictConfig) -> str | None:
    """The ``global_step_N`` folder verl's ``_load_checkpoint`` would resume from (None: training from scratch),
    found the way verl 0.9.1 finds it (``trainer.resume_mode`` auto: the tracker file under
    ``trainer.default_local_dir``; resume_path: ``trainer.resume_from_path``), relative paths against the cwd."""
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    trainer = config.trainer
    mode = trainer.get("resume_mode", "auto")
    if mode == "auto":
        folder = trainer.get("default_local_dir")
        if not folder or _REMOTE.match(str(folder)):
            return None
        with contextlib.redirect_stdout(io.StringIO()):  # verl prints "Found checkpoint: %s <path>"; our note says it
            return find_latest_ckpt_path(os.path.abspath(os.path.expanduser(str(folder))))
    if mode == "resume_path":
        path = trainer.get("resume_from_path")
        return None if not path or _REMOTE.match(str(path)) else os.path.abspath(os.path.expanduser(str(path)))
    return None


def checkpoint_world_sizes(actor_dir: str) -> dict[int, set[int]]:
    """{world size: ranks with a model shard} of the sharded actor checkpoint in ``actor_dir``."""
    sizes: dict[int, set[int]] = {}
    for name in os.listdir(actor_dir):
        match = _SHARD.match(name)
        if match and match.group(1) == "model":
            sizes.setdefault(int(match.group(2)), set()).add(int(match.group(3)))
    return sizes


def check_resume_world_size(config: DictConfig) -> list[str]:
    """Problems of the checkpoint a resume would load (empty when fine or when nothing is resumed).

    verl 0.9.1 saves one model, optimizer and extra-state shard per FSDP rank and loads rank r's shard of the
    current world size; a checkpoint written at another world size fails only after Ray, the workers and the
    rollout servers have started (FileNotFoundError ``model_world_size_W_rank_r.pt``). The actor's world size
    is ``trainer.nnodes * trainer.n_gpus_per_node`` (every worker of the global pool is an FSDP rank).
    """
    folder = resume_folder(config)
    if folder is None:
        return []
    mode = config.trainer.get("resume_mode", "auto")
    key = "trainer.resume_from_path" if mode == "resume_path" else "trainer.default_local_dir"
    actor_dir = os.path.join(folder, "actor")
    if not os.path.isdir(actor_dir):
        if mode == "resume_path":
            return [f"{key}={config.trainer.resume_from_path!r}: no actor checkpoint folder {actor_dir}: point it at a "
                    "global_step_N folder written by a training run, or set trainer.resume_mode=disable"]
        return [f"{key}: the latest checkpoint {folder} has no actor/ folder (a save that did not finish?): remove "
                "the folder or point trainer.default_local_dir elsewhere, or set trainer.resume_mode=disable"]
    nnodes, per_node = int(config.trainer.nnodes), int(config.trainer.n_gpus_per_node)
    world = nnodes * per_node
    sizes = checkpoint_world_sizes(actor_dir)
    if not sizes:
        _note(f"{actor_dir} has no sharded model (checkpoint.save_contents without 'model'?): not checked")
        return []
    if world in sizes and sizes[world] == set(range(world)):
        _note(f"resume from {folder}: written at world size {world}, as this run")
        return []
    if world in sizes:
        missing = sorted(set(range(world)) - sizes[world])
        return [f"{key}: the checkpoint {folder} lacks the model shards of rank(s) {missing} of world size {world} "
                "(an incomplete copy?): copy the whole global_step folder, or resume from an earlier one"]
    written = sorted(sizes)
    shape = " or ".join(str(w) for w in written)
    merged = os.path.join(folder, "merged_hf")
    return [
        f"{key}: the checkpoint {folder} was written at world size {shape} (model_world_size_{written[0]}_rank_*.pt), "
        f"but this run has world size {world} (trainer.nnodes={nnodes} x trainer.n_gpus_per_node={per_node}); verl "
        "0.9.1 keeps one shard per rank and cannot reshard on load. Fix: resume with the world size it was "
        f"written at (trainer.nnodes x trainer.n_gpus_per_node = {shape}); or export its weights (`python -m "
        f"verl.model_merger merge --backend fsdp --local_dir {actor_dir} --target_dir {merged}`) and start a new "
        f"run from them (actor_rollout_ref.model.path={merged} trainer.resume_mode=disable, a fresh optimizer and "
        "step count); or set trainer.resume_mode=disable to train from scratch"]


# configs/platform/cpu.yaml (and cpu_vllm, which extends it) run only with these in the environment of the driver,
# which its Ray workers inherit (recipe/smoke.py sets them)
CPU_PLATFORM_ENV = {"VERL_PLATFORM": "cpu", "VERL_ENGINE_DEVICE": "cuda"}


def check_platform_env(platform: str | None, environ=None) -> list[str]:
    """Problems of a CPU platform preset (`platform`: hydra's choice for the platform group, e.g. ``cpu`` under
    ``--config-name smoke_cpu``) run without CPU_PLATFORM_ENV: verl then takes the CUDA platform and the run fails
    in its workers after about a minute ("Distributed package doesn't have NCCL built in"). Not skippable."""
    if not str(platform or "").startswith("cpu"):
        return []
    environ = os.environ if environ is None else environ
    missing = {k: v for k, v in CPU_PLATFORM_ENV.items() if environ.get(k, "").lower() != v}
    if not missing:
        return []
    needed = " ".join(f"{k}={v}" for k, v in CPU_PLATFORM_ENV.items())
    here = ", ".join(f"{k}={environ[k]}" if k in environ else f"{k} is unset" for k in missing)
    return [f"platform={platform} (the CPU preset; --config-name smoke_cpu selects it) needs {needed} in the "
            f"environment; here {here}: run `{needed} python -m recipe.main_gapo ...`, or `python -m recipe.smoke` "
            "(make smoke), which sets them"]


def run_driver_checks(config: DictConfig, platform: str | None = None) -> None:
    """Data, model, resume and package checks in the driver (no Ray), and the environment of a CPU `platform` preset
    (`check_platform_env`); raises PreflightError listing every problem."""
    skip = skipped_checks()
    problems = check_platform_env(platform)
    if "data" not in skip:
        problems += check_data_files(config)
    if "model" not in skip:
        problems += check_model_path(config)
    if "checkpoint" not in skip:
        problems += check_resume_world_size(config)
    if "packages" not in skip:
        problems += check_trl_conflict()
    driver_checks = {"data", "model", "checkpoint", "packages"}
    if skip & driver_checks:
        _note(f"skipped: {', '.join(sorted(skip & driver_checks))} ({SKIP_ENV})")
    if problems:
        raise PreflightError(problems)


def check_trl_conflict() -> list[str]:
    """A trl that verl 0.9.1's FSDP actor cannot be built with.

    verl's `apply_monkey_patch` (verl/models/transformers/monkey_patch.py) imports `AutoModelForCausalLMWithValueHead`
    from `trl.experimental.ppo` or `trl` whenever trl is importable; trl 1.x has neither (trl 1.16.0, the version
    `gapo.integrations.trl` pins, included), so every actor worker would fail while building its model, after Ray and
    the rollout servers started. verl itself pins trl 0.27.0 in its `fsdp` extra. Only imports trl when it is there.
    """
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        return []
    for module in ("trl.experimental.ppo", "trl"):
        try:
            if hasattr(importlib.import_module(module), "AutoModelForCausalLMWithValueHead"):
                return []
        except ImportError:
            continue
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("trl")
    except PackageNotFoundError:
        installed = "(unknown version)"
    return [f"trl {installed} is installed here, and verl 0.9.1's FSDP actor imports trl's "
            "AutoModelForCausalLMWithValueHead whenever trl is importable (trl 1.x removed it): every actor worker "
            "would fail building its model. Train with verl in an environment without trl (`make install`'s .venv) "
            "and with TRL in its own (`make install-trl`: .venv-trl, docs/trl.md), or `pip uninstall trl` here"]


# ------------------------------------------------------------------------------------------------- GPUs
def required_gpu_pools(config: DictConfig) -> list[tuple[str, int, int]]:
    """(keys, nnodes, gpus per node) of every resource pool verl 0.9.1's v1 trainer creates
    (trainer/ppo/v1/trainer_base.py ``_init_resource_pool_mgr``)."""
    pools = [("trainer.nnodes x trainer.n_gpus_per_node", int(config.trainer.nnodes),
              int(config.trainer.n_gpus_per_node))]
    rm = (config.get("reward") or {}).get("reward_model") or {}
    if rm.get("enable_resource_pool"):
        pools.append(("reward.reward_model.nnodes x reward.reward_model.n_gpus_per_node", int(rm.nnodes),
                      int(rm.n_gpus_per_node)))
    distill = config.get("distillation") or {}
    if distill.get("enabled"):
        pools.append(("distillation.nnodes x distillation.n_gpus_per_node", int(distill.nnodes),
                      int(distill.n_gpus_per_node)))
    return pools


def check_cluster_gpus(config: DictConfig, nodes: list[dict] | None = None, available: dict | None = None,
                       resource: str | None = None) -> None:
    """Raise PreflightError when the Ray cluster cannot hold verl's resource pools: fewer GPUs (the platform's
    Ray resource: "GPU" on CUDA and on gapo's CPU platform, "NPU" on Ascend) than the pools ask for, fewer
    nodes with ``trainer.n_gpus_per_node`` of them than ``trainer.nnodes`` (verl packs each node's workers
    onto one node: its placement group would wait forever), or GPUs held by other jobs.

    ``nodes`` (``ray.nodes()``), ``available`` (``ray.available_resources()``) and ``resource`` default to
    the connected cluster's and the current platform's."""
    if "gpu" in skipped_checks():
        _note(f"GPU check skipped ({SKIP_ENV})")
        return
    if resource is None:
        from verl.utils.device import get_resource_name

        resource = get_resource_name()
    if nodes is None or available is None:
        import ray

        nodes = ray.nodes() if nodes is None else nodes
        available = ray.available_resources() if available is None else available
    per_node = sorted((float(n.get("Resources", {}).get(resource, 0)) for n in nodes if n.get("Alive", True)),
                      reverse=True)
    total = sum(per_node)
    pools = required_gpu_pools(config)
    need = sum(nn * g for _, nn, g in pools)
    asked = " + ".join(f"{keys} = {nn} x {g}" for keys, nn, g in pools)
    shape = f"{len(per_node)} node(s) with {', '.join(f'{x:g}' for x in per_node) or 'none'} {resource} each"
    biggest = int(per_node[0]) if per_node else 0
    fits = (f"set trainer.nnodes={sum(1 for x in per_node if x >= biggest)} trainer.n_gpus_per_node={biggest} "
            "(this cluster's shape), " if biggest >= 1 else "")
    fix_shape = (f"{fits}start the run on the GPU cluster (launch/submit.sh with RAY_ADDRESS), or on a machine "
                 f"without GPUs use --config-name smoke_cpu; on an autoscaling cluster set {SKIP_ENV}=gpu")
    local_gpus = ((config.get("ray_kwargs") or {}).get("ray_init") or {}).get("num_gpus")
    if local_gpus is not None:
        fix_shape += (f" (a local Ray that this run starts gets ray_kwargs.ray_init.num_gpus={local_gpus}: the CPU "
                      "preset's logical GPUs)")
    if total < need:
        raise PreflightError(f"{asked}: {need} {resource}s requested, but the Ray cluster has {total:g} "
                             f"({shape}): {fix_shape}")
    nn, g = pools[0][1], pools[0][2]
    fitting = sum(1 for x in per_node if x >= g)
    if fitting < nn:
        raise PreflightError(f"trainer.nnodes={nn} x trainer.n_gpus_per_node={g}: verl places "
                             f"{g} workers on each of {nn} node(s), but only {fitting} node(s) have {g} {resource}s "
                             f"({shape}); its placement group would wait forever: {fix_shape}")
    free = float(available.get(resource, 0))
    if free < need:
        raise PreflightError(f"{asked}: {need} {resource}s requested; the Ray cluster has {total:g} but only "
                             f"{free:g} free (other jobs or actors hold the rest): stop them (`ray list actors`, "
                             "`ray job list`) or ask for fewer GPUs")
    _note(f"{need} {resource}s requested ({asked}); the Ray cluster has {total:g} ({shape}), {free:g} free")

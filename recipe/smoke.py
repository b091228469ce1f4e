"""CPU smoke run: train a tiny random model with GAPO through verl's real trainer, then resume from its checkpoint.

    python -m recipe.smoke [--out runs/smoke] [--steps 2] [--resume-steps 1] [--rollout hf|vllm]   (or `make smoke`)
                           [--ranks R] [--nodes N]                (make smoke RANKS=2, make smoke NODES=2)
                           [KEY=VALUE ...]                        (make smoke SMOKE_ARGS="KEY=VALUE ... --steps 3")

KEY=VALUE: hydra overrides of the smoke_cpu preset, given to both training runs (the first and the resume; with
`--nodes N` through launch/submit.sh), after the smoke's own, e.g. `actor_rollout_ref.actor.policy_loss.schedule=exp`;
options and overrides may come in any order. The keys the smoke run sets itself are refused, naming the option that
sets them (OWN_KEYS: steps, shape, rollout engine, checkpoint folder); a misspelt key fails the first run within
seconds with recipe.main_gapo's message naming the closest key, quoted from its log.

1. builds the tiny model/tokenizer and the synthetic task's parquet files under OUT (offline, cached);
2. trains `--steps` steps with `python -m recipe.main_gapo --config-name smoke_cpu` (Ray, FSDP2 actor, HF
   rollout groups, reward, GAPO loss, a checkpoint every step);
3. runs again with `--resume-steps` more steps: verl resumes from the latest checkpoint;
4. checks that the run showed GAPO at work (mixed groups, several thresholds, clipping that binds,
   thresholds that reached the loss, the resumed run starting after the saved step, rollout log-probs equal to
   the actor's in every step, i.e. the new weights reached the rollout engine) and prints a summary.
`--ranks R` trains with R FSDP ranks per node (R logical GPUs, gloo). `--nodes N` starts a local N-node Ray cluster
on this machine (gapo.local_cluster: N raylets with R logical GPUs each) and submits both runs to it with
launch/submit.sh, as on a real cluster (`trainer.nnodes=N`). The checks then also ask for one checkpoint shard per
rank (world size N x R).
`--rollout vllm` uses verl's real vLLM rollout (preset configs/platform/cpu_vllm.yaml; needs the vLLM CPU
environment, `make smoke ROLLOUT=vllm`). Every run is supervised (gapo.supervisor): a hard wall-clock limit
(`--timeout`), a rollout server's fatal error ends it within a bounded time, and no process or shared-memory
segment of it is left.
Logs: OUT/logs/run{1,2}.log (stdout+stderr) and run{1,2}.jsonl (metrics per step); checkpoints: OUT/checkpoints.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gapo.exploration import (
    COVERAGE_FRAC,
    COVERAGE_WINDOW,
    COVERAGE_WINDOW_SEEN,
    ENTRANCE_DISTINCT,
    ENTRANCE_UNIQUE_SUCCESS,
    ENTROPY_FAILURE,
    ENTROPY_SUCCESS,
)
from gapo.peers import PEER_LOSS_MODES
from gapo.peers.bapo import BAPO_METRICS
from gapo.supervisor import SupervisedRun, SupervisedRunError

ROOT = Path(__file__).resolve().parents[1]

# Every smoke run's environment (inherited by every Ray worker); CPU_ENV adds the CPU platform for verl (gapo.cpu).
RUN_ENV = {"TOKENIZERS_PARALLELISM": "false", "RAY_DEDUP_LOGS": "0", "WANDB_MODE": "offline"}
CPU_ENV = {"VERL_PLATFORM": "cpu", "VERL_ENGINE_DEVICE": "cuda", **RUN_ENV}


# The rollout engines the smoke run can use: hydra overrides that select each (hf: the preset's default).
ROLLOUT_OVERRIDES = {"hf": [], "vllm": ["platform=cpu_vllm"]}
# verl's rollout/actor log-prob gap (max over tokens) in every step: fp32 on both sides gives ~1e-8; a rollout
# engine that kept the old weights (a skipped or failed sync) differs by ~1e-3 or more after one update.
MAX_ROLLOUT_PROBS_DIFF = 1e-5
# logged by every step of every run (a step with no success has no entropy_success: the smoke task's groups are mixed)
EXPLORATION_REQUIRED = (ENTROPY_SUCCESS, ENTROPY_FAILURE, ENTRANCE_DISTINCT, COVERAGE_FRAC, COVERAGE_WINDOW)
RUN_TIMEOUT_S = 900  # per training run (one run of 2-3 steps takes 1-2 min on 2 cores; vLLM's start adds ~40 s)
# Config keys the smoke run sets itself on every run's command line (or whose value its checks depend on), and the
# option that sets them instead of a hydra override
OWN_KEYS = {
    "trainer.total_training_steps": "--steps (first run) and --resume-steps (the resume)",
    "trainer.nnodes": "--nodes (make smoke NODES=N)",
    "trainer.n_gpus_per_node": "--ranks (make smoke RANKS=R)",
    "ray_kwargs.ray_init.num_gpus": "--ranks (make smoke RANKS=R)",
    "ray_kwargs.ray_init._temp_dir": "nothing: each run gets its own Ray temp dir",
    "platform": "--rollout (make smoke ROLLOUT=vllm)",
    "trainer.default_local_dir": "--out (checkpoints go to OUT/checkpoints; make smoke SMOKE_DIR=...)",
}


class SmokeCheckError(RuntimeError):
    """The smoke run finished but did not show what it must (or did not finish)."""


def prepare(out: Path) -> None:
    """Tiny model and task data under OUT (the smoke_cpu preset reads them from GAPO_SMOKE_DIR)."""
    from gapo.smoke.task import make_dataset
    from gapo.smoke.tiny_model import build_tiny_model

    build_tiny_model(out / "model")
    make_dataset(out / "data")


def override_key(override: str) -> str:
    """The config key of a hydra override: `a.b=1`, `+a.b=1`, `++a.b=1`, `~a.b` -> `a.b`."""
    return override.split("=", 1)[0].lstrip("+~").strip()


def check_overrides(overrides: list[str]) -> None:
    """Raise SmokeCheckError for an override of a key the smoke run sets itself (OWN_KEYS), naming the option to use,
    or for one that is not KEY=VALUE (nor ~KEY)."""
    problems = []
    for override in overrides:
        key = override_key(override)
        if not key or ("=" not in override and not override.startswith("~")):
            problems.append(f"{override!r} is not a hydra override (KEY=VALUE, +KEY=VALUE or ~KEY)")
        elif key in OWN_KEYS:
            problems.append(f"{override!r}: the smoke run sets {key} itself; use {OWN_KEYS[key]}")
    if problems:
        raise SmokeCheckError("overrides refused:\n- " + "\n- ".join(problems))


def shape_overrides(ranks: int = 1, nodes: int = 1) -> list[str]:
    """Hydra overrides for `nodes` x `ranks` FSDP ranks (logical GPUs on the CPU platform). A local Ray (one node)
    gets the logical GPUs in ray.init; a cluster has them from `ray start --num-gpus` (submit.sh nulls ray_init's)."""
    if ranks < 1 or nodes < 1:
        raise SmokeCheckError(f"--ranks and --nodes must be at least 1, got ranks={ranks} nodes={nodes}")
    shape = [f"trainer.nnodes={nodes}", f"trainer.n_gpus_per_node={ranks}"]
    return shape if nodes > 1 else [*shape, f"ray_kwargs.ray_init.num_gpus={ranks}"]


def run_command(out: Path, run: str, total_steps: int, overrides: list[str],
                cluster=None, platform_env: dict = CPU_ENV,
                config_name: str = "smoke_cpu") -> tuple[list[str], dict, Path, Path]:
    """(command, environment, metrics file, log file) of one training run, as `train` starts it (with cwd ROOT).
    With `cluster` (a started gapo.local_cluster.LocalRayCluster) the command is launch/submit.sh against it.
    `platform_env`: CPU_ENV (the CPU platform), or RUN_ENV on GPUs (recipe.gpu_check). `config_name`: the experiment
    (configs/<name>.yaml; recipe.learn runs learn_cpu).
    Also used by tests that start the run themselves (tests/test_kill_resume.py kills it)."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    metrics_file, log_file = logs / f"{run}.jsonl", logs / f"{run}.log"
    env = {**os.environ, **platform_env, "GAPO_SMOKE_DIR": str(out), "VERL_FILE_LOGGER_PATH": str(metrics_file)}
    args = [f"trainer.total_training_steps={total_steps}", *overrides]
    if cluster is None:
        return [sys.executable, "-m", "recipe.main_gapo", "--config-name", config_name, *args], env, metrics_file, \
            log_file
    # as on a real cluster: the job gets the CPU platform's variables (EXTRA_ENV) and this shell's GAPO_SMOKE_DIR and
    # VERL_FILE_LOGGER_PATH (submit.sh's pass-through); its driver is this environment's python
    bin_dir = Path(sys.executable).parent
    env.update(cluster.auth, RAY_ADDRESS=cluster.dashboard_url, JOB_PYTHON=sys.executable, PYTHON=sys.executable,
               RAY=str(bin_dir / "ray"), PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
               EXTRA_ENV=" ".join(f"{k}={v}" for k, v in platform_env.items()),
               JOB_ID=f"gapo-smoke-{run}-{os.getpid()}-{int(time.time())}")
    return ["bash", str(ROOT / "launch" / "submit.sh"), config_name, *args], env, metrics_file, log_file


# Ray's own words when its local node does not register with its GCS within Ray's fixed 30 s (ray/_private/node.py,
# not configurable): on a loaded machine (make test's four streams on 2 cores) one GCS call can take longer than that.
# Nothing of the run has started then, so train() starts it again, up to RAY_START_ATTEMPTS times in all.
RAY_START_TIMEOUT = "The current node timed out during startup"
RAY_START_ATTEMPTS = 3


def ray_start_timed_out(log_text: str) -> bool:
    """Whether a failed run's log shows Ray's local node timing out at start (RAY_START_TIMEOUT): ray.init, the
    driver's first act after its config checks, failed, so no step ran."""
    return RAY_START_TIMEOUT in log_text


def train(out: Path, run: str, total_steps: int, overrides: list[str], timeout_s: float = RUN_TIMEOUT_S,
          cluster=None, extra_env: dict | None = None, platform_env: dict = CPU_ENV,
          config_name: str = "smoke_cpu") -> dict:
    """One supervised training run, in its own session and Ray temp dir (or submitted to `cluster`). Returns
    {"metrics_file", "wall_s", "peak_pss_bytes", "session", "marker", "ray_tmp"}. Raises SmokeCheckError with the
    log's tail (or the rollout server's error) on failure. The peak memory of a submitted run is that of submit.sh
    plus the peak of the whole cluster's processes (the job runs in the cluster's nodes, idle Ray included).
    A run whose Ray node timed out at start (ray_start_timed_out) is started again, up to RAY_START_ATTEMPTS in all;
    each failed attempt's log is kept as LOG.attemptN."""
    cmd, env, metrics_file, log_file = run_command(out, run, total_steps, overrides, cluster, platform_env, config_name)
    env.update(extra_env or {})
    if cluster is None:
        env = {k: v for k, v in env.items() if not k.startswith("RAY_ADDRESS")}
    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        # its own Ray temp dir (short: Ray's socket paths must fit 107 bytes): never joins another cluster
        ray_tmp = tempfile.mkdtemp(prefix="gsm-", dir="/tmp")
        attempt_cmd = [*cmd, f"+ray_kwargs.ray_init._temp_dir={ray_tmp}"] if cluster is None else cmd
        print(f"[smoke] {run}: {' '.join(attempt_cmd[1:])}\n[smoke] log: {log_file}", flush=True)
        supervised = SupervisedRun(attempt_cmd, env, log_file, cwd=ROOT, timeout_s=timeout_s)
        try:
            with (cluster.peak_memory() if cluster is not None else contextlib.nullcontext({})) as cluster_memory:
                result = supervised.wait()
        except SupervisedRunError as err:
            raise SmokeCheckError(f"{run} failed: {err}") from None
        finally:
            shutil.rmtree(ray_tmp, ignore_errors=True)
        result.peak_pss_bytes += cluster_memory.get("peak_pss_bytes", 0)  # a submitted run's are the cluster's
        print(f"[smoke] {run}: exit {result.returncode} after {result.wall_s:.0f} s, peak memory of its processes "
              f"{result.peak_pss_bytes / 2**30:.1f} GiB", flush=True)
        if result.returncode == 0:
            break
        text = log_file.read_text(errors="replace") if log_file.exists() else ""
        if not ray_start_timed_out(text) or attempt == RAY_START_ATTEMPTS:
            tail = "".join(text.splitlines(keepends=True)[-40:])
            raise SmokeCheckError(f"{run} failed (exit {result.returncode}); last lines of {log_file}:\n{tail}")
        kept = log_file.with_name(f"{log_file.name}.attempt{attempt}")
        log_file.replace(kept)
        print(f"[smoke] {run}: Ray's node timed out at start (Ray's fixed 30 s; the machine is loaded): starting "
              f"again, attempt {attempt + 1} of {RAY_START_ATTEMPTS} (that log: {kept})", flush=True)
    return {"metrics_file": metrics_file, "wall_s": result.wall_s, "peak_pss_bytes": result.peak_pss_bytes,
            # what identifies the run's processes (its session, its marker variable, its Ray temp dir), for checks
            "session": supervised.proc.pid, "marker": (supervised.marker_env, supervised.token), "ray_tmp": ray_tmp}


def logged_steps(path: Path) -> list[int]:
    """Steps logged so far in verl's file-logger jsonl (complete lines only: the run may be writing), [] before any."""
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.endswith("}")]


def read_metrics(path: Path) -> dict[int, dict]:
    """{step: metrics} from verl's file logger."""
    if not path.exists():
        raise SmokeCheckError(f"no metrics file {path}: the trainer logged nothing (is 'file' in trainer.logger?)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {row["step"]: row["data"] for row in rows}


def missing_shards(ckpt_dir: Path, step: int, world_size: int) -> list[str]:
    """The per-rank files verl 0.9.1 writes for step `step` at `world_size` that are not there."""
    actor = ckpt_dir / f"global_step_{step}" / "actor"
    return [f"{kind}_world_size_{world_size}_rank_{rank}.pt" for rank in range(world_size)
            for kind in ("model", "optim", "extra_state")
            if not (actor / f"{kind}_world_size_{world_size}_rank_{rank}.pt").exists()]


LOSS_MODE_KEY = "actor_rollout_ref.actor.policy_loss.loss_mode"


def loss_mode_of(overrides: list[str], default: str = "gapo") -> str:
    """The loss mode the overrides set, directly or through the `peer` group (`+peer=NAME`: that file of configs/peer/);
    the last one wins; else `default` (smoke_cpu's)."""
    import yaml

    from gapo.config import BASE_CONFIG

    modes = []
    for override in overrides:
        key, _, value = override.lstrip("+").partition("=")
        if key == LOSS_MODE_KEY and value:
            modes.append(value)
        elif key == "peer" and (BASE_CONFIG.parents[1] / "peer" / f"{value}.yaml").is_file():  # else hydra says so
            group = yaml.safe_load((BASE_CONFIG.parents[1] / "peer" / f"{value}.yaml").read_text())
            modes.append(group["actor_rollout_ref"]["actor"]["policy_loss"]["loss_mode"])
    return modes[-1] if modes else default


def check(run1: dict[int, dict], run2: dict[int, dict], steps: int, resume_steps: int, ckpt_dir: Path,
          world_size: int = 1, loss_mode: str = "gapo") -> None:
    """What a smoke run must show; each failure says what was missing. A ported peer's run (`loss_mode` dcpo or
    bapo, docs/peers.md) has no GAPO thresholds to vary; a BAPO run must log its bounds instead."""
    problems = []
    for step in range(1, steps + resume_steps + 1):
        missing = missing_shards(ckpt_dir, step, world_size)
        if missing:
            problems.append(f"checkpoint of step {step} lacks {missing} (world size {world_size}: one shard per rank)")
    if sorted(run1) != list(range(1, steps + 1)):
        problems.append(f"first run logged steps {sorted(run1)}, expected 1..{steps}")
    if sorted(run2) != list(range(steps + 1, steps + resume_steps + 1)):
        problems.append(f"resumed run logged steps {sorted(run2)}, expected {steps + 1}..{steps + resume_steps} "
                        "(it must continue from the checkpoint, not start over)")
    tracker = ckpt_dir / "latest_checkpointed_iteration.txt"
    if not tracker.exists() or tracker.read_text().strip() != str(steps + resume_steps):
        problems.append(f"{tracker} should name step {steps + resume_steps}")
    every = {**run1, **run2}
    if not every:
        raise SmokeCheckError("no steps logged at all")
    if not all(m.get("gapo/groups/mixed_frac", 0) > 0 for m in every.values()):
        problems.append("a step had no mixed group (0 < c < k): all-right or all-wrong groups show nothing")
    if loss_mode in PEER_LOSS_MODES:
        if loss_mode == "bapo" and not all(name in m for m in every.values() for name in BAPO_METRICS):
            problems.append(f"a step logged no {', '.join(BAPO_METRICS)}: BAPO's bounds did not reach the metrics")
    elif not any(m.get("gapo/eps_high/max", 0) > m.get("gapo/eps_high/min", 0) for m in every.values()):
        problems.append("no step used more than one threshold: the adaptive clip was never exercised")
    if not all("gapo/loss_eps_high_mean" in m for m in every.values()):
        problems.append("gapo/loss_eps_high_mean missing: per-rollout thresholds did not reach the loss")
    if not any(v > 0 for m in every.values() for k, v in m.items() if k.startswith("gapo/clipfrac_pos/")):
        problems.append("nothing was ever clipped: raise the learning rate or the number of mini-batches")
    for step, m in sorted(every.items()):
        absent = [name for name in EXPLORATION_REQUIRED if name not in m]
        if absent:
            problems.append(f"step {step} logged no {', '.join(absent)}: the exploration instruments did not run")
        gap = m.get("training/rollout_probs_diff_max")
        if gap is None or not gap < MAX_ROLLOUT_PROBS_DIFF:
            problems.append(f"step {step}: rollout/actor log-prob gap training/rollout_probs_diff_max={gap} (must be "
                            f"< {MAX_ROLLOUT_PROBS_DIFF}): the rollout engine did not sample from the actor's weights")
    if problems:
        raise SmokeCheckError("smoke run did not show GAPO at work:\n- " + "\n- ".join(problems))


def summary_lines(metrics: dict[int, dict]) -> list[str]:
    """One printed line per step: reward, mixed groups, eps_high (min/mean/max), clip fraction, generation time,
    log-prob gap and the clip fraction per success count c."""
    lines = ["step  reward  mixed  eps_high(min/mean/max)        clipfrac  gen_s  logp_gap  clipfrac_pos by c"]
    for step in sorted(metrics):
        m = metrics[step]
        by_c = {int(k.rsplit("/c", 1)[1]): v for k, v in m.items() if k.startswith("gapo/clipfrac_pos/c")}
        per_c = " ".join(f"c{c}={by_c[c]:.2f}" for c in sorted(by_c))
        lines.append(
            f"{step:>4}  {m.get('critic/score/mean', float('nan')):6.3f}  {m.get('gapo/groups/mixed_frac', float('nan')):5.2f}  "
            f"{m.get('gapo/eps_high/min', float('nan')):.4f}/{m.get('gapo/eps_high/mean', float('nan')):.4f}/"
            f"{m.get('gapo/eps_high/max', float('nan')):.4f}   {m.get('actor/pg_clipfrac', float('nan')):8.3f}  "
            f"{m.get('timing_s/gen', float('nan')):5.2f}  {m.get('training/rollout_probs_diff_max', float('nan')):8.1e}"
            f"  {per_c}"
        )
    return lines


def exploration_lines(metrics: dict[int, dict]) -> list[str]:
    """One printed line per step of the exploration instruments (`gapo.exploration`, docs/metrics.md): entropy of the
    successes and the failures, entrance diversity and the successes' unique entrances, live coverage this step and
    over the window (covered / seen prompts)."""
    lines = ["step  entropy(succ/fail)  entrance(distinct/uniq_succ)  coverage  window(covered/seen)"]
    nan = float("nan")
    for step in sorted(metrics):
        m = metrics[step]
        lines.append(
            f"{step:>4}  {m.get(ENTROPY_SUCCESS, nan):8.3f}/{m.get(ENTROPY_FAILURE, nan):<8.3f}  "
            f"{m.get(ENTRANCE_DISTINCT, nan):13.3f}/{m.get(ENTRANCE_UNIQUE_SUCCESS, nan):<13.3f}  "
            f"{m.get(COVERAGE_FRAC, nan):8.3f}  {m.get(COVERAGE_WINDOW, nan):9.0f}/{m.get(COVERAGE_WINDOW_SEEN, nan):<.0f}"
        )
    return lines


def run_smoke(out: Path, steps: int = 2, resume_steps: int = 1, overrides: list[str] | None = None,
              rollout: str = "hf", timeout_s: float = RUN_TIMEOUT_S, ranks: int = 1, nodes: int = 1) -> dict:
    """The whole smoke run at `nodes` x `ranks` FSDP ranks; returns {"run1": metrics, "run2": metrics, "ckpt_dir":
    path, "runs": [per-run wall time and peak memory], "world_size": nodes * ranks}. Raises SmokeCheckError."""
    if rollout not in ROLLOUT_OVERRIDES:
        raise SmokeCheckError(f"unknown rollout {rollout!r}: expected one of {sorted(ROLLOUT_OVERRIDES)}")
    check_overrides(overrides or [])
    out = out.resolve()
    overrides = [*ROLLOUT_OVERRIDES[rollout], *shape_overrides(ranks, nodes), *(overrides or [])]
    prepare(out)
    ckpt_dir = out / "checkpoints"
    with contextlib.ExitStack() as stack:
        cluster = None
        if nodes > 1:
            from gapo.local_cluster import LocalRayCluster

            env = {**os.environ, **CPU_ENV, "GAPO_SMOKE_DIR": str(out)}
            print(f"[smoke] starting a local Ray cluster: {nodes} nodes x {ranks} logical GPUs", flush=True)
            cluster = stack.enter_context(LocalRayCluster(nodes, ranks, env, out / "logs" / "cluster"))
            print(f"[smoke] cluster up: {cluster.address}, jobs at {cluster.dashboard_url}", flush=True)
        first = train(out, "run1", steps, overrides, timeout_s, cluster)
        second = train(out, "run2", steps + resume_steps, overrides, timeout_s, cluster)
    run1, run2 = read_metrics(first["metrics_file"]), read_metrics(second["metrics_file"])
    check(run1, run2, steps, resume_steps, ckpt_dir, world_size=nodes * ranks, loss_mode=loss_mode_of(overrides))
    return {"run1": run1, "run2": run2, "ckpt_dir": ckpt_dir, "runs": [first, second], "world_size": nodes * ranks}


def write_summary(path: Path, rollout: str, wall_s: float, result: dict) -> None:
    """OUT/logs/summary.json: engine, wall time, each run's wall time and peak memory (PSS of its whole process
    tree), and every step's metrics (recipe.bench.rollout compares engines from it)."""
    runs = [{"name": name, "wall_s": r["wall_s"], "peak_pss_bytes": r["peak_pss_bytes"]}
            for name, r in zip(("run1", "run2"), result["runs"])]
    steps = {str(step): m for step, m in sorted({**result["run1"], **result["run2"]}.items())}
    path.write_text(json.dumps({"rollout": rollout, "wall_s": wall_s, "runs": runs, "steps": steps}, indent=1))


def main(argv=None):
    """CLI entry: the smoke run (train, then resume) and its checks; prints the per-step summary, exits on failure."""
    parser = argparse.ArgumentParser(prog="python -m recipe.smoke", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/smoke", help="folder for model, data, logs, checkpoints (wiped)")
    parser.add_argument("--steps", type=int, default=2, help="steps of the first run")
    parser.add_argument("--resume-steps", type=int, default=1, help="steps the resumed run adds")
    parser.add_argument("--rollout", choices=sorted(ROLLOUT_OVERRIDES), default="hf",
                        help="rollout engine: hf (HF generate, default environment) or vllm (verl's vLLM rollout; "
                             "needs the vLLM CPU environment: make smoke ROLLOUT=vllm)")
    parser.add_argument("--ranks", type=int, default=1,
                        help="FSDP ranks per node (logical GPUs, gloo); world size = nodes x ranks (make smoke RANKS=2)")
    parser.add_argument("--nodes", type=int, default=1,
                        help="nodes of a local Ray cluster started on this machine; >1 submits the runs with "
                             "launch/submit.sh (make smoke NODES=2)")
    parser.add_argument("--timeout", type=float, default=RUN_TIMEOUT_S,
                        help="hard wall-clock limit of each run in seconds (killed past it)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="hydra overrides of the smoke_cpu preset for both runs (the first and the resume), e.g. "
                             "actor_rollout_ref.actor.policy_loss.schedule=exp; in any order with the options")
    args = parser.parse_intermixed_args(argv)
    out = Path(args.out)
    for stale in ("checkpoints", "logs"):  # a smoke run starts from scratch; its second run is the resume
        subprocess.run(["rm", "-rf", str(out / stale)], check=True)
    start = time.time()
    try:
        result = run_smoke(out, args.steps, args.resume_steps, args.overrides, args.rollout, args.timeout,
                           ranks=args.ranks, nodes=args.nodes)
    except SmokeCheckError as err:
        sys.exit(f"[smoke] FAILED: {err}")
    peak = max(r["peak_pss_bytes"] for r in result["runs"]) / 2**30
    wall = time.time() - start
    write_summary(out / "logs" / "summary.json", args.rollout, wall, result)
    print(f"\n[smoke] OK in {wall:.0f} s (rollout {args.rollout}; world size {result['world_size']} = {args.nodes} "
          f"node(s) x {args.ranks} rank(s); peak memory {peak:.1f} GiB)")
    print(f"[smoke] logs: {out.resolve() / 'logs'}\n[smoke] checkpoints: {result['ckpt_dir']}")
    print("\n".join(summary_lines({**result["run1"], **result["run2"]})))
    print("\nexploration (gapo/explore/*, docs/metrics.md)")
    print("\n".join(exploration_lines({**result["run1"], **result["run2"]})))


if __name__ == "__main__":
    main()

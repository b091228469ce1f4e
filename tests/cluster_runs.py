"""The session's smoke run at the cluster shape (2 FSDP ranks), with one rank's worker killed mid-step.

Used by tests/conftest.py's ``smoke_run`` (read by tests/test_trainer_e2e.py, tests/test_cluster_e2e.py and
tests/test_eval_cli.py). The run is ``make smoke RANKS=2`` with a failure in the middle:

1. run1 (3 steps planned, a checkpoint every step, verl's rollout dump, GAPO's per-row loss and exploration dumps)
   trains steps 1 and 2; once step 2 is logged (its checkpoint is committed before the log line) and step 3 is under way, the Ray worker
   process of FSDP rank 1 is SIGKILLed. run1 must then end by itself, with an error that names the dead worker;
2. run2 resumes from step 2 at the same world size and trains step 3.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from gapo.supervisor import SupervisedRun, SupervisedRunError
from recipe.smoke import (ROOT, SmokeCheckError, logged_steps, prepare, read_metrics, run_command, shape_overrides,
                          train)

RANKS = 2
STEPS, TOTAL_STEPS = 2, 3  # steps before the kill; steps in all
KILL_AFTER_S = 1.0  # into step 3 (a step takes 3 s or more here)
END_BOUND_S = 120  # a run that lost a rank must end by itself within this (measured 3.8 s)
RUN_TIMEOUT_S = 900


def actor_workers(run: SupervisedRun) -> dict[int, psutil.Process]:
    """{FSDP rank: process} of the run's actor workers (verl's colocated WorkerDict actors; the rank is the RANK
    variable verl's worker group sets in each worker's environment)."""
    workers = {}
    for proc in run.processes():
        try:
            if proc.name().startswith("ray::WorkerDict") and "RANK" in proc.environ():
                workers[int(proc.environ()["RANK"])] = proc
        except psutil.Error:
            continue
    return workers


def killed_then_resumed(out: Path, overrides: list[str], rows_dir: Path) -> dict:
    """Runs 1 and 2 above; returns run_smoke's dict (run1, run2, ckpt_dir, runs, world_size) plus "kill": the killed
    rank, its pid, the rank 0 pid, seconds from the kill to run1's exit, run1's exit code and log, run2's log."""
    out = out.resolve()
    prepare(out)
    overrides = [*shape_overrides(RANKS), *overrides]
    cmd, env, metrics_file, log_file = run_command(out, "run1", TOTAL_STEPS, overrides)
    ray_tmp = tempfile.mkdtemp(prefix="gsk-", dir="/tmp")
    env = {k: v for k, v in env.items() if not k.startswith("RAY_ADDRESS")}
    env["GAPO_DEBUG_LOSS_ROWS"] = str(rows_dir / "run1")
    env["GAPO_DEBUG_EXPLORE_ROWS"] = str(rows_dir / "explore-run1")
    run = SupervisedRun([*cmd, f"+ray_kwargs.ray_init._temp_dir={ray_tmp}"], env, log_file, cwd=ROOT,
                        timeout_s=RUN_TIMEOUT_S, grace_s=END_BOUND_S)
    started = time.time()
    try:
        while STEPS not in logged_steps(metrics_file):
            if run.proc.poll() is not None or time.time() - started > RUN_TIMEOUT_S:
                raise SmokeCheckError(f"run1 ended or hung before step {STEPS}:\n{run.log_text()[-4000:]}")
            time.sleep(0.2)
        time.sleep(KILL_AFTER_S)
        workers = actor_workers(run)
        if sorted(workers) != list(range(RANKS)):
            raise SmokeCheckError(f"expected actor workers of ranks 0..{RANKS - 1}, found {sorted(workers)}")
        victim = workers[1]
        victim.kill()
        killed_at = time.time()
        try:
            result = run.wait()  # the supervisor's own bound (grace_s after a logged actor death) is the backstop
            exit_code, ended_s = result.returncode, time.time() - killed_at
        except SupervisedRunError as err:
            raise SmokeCheckError(f"run1 did not end by itself after rank 1 was killed: {err}") from None
    finally:
        run.kill()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    run1_wall = time.time() - started
    second = train(out, "run2", TOTAL_STEPS, overrides, RUN_TIMEOUT_S,
                   extra_env={"GAPO_DEBUG_LOSS_ROWS": str(rows_dir / "run2"),
                              "GAPO_DEBUG_EXPLORE_ROWS": str(rows_dir / "explore-run2")})
    run1, run2 = read_metrics(metrics_file), read_metrics(second["metrics_file"])
    return {
        "run1": run1, "run2": run2, "ckpt_dir": out / "checkpoints", "world_size": RANKS,
        "runs": [{"wall_s": run1_wall, "peak_pss_bytes": run.peak_pss}, second],
        "kill": {"rank": 1, "pid": victim.pid, "rank0_pid": workers[0].pid, "ended_s": ended_s,
                 "exit_code": exit_code, "log": log_file.read_text(errors="replace"),
                 "run2_log": (out / "logs" / "run2.log").read_text(errors="replace")},
    }


NODES = 2
NODE_END_BOUND_S = 300  # a job that lost a node must end within this (Ray declares the node dead after ~16 s here)
# run1's distinctive overrides, checked in its printed config (tests/test_launch.py): 16 prompts in batches of 8 make
# steps 1-2 epoch 0, so run2's resume from step 2 lands exactly on the epoch boundary (verl #5725/#7401)
LAUNCH_OVERRIDES = ["data.train_max_samples=16", "trainer.experiment_name=launch_e2e"]


def _node_workers(cluster, index: int) -> list[int]:
    """pids of verl's actor workers among node `index`'s processes."""
    return [proc.pid for proc in actor_workers(cluster.runs[index]).values()]


def _ray_job(env: dict, *args: str) -> str:
    """stdout of `ray job <args>` against the run's cluster (its address and token are in `env`)."""
    proc = subprocess.run([env["RAY"], "job", *args, "--address", env["RAY_ADDRESS"]], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    return proc.stdout


def _job_status(env: dict, job_id: str) -> str:
    """The job's status word (launch/ray_job.py status: PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED)."""
    proc = subprocess.run([sys.executable, str(ROOT / "launch" / "ray_job.py"), "status", "--address",
                           env["RAY_ADDRESS"], job_id], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    return proc.stdout.strip() or f"unknown ({proc.stderr.strip()[-300:]})"


def lost_node_then_resumed(out: Path) -> dict:
    """A local 2-node Ray cluster (gapo.local_cluster, one logical GPU per raylet), the smoke preset at
    `trainer.nnodes=2 trainer.n_gpus_per_node=1` submitted with launch/submit.sh as on a real cluster:

    1. run1 (3 steps planned, a checkpoint each, followed by submit.sh) places an actor worker on each node and
       trains steps 1 and 2; in step 3 the second node's raylet is SIGKILLed (a lost machine). The job must end by
       itself, FAILED, naming the lost node, and submit.sh must exit non-zero;
    2. the node is started again (a replacement joins) and run2, submitted with `--no-wait` and then polled,
       resumes from step 2 and trains step 3.
    Used by tests/test_cluster_nodes.py and tests/test_launch.py (conftest's ``lost_node``). Only this run's Ray
    processes are touched (its own sessions, markers and temp dir; never `ray stop`)."""
    from gapo.local_cluster import LocalRayCluster
    from recipe.smoke import CPU_ENV

    out = out.resolve()
    prepare(out)
    overrides = [*shape_overrides(ranks=1, nodes=NODES), *LAUNCH_OVERRIDES]
    env = {**os.environ, **CPU_ENV, "GAPO_SMOKE_DIR": str(out)}
    result = {"out": out, "ckpt": out / "checkpoints"}
    started = time.time()
    with LocalRayCluster(NODES, 1, env, out / "logs" / "cluster") as cluster:
        cmd, env1, metrics1, log1 = run_command(out, "run1", TOTAL_STEPS, overrides, cluster)
        run1 = SupervisedRun(cmd, env1, log1, cwd=ROOT, timeout_s=RUN_TIMEOUT_S, watch_patterns=False)
        try:
            while STEPS not in logged_steps(metrics1):
                if run1.proc.poll() is not None or time.time() - started > RUN_TIMEOUT_S:
                    raise SmokeCheckError(f"run1 ended or hung before step {STEPS}:\n{run1.log_text()[-4000:]}")
                time.sleep(0.2)
            result["workers"] = {i: _node_workers(cluster, i) for i in range(NODES)}
            time.sleep(KILL_AFTER_S)  # into step 3
            result["raylet_pid"] = cluster.kill_raylet(1)
            killed_at = time.time()
            try:
                rc = run1.wait().returncode
            except SupervisedRunError as err:
                raise SmokeCheckError(f"run1 did not end after node 1 was lost: {err}") from None
            # what submit.sh followed, plus the job's whole log from Ray: a followed stream can miss lines (seen:
            # the printed config), so assertions on the log's content read both
            result.update(run1_exit=rc, ended_s=time.time() - killed_at, run1_steps=logged_steps(metrics1),
                          run1_log=run1.log_text() + _ray_job(env1, "logs", env1["JOB_ID"]),
                          run1_metrics=read_metrics(metrics1))
        finally:
            run1.kill()
        cluster.restart_node(1)  # a replacement node joins the cluster
        cmd, env2, metrics2, log2 = run_command(out, "run2", TOTAL_STEPS, overrides, cluster)
        cmd = [*cmd[:2], "--no-wait", *cmd[2:]]
        del env2["JOB_ID"]  # submit.sh's own submission id (gapo-<experiment>-<date>-<random>)
        submitted = SupervisedRun(cmd, env2, log2, cwd=ROOT, timeout_s=120).wait()
        submit_log = log2.read_text(errors="replace")
        found = re.search(r"^submitted job: (\S+)$", submit_log, flags=re.MULTILINE)
        result.update(run2_submit_exit=submitted.returncode, run2_submit_log=submit_log,
                      run2_job_id=found.group(1) if found else None)
        status, logs = "NOT SUBMITTED", ""
        if submitted.returncode == 0 and found:
            deadline = time.time() + RUN_TIMEOUT_S
            while (status := _job_status(env2, found.group(1))) in ("PENDING", "RUNNING") and time.time() < deadline:
                time.sleep(2)
            logs = _ray_job(env2, "logs", found.group(1))
        result.update(run2_status=status, run2_log=logs,
                      run2_steps=logged_steps(metrics2),
                      run2_metrics=read_metrics(metrics2) if metrics2.exists() else {})
        # each node unpacked the job's code in its own runtime_resources (a machine's own disk; see local_cluster)
        result["unpacked"] = {i: sorted(p.name for p in Path(cluster.temp_dir, f"n{i}").glob(
            "session_*/runtime_resources/working_dir_files/_ray_pkg_*") if p.is_dir()) for i in range(NODES)}
        cluster_processes = cluster.processes
    result["wall_s"] = time.time() - started
    result["left"] = cluster_processes()
    print(f"\n[nodes] 2-node run: node 1 lost in step 3, job ended after {result['ended_s']:.1f} s; "
          f"whole run {result['wall_s']:.0f} s")
    return result

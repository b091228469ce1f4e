"""The session's smoke run at the cluster shape (2 FSDP ranks), with one rank's worker killed mid-step.

Used by tests/conftest.py's ``smoke_run`` (read by tests/test_trainer_e2e.py, tests/test_cluster_e2e.py and
tests/test_eval.py). The run is ``make smoke RANKS=2`` with a failure in the middle:

1. run1 (3 steps planned, a checkpoint every step, verl's rollout dump, GAPO's per-row loss dump) trains steps 1 and
   2; once step 2 is logged (its checkpoint is committed before the log line) and step 3 is under way, the Ray worker
   process of FSDP rank 1 is SIGKILLed. run1 must then end by itself, with an error that names the dead worker;
2. run2 resumes from step 2 at the same world size and trains step 3.
"""

from __future__ import annotations

import shutil
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
                   extra_env={"GAPO_DEBUG_LOSS_ROWS": str(rows_dir / "run2")})
    run1, run2 = read_metrics(metrics_file), read_metrics(second["metrics_file"])
    return {
        "run1": run1, "run2": run2, "ckpt_dir": out / "checkpoints", "world_size": RANKS,
        "runs": [{"wall_s": run1_wall, "peak_pss_bytes": run.peak_pss}, second],
        "kill": {"rank": 1, "pid": victim.pid, "rank0_pid": workers[0].pid, "ended_s": ended_s,
                 "exit_code": exit_code, "log": log_file.read_text(errors="replace"),
                 "run2_log": (out / "logs" / "run2.log").read_text(errors="replace")},
    }

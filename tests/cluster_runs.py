"""The session's smoke run at the cluster shape (2 FSDP ranks), killed twice on its way to step 4.

Used by tests/conftest.py's ``smoke_run`` (read by tests/test_trainer_e2e.py, tests/test_cluster_e2e.py,
tests/test_kill_resume.py and the evaluation's tests). The run is ``make smoke RANKS=2`` with two failures in the
middle, each followed by a resume (one trained checkpoint series shared by the resume, cluster and evaluation tests):

1. run1 (4 steps planned, a checkpoint every step, verl's rollout dump, GAPO's per-row loss and exploration dumps)
   trains steps 1 and 2 and is SIGKILLed, whole process tree, inside the save of step 3: the actor is written,
   data.pt and the tracker are not (deterministic: the trainer's test hook `GAPO_TEST_CHECKPOINT_PAUSE` holds the
   save there);
2. run2 must resume from step 2 (not the half-written step 3), trains and commits step 3 over the half-written
   folder; once step 3 is logged and step 4 is under way, the Ray worker process of FSDP rank 1 is SIGKILLed. run2
   must then end by itself, with an error that names the dead worker (the hook would hold a kill that came late
   before step 4's commit, and the tests fail if the kill did not land inside step 4);
3. run3 resumes from step 3 at the same world size and trains step 4.
Each killed run's processes (Ray's raylet, GCS and workers included) are gone before the next run starts: every
run has its own session, Ray temp dir and marker variable, and only processes carrying them are killed.
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

from gapo.supervisor import MARKER_ENV, SupervisedRun, SupervisedRunError
from recipe.smoke import ROOT, SmokeCheckError, logged_steps, prepare, read_metrics, run_command, shape_overrides, train

RANKS = 2
STEPS, TOTAL_STEPS = 2, 3  # the 2-node run (lost_node_then_resumed): steps before the kill; steps in all
SAVE_KILL_STEP = 3  # smoke run: run1 trains steps 1-2 and is killed inside the save of this step
RANK_KILL_STEP = 4  # smoke run: run2 trains step 3 and loses rank 1 in this step; run3 trains it (the last step)
# the steps each smoke run logged (a step is logged once, by the run that finished it)
SMOKE_RUN_STEPS = {"run1": range(1, SAVE_KILL_STEP), "run2": range(SAVE_KILL_STEP, RANK_KILL_STEP),
                   "run3": range(RANK_KILL_STEP, RANK_KILL_STEP + 1)}
KILL_AFTER_S = 1.0  # into the step (a step takes 3 s or more here)
END_BOUND_S = 120  # a run that lost a rank must end by itself within this (measured 3.8 s)
RUN_TIMEOUT_S = 900
TRACKER = "latest_checkpointed_iteration.txt"


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


def checkpoint_state(ckpt: Path) -> dict:
    """{"tracker": the tracker's text or None, "folders": {global_step_N: sorted relative file paths}}."""
    tracker = ckpt / TRACKER
    return {"tracker": tracker.read_text() if tracker.exists() else None,
            "folders": {p.name: sorted(q.relative_to(p).as_posix() for q in p.rglob("*") if q.is_file())
                        for p in sorted(ckpt.glob("global_step_*"))}}


class _Run:
    """One supervised training run of the smoke preset started in the background, in its own session, Ray temp dir
    and marker (gapo.supervisor.SupervisedRun), with the per-row dumps in ROWS_DIR/<name> and explore-<name>."""

    def __init__(self, out: Path, name: str, overrides: list[str], rows_dir: Path, extra_env: dict):
        cmd, env, self.metrics_file, self.log_file = run_command(out, name, RANK_KILL_STEP, overrides)
        self.name = name
        self.ray_tmp = tempfile.mkdtemp(prefix="gsk-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
        env = {k: v for k, v in env.items() if not k.startswith(("RAY_ADDRESS", MARKER_ENV, "GAPO_TEST_"))}
        env.update(GAPO_DEBUG_LOSS_ROWS=str(rows_dir / name), GAPO_DEBUG_EXPLORE_ROWS=str(rows_dir / f"explore-{name}"),
                   **extra_env)
        self.started, self.ended = time.time(), None
        self.run = SupervisedRun([*cmd, f"+ray_kwargs.ray_init._temp_dir={self.ray_tmp}"], env, self.log_file,
                                 cwd=ROOT, timeout_s=RUN_TIMEOUT_S, grace_s=END_BOUND_S)
        self.proc = self.run.proc

    def wait_until(self, done, what: str) -> None:
        """Until `done()` (polled every 0.2 s); SmokeCheckError naming `what` if the run ends or hangs first."""
        while not done():
            if self.proc.poll() is not None or time.time() - self.started > RUN_TIMEOUT_S:
                raise SmokeCheckError(f"{self.name} ended or hung before {what}:\n{self.run.log_text()[-4000:]}")
            time.sleep(0.2)

    def sweep(self) -> None:
        """SIGKILL whatever is left of the run (its session and marker) and remove its Ray temp dir."""
        self.ended = self.ended or time.time()
        try:
            self.run.kill()
        finally:
            shutil.rmtree(self.ray_tmp, ignore_errors=True)

    def summary(self) -> dict:
        return {"started": self.started, "wall_s": (self.ended or time.time()) - self.started,
                "peak_pss_bytes": self.run.peak_pss,
                "steps": logged_steps(self.metrics_file), "ray_tmp": self.ray_tmp,
                "log": self.log_file.read_text(errors="replace")}



def killed_then_resumed(out: Path, overrides: list[str], rows_dir: Path) -> dict:
    """Runs 1-3 above. Returns {"run1", "run2", "run3": {step: metrics}, "ckpt_dir", "world_size", "runs": [run1's,
    run2's and run3's {"wall_s", "peak_pss_bytes", ...}], "states": the checkpoint folder after each run, "save_kill":
    run1's summary, "kill": the killed rank, its pid, the rank 0 pid, seconds from the kill to run2's exit, run2's exit
    code and log, whether step 4's save was reached, run3's log; "left": {run: its processes still alive}}."""
    from gapo.verl_plugin.trainer import GAPOTrainer

    out = out.resolve()
    prepare(out)
    ckpt = out / "checkpoints"
    overrides = [*shape_overrides(RANKS), *overrides]
    pause = GAPOTrainer.CHECKPOINT_PAUSE_ENV
    runs, states = {}, {}
    try:
        # run1: steps 1-2, then a SIGKILL of the whole tree inside the save of step 3 (actor written, no commit)
        marker = out / f"paused_at_step_{SAVE_KILL_STEP}"
        run1 = runs["run1"] = _Run(out, "run1", overrides, rows_dir, {pause: f"{SAVE_KILL_STEP}:{marker}"})
        run1.wait_until(marker.exists, f"the save of step {SAVE_KILL_STEP} paused")
        run1.sweep()
        states["after_run1"] = checkpoint_state(ckpt)

        # run2: resumes from step 2, commits step 3, loses rank 1's worker inside step 4
        marker4 = out / f"paused_at_step_{RANK_KILL_STEP}"  # a kill that came late would find step 4 held here
        run2 = runs["run2"] = _Run(out, "run2", overrides, rows_dir, {pause: f"{RANK_KILL_STEP}:{marker4}"})
        last = RANK_KILL_STEP - 1  # its checkpoint is committed before its log line
        run2.wait_until(lambda: last in logged_steps(run2.metrics_file), f"step {last}")
        time.sleep(KILL_AFTER_S)
        workers = actor_workers(run2.run)
        if sorted(workers) != list(range(RANKS)):
            raise SmokeCheckError(f"expected actor workers of ranks 0..{RANKS - 1}, found {sorted(workers)}")
        victim = workers[1]
        victim.kill()
        killed_at = time.time()
        try:
            result = run2.run.wait()  # the supervisor's own bound (grace_s after a logged actor death) is the backstop
            exit_code, ended_s = result.returncode, time.time() - killed_at
        except SupervisedRunError as err:
            raise SmokeCheckError(f"run2 did not end by itself after rank 1 was killed: {err}") from None
        run2.sweep()
        states["after_run2"] = checkpoint_state(ckpt)
        states["step4_save_reached"] = marker4.exists()
    finally:
        for run in runs.values():
            run.sweep()
    left = {name: [p.pid for p in run.run.processes()] for name, run in runs.items()}
    third = train(out, "run3", RANK_KILL_STEP, overrides, RUN_TIMEOUT_S,
                  extra_env={"GAPO_DEBUG_LOSS_ROWS": str(rows_dir / "run3"),
                             "GAPO_DEBUG_EXPLORE_ROWS": str(rows_dir / "explore-run3")})
    states["after_run3"] = checkpoint_state(ckpt)
    summaries = {name: run.summary() for name, run in runs.items()}
    return {
        **{name: read_metrics(run.metrics_file) for name, run in runs.items()},
        "run3": read_metrics(third["metrics_file"]), "ckpt_dir": ckpt, "world_size": RANKS,
        "runs": [summaries["run1"], summaries["run2"], third], "states": states, "save_kill": summaries["run1"],
        "left": left,
        "kill": {"rank": 1, "pid": victim.pid, "rank0_pid": workers[0].pid, "ended_s": ended_s,
                 "exit_code": exit_code, "log": summaries["run2"]["log"],
                 "run3_log": (out / "logs" / "run3.log").read_text(errors="replace")},
    }


NODES = 2
NODE_END_BOUND_S = 300  # a job that lost a node must end within this (Ray declares the node dead after ~16 s here)
# run1's distinctive overrides, checked in its printed config (tests/test_launch.py): 16 prompts in batches of 8 make
# steps 1-2 epoch 0, so run2's resume from step 2 lands exactly on the epoch boundary (verl #5725/#7401)
LAUNCH_OVERRIDES = ["data.train_max_samples=16", "trainer.experiment_name=launch_e2e"]
# VIGOR's end-to-end checks (tests/test_vigor_e2e.py) read the same run: VIGOR's allocation, verl's rollout dump
# (ROLLOUTS) and GAPO's per-row loss dump of each run (ROWS/run1, ROWS/run2, through the job's environment)
ROLLOUTS, ROWS = "rollouts", "loss_rows"


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
    `trainer.nnodes=2 trainer.n_gpus_per_node=1` with `vigor=enabled`, submitted with launch/submit.sh as on a real
    cluster:

    1. run1 (3 steps planned, a checkpoint each, followed by submit.sh) places an actor worker on each node and
       trains steps 1 and 2; in step 3 the second node's raylet is SIGKILLed (a lost machine). The job must end by
       itself, FAILED, naming the lost node, and submit.sh must exit non-zero;
    2. the node is started again (a replacement joins) and run2, submitted with `--no-wait` and then polled,
       resumes from step 2 and trains step 3.
    Each step's rollouts are dumped by verl (OUT/rollouts) and each run's per-row loss values by GAPO
    (OUT/loss_rows/run1, run2). Used by tests/test_cluster_nodes.py, tests/test_launch.py and tests/test_vigor_e2e.py
    (conftest's ``lost_node``). Only this run's Ray processes are touched (its own sessions, markers and temp dir;
    never `ray stop`)."""
    from gapo.local_cluster import LocalRayCluster
    from recipe.smoke import CPU_ENV

    out = out.resolve()
    prepare(out)
    rollout_dir, rows_dir = out / ROLLOUTS, out / ROWS
    overrides = [*shape_overrides(ranks=1, nodes=NODES), *LAUNCH_OVERRIDES, "vigor=enabled",
                 f"trainer.rollout_data_dir={rollout_dir}"]
    env = {**os.environ, **CPU_ENV, "GAPO_SMOKE_DIR": str(out)}
    result = {"out": out, "ckpt": out / "checkpoints", "rollout_dir": rollout_dir, "rows_dir": rows_dir}
    started = time.time()
    with LocalRayCluster(NODES, 1, env, out / "logs" / "cluster") as cluster:
        cmd, env1, metrics1, log1 = run_command(out, "run1", TOTAL_STEPS, overrides, cluster)
        env1["EXTRA_ENV"] += f" GAPO_DEBUG_LOSS_ROWS={rows_dir / 'run1'}"
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
        env2["EXTRA_ENV"] += f" GAPO_DEBUG_LOSS_ROWS={rows_dir / 'run2'}"
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
                # each status is a Python start-up (~0.7 CPU-s): every 10 s while the job trains, every 2 s once its
                # last step is logged (a job that fails sooner is seen at most 10 s late)
                time.sleep(2 if TOTAL_STEPS in logged_steps(metrics2) else 10)
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

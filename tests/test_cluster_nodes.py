"""Two Ray nodes on one machine (gapo.local_cluster), the job submitted with launch/submit.sh, one node lost mid-step.

End to end on CPU (`@pytest.mark.slow`): a local cluster of 2 raylets with one logical GPU each; the smoke preset at
`trainer.nnodes=2 trainer.n_gpus_per_node=1` (world size 2, one FSDP rank per node) submitted as a Ray job, as on a
real cluster (`make smoke NODES=2` runs the same without the failure):

1. run1 (3 steps planned, a checkpoint each) places an actor worker on each node and trains steps 1 and 2; in step 3
   the second node's raylet is SIGKILLed (a lost machine). The job must end by itself within a bound, FAILED, with an
   error naming the lost worker or node; submit.sh must exit non-zero;
2. the node is started again (a replacement joins) and run2, submitted the same way, resumes from step 2 and trains
   step 3: no step lost or repeated, every checkpoint with one shard per rank.
Only this test's Ray processes are touched (its own sessions, markers and temp dir; never `ray stop`).
"""

from __future__ import annotations

import os
import time

import pytest

from gapo.local_cluster import LocalRayCluster
from gapo.supervisor import SupervisedRun, SupervisedRunError
from recipe.smoke import (CPU_ENV, ROOT, logged_steps, missing_shards, prepare, read_metrics, run_command,
                          shape_overrides)

NODES, TOTAL_STEPS, STEPS_BEFORE = 2, 3, 2
END_BOUND_S = 300  # a job that lost a node must end within this (Ray declares the node dead after ~16 s here)
RUN_TIMEOUT_S = 900


def _node_workers(cluster: LocalRayCluster, index: int) -> list[int]:
    """pids of verl's actor workers (WorkerDict) among node `index`'s processes."""
    pids = []
    for proc in cluster.runs[index].processes():
        try:
            if proc.name().startswith("ray::WorkerDict"):
                pids.append(proc.pid)
        except Exception:  # noqa: BLE001  a process that just ended
            continue
    return pids


@pytest.fixture(scope="module")
def lost_node(tmp_path_factory):
    out = tmp_path_factory.mktemp("nodes").resolve()
    prepare(out)
    overrides = shape_overrides(ranks=1, nodes=NODES)
    env = {**os.environ, **CPU_ENV, "GAPO_SMOKE_DIR": str(out)}
    result = {"out": out}
    with LocalRayCluster(NODES, 1, env, out / "logs" / "cluster") as cluster:
        cmd, env1, metrics1, log1 = run_command(out, "run1", TOTAL_STEPS, overrides, cluster)
        run1 = SupervisedRun(cmd, env1, log1, cwd=ROOT, timeout_s=RUN_TIMEOUT_S, watch_patterns=False)
        started = time.time()
        try:
            while STEPS_BEFORE not in logged_steps(metrics1):
                if run1.proc.poll() is not None or time.time() - started > RUN_TIMEOUT_S:
                    pytest.fail(f"run1 ended or hung before step {STEPS_BEFORE}:\n{run1.log_text()[-4000:]}")
                time.sleep(0.2)
            result["workers"] = {i: _node_workers(cluster, i) for i in range(NODES)}
            time.sleep(1.0)  # into step 3
            result["raylet_pid"] = cluster.kill_raylet(1)
            killed_at = time.time()
            try:
                rc = run1.wait().returncode
            except SupervisedRunError as err:
                pytest.fail(f"run1 did not end after node 1 was lost: {err}")
            result.update(run1_exit=rc, ended_s=time.time() - killed_at, run1_log=run1.log_text(),
                          run1_steps=logged_steps(metrics1))
        finally:
            run1.kill()
        cluster.restart_node(1)  # a replacement node joins the cluster
        cmd, env2, metrics2, log2 = run_command(out, "run2", TOTAL_STEPS, overrides, cluster)
        run2 = SupervisedRun(cmd, env2, log2, cwd=ROOT, timeout_s=RUN_TIMEOUT_S)
        result.update(run2_exit=run2.wait().returncode, run2_log=run2.log_text(), run2_steps=logged_steps(metrics2),
                      run2_metrics=read_metrics(metrics2) if metrics2.exists() else {})
        result["cluster_processes"] = cluster.processes
    result["wall_s"] = time.time() - started
    result["left"] = result.pop("cluster_processes")()
    print(f"\n[nodes] 2-node run: node 1 lost in step 3, job ended after {result['ended_s']:.1f} s; "
          f"whole test {result['wall_s']:.0f} s")
    return result


@pytest.mark.slow
def test_the_job_placed_an_actor_worker_on_each_node(lost_node):
    assert all(len(pids) == 1 for pids in lost_node["workers"].values()), lost_node["workers"]


@pytest.mark.slow
def test_a_lost_node_ends_the_job_within_a_bound_naming_what_died(lost_node):
    assert lost_node["run1_steps"] == [1, 2]
    assert lost_node["run1_exit"] != 0  # submit.sh reports the job's failure
    assert lost_node["ended_s"] < END_BOUND_S, lost_node["ended_s"]
    log = lost_node["run1_log"]
    assert "FAILED" in log
    # the survivor's error (gloo: "Connection closed by peer") is explained by what Ray reports dead
    # (gapo/verl_plugin/lost_members.py): the lost node, by address
    assert "the run lost members of its Ray cluster: " in log, log[-4000:]
    explained = log[log.index("the run lost members of its Ray cluster: "):]
    assert "node " in explained.split("Training stopped")[0] and "resume" in explained


@pytest.mark.slow
def test_a_restarted_cluster_resumes_from_the_last_checkpoint(lost_node):
    out = lost_node["out"]
    assert lost_node["run2_exit"] == 0, lost_node["run2_log"][-4000:]
    ckpt = out / "checkpoints"
    assert f"Resuming from {ckpt}/global_step_{STEPS_BEFORE}, setting global step to {STEPS_BEFORE}" in \
        lost_node["run2_log"]
    assert lost_node["run1_steps"] + lost_node["run2_steps"] == list(range(1, TOTAL_STEPS + 1))
    for step in range(1, TOTAL_STEPS + 1):
        assert missing_shards(ckpt, step, NODES) == [], step
    m = lost_node["run2_metrics"][TOTAL_STEPS]
    assert m["training/rollout_probs_diff_max"] < 1e-5  # both nodes' rollout servers got the resumed weights
    assert "gapo/loss_eps_high_mean" in m


@pytest.mark.slow
def test_nothing_of_the_cluster_is_left(lost_node):
    assert lost_node["left"] == []

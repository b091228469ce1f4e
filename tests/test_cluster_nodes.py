"""Two Ray nodes on one machine (gapo.local_cluster), the job submitted with launch/submit.sh, one node lost mid-step.

End to end on CPU (`@pytest.mark.slow`): a local cluster of 2 raylets with one logical GPU each; the smoke preset at
`trainer.nnodes=2 trainer.n_gpus_per_node=1` (world size 2, one FSDP rank per node) submitted as a Ray job, as on a
real cluster (`make smoke NODES=2` runs the same without the failure):

1. run1 (3 steps planned, a checkpoint each) places an actor worker on each node and trains steps 1 and 2; in step 3
   the second node's raylet is SIGKILLed (a lost machine). The job must end by itself within a bound, FAILED, with an
   error naming the lost worker or node; submit.sh must exit non-zero;
2. the node is started again (a replacement joins) and run2, submitted with --no-wait and polled, resumes from step 2
   and trains step 3: no step lost or repeated, every checkpoint with one shard per rank.
The run is the session's ``lost_node`` fixture (tests/cluster_runs.py), which tests/test_launch.py also reads.
"""

from __future__ import annotations

import pytest

from recipe.smoke import missing_shards
from tests.cluster_runs import NODE_END_BOUND_S, NODES, STEPS, TOTAL_STEPS


@pytest.mark.slow
def test_the_job_placed_an_actor_worker_on_each_node(lost_node):
    assert all(len(pids) == 1 for pids in lost_node["workers"].values()), lost_node["workers"]


@pytest.mark.slow
def test_each_node_unpacked_the_job_in_its_own_directory(lost_node):
    assert all(lost_node["unpacked"][i] for i in range(NODES)), lost_node["unpacked"]
    assert lost_node["unpacked"][0] == lost_node["unpacked"][1]  # the same package, two copies


@pytest.mark.slow
def test_a_lost_node_ends_the_job_within_a_bound_naming_what_died(lost_node):
    assert lost_node["run1_steps"] == list(range(1, STEPS + 1))
    assert lost_node["run1_exit"] != 0  # submit.sh reports the job's failure
    assert lost_node["ended_s"] < NODE_END_BOUND_S, lost_node["ended_s"]
    log = lost_node["run1_log"]
    assert "FAILED" in log
    # the survivor's error (gloo: "Connection closed by peer") is explained by what Ray reports dead
    # (gapo/verl_plugin/lost_members.py): the lost node, by address
    assert "the run lost members of its Ray cluster: " in log, log[-4000:]
    explained = log[log.index("the run lost members of its Ray cluster: "):]
    assert "node " in explained.split("Training stopped")[0] and "resume" in explained


@pytest.mark.slow
def test_a_restarted_cluster_resumes_from_the_last_checkpoint(lost_node):
    assert lost_node["run2_status"] == "SUCCEEDED", lost_node["run2_log"][-4000:]
    ckpt = lost_node["ckpt"]
    assert f"Resuming from {ckpt}/global_step_{STEPS}, setting global step to {STEPS}" in lost_node["run2_log"]
    assert lost_node["run1_steps"] + lost_node["run2_steps"] == list(range(1, TOTAL_STEPS + 1))
    for step in range(1, TOTAL_STEPS + 1):
        assert missing_shards(ckpt, step, NODES) == [], step
    m = lost_node["run2_metrics"][TOTAL_STEPS]
    assert m["training/rollout_probs_diff_max"] < 1e-5  # both nodes' rollout servers got the resumed weights
    assert "gapo/loss_eps_high_mean" in m


@pytest.mark.slow
def test_nothing_of_the_cluster_is_left(lost_node):
    assert lost_node["left"] == []

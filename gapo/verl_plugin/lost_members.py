"""Name what a training run lost when it fails because a Ray node or worker died.

When a node of the cluster goes (its machine, its raylet) or a rank's worker process is killed, verl's trainer fails
with whatever error reached the driver first: often not the dead worker's, but a survivor's, e.g. gloo's
``Connection closed by peer [127.0.0.1]:28816`` from rank 0 (measured: tests/test_cluster_nodes.py). The task runner
(recipe.main_gapo.GAPOTaskRunner) then asks Ray what died and raises :class:`ClusterMemberLost`, which names the dead
nodes (id, address) and the dead actors of the job (class, pid, node), with the fix; the original error is chained.

Ray declares a node dead only after its health checks fail (~16 s after a raylet's SIGKILL here), so when the error
is a survivor's transport error (:data:`LOST_PEER_PATTERNS`) the lookup waits up to ``wait_s`` for Ray to say so; any
other error is looked up once, without waiting.
"""

from __future__ import annotations

import re
import time

# errors that a dead node or worker causes in the survivors (Ray's own, gloo's and NCCL's)
LOST_PEER_PATTERNS = re.compile(
    r"ActorDiedError|RayActorError|ActorUnavailableError|NodeDiedError|OwnerDiedError|ObjectLostError|"
    r"Connection closed by peer|Connection reset by peer|remote worker crashing|NCCL communicator was aborted"
)
DEFAULT_WAIT_S = 45.0  # Ray's health check declares a lost node dead within ~16-30 s


class ClusterMemberLost(RuntimeError):
    """The run failed because members of the Ray cluster died; the message names them and the fix."""


def dead_nodes(nodes: list[dict]) -> list[str]:
    """'node <id> at <address>' for every node `ray.nodes()` reports as not alive."""
    return [f"node {n.get('NodeID', '?')[:12]} at {n.get('NodeManagerAddress', '?')}"
            + (f" ({n['DeathReasonMessage']})" if n.get("DeathReasonMessage") else "")
            for n in nodes if not n.get("Alive", True)]


def dead_actors(actors: list) -> list[str]:
    """'actor <class> pid <pid> on node <id>' for every DEAD actor of the state API's `list_actors` output."""
    out = []
    for actor in actors:
        get = actor.get if isinstance(actor, dict) else (lambda key, a=actor: getattr(a, key, None))
        if get("state") != "DEAD":
            continue
        name = str(get("class_name") or "?").rsplit(".", 1)[-1]
        cause = get("death_cause") or {}
        detail = ""
        if isinstance(cause, dict):
            ctx = cause.get("actor_died_error_context") or {}
            detail = ctx.get("error_message", "") if isinstance(ctx, dict) else ""
        out.append(f"actor {name} pid {get('pid')} on node {str(get('node_id') or '?')[:12]}"
                   + (f" ({detail.splitlines()[0][:160]})" if detail else ""))
    return out


def _query() -> tuple[list[dict], list]:
    import ray

    nodes = ray.nodes()
    try:  # the state API needs the dashboard; without it, nodes only
        from ray.util.state import list_actors

        actors = list_actors(filters=[("state", "=", "DEAD")], limit=1000, timeout=10, raise_on_missing_output=False)
    except Exception:  # noqa: BLE001  (no dashboard, or an older Ray): the nodes still say enough
        actors = []
    return nodes, actors


def lost_members(error: BaseException, wait_s: float = DEFAULT_WAIT_S, query=_query, sleep=time.sleep) -> list[str]:
    """The dead nodes and actors Ray reports after `error` (empty: nothing died, the error is the run's own).

    An ActorDiedError already names its actor: one look, no wait. A survivor's transport error (gloo's "Connection
    closed by peer", ...) is explained by a node or actor that died: wait up to `wait_s` for Ray to report one.
    """
    text = f"{type(error).__name__}: {error}"
    wait = LOST_PEER_PATTERNS.search(text) is not None and "ActorDiedError" not in text
    deadline = time.monotonic() + (wait_s if wait else 0.0)
    while True:
        nodes, actors = query()
        found = dead_nodes(nodes) + dead_actors(actors)
        if found or time.monotonic() >= deadline:
            return found
        sleep(2.0)


def explain(error: BaseException, found: list[str]) -> ClusterMemberLost:
    return ClusterMemberLost(
        "the run lost members of its Ray cluster: " + "; ".join(found)
        + ". Training stopped; the last complete checkpoint is intact. Fix: bring the node back (or replace it) so "
        "that the cluster has trainer.nnodes x trainer.n_gpus_per_node GPUs again, then start the same command: "
        f"trainer.resume_mode=auto resumes from the last checkpoint. First error: {type(error).__name__}: "
        f"{str(error).strip().splitlines()[-1][:300] if str(error).strip() else ''}")

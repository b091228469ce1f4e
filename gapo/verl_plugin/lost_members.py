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

import os
import re
import sys
import threading
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


def explain(error: BaseException | None, found: list[str]) -> ClusterMemberLost:
    """The `ClusterMemberLost` to raise: the dead members `found`, the fix (restore the cluster's GPUs, rerun to
    resume) and the last line of the first `error`, if any."""
    first = ""
    if error is not None:
        text = str(error).strip()
        first = f" First error: {type(error).__name__}: {text.splitlines()[-1][:300] if text else ''}"
    return ClusterMemberLost(
        "the run lost members of its Ray cluster: " + "; ".join(found)
        + ". Training stopped; the last complete checkpoint is intact. Fix: bring the node back (or replace it) so "
        "that the cluster has trainer.nnodes x trainer.n_gpus_per_node GPUs again, then start the same command: "
        "trainer.resume_mode=auto resumes from the last checkpoint." + first)


class NodeWatchdog(threading.Thread):
    """Ends the driver when a node of its Ray cluster dies during the run.

    Why: a node lost while verl waits for rollouts leaves the trainer waiting forever (measured: a raylet SIGKILLed
    during generation; Ray marked the node dead after ~16 s and verl's agent loop kept polling). Every `every_s` the
    thread compares `ray.nodes()` with the nodes seen alive before; when one of them is dead it prints
    :func:`explain`'s message and exits the process with status 1 (Ray then stops the job's actors)."""

    def __init__(self, every_s: float = 5.0, exit=os._exit, nodes=None):
        """A daemon thread; `start()` it any time (until Ray is initialised its polls see no node).

        Args:
            every_s: seconds between polls of `ray.nodes()`.
            exit: what ends the process on a lost node (`os._exit`, no clean-up that could hang; tests pass a recorder).
            nodes: a `ray.nodes()` stand-in for tests (None: Ray's, empty until Ray is initialised).
        """
        super().__init__(name="gapo-node-watchdog", daemon=True)
        self.every_s, self._exit, self._nodes = every_s, exit, nodes

    def _query(self) -> list[dict]:
        if self._nodes is not None:
            return self._nodes()
        import ray

        return ray.nodes() if ray.is_initialized() else []

    def check(self, seen: set[str]) -> list[str]:
        """One poll: the messages of nodes in `seen` that are dead now (and `seen` grows by the living ones)."""
        try:
            nodes = self._query()
        except Exception:  # noqa: BLE001  (GCS briefly unreachable): look again next time
            return []
        lost = dead_nodes([n for n in nodes if n.get("NodeID") in seen and not n.get("Alive", True)])
        seen.update(n["NodeID"] for n in nodes if n.get("Alive", True) and "NodeID" in n)
        return lost

    def run(self) -> None:
        """Poll every `every_s` until a node seen alive is dead; then print the explanation and exit with status 1."""
        seen: set[str] = set()
        while True:
            lost = self.check(seen)
            if lost:
                print(f"GAPO: {explain(None, lost)}", file=sys.stderr, flush=True)
                self._exit(1)
                return
            time.sleep(self.every_s)

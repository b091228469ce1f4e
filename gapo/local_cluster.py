"""A Ray cluster of several nodes on one machine, started with Ray's own CLI, for smoke runs and tests.

    with LocalRayCluster(nodes=2, gpus_per_node=1, env=..., root=Path("/tmp/x")) as cluster:
        cluster.dashboard_url      # RAY_ADDRESS for `ray job submit` / launch/submit.sh, with cluster.auth in its env
        cluster.kill_raylet(1)     # SIGKILL node 1's raylet (a lost node)
        cluster.restart_node(1)    # start node 1 again (a replacement node joins)

Each node is ``ray start --block`` in its own session under :class:`gapo.supervisor.SupervisedRun` (its own marker),
exactly as on a real cluster: the head (GCS, dashboard and job server, a raylet) and workers that join it by
address; every node has its own ports, temp dir and logical resources (``--num-gpus``: the CPU platform's
logical GPUs, ``--num-cpus``: logical CPUs for verl's many actors); the nodes share one short temp dir of their
own. Only the processes of these nodes are ever stopped (never ``ray stop``, which would take every Ray cluster of
the machine down). Measured facts: docs/cluster.md.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from gapo.supervisor import SupervisedRun, SupervisedRunError

START_TIMEOUT_S = 120  # a node's start on 2 loaded cores (measured ~10 s idle)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it; another process may take it before it is used)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_cause(log: str) -> str:
    """A node log's cause line, for the first line of an error (which is all pytest's short summary shows): the last
    line that names an error or a failure, else the last line that is not empty (cut to 300 characters)."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    named = [line for line in lines if re.search(r"error|exception|failed|fatal|refused|in use", line, re.I)]
    found = (named or lines or ["(its log is empty)"])[-1]
    return found[:300]


class LocalClusterError(RuntimeError):
    """The local cluster did not start (or a node did not join); the message quotes the node's log."""


class LocalRayCluster:
    """``nodes`` Ray nodes on this machine, ``gpus_per_node`` logical GPUs each (see the module docstring)."""

    def __init__(self, nodes: int, gpus_per_node: int, env: dict, root: Path, cpus_per_node: int = 16,
                 ray: str | None = None):
        """Set up the cluster's ports, auth token and temp dir; the nodes start in `start()` (or on entering `with`).

        Args:
            nodes: Ray nodes, the first one the head.
            gpus_per_node: logical GPUs per node (``ray start --num-gpus``; the CPU platform's devices).
            env: every node's environment; its ``RAY_ADDRESS*`` and ``RAY_AUTH_*`` are replaced by this cluster's.
            root: folder for the nodes' logs (``node{i}.log``).
            cpus_per_node: logical CPUs per node (``--num-cpus``), enough for verl's many actors whatever the machine.
            ray: the ``ray`` executable (default: the one beside this Python).
        """
        if nodes < 1 or gpus_per_node < 1:
            raise ValueError(f"a local cluster needs nodes >= 1 and gpus_per_node >= 1, got {nodes} x {gpus_per_node}")
        self.nodes, self.gpus_per_node, self.cpus_per_node = nodes, gpus_per_node, cpus_per_node
        # Ray 2.60 turns token authentication on for a `ray start` cluster once a token exists on the machine
        # (~/.ray/auth_token): every node and every client of this cluster gets the same fresh token
        # (launch/slurm_ray.sbatch does the same per allocation)
        self.auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        self.env = {**{k: v for k, v in env.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH_"))}, **self.auth}
        self.root = Path(root)
        self.ray = ray or str(Path(sys.executable).with_name("ray"))
        # Ray's socket paths must fit 107 bytes: a short temp dir of its own, removed with the cluster; each node
        # gets its own below it (`ray start --temp-dir` is per node), as each machine of a real cluster has its own
        # disk: nodes sharing one runtime_resources/working_dir_files race, a node whose runtime-env agent lacks a
        # job's package in its cache deletes and unpacks it again (Ray 2.60, overwrite=True) under a job driver
        # that runs there (seen once in CI with one shared dir: a resumed job's driver died at start with "oneMKL
        # FATAL ERROR: Cannot load libtorch_cpu.so", the error of a process whose working directory was removed)
        self.temp_dir = tempfile.mkdtemp(prefix="glc-", dir="/tmp")
        self.gcs_port, self.dashboard_port = free_port(), free_port()
        self.runs: dict[int, SupervisedRun] = {}
        # the machine's own address: Ray 2.60 registers a node under it even when told 127.0.0.1, and a driver that
        # connects to 127.0.0.1 is then sent to it
        from ray.util import get_node_ip_address

        self.ip = get_node_ip_address()

    @property
    def address(self) -> str:
        """The head's GCS address ``ip:port``, which the other nodes join (``ray start --address``)."""
        return f"{self.ip}:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        """The dashboard and job server's URL: RAY_ADDRESS for ``ray job submit`` (with ``auth`` in the environment)."""
        return f"http://127.0.0.1:{self.dashboard_port}"

    def _command(self, index: int) -> list[str]:
        cmd = [self.ray, "start", "--block", "--disable-usage-stats", f"--node-ip-address={self.ip}",
               f"--num-cpus={self.cpus_per_node}", f"--num-gpus={self.gpus_per_node}", f"--temp-dir={self.temp_dir}/n{index}",
               f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
               f"--metrics-export-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
               f"--dashboard-agent-grpc-port={free_port()}", f"--runtime-env-agent-port={free_port()}"]
        low = 20000 + 1000 * index  # each node its own worker port range
        cmd += [f"--min-worker-port={low}", f"--max-worker-port={low + 999}"]
        if index == 0:
            return [*cmd, "--head", f"--port={self.gcs_port}", "--include-dashboard=true",
                    "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}",
                    f"--ray-client-server-port={free_port()}"]
        return [*cmd, f"--address={self.address}"]

    def _start_node(self, index: int) -> None:
        log = self.root / f"node{index}.log"
        self.runs[index] = SupervisedRun(self._command(index), self.env, log, timeout_s=None, watch_patterns=False,
                                         sample_memory_s=None, marker_env=f"GAPO_RAY_NODE{index}_MARKER")

    def start(self) -> "LocalRayCluster":
        """Start the head, then the other nodes; returns when every node's GPUs are in the cluster."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._start_node(0)
        self._wait_for(1)
        for index in range(1, self.nodes):
            self._start_node(index)
        self._wait_for(self.nodes)
        return self

    def _alive_nodes(self) -> list[float]:
        """GPUs of each living node, asked in a child process (this process never becomes a Ray driver)."""
        code = ("import json, ray; ray.init(address=%r, logging_level='ERROR', log_to_driver=False); "
                "print('NODES', json.dumps([n['Resources'].get('GPU', 0) for n in ray.nodes() if n['Alive']]))"
                % self.address)
        proc = subprocess.run([sys.executable, "-c", code], env=self.env, capture_output=True, text=True,
                              timeout=90, check=False)
        for line in proc.stdout.splitlines():
            if line.startswith("NODES "):
                return json.loads(line[len("NODES "):])
        return []

    def _session_errors(self, index: int) -> str:
        """Node ``index``'s error lines in its Ray session's own logs (raylet, GCS, agents: `ray start` itself often
        only says that one of them exited), the last 8 of each file, or '' when there are none."""
        logs = Path(self.temp_dir) / f"n{index}" / "session_latest" / "logs"
        out = []
        for path in sorted(logs.glob("*.*")) if logs.is_dir() else []:
            if path.suffix not in (".out", ".err", ".log"):
                continue
            text = path.read_text(errors="replace")
            bad = [line for line in text.splitlines() if re.search(r"\b(error|fatal|failed)\b", line, re.I)]
            if bad:
                out.append(f"--- {path.name}:\n" + "\n".join(line[:400] for line in bad[-8:]))
        return ("\n" + "\n".join(out)) if out else ""

    def _wait_for(self, nodes: int) -> None:
        deadline = time.time() + START_TIMEOUT_S
        while True:
            for index, run in self.runs.items():
                if run.proc.poll() is not None:
                    log = run.log_text()
                    raise LocalClusterError(f"ray node {index} exited ({run.proc.returncode}): {log_cause(log)}\n"
                                            f"--- the end of its log ({run.log_file}):\n{log[-3000:]}"
                                            f"{self._session_errors(index)}")
            alive = self._alive_nodes()
            if len(alive) >= nodes and all(gpus >= self.gpus_per_node for gpus in alive):
                return
            if time.time() > deadline:
                logs = "\n".join(f"--- node {i}:\n{r.log_text()[-1500:]}" for i, r in self.runs.items())
                raise LocalClusterError(f"{len(alive)} of {nodes} Ray node(s) up after {START_TIMEOUT_S} s:\n{logs}")
            time.sleep(1.0)

    def raylet(self, index: int) -> psutil.Process:
        """Node ``index``'s raylet process."""
        for proc in self.runs[index].processes():
            try:
                if proc.name() == "raylet" or proc.cmdline()[:1] and proc.cmdline()[0].endswith("/raylet"):
                    return proc
            except psutil.Error:
                continue
        raise LocalClusterError(f"node {index} has no raylet process")

    def kill_raylet(self, index: int) -> int:
        """SIGKILL node ``index``'s raylet (what a lost machine looks like to the cluster); returns its pid. The
        node's other processes are left to die as they do when their raylet goes; ``stop_node`` removes them."""
        proc = self.raylet(index)
        proc.kill()
        return proc.pid

    def stop_node(self, index: int) -> None:
        """Kill every process of node ``index`` (none of another node)."""
        run = self.runs.pop(index, None)
        if run is not None:
            try:
                run.kill()
            except SupervisedRunError as err:
                raise LocalClusterError(f"node {index}: {err}") from None

    def restart_node(self, index: int) -> None:
        """Stop what is left of node ``index`` and start it again; returns when the cluster has all its nodes."""
        self.stop_node(index)
        self._start_node(index)
        self._wait_for(self.nodes)

    def stop(self) -> None:
        """Stop the worker nodes, then the head, and remove the temp dir."""
        for index in sorted(self.runs, reverse=True):
            self.stop_node(index)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def processes(self) -> list[psutil.Process]:
        """Living processes of every node (raylets, GCS, dashboard, and the jobs' drivers and workers)."""
        return [p for run in self.runs.values() for p in run.processes()]

    @contextlib.contextmanager
    def peak_memory(self, every_s: float = 2.0):
        """Samples the PSS of all the cluster's processes in a thread while the block runs; yields a dict whose
        "peak_pss_bytes" holds the largest sum seen."""
        seen = {"peak_pss_bytes": 0}
        done = threading.Event()

        def sample():
            while not done.is_set():
                total = 0
                for proc in self.processes():
                    try:
                        total += proc.memory_full_info().pss
                    except (psutil.Error, OSError):
                        continue
                seen["peak_pss_bytes"] = max(seen["peak_pss_bytes"], total)
                done.wait(every_s)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            yield seen
        finally:
            done.set()
            thread.join()

    def __enter__(self) -> "LocalRayCluster":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

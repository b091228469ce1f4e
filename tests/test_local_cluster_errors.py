"""What gapo.local_cluster says when a Ray node dies during its start: the cause on the error's first line (the only
line pytest's short summary shows) and the node's own Ray session logs' error lines. No Ray process starts here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gapo.local_cluster import LocalClusterError, LocalRayCluster, log_cause

NODE_LOG = """\
Local node IP: 10.0.0.5
[2026-12-08 00:10:01] Starting Ray worker node
RuntimeError: Failed to bind the node manager to port 41235: address already in use
[2026-12-08 00:10:02] Ray runtime stopped.
"""


def test_the_cause_is_the_last_line_naming_an_error_not_the_last_line():
    assert log_cause(NODE_LOG) == "RuntimeError: Failed to bind the node manager to port 41235: address already in use"


def test_a_log_without_an_error_gives_its_last_line_and_an_empty_log_says_so():
    assert log_cause("starting\n  waiting for the head  \n\n") == "waiting for the head"
    assert log_cause("") == "(its log is empty)"
    assert len(log_cause("error: " + "x" * 1000)) == 300


class _Exited:
    """A SupervisedRun whose process has exited with code 1, its log on disk."""

    def __init__(self, log_file: Path):
        self.log_file = log_file
        self.proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
        self.proc.wait()

    def log_text(self) -> str:
        return self.log_file.read_text()


def test_a_node_that_exits_names_its_cause_first_then_its_log_and_its_session_errors(tmp_path):
    cluster = LocalRayCluster.__new__(LocalRayCluster)  # no ports, no Ray: only what _wait_for reads
    cluster.temp_dir = str(tmp_path / "glc")
    logs = tmp_path / "glc" / "n1" / "session_latest" / "logs"
    logs.mkdir(parents=True)
    (logs / "raylet.out").write_text("".join(f"[info] line {i}\n" for i in range(50))
                                     + "".join(f"[E] check failed: plasma store {i}\n" for i in range(10)))
    (logs / "gcs_server.out").write_text("[info] all well\n")
    (logs / "dashboard_agent.log").write_text("Fatal: agent could not start\n")
    (logs / "core.bin").write_text("error in a binary file that is not read\n")
    (tmp_path / "node1.log").write_text(NODE_LOG)
    cluster.runs = {1: _Exited(tmp_path / "node1.log")}
    with pytest.raises(LocalClusterError) as err:
        cluster._wait_for(2)
    text = str(err.value)
    first, rest = text.split("\n", 1)
    assert first == ("ray node 1 exited (1): RuntimeError: Failed to bind the node manager to port 41235: address "
                     "already in use")
    assert f"--- the end of its log ({tmp_path / 'node1.log'}):\n" + NODE_LOG in rest
    # the last 8 error lines of each session log that has any, in file-name order; no other file's lines
    raylet = "--- raylet.out:\n" + "\n".join(f"[E] check failed: plasma store {i}" for i in range(2, 10))
    assert rest.endswith("--- dashboard_agent.log:\nFatal: agent could not start\n" + raylet)
    assert "gcs_server" not in rest and "binary" not in rest and "line 49" not in rest

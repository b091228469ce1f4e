"""Run a training or evaluation command with a hard wall-clock limit, failure detection and a full clean-up.

Why: when verl's rollout server fails (a vLLM engine that dies at start-up or in a weight sync), verl's trainer
does not exit: the driver waits on Ray for results that never come. A bare ``subprocess.run`` then hangs
forever, and the run's Ray processes and shared-memory segments outlive it. :class:`SupervisedRun`:

- starts the command in its own session (``setsid``) with a marker variable, so that every process of the run
  (driver, Ray's GCS and raylet, Ray workers, vLLM engine cores) can be found and nothing else is touched;
- watches the log for a rollout server's fatal error (:data:`FATAL_PATTERNS`): on a match the run gets
  ``grace_s`` to exit by itself, then it is killed and :class:`RolloutServerFailed` names the error and quotes
  the log lines around it;
- kills the run when ``timeout_s`` passes (:class:`RunTimedOut`);
- afterwards kills whatever of the run is still alive and removes the shared-memory segments it leaked
  (created under /dev/shm while it ran, and now held by no living process: vLLM's ``psm_*``, verl's
  ``verl_weights_*``, ...);
- samples the peak memory (PSS) of the whole process tree, so runs can be compared.

Used by ``recipe.smoke`` (every training run) and the tests that start runs of their own.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

MARKER_ENV = "GAPO_RUN_MARKER"
SHM_DIR = Path("/dev/shm")

# A rollout server's errors that verl does not turn into an exit. Each entry: (name, pattern on one log line).
FATAL_PATTERNS: tuple[tuple[str, re.Pattern], ...] = tuple((name, re.compile(pattern)) for name, pattern in (
    ("vLLM engine failed to start", r"Engine core initialization failed|EngineCore failed to start"),
    ("vLLM engine died", r"EngineDeadError|EngineCore encountered a fatal error"),
    ("vLLM weight sync failed", r"Attempted to load weight \(torch\.Size"),
    ("vLLM rejected the model", r"Unsupported CPU attention configuration|ValueError: .*(?:KV cache|kv_cache)"),
    ("a Ray actor died", r"ray\.exceptions\.(?:ActorDiedError|RayActorError)|The actor died unexpectedly"),
))


class SupervisedRunError(RuntimeError):
    """The run did not end normally; the message says why and quotes the log."""


class RunTimedOut(SupervisedRunError):
    """The run was still going at ``timeout_s`` and was killed."""
    pass


class RolloutServerFailed(SupervisedRunError):
    """A rollout server logged a fatal error (FATAL_PATTERNS); the run, not gone within ``grace_s``, was killed."""
    pass


@dataclass
class RunResult:
    """A run that exited by itself: its exit code, wall time, the peak PSS of its process tree in bytes, and the
    shared-memory segments it leaked that were removed after it."""

    returncode: int
    wall_s: float
    peak_pss_bytes: int
    leaked_shm_removed: list[str] = field(default_factory=list)


def _log_context(lines: list[str], index: int, before: int = 5, after: int = 15) -> str:
    return "".join(lines[max(0, index - before):index + after])


def find_fatal_error(text: str) -> tuple[str, str] | None:
    """(name, log excerpt) of the first fatal rollout-server error in ``text``, or None."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        for name, pattern in FATAL_PATTERNS:
            if pattern.search(line):
                return name, _log_context(lines, i)
    return None


def _shm_paths() -> list[Path]:
    try:
        return list(SHM_DIR.iterdir())
    except OSError:
        return []


def _shm_segments() -> set[str]:
    return {p.name for p in _shm_paths()}


# Segments the rollout stack creates and may leak (vLLM's shared-memory broadcast, verl's weight-sync buckets):
# new ones of these names are candidates even when the run was never seen holding them.
LEAKY_PREFIXES = ("psm_", "verl_weights_")


def held_segments(processes) -> set[str]:
    """Names under /dev/shm that these processes have open or mapped (unreadable processes count as holding
    nothing). Matched by inode as well as by name: a POSIX semaphore's creator maps it under a temporary name that
    it then links to the real one (``sem.XXXXXX`` -> ``sem.mp-...``), so only the inode ties the two."""
    names, inodes = set(), set()
    for proc in processes:
        try:
            for f in proc.open_files():
                if f.path.startswith("/dev/shm/"):
                    names.add(f.path[len("/dev/shm/"):])
            with open(f"/proc/{proc.pid}/maps") as maps:
                for line in maps:
                    at = line.find("/dev/shm/")
                    if at >= 0:
                        names.add(line[at + len("/dev/shm/"):].split()[0])
                        inodes.add(int(line.split()[4]))
        except (psutil.Error, OSError, ValueError, IndexError):  # ended meanwhile, or not ours
            continue
    if inodes:
        for path in _shm_paths():
            try:
                if path.stat().st_ino in inodes:
                    names.add(path.name)
            except OSError:
                continue
    return names


def _segments_in_use() -> set[str]:
    """Names under /dev/shm that any living process has open or mapped."""
    return held_segments(psutil.process_iter())


class SupervisedRun:
    """One command in its own session; ``wait()`` enforces the limit, detects failures and cleans up.

    ``log_file`` receives stdout and stderr; ``timeout_s`` is the hard wall-clock limit; ``grace_s`` how long a
    run with a fatal error in its log may take to exit by itself; ``watch_patterns`` turns failure detection on.
    """

    def __init__(self, cmd: list[str], env: dict, log_file: Path | None, *, cwd: Path | str | None = None,
                 timeout_s: float | None = 1800, grace_s: float = 30, watch_patterns: bool = True,
                 sample_memory_s: float | None = 2.0, marker_env: str = MARKER_ENV):
        """``log_file`` None: the command shares this process's stdin, stdout and stderr (no failure detection).
        ``timeout_s`` None: no limit. ``marker_env``: the marker's variable (a supervised run inside another one
        takes its own name, so the outer one still finds every process by its marker)."""
        self.cmd, self.log_file = list(cmd), Path(log_file) if log_file is not None else None
        self.timeout_s, self.grace_s = timeout_s, grace_s
        self.watch_patterns = watch_patterns and self.log_file is not None
        self.sample_memory_s, self.marker_env = sample_memory_s, marker_env
        self.token = uuid.uuid4().hex[:16]
        self.shm_before = _shm_segments()
        self.shm_held: set[str] = set()
        self.peak_pss, self.killed = 0, 0
        self.started = time.time()
        env = {**env, marker_env: self.token}
        if self.log_file is None:
            self.proc = subprocess.Popen(self.cmd, cwd=cwd, env=env, start_new_session=True)
            return
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "w") as log:
            self.proc = subprocess.Popen(self.cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    # ----------------------------------------------------------------------------------- the run's processes
    def processes(self) -> list[psutil.Process]:
        """Living processes of the run: its session, and anything that carries its marker (moved sessions)."""
        found = []
        for proc in psutil.process_iter():
            try:
                if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                if os.getsid(proc.pid) == self.proc.pid or proc.environ().get(self.marker_env) == self.token:
                    found.append(proc)
            except (psutil.Error, OSError):
                continue
        return found

    def _sample(self) -> None:
        """Peak memory (PSS of the whole tree) and the /dev/shm segments the run's processes hold."""
        processes = self.processes()
        self.shm_held |= held_segments(processes)
        total = 0
        for proc in processes:
            try:
                total += proc.memory_full_info().pss
            except (psutil.Error, OSError):
                continue
        self.peak_pss = max(self.peak_pss, total)

    def kill(self) -> None:
        """SIGKILL the run's process group, then every other process of it, until none is left (60 s at most)."""
        alive = self.processes()
        self.killed = len(alive)  # processes of the run still alive when it was killed
        self.shm_held |= held_segments(alive)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.time() + 60
        while alive := self.processes():
            if time.time() > deadline:
                raise SupervisedRunError(f"processes of the run survive SIGKILL: {[p.pid for p in alive]}")
            for proc in alive:
                try:
                    proc.kill()
                except psutil.Error:
                    pass
            time.sleep(0.5)

    def remove_leaked_shm(self) -> list[str]:
        """Remove the segments the run left that no living process holds: those it was seen holding, and new ones
        of LEAKY_PREFIXES (another program's segments are never candidates). Returns their names."""
        present = _shm_segments()
        candidates = (self.shm_held | {n for n in present - self.shm_before if n.startswith(LEAKY_PREFIXES)}) & present
        if not candidates:
            return []
        leaked = sorted(candidates - _segments_in_use())
        for name in leaked:
            try:
                (SHM_DIR / name).unlink()
            except OSError:
                pass
        return leaked

    # ---------------------------------------------------------------------------------------- waiting
    def log_text(self) -> str:
        """The run's log so far ('' when it has none yet)."""
        return self.log_file.read_text(errors="replace") if self.log_file and self.log_file.exists() else ""

    def wait(self, poll_s: float = 0.5) -> RunResult:
        """Wait for the run; always leaves no process and no leaked segment of it behind.

        Raises RunTimedOut past ``timeout_s`` and RolloutServerFailed when a fatal error was logged and the run
        did not exit within ``grace_s`` of it (it is killed in both cases). A run that exits by itself returns
        its result, whatever its exit code.
        """
        deadline = self.started + self.timeout_s if self.timeout_s is not None else float("inf")
        failure_seen_at, next_sample = None, 0.0
        log_pos, log_tail = 0, ""  # bytes of the log already read; its last characters (a line cut by a read)
        error: SupervisedRunError | None = None
        try:
            while self.proc.poll() is None:
                now = time.time()
                if self.sample_memory_s and now >= next_sample:
                    self._sample()
                    next_sample = now + self.sample_memory_s
                if self.watch_patterns and failure_seen_at is None and self.log_file.exists():
                    with open(self.log_file, "rb") as log:  # only what was written since the last poll
                        log.seek(log_pos)
                        raw = log.read()
                    log_pos += len(raw)
                    chunk = raw.decode(errors="replace")
                    if chunk and find_fatal_error(log_tail + chunk):
                        failure_seen_at = now
                    log_tail = (log_tail + chunk)[-2000:]
                if failure_seen_at is not None and now - failure_seen_at > self.grace_s:
                    name, excerpt = find_fatal_error(self.log_text())  # the whole log once: context after it too
                    error = RolloutServerFailed(
                        f"{name}; the run did not exit within {self.grace_s:.0f} s of it and was killed. "
                        f"Log {self.log_file}:\n{excerpt}")
                    break
                if now > deadline:
                    tail = "".join(self.log_text().splitlines(keepends=True)[-30:])
                    error = RunTimedOut(f"the run exceeded its wall-clock limit of {self.timeout_s:.0f} s and was "
                                        f"killed. Last lines of {self.log_file}:\n{tail}")
                    break
                time.sleep(poll_s)
        finally:
            self.kill()
            leaked = self.remove_leaked_shm()
        if error is not None:
            raise error
        return RunResult(self.proc.returncode, time.time() - self.started, self.peak_pss, leaked)

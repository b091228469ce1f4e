"""Run untrusted (model-written) Python programs on test inputs, isolated by bubblewrap: the client side.

A :class:`Sandbox` owns one executor process (:mod:`gapo.rewards.sandbox._executor`, a child
subreaper that launches, limits, times and reaps one sandboxed process per test) and talks to it over
pipes. It only runs programs and returns what they printed; judging happens in the caller, so
expected outputs never reach the sandbox (nor the executor).

Isolation of each test (the launch chain: :mod:`gapo.rewards.sandbox.policy`): every namespace unshared
(user, pid, net, ipc, uts, cgroup, mount), no host files except read-only ``/usr`` (plus the
interpreter's prefix when it lives elsewhere), the program read-only at ``/main.py``, a small tmpfs
``/tmp``, a cleared environment (bwrap itself also starts with a minimal one), rlimits on address
space, CPU, file size, open files, processes and core dumps, a non-root uid per concurrent slot
(when the executor runs as root), a wall-clock limit per test and per problem, and an output cap.

Limits per slot (rlimits are per process: a test that forks escapes them): each slot has its own cgroup
with a memory limit, a CPU quota and a task limit (knobs ``slot_memory_mb``, ``slot_cpus``,
``slot_pids``); cgroup v2 is tried first, then v1. Where neither can be written (not root, a read-only
``/sys/fs/cgroup``, controllers missing), the sandbox falls back to rlimits only, with a tighter
``RLIMIT_NPROC`` (``rlimits_nproc``). Which one is in use: :attr:`Sandbox.isolation` and
:attr:`RunResult.isolation` (``cgroup_v2``, ``cgroup_v1`` or ``rlimits``; the reason for a fallback is in
``Sandbox.probe["isolation_note"]``).

Nothing outlives a result: the executor reports a test only once its slot is empty (cgroup: killed until
no task is left; rlimits: uid cleaner, or the subreaper's orphans killed), and :meth:`Job.cancel` waits for
the reports of the tests it stopped, so when a caller has every result of a job (or cancelled it), no
process of that job is left.

If bubblewrap is missing or cannot create namespaces, :meth:`Sandbox.start` raises
:class:`SandboxUnavailable` unless unsandboxed execution was allowed explicitly
(``allow_unsandboxed=True`` or ``GAPO_ALLOW_UNSANDBOXED=1``), in which case programs run with the
rlimits and uid drop only, and a warning says so.

Threads: any number of threads may call :meth:`Sandbox.submit` / :meth:`Sandbox.run` at once; one
lock serialises writes to the executor, one reader thread dispatches results. Each submission is a
*group* (one problem): its tests run in parallel on free slots, it stops at its first failing test,
and it can be cancelled (:meth:`Job.cancel`) as soon as the caller sees a wrong answer.
"""

from __future__ import annotations

import atexit
import itertools
import json
import marshal
import os
import queue
import shutil
import struct
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

EXECUTOR_SCRIPT = Path(__file__).with_name("_executor.py")
FRAME = struct.Struct("<Q")  # same framing as the executor
ALLOW_ENV = "GAPO_ALLOW_UNSANDBOXED"
CGROUP_ENV = "GAPO_SANDBOX_CGROUP"
ISOLATIONS = ("cgroup_v2", "cgroup_v1", "rlimits")
BWRAP_ENV = "GAPO_BWRAP"
INSTALL_HINT = (
    "Install bubblewrap (Debian/Ubuntu: `apt-get install -y bubblewrap`) and allow unprivileged user "
    "namespaces (`sysctl kernel.unprivileged_userns_clone=1`; Ubuntu 24.04+: "
    "`sysctl kernel.apparmor_restrict_unprivileged_userns=0`; in Docker, a seccomp profile that permits "
    "clone/unshare of namespaces). To run model-written code WITHOUT isolation anyway (a throwaway "
    f"machine only), set {ALLOW_ENV}=1."
)


class SandboxUnavailable(RuntimeError):
    """Isolation cannot be set up here and unsandboxed execution was not allowed."""


def _default_bwrap() -> str:
    return os.environ.get(BWRAP_ENV) or shutil.which("bwrap") or "/usr/bin/bwrap"


def _default_interpreter() -> str:
    # The system interpreter under /usr needs no extra mount; a venv's python would drag its prefix in.
    if os.path.exists("/usr/bin/python3"):
        return "/usr/bin/python3"
    return os.path.realpath(sys.executable)


def _bytes(text: str | bytes) -> bytes:
    # surrogatepass: a lone surrogate becomes bytes that are not UTF-8 (see Sandbox.submit), never an exception
    return text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class SandboxConfig:
    """Limits and paths of the sandbox (defaults here and nowhere else).

    Attributes:
        bwrap: path of the bubblewrap binary (default: ``$GAPO_BWRAP``, else ``bwrap`` on ``PATH``).
        interpreter: Python that runs the programs (default ``/usr/bin/python3``). One outside ``/usr``
            gets its prefix (two levels above the binary) mounted read-only.
        python_args: ``-I`` isolates from ``PYTHON*`` variables and the user site. ``site`` stays on so
            that the system's packages under ``/usr`` (read-only) can be imported: HumanEval+'s tests import
            numpy (Debian ``python3-numpy``, which ``make install`` installs). Add ``-S`` for stdlib only
            (as on contest judges), which roughly halves start-up time.
        slots: tests run at once (default: CPU count). Each slot has its own uid.
        uid_base: slots run as uids claimed from ``[uid_base, uid_base + 4096)`` (only when the executor
            is root): each executor on the host locks its own (``/tmp/gapo-sandbox-uids``), so concurrent
            executors never share a uid. Pick a range no real account uses.
        memory_mb: ``RLIMIT_AS`` per test process.
        test_timeout_s / problem_timeout_s: wall-clock limits per test (from its start) and per problem
            (from its first test's start). ``RLIMIT_CPU`` is the test limit + 1 s.
        fsize_mb: ``RLIMIT_FSIZE`` (largest file a test may write, in its tmpfs).
        nofile / nproc: ``RLIMIT_NOFILE`` / ``RLIMIT_NPROC`` (processes + threads of a slot's uid,
            bwrap's two processes included).
        tmpfs_mb / shm_mb: sizes of the sandbox's ``/tmp`` and ``/dev/shm``, its only writable places (``/`` and
            ``/dev`` are read-only), each at most the test's ``memory_mb``. RLIMIT_AS does not count their pages,
            so without cgroups they are the whole bound on what a test keeps there: together ``tmpfs_mb +
            shm_mb`` past its memory limit (a slot cgroup's limit includes them).
        max_output_bytes: hard cap on a test's stdout (callers usually pass a tighter one per test).
        stderr_bytes: how much of the end of stderr is kept (diagnostics only).
        extra_ro_binds: more host paths mounted read-only at the same place. Default: Debian's
            ``/etc/alternatives`` (symlinks only), through which shared libraries such as numpy's BLAS
            resolve; missing paths are skipped.
        allow_unsandboxed: run without isolation when bwrap cannot work (default: ``$GAPO_ALLOW_UNSANDBOXED``).
        startup_timeout_s: how long the executor may take to start and pass its probe.
        cgroup: per-slot cgroups: ``auto`` (v2, else v1, else rlimits only), ``v2``, ``v1`` (that one, else
            rlimits only) or ``off`` (default: ``$GAPO_SANDBOX_CGROUP``, else ``auto``). The executor's group
            is ``gapo-sandbox-<pid>`` inside its own cgroup (v2: next to it, since a v2 group holding processes
            cannot have limited children) in each hierarchy, one ``slot<N>`` below it per slot; it is removed
            when the executor stops (and an empty one left by a killed executor, at the next start).
        cgroup_root: where the cgroup hierarchies are mounted (v2: ``cgroup_root`` or ``cgroup_root/unified``;
            v1: ``cgroup_root/<controller>``).
        slot_memory_mb: memory of all the processes of one slot together (resident memory, its tmpfs, page
            cache, kernel memory; no swap). Default: the test's ``memory_mb`` + ``tmpfs_mb`` + ``shm_mb`` + 64,
            so one test process can use its whole ``RLIMIT_AS``, but children cannot multiply it. Past it,
            the kernel kills a process of the slot (the test fails).
        slot_cpus: CPU quota of a slot, in CPUs (cgroup ``cpu.max`` / ``cfs_quota_us``; 0: no quota). The
            slots also share CPU equally whatever their number of processes, and the executor's group weighs
            as much as ``slots`` ordinary processes against the rest of the host.
        slot_pids: most tasks (processes + threads) in a slot, bwrap's included (``pids.max``; default ``nproc``).
        rlimits_nproc: ``RLIMIT_NPROC`` when no cgroup is usable (instead of ``nproc``). A slot's memory is then
            bounded only by its process count times ``memory_mb``: about ``(rlimits_nproc - 2) * memory_mb``
            (bwrap and the program take two), and a slot's CPU share is not protected at all.
        cancel_wait_s: how long :meth:`Job.cancel` waits for the stopped tests to be reported (killed, and
            their slot emptied).
    """

    bwrap: str = field(default_factory=_default_bwrap)
    interpreter: str = field(default_factory=_default_interpreter)
    python_args: tuple[str, ...] = ("-I",)
    slots: int = field(default_factory=lambda: os.cpu_count() or 1)
    uid_base: int = 61000
    memory_mb: int = 2048
    test_timeout_s: float = 6.0
    problem_timeout_s: float = 30.0
    fsize_mb: int = 16
    nofile: int = 64
    nproc: int = 32
    tmpfs_mb: int = 64
    shm_mb: int = 16
    max_output_bytes: int = 64 << 20
    stderr_bytes: int = 4096
    extra_ro_binds: tuple[str, ...] = ("/etc/alternatives",)
    allow_unsandboxed: bool = field(default_factory=lambda: _env_flag(ALLOW_ENV))
    startup_timeout_s: float = 30.0
    cgroup: str = field(default_factory=lambda: os.environ.get(CGROUP_ENV, "").strip().lower() or "auto")
    cgroup_root: str = "/sys/fs/cgroup"
    slot_memory_mb: int | None = None
    slot_cpus: float = 1.0
    slot_pids: int | None = None
    rlimits_nproc: int = 8
    cancel_wait_s: float = 10.0

    def __post_init__(self):
        if self.slots < 1:
            raise ValueError(f"slots must be >= 1, got {self.slots}")
        if self.tmpfs_mb < 1 or self.shm_mb < 1:
            raise ValueError(f"tmpfs_mb and shm_mb must be >= 1 (MiB), got {self.tmpfs_mb}, {self.shm_mb}")
        if not 0 < self.test_timeout_s <= self.problem_timeout_s:
            raise ValueError(f"need 0 < test_timeout_s <= problem_timeout_s, got {self.test_timeout_s}, "
                             f"{self.problem_timeout_s}")
        if self.nproc < 4 or self.rlimits_nproc < 4 or (self.slot_pids is not None and self.slot_pids < 4):
            raise ValueError("nproc, rlimits_nproc and slot_pids must be >= 4 (bwrap needs two processes besides "
                             "the program)")
        if self.cgroup not in ("auto", "v2", "v1", "off"):
            raise ValueError(f"cgroup must be auto, v2, v1 or off, got {self.cgroup!r}")
        if self.slot_cpus != 0 and self.slot_cpus < 0.01:
            raise ValueError(f"slot_cpus must be 0 (no quota) or >= 0.01, got {self.slot_cpus}")

    def slot_memory_bytes(self, memory_mb=None) -> int:
        """The memory limit of a slot running a test with ``memory_mb`` (see ``slot_memory_mb``)."""
        if self.slot_memory_mb is not None:
            return int(self.slot_memory_mb) << 20
        return (int(memory_mb or self.memory_mb) + self.tmpfs_mb + self.shm_mb + 64) << 20

    def limits(self, test_timeout_s=None, problem_timeout_s=None, memory_mb=None) -> dict:
        """The limits sent with a group of tests: this config's, each replaced by the argument when one is given."""
        return {
            "test_timeout_s": float(test_timeout_s or self.test_timeout_s),
            "problem_timeout_s": float(problem_timeout_s or self.problem_timeout_s),
            "memory_bytes": int(memory_mb or self.memory_mb) << 20,
            "slot_memory_bytes": self.slot_memory_bytes(memory_mb),
            "fsize_bytes": self.fsize_mb << 20,
            "nofile": self.nofile,
        }


@dataclass
class RunResult:
    """What one test run did. ``status``: ``ok`` (it exited by itself; see ``exit_code``), ``timeout``,
    ``output_limit``, ``skipped`` (not run or stopped: its problem failed, timed out or was cancelled)
    or ``error`` (the executor failed). ``isolation``: the sandbox's per-slot isolation
    (``cgroup_v2``, ``cgroup_v1`` or ``rlimits``, see :attr:`Sandbox.isolation`)."""

    status: str
    exit_code: int | None = None
    signal: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    wall_s: float = 0.0
    isolation: str = ""

    @property
    def exited_ok(self) -> bool:
        """True when the test ran to its end and exited 0."""
        return self.status == "ok" and self.exit_code == 0


class Job:
    """One submitted group of tests. Results arrive on ``sink`` as ``(tag, index, RunResult)``; ``done`` is
    set once all ``n`` are there (each sent by the executor only when its slot was empty)."""

    def __init__(self, sandbox: Sandbox, gid: int, n: int, sink: queue.Queue, tag):
        """A job of ``n`` tests, id ``gid`` in ``sandbox``; its results go to ``sink`` tagged ``tag``."""
        self._sandbox, self.gid, self.n, self.sink, self.tag = sandbox, gid, n, sink, tag
        self.received = 0
        self.done = threading.Event()
        if n == 0:
            self.done.set()

    def cancel(self, wait: bool = True, timeout: float | None = None) -> bool:
        """Stop the tests not finished yet (they are reported as ``skipped``) and, with ``wait``, wait until
        every test of the job is reported (at most ``timeout``, default ``cancel_wait_s``): then no process
        of the job is left. Returns whether all were reported."""
        self._sandbox._cancel(self)
        if not wait:
            return self.done.is_set()
        return self.done.wait(self._sandbox.config.cancel_wait_s if timeout is None else timeout)


class Sandbox:
    """Client of one executor process; start it lazily, share it across threads."""

    def __init__(self, config: SandboxConfig | None = None):
        """Nothing starts before :meth:`start`; ``config`` defaults to ``SandboxConfig()``."""
        self.config = config or SandboxConfig()
        self.mode: str | None = None  # "bwrap" or "unsandboxed" once started
        self.probe: dict = {}  # what the executor found at start (isolation, isolation_note, cgroup, uids...)
        # Two locks, never held by the reader thread together: ``_lock`` serialises start/stop and every
        # write to the executor; ``_jobs_lock`` guards the job table. The reader takes only the latter,
        # so a writer blocked on a full pipe can never stop the reader from draining the other one.
        self._lock = threading.RLock()
        self._jobs_lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._jobs: dict[int, Job] = {}
        self._gids = itertools.count(1)
        self._hello = threading.Event()
        self._pid = os.getpid()

    @property
    def isolation(self) -> str:
        """Per-slot isolation of the started executor: ``cgroup_v2``, ``cgroup_v1`` or ``rlimits`` ("" before
        :meth:`start`)."""
        return self.probe.get("isolation", "") if self.probe.get("ok") else ""

    # ----- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Sandbox:
        """Start the executor if needed (raises :class:`SandboxUnavailable`)."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return self
            reason = None
            if not (os.path.isfile(self.config.bwrap) and os.access(self.config.bwrap, os.X_OK)):
                reason = f"bubblewrap not found at {self.config.bwrap!r}"
            else:
                probe = self._spawn("bwrap")
                if not probe.get("ok"):
                    self._stop_proc()
                    reason = ("bubblewrap cannot create the sandbox here: "
                              f"{(probe.get('stderr') or probe.get('stdout') or 'no output').strip()[-800:]}")
            if reason is not None:
                if not self.config.allow_unsandboxed:
                    raise SandboxUnavailable(
                        f"Refusing to run untrusted code: {reason}. {INSTALL_HINT}")
                warnings.warn(f"{reason}; {ALLOW_ENV} is set, so model-written code runs WITHOUT isolation "
                              "(rlimits and a separate uid only)", RuntimeWarning, stacklevel=2)
                probe = self._spawn("unsandboxed")
                if not probe.get("ok"):
                    self._stop_proc()
                    raise SandboxUnavailable(f"cannot run programs even unsandboxed: {probe}")
            return self

    def _spawn(self, mode: str) -> dict:
        cfg = self.config
        exe_cfg = {
            "mode": mode, "bwrap": cfg.bwrap, "interpreter": cfg.interpreter,
            "python_args": list(cfg.python_args), "slots": cfg.slots, "uid_base": cfg.uid_base,
            "nproc": cfg.nproc, "tmpfs_bytes": cfg.tmpfs_mb << 20, "shm_bytes": cfg.shm_mb << 20,
            "stderr_bytes": cfg.stderr_bytes,
            "extra_ro_binds": [p for p in cfg.extra_ro_binds if os.path.exists(p)] + self._interpreter_binds(),
            "cgroup": cfg.cgroup, "cgroup_root": cfg.cgroup_root, "slot_memory_bytes": cfg.slot_memory_bytes(),
            "slot_cpus": cfg.slot_cpus, "slot_pids": cfg.slot_pids or cfg.nproc, "rlimits_nproc": cfg.rlimits_nproc,
        }
        # A minimal environment: the executor needs none of the trainer's variables (tokens, keys).
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(EXECUTOR_SCRIPT), json.dumps(exe_cfg)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={"PATH": "/usr/bin:/bin"}, close_fds=True,
        )
        self.mode = mode
        self._hello.clear()
        self.probe = {}
        reader = threading.Thread(target=self._read_loop, args=(self._proc,), name="gapo-sandbox-reader",
                                  daemon=True)
        reader.start()
        if not self._hello.wait(cfg.startup_timeout_s):
            return {"ok": False, "stderr": f"the executor did not answer within {cfg.startup_timeout_s} s"}
        return self.probe

    def _interpreter_binds(self) -> list[str]:
        real = os.path.realpath(self.config.interpreter)
        if real.startswith("/usr/"):
            return []
        return [str(Path(real).parent.parent)]

    def _stop_proc(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()  # the executor kills and reaps everything it started, then exits
        except OSError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        """Stop the executor (and every test still running; their jobs get ``error`` results)."""
        with self._lock:
            self._stop_proc()
        self._fail_all("the sandbox was closed")

    # ----- submit / results --------------------------------------------------------------------
    def submit(self, program: str | bytes, inputs: Sequence[str | bytes], *, output_caps: Sequence[int] | None = None,
               test_timeout_s: float | None = None, problem_timeout_s: float | None = None,
               memory_mb: int | None = None, sink: queue.Queue | None = None, tag=None) -> Job:
        """Run ``program`` once per input (fed on stdin). Results go to ``sink`` (a new queue if none).

        Text (``str``) is written as UTF-8; what UTF-8 cannot hold (a lone surrogate) is written as its
        ``surrogatepass`` bytes, which are not UTF-8: Python refuses such a program (SyntaxError, a failed run) and
        a program gets such an input as those bytes, never an exception here. (The code reward refuses such
        programs and inputs before they get here, with a reason: :func:`gapo.rewards.code.score.utf8`.)"""
        if os.getpid() != self._pid:
            raise RuntimeError("a Sandbox cannot be used across fork(); create one in the child (get_sandbox())")
        program = _bytes(program)
        caps = list(output_caps) if output_caps is not None else [self.config.max_output_bytes] * len(inputs)
        tests = [(_bytes(x), min(int(c), self.config.max_output_bytes)) for x, c in zip(inputs, caps, strict=True)]
        limits = self.config.limits(test_timeout_s, problem_timeout_s, memory_mb)
        sink = sink if sink is not None else queue.Queue()
        with self._lock:
            self.start()
            job = Job(self, next(self._gids), len(tests), sink, tag)
            if not tests:
                return job
            with self._jobs_lock:
                self._jobs[job.gid] = job
            try:
                self._send(("run", job.gid, program, tests, limits))
            except OSError:
                self._fail_all("the sandbox executor died")
        return job

    def run(self, program: str | bytes, inputs: Sequence[str | bytes], timeout: float | None = None,
            **kwargs) -> list[RunResult]:
        """Submit and wait for every result (in input order). Past ``timeout`` the job is cancelled."""
        job = self.submit(program, inputs, **kwargs)
        results: list[RunResult | None] = [None] * job.n
        end = None if timeout is None else time.monotonic() + timeout
        got = 0
        while got < job.n:
            wait = None if end is None else max(0.0, end - time.monotonic())
            try:
                _, idx, result = job.sink.get(timeout=wait)
            except queue.Empty:
                job.cancel()
                end = None  # the cancelled tests report soon
                continue
            if idx < 0:  # the executor died: which test is unknown, fill the first gap
                idx = results.index(None)
            results[idx] = result
            got += 1
        return results

    def _send(self, msg) -> None:
        data = marshal.dumps(msg)
        stdin = self._proc.stdin
        stdin.write(FRAME.pack(len(data)))
        stdin.write(data)
        stdin.flush()

    def _cancel(self, job: Job) -> None:
        with self._lock:
            if job.gid in self._jobs and self._proc is not None:  # a stale read is harmless here
                try:
                    self._send(("cancel", job.gid))
                except OSError:
                    pass

    def _read_loop(self, proc: subprocess.Popen) -> None:
        out = proc.stdout
        try:
            while True:
                head = out.read(FRAME.size)
                if len(head) < FRAME.size:
                    break
                (size,) = FRAME.unpack(head)
                body = out.read(size)
                if len(body) < size:
                    break
                msg = marshal.loads(body)
                if msg[0] == "hello":
                    self.probe = msg[1]
                    self._hello.set()
                elif msg[0] == "result":
                    _, gid, idx, res = msg
                    with self._jobs_lock:
                        job = self._jobs.get(gid)
                        if job is not None:
                            job.received += 1
                            if job.received >= job.n:
                                del self._jobs[gid]
                    if job is not None:
                        job.sink.put((job.tag, idx, RunResult(**res, isolation=self.isolation)))
                        if job.received >= job.n:
                            job.done.set()
        finally:
            self._hello.set()
            if self._proc is proc:
                self._fail_all("the sandbox executor exited")

    def _fail_all(self, why: str) -> None:
        """Every test still expected from the executor is reported as an error (index -1)."""
        with self._jobs_lock:
            jobs, self._jobs = self._jobs, {}
        for job in jobs.values():
            # Which indices are missing is unknown here: report enough errors to complete the job.
            for _ in range(job.n - job.received):
                job.sink.put((job.tag, -1, RunResult("error", stderr=why.encode(), isolation=self.isolation)))
            job.done.set()


_SHARED: dict[tuple, Sandbox] = {}
_SHARED_LOCK = threading.Lock()


def get_sandbox(config: SandboxConfig | None = None) -> Sandbox:
    """The process-wide :class:`Sandbox` for ``config`` (one executor per config and process)."""
    config = config or SandboxConfig()
    key = (os.getpid(), tuple(sorted(asdict(config).items())))
    with _SHARED_LOCK:
        box = _SHARED.get(key)
        if box is None:
            box = _SHARED[key] = Sandbox(config)
        return box


@atexit.register
def _close_all() -> None:
    for box in list(_SHARED.values()):
        if box._pid == os.getpid():
            box.close()


__all__ = ["ALLOW_ENV", "CGROUP_ENV", "ISOLATIONS", "Job", "RunResult", "Sandbox", "SandboxConfig", "SandboxUnavailable", "get_sandbox"]

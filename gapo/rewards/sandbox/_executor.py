"""Sandbox executor: the dedicated process that launches, limits, times and reaps untrusted test runs.

Started by :mod:`gapo.rewards.sandbox.client` as ``python -I -S _executor.py CONFIG_JSON`` (stdlib
only, never imported by the trainer). It reads requests from stdin and writes results to stdout,
both as length-prefixed ``marshal`` frames (plain data only; both ends are this project's code).

One process per test, launched with ``fork`` + ``execve`` from this single-threaded loop (so no lock
can be held across the fork), through this chain::

    rlimits (AS, CPU, FSIZE, NOFILE, NPROC, CORE) -> drop to the slot's own non-root uid
    -> PR_SET_PDEATHSIG -> execve(bwrap, minimal env) -> every namespace unshared, read-only /usr,
    program read-only at /main.py, small tmpfs /tmp, cleared env -> python3 -I -S /main.py
    (pid 1 a shell, the program its child: normal signal semantics; its stdin a sealed regular file, as on a judge)

Why this process exists (each point was a measured failure of simpler designs):

- it is a child subreaper and reaps on every SIGCHLD: processes of killed sandboxes are re-parented
  here, not to the host's init (which reaped them seconds later, while they still counted against
  RLIMIT_NPROC, so later runs failed to fork and got false "wrong answer" rewards);
- a slot is reused only when nothing of its previous run is left (below), so no test inherits
  another's leftovers; a killed run's result is sent only after that, so "the batch returned" means
  "nothing is running";
- bwrap is exec'ed with a minimal environment: bwrap's own pid 1 keeps the environment it was
  started with, readable as ``/proc/1/environ`` inside the sandbox;
- each slot has its own cgroup (``<own cgroup>/gapo-sandbox-<pid>/slot<N>``, v2 or v1, see
  :func:`detect_cgroups`) with memory, CPU and pids limits, because rlimits are per process: one test
  forking 12 children of 150 MB each took 1.8 GB at ``memory_mb=256``, and busy ``setsid()`` children
  in one slot made a correct program in another slot time out. The launcher starts in its slot's
  cgroup (v2: clone3 with CLONE_INTO_CGROUP) or moves itself there before dropping privileges (v1);
  everything it starts stays there (no cgroup file is reachable from the sandbox, none is writable by
  the slot's uid).

Nothing outlives a result: a test's result is sent only once its slot is empty. With cgroups: no task
left in the slot's cgroup (``pids.current`` is 0, so even zombies are reaped), after killing them all
(``cgroup.kill`` on v2, SIGKILL to every pid of ``cgroup.procs`` until empty on v1). Without
(isolation ``rlimits``): as root, a cleaner child running as the slot's uid repeats
``kill(-1, SIGKILL)`` until no process of that uid is left; otherwise the process group is killed and
every child of this subreaper that is not a live launcher (orphans of killed runs) is killed and
reaped until none is left. Which of these is in use is reported in the probe (``isolation``).

Scheduling: groups (one per problem) run FIFO; a group's tests run in parallel on free slots. A group
stops at its first test that does not exit 0 (and when the client cancels it, e.g. on a wrong
answer); its remaining tests are reported as ``skipped``. Every test of a group is reported exactly
once. Deadlines: per test (from its start) and per group (from its first test's start).
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import marshal
import os
import resource
import selectors
import signal
import struct
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
FRAME = struct.Struct("<Q")
READ_CHUNK = 1 << 16
EOF_GRACE_S = 0.5  # after the launcher exited, wait this long for its pipes to close, then close them
CLEAN_RETRY_S = 1.0  # a slot whose cleaner gave up is retried after this long
DRAIN_POLL_S = 0.002  # while a slot is being emptied, look again this often
# One thread per numeric library: a slot gets about one CPU (cgroup quota) and a few tasks (pids.max,
# RLIMIT_NPROC); OpenBLAS would otherwise start one thread per host core at `import numpy`.
MINIMAL_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1"}
PROGRAM_PATH = "/main.py"  # where the program appears inside the sandbox

_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, arg: int) -> None:
    if _libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


_STDIN_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


def _stdin_file(data: bytes) -> int:
    """A test's input as a regular file, sealed read-only, at offset 0 (it becomes the program's fd 0).

    A regular file, not a pipe, because the judges whose problems these are (Codeforces, AtCoder, LeetCode's
    stdin runs) give stdin as a file: the fast-input idiom ``os.read(0, os.fstat(0).st_size)`` reads it all
    there and reads nothing from a pipe (size 0), so a right program scored 0. Sealed (no write, grow or
    shrink; the seals themselves sealed), so a program cannot change what it reads, even through /proc."""
    fd = os.memfd_create("stdin", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        _write_all(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _STDIN_SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


def send(obj) -> None:
    data = marshal.dumps(obj)
    _write_all(1, FRAME.pack(len(data)))
    _write_all(1, data)


# PID 1 of a test's namespace: a shell that runs the program as its child and exits with its status (128 + N
# for a death by signal N); its exit ends the namespace (the kernel kills what is left, and bwrap returns
# once all is gone). Not bwrap's own init: measured 20-40% lower throughput here (15-25% slower per 15-test
# problem), against 7-9% for the shell (python -m recipe.bench.sandbox --repeats 5 --tests 300).
INIT_SHELL = ["/bin/sh", "-c", '"$@"; exit $?', "sh"]  # not a lone "$@": a shell may exec a last command


class Run:
    """One test process: its pipes, buffers, deadline and outcome."""

    def __init__(self, group, idx: int, slot: int):
        self.group, self.idx, self.slot = group, idx, slot
        self.pid = 0
        self.start = time.monotonic()
        self.deadline = min(self.start + group.limits["test_timeout_s"], group.deadline_from(self.start))
        self.cap = group.inputs[idx][1]
        self.out_fd = self.err_fd = -1
        self.out_chunks: list[bytes] = []
        self.out_len = 0
        self.err = b""
        self.reason = ""  # why we killed it: timeout, output_limit, skipped
        self.exit_status: int | None = None
        self.exited_at = 0.0
        self.result: dict | None = None


class Group:
    """One problem: its program, test inputs, limits, and which tests are pending/running/reported."""

    def __init__(self, gid, program: bytes, inputs, limits: dict):
        self.gid, self.program, self.inputs, self.limits = gid, program, inputs, limits
        self.next = 0
        self.running: set[Run] = set()
        self.reported = 0
        self.first_start: float | None = None
        self.stopped = False
        self.on_result = None  # internal groups (the probe) get a callback instead of a frame

    def deadline_from(self, now: float) -> float:
        if self.first_start is None:
            self.first_start = now
        return self.first_start + self.limits["problem_timeout_s"]

    def pending(self) -> bool:
        return not self.stopped and self.next < len(self.inputs)


class Executor:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.sandboxed = cfg["mode"] == "bwrap"
        self.root = os.geteuid() == 0
        self.pid = os.getpid()
        self.sel = selectors.DefaultSelector()
        self.groups: dict = {}
        self.queue: list[Group] = []  # FIFO of groups with tests still to start
        self.free_slots = list(range(cfg["slots"]))
        self.runs_by_pid: dict[int, Run] = {}
        self.cleaners: dict[int, tuple[int, list[Run]]] = {}  # cleaner pid -> (slot, runs to report)
        self.draining: dict[int, list[Run]] = {}  # slot -> runs reported once the slot is empty
        self.retry_clean: list[tuple[float, int, list[Run]]] = []
        self.stdin_buf = bytearray()
        self.stdin_open = True
        # Several executors run at once on a node (one per reward worker, per test process...): each claims
        # its own uids, or one executor's cleaner would kill another's programs and count them as leftovers.
        self.uids = _claim_uids(cfg["slots"], cfg["uid_base"], cfg.get("uid_span", 4096)) if self.root else []
        self.clone3 = True  # v2: start each run in its slot with clone3(CLONE_INTO_CGROUP) until it fails
        cg, note = detect_cgroups(cfg.get("cgroup", "auto"), cfg.get("cgroup_root", "/sys/fs/cgroup"), cfg["slots"],
                                  cfg.get("slot_memory_bytes", 1 << 31), cfg.get("slot_cpus", 1.0),
                                  cfg.get("slot_pids", cfg["nproc"]))
        self._set_isolation(cg, note)
        self.argv_prefix = self._argv_prefix()

    def _set_isolation(self, cg: Cgroups | None, note: str = "") -> None:
        """Per-slot cgroups, or (``rlimits``) a tighter RLIMIT_NPROC: without a memory limit per slot,
        a test's memory is bounded only by its process count times RLIMIT_AS."""
        self.cg, self.cg_note = cg, note
        self.isolation = f"cgroup_v{cg.version}" if cg is not None else "rlimits"
        nproc = self.cfg["nproc"] if cg is not None else min(self.cfg["nproc"], self.cfg.get("rlimits_nproc", 8))
        self.nproc = nproc
        if not self.root:
            # Shared-uid mode: NPROC counts every task of our uid (the trainer's threads too), so the
            # cap is "what exists now" plus a per-slot budget. Weaker than a uid per slot: see docs.
            self.nproc = _tasks_of_uid(os.getuid()) + nproc * self.cfg["slots"]

    # ----- launch ------------------------------------------------------------------------------
    def _argv_prefix(self) -> list[str]:
        py = [self.cfg["interpreter"], *self.cfg["python_args"]]
        if not self.sandboxed:
            return py + ["/dev/fd/3"]
        # --as-pid-1: bwrap returns only once every process in the namespace is gone (with bwrap's own init
        # it returns when the program does). PID 1 is INIT_SHELL, the program its child: a normal process.
        # As pid 1 the program ignored the signals it has no handler for, so one that printed the right output
        # and then SIGKILLed or SIGTERMed itself exited 0 here, while a judge reports a runtime error.
        a = [self.cfg["bwrap"], "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--as-pid-1"]
        if self.cfg.get("disable_userns", True):
            a.append("--disable-userns")  # no nested user namespaces: less kernel surface
        a += ["--ro-bind", "/usr", "/usr"]
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            path = "/" + name
            if os.path.islink(path):
                a += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                a += ["--ro-bind", path, path]
        for path in self.cfg.get("extra_ro_binds", []):
            a += ["--ro-bind", path, path]
        a += ["--proc", "/proc", "--dev", "/dev",
              "--size", str(self.cfg["tmpfs_bytes"]), "--tmpfs", "/tmp",
              "--perms", "0444", "--ro-bind-data", "3", PROGRAM_PATH,
              "--chdir", "/tmp", "--clearenv"]
        for key, value in MINIMAL_ENV.items():
            a += ["--setenv", key, value]
        a += ["--setenv", "HOME", "/tmp", "--"]
        return a + INIT_SHELL + py + [PROGRAM_PATH]

    def _uid(self, slot: int) -> int:
        return self.uids[slot]

    def start_run(self, group: Group, slot: int) -> None:
        idx = group.next
        group.next += 1
        run = Run(group, idx, slot)
        group.running.add(run)
        stdin_r = _stdin_file(group.inputs[idx][0])
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        code_fd = os.memfd_create("program", os.MFD_CLOEXEC)  # one per run: bwrap reads it from offset 0
        cg_join: list[str] = []
        pid = -1
        if self.cg is not None:
            try:
                self.cg.set_memory(slot, group.limits.get("slot_memory_bytes", self.cfg.get("slot_memory_bytes", 1 << 31)))
            except OSError:
                pass  # v1 refuses a limit below what the slot still holds (page cache): keep the last one
            if self.cg.version == 2 and self.clone3:
                try:
                    pid = fork_into_cgroup(self.cg.fd(slot))  # born in the slot: nothing to join
                except OSError as exc:  # before Linux 5.7, or clone3 filtered by seccomp (Docker: ENOSYS)
                    self.clone3 = False
                    self.cg_note = (self.cg_note + "; " if self.cg_note else "") + f"clone3 unavailable: {exc}"
            if pid < 0:
                cg_join = self.cg.join_files(slot)
        _write_all(code_fd, group.program)
        os.lseek(code_fd, 0, os.SEEK_SET)
        if pid < 0:
            pid = os.fork()
        if pid == 0:  # child: never returns
            try:
                self._child(slot, group.limits, stdin_r, out_w, err_w, code_fd, cg_join)
            except BaseException as exc:  # noqa: BLE001 - report any setup failure on the test's stderr
                try:
                    os.write(2, f"sandbox launch failed: {exc!r}\n".encode())
                finally:
                    os._exit(125)
            os._exit(125)
        for fd in (stdin_r, out_w, err_w, code_fd):
            os.close(fd)
        run.pid = pid
        self.runs_by_pid[pid] = run
        run.out_fd, run.err_fd = out_r, err_r
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
        self.sel.register(out_r, selectors.EVENT_READ, ("out", run))
        self.sel.register(err_r, selectors.EVENT_READ, ("err", run))

    def _child(self, slot, limits, stdin_r, out_w, err_w, code_fd, cg_join) -> None:
        os.setsid()  # own process group: a kill reaches the whole launcher
        for path in cg_join:  # into the slot's cgroup (while still privileged); all it starts stays there
            with open(path, "w") as f:
                f.write("0")  # "0": this thread (see Cgroups.join_files)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGPIPE, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        os.dup2(stdin_r, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.dup2(code_fd, 3)
        os.closerange(4, 1 << 20)
        mem = limits["memory_bytes"]
        cpu = int(limits["test_timeout_s"]) + 1
        for res, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu),
                           (resource.RLIMIT_FSIZE, limits["fsize_bytes"]), (resource.RLIMIT_NOFILE, limits["nofile"]),
                           (resource.RLIMIT_NPROC, self.nproc), (resource.RLIMIT_CORE, 0)):
            resource.setrlimit(res, (value, value))
        if self.root:
            uid = self._uid(slot)  # RLIMIT_NPROC is not enforced for root, and counts per uid
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid change, which clears it
        if os.getppid() != self.pid:
            os._exit(125)
        if not self.sandboxed:
            os.chdir("/tmp")
        os.execve(self.argv_prefix[0], self.argv_prefix, MINIMAL_ENV)

    # ----- I/O events -------------------------------------------------------------------------
    def _unregister_close(self, fd: int) -> None:
        try:
            self.sel.unregister(fd)
        except (KeyError, ValueError):
            pass
        os.close(fd)

    def on_output(self, run: Run, which: str) -> None:
        fd = run.out_fd if which == "out" else run.err_fd
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return
        if not data:
            self._unregister_close(fd)
            if which == "out":
                run.out_fd = -1
            else:
                run.err_fd = -1
            self.maybe_finish(run)
            return
        if which == "err":
            run.err = (run.err + data)[-self.cfg["stderr_bytes"]:]
            return
        run.out_chunks.append(data)
        run.out_len += len(data)
        if run.out_len > run.cap:
            self.kill(run, "output_limit")
            self._unregister_close(run.out_fd)  # the writer now gets EPIPE; we keep nothing more
            run.out_fd = -1
            self.maybe_finish(run)

    def on_stdin_frames(self) -> None:
        try:
            data = os.read(0, 1 << 20)
        except BlockingIOError:
            return
        if not data:
            self.stdin_open = False
            self.sel.unregister(0)
            return
        self.stdin_buf += data
        while len(self.stdin_buf) >= FRAME.size:
            (size,) = FRAME.unpack_from(self.stdin_buf)
            if len(self.stdin_buf) < FRAME.size + size:
                break
            msg = marshal.loads(bytes(self.stdin_buf[FRAME.size:FRAME.size + size]))
            del self.stdin_buf[:FRAME.size + size]
            self.handle(msg)

    def handle(self, msg) -> None:
        kind = msg[0]
        if kind == "run":
            _, gid, program, inputs, limits = msg
            self.add_group(Group(gid, program, inputs, limits))
        elif kind == "cancel":
            group = self.groups.get(msg[1])
            if group is not None:
                self.stop_group(group)

    # ----- groups and runs ---------------------------------------------------------------------
    def add_group(self, group: Group) -> None:
        self.groups[group.gid] = group
        if not group.inputs:
            self.groups.pop(group.gid)
            return
        self.queue.append(group)

    def stop_group(self, group: Group) -> None:
        """No more tests of this group: report the unstarted ones as skipped, kill the running ones."""
        if group.stopped:
            return
        group.stopped = True
        while group.next < len(group.inputs):
            self.report(group, group.next, {"status": "skipped", "exit_code": None, "signal": None,
                                            "stdout": b"", "stderr": b"", "wall_s": 0.0})
            group.next += 1
        for run in list(group.running):
            self.kill(run, "skipped")

    def kill(self, run: Run, reason: str) -> None:
        if not run.reason:
            run.reason = reason
        if run.exit_status is None:
            for fn in (os.killpg, os.kill):
                try:
                    fn(run.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        if self.cg is not None:
            self.cg.kill(run.slot)  # the slot is this run's alone: its setsid() children too, at once

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            run = self.runs_by_pid.pop(pid, None)
            if run is not None:
                run.exit_status = status
                run.exited_at = time.monotonic()
                self.maybe_finish(run)
            elif pid in self.cleaners:
                slot, runs = self.cleaners.pop(pid)
                if os.waitstatus_to_exitcode(status) == 0:
                    self.release(slot, runs)
                else:
                    self.retry_clean.append((time.monotonic() + CLEAN_RETRY_S, slot, runs))
            # anything else: an orphan of a sandbox, re-parented to us (subreaper); now reaped

    def maybe_finish(self, run: Run, force: bool = False) -> None:
        if run.result is not None or run.exit_status is None:
            return
        if not force and (run.out_fd >= 0 or run.err_fd >= 0):
            return
        for attr in ("out_fd", "err_fd"):
            fd = getattr(run, attr)
            if fd >= 0:
                self._unregister_close(fd)
                setattr(run, attr, -1)
        status = run.exit_status
        code = os.waitstatus_to_exitcode(status)
        run.result = {
            "status": run.reason or "ok",
            "exit_code": code if code >= 0 else None,
            "signal": -code if code < 0 else None,
            "stdout": b"".join(run.out_chunks),
            "stderr": bytes(run.err),
            "wall_s": run.exited_at - run.start,
        }
        run.out_chunks = []
        group = run.group
        group.running.discard(run)
        if run.reason != "skipped" and (run.reason or code != 0):
            self.stop_group(group)  # stop at the first failure the executor can see by itself
        # A killed run (or any run without namespaces) may leave processes behind.
        self.settle(run.slot, [run], dirty=bool(run.reason) or not self.sandboxed)

    def settle(self, slot: int, runs: list[Run], dirty: bool) -> None:
        """Report ``runs`` once nothing they started is left (see the module docstring)."""
        if self.cg is not None:
            if self.cg.count(slot) == 0:
                self.release(slot, runs)
            else:
                self.cg.kill(slot)
                self.draining[slot] = runs
        elif self.root and dirty:
            self.spawn_cleaner(slot, runs)  # kills every process of the slot's uid
        elif dirty:
            self.draining[slot] = runs  # kill the orphans re-parented to us (see drain)
        else:
            self.release(slot, runs)  # exited by itself in its pid namespace: nothing of it can be left

    def drain(self) -> bool:
        """One round of emptying the slots in ``draining``; true while some are not empty yet."""
        if not self.draining:
            return False
        self.reap()
        if self.cg is not None:
            for slot, runs in list(self.draining.items()):
                if self.cg.count(slot) == 0:
                    del self.draining[slot]
                    self.release(slot, runs)
                else:
                    self.cg.kill(slot)
        else:
            # No cgroup and no uid of our own: whatever a run left behind is re-parented to us (we are a
            # subreaper), so every child that is not a launcher or a cleaner is a leftover.
            tracked = set(self.runs_by_pid) | set(self.cleaners)
            orphans = [pid for pid in _children_of(self.pid) if pid not in tracked]
            if orphans:
                for pid in orphans:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            else:
                draining, self.draining = self.draining, {}
                for slot, runs in draining.items():
                    self.release(slot, runs)
        return bool(self.draining)

    def spawn_cleaner(self, slot: int, runs: list[Run]) -> None:
        uid = self._uid(slot)
        pid = os.fork()
        if pid == 0:
            code = 2
            try:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                end = time.monotonic() + 5.0
                code = 1
                while time.monotonic() < end:
                    # Kills every process of this uid except ourselves. Its return value cannot tell
                    # whether any was left (it is 0 when other processes exist, even if none could be
                    # signalled), so look in /proc; zombies count until the executor has reaped them.
                    try:
                        os.kill(-1, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    if _tasks_of_uid(uid, exclude=os.getpid()) == 0:
                        code = 0
                        break
                    time.sleep(0.002)
            finally:
                os._exit(code)
        self.cleaners[pid] = (slot, runs)

    def release(self, slot: int, runs: list[Run]) -> None:
        for run in runs:
            self.report(run.group, run.idx, run.result)
        self.free_slots.append(slot)

    def report(self, group: Group, idx: int, result: dict) -> None:
        group.reported += 1
        if group.on_result is not None:
            group.on_result(idx, result)
        else:
            send(("result", group.gid, idx, result))
        if group.reported >= len(group.inputs):
            self.groups.pop(group.gid, None)

    def schedule(self) -> None:
        self.queue = [g for g in self.queue if g.pending()]
        while self.free_slots and self.queue:
            group = self.queue[0]
            self.start_run(group, self.free_slots.pop())
            if not group.pending():
                self.queue.pop(0)

    def check_deadlines(self, now: float) -> float:
        """Kill runs past their deadline; returns the next deadline (or now + 1 s)."""
        nxt = now + 1.0
        for run in list(self.runs_by_pid.values()):
            if run.exit_status is None and not run.reason:
                if now >= run.deadline:
                    self.kill(run, "timeout")
                    if now >= run.group.deadline_from(now):
                        self.stop_group(run.group)  # the problem's budget is spent
                else:
                    nxt = min(nxt, run.deadline)
        for group in list(self.groups.values()):
            for run in list(group.running):
                if run.exit_status is not None and run.result is None:
                    grace_end = run.exited_at + EOF_GRACE_S
                    if now >= grace_end:
                        self.maybe_finish(run, force=True)  # something outside still holds a pipe
                    else:
                        nxt = min(nxt, grace_end)
        keep = []
        for when, slot, runs in self.retry_clean:
            if now >= when:
                self.spawn_cleaner(slot, runs)
            else:
                keep.append((when, slot, runs))
                nxt = min(nxt, when)
        self.retry_clean = keep
        if self.drain():
            nxt = min(nxt, now + DRAIN_POLL_S)
        return nxt

    # ----- main loop ---------------------------------------------------------------------------
    def loop(self, until=None) -> None:
        while True:
            self.schedule()
            if until is not None and until():
                return
            if until is None and not self.stdin_open:
                return
            now = time.monotonic()
            nxt = self.check_deadlines(now)
            for key, _ in self.sel.select(max(0.0, nxt - time.monotonic())):
                tag = key.data
                if tag == "chld":
                    try:
                        while os.read(key.fd, 4096):
                            pass
                    except BlockingIOError:
                        pass
                    self.reap()
                elif tag == "stdin":
                    self.on_stdin_frames()
                else:
                    kind, run = tag
                    if run.result is None:
                        self.on_output(run, kind)
            self.reap()

    def probe(self) -> dict:
        """Run one tiny program through the real launch path and check what it can see. If it fails with
        the slot cgroups, they are removed and it is tried again with rlimits only."""
        info = self._probe_once()
        if not info["ok"] and self.cg is not None:
            self.cg.remove()
            self._set_isolation(None, f"the probe failed in the slot cgroups: {info['stderr'][-300:]}")
            info = self._probe_once()
        info["isolation"] = self.isolation
        info["cgroup"] = self.cg.describe() if self.cg is not None else None
        info["isolation_note"] = self.cg_note
        return info

    def _probe_once(self) -> dict:
        code = b"import json, os\nprint(json.dumps({'root': sorted(os.listdir('/')), 'uid': os.getuid()}))\n"
        limits = {"test_timeout_s": 10.0, "problem_timeout_s": 10.0, "memory_bytes": 1 << 30,
                  "fsize_bytes": 1 << 20, "nofile": 64}
        group = Group("probe", code, [(b"", 1 << 16)], limits)
        got = {}
        group.on_result = lambda idx, result: got.update(result)
        self.add_group(group)
        self.loop(until=lambda: bool(got))
        out = got["stdout"].decode(errors="replace").strip()
        info = {"mode": self.cfg["mode"], "root": self.root, "uids": self.uids, "stdout": out,
                "stderr": got["stderr"].decode(errors="replace")[-2000:]}
        try:
            seen = json.loads(out)["root"]
        except (ValueError, KeyError, TypeError):
            seen = None
        ok = got["status"] == "ok" and got["exit_code"] == 0 and seen is not None
        if ok and self.sandboxed:
            allowed = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "proc", "dev", "tmp",
                       PROGRAM_PATH.strip("/")}
            allowed |= {p.strip("/").split("/")[0] for p in self.cfg.get("extra_ro_binds", [])}
            extra = set(seen) - allowed
            if extra:
                ok = False
                info["stderr"] += f"\nthe sandbox sees host paths: {sorted(extra)}"
        info["ok"] = ok
        return info

    def shutdown(self) -> None:
        for run in list(self.runs_by_pid.values()):
            self.kill(run, "skipped")
        end = time.monotonic() + 5.0
        while self.runs_by_pid and time.monotonic() < end:
            self.reap()
            time.sleep(0.005)
        if self.cg is not None:
            while time.monotonic() < end:
                self.reap()
                busy = [slot for slot in range(self.cfg["slots"]) if self.cg.count(slot)]
                if not busy:
                    break
                for slot in busy:
                    self.cg.kill(slot)
                time.sleep(DRAIN_POLL_S)
            self.reap()
            self.cg.remove()
        elif self.root:
            for slot in range(self.cfg["slots"]):
                self.spawn_cleaner(slot, [])
            while self.cleaners and time.monotonic() < end:
                self.reap()
                time.sleep(0.002)
        else:
            while time.monotonic() < end:
                self.reap()
                orphans = _children_of(self.pid)
                if not orphans:
                    break
                for pid in orphans:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(DRAIN_POLL_S)
        self.reap()


# ----- per-slot cgroups ----------------------------------------------------------------------------
CG_CONTROLLERS = ("memory", "cpu", "pids")
CG_PREFIX = "gapo-sandbox-"
CPU_PERIOD_US = 100_000


def cgroup_slot_files(version: int, memory_bytes: int, cpus: float, pids: int) -> list[tuple[str, str, str, bool]]:
    """What to write in one slot's cgroup, in order: ``(controller, file, value, required)``.

    With :func:`cgroup_base_files`, the whole v1/v2 difference in limits. Optional files (swap accounting)
    are written only where they exist. ``cpus`` <= 0: no quota (the slots still share CPU equally).
    """
    if version == 2:
        quota = str(int(cpus * CPU_PERIOD_US)) if cpus > 0 else "max"
        return [("memory", "memory.max", str(memory_bytes), True),
                ("memory", "memory.swap.max", "0", False),
                ("pids", "pids.max", str(pids), True),
                ("cpu", "cpu.max", f"{quota} {CPU_PERIOD_US}", True)]
    quota = str(int(cpus * CPU_PERIOD_US)) if cpus > 0 else "-1"
    return [("memory", "memory.limit_in_bytes", str(memory_bytes), True),
            ("memory", "memory.memsw.limit_in_bytes", str(memory_bytes), False),
            ("pids", "pids.max", str(pids), True),
            ("cpu", "cpu.cfs_period_us", str(CPU_PERIOD_US), True),
            ("cpu", "cpu.cfs_quota_us", quota, True)]


def cgroup_base_files(version: int, slots: int) -> list[tuple[str, str, str, bool]]:
    """The executor's own group (parent of the slots): its CPU weight is that of ``slots`` ordinary
    processes, so against the rest of the host the sandboxes weigh what one process per slot did before."""
    if version == 2:
        return [("cpu", "cpu.weight", str(min(10000, 100 * slots)), False)]
    return [("cpu", "cpu.shares", str(min(262144, 1024 * slots)), False)]


def _cg_read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _cg_write(path: str, value: str, required: bool = True) -> None:
    if not required and not os.path.exists(path):
        return
    with open(path, "w") as f:
        f.write(value)


SYS_CLONE3 = 435  # the same number on every architecture that has it (x86_64, arm64, ppc64, s390x, riscv)
CLONE_INTO_CGROUP = 0x200000000


class _CloneArgs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("flags", "pidfd", "child_tid", "parent_tid", "exit_signal",
                                                      "stack", "stack_size", "tls", "set_tid", "set_tid_size",
                                                      "cgroup")]


_pyapi = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the GIL stays held across the call, as in os.fork()


def fork_into_cgroup(cgroup_fd: int) -> int:
    """``os.fork()`` whose child starts in the cgroup (v2) open as ``cgroup_fd``: clone3 with
    CLONE_INTO_CGROUP (Linux 5.7+), wrapped in the interpreter's own before/after-fork hooks like
    ``os.fork``. Only for a single-threaded process (the executor): glibc's fork handlers do not run.
    Raises OSError where clone3 is unavailable (ENOSYS: old kernel or a seccomp filter; EINVAL...)."""
    args = _CloneArgs(flags=CLONE_INTO_CGROUP, exit_signal=signal.SIGCHLD, cgroup=cgroup_fd)
    _pyapi.syscall.restype = ctypes.c_long
    ctypes.pythonapi.PyOS_BeforeFork()
    pid = _pyapi.syscall(ctypes.c_long(SYS_CLONE3), ctypes.byref(args), ctypes.c_size_t(ctypes.sizeof(args)))
    if pid == 0:
        ctypes.pythonapi.PyOS_AfterFork_Child()
        return 0
    err = ctypes.get_errno()
    ctypes.pythonapi.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(err, f"clone3(CLONE_INTO_CGROUP): {os.strerror(err)}")
    return pid


class Cgroups:
    """One executor's slot cgroups: ``<parent>/gapo-sandbox-<pid>/slot<N>`` in every hierarchy that holds
    one of memory, cpu, pids (v2: a single one holds all three; v1: usually one per controller)."""

    def __init__(self, version: int, parents: dict, slots: int, name: str | None = None):
        self.version = version
        self.name = name or f"{CG_PREFIX}{os.getpid()}"
        self.parents = dict(parents)  # controller -> the directory the group is created in
        self.bases = {c: os.path.join(p, self.name) for c, p in self.parents.items()}
        self.slots = slots
        self.dirs = sorted(set(self.bases.values()))  # one per hierarchy
        self.memory = [0] * slots  # memory limit currently written, per slot
        self.created: list[str] = []
        self.fds: dict[int, int] = {}

    def slot_dir(self, controller: str, slot: int) -> str:
        return os.path.join(self.bases[controller], f"slot{slot}")

    def join_files(self, slot: int) -> list[str]:
        """The files a launcher writes ``0`` (itself) to, to enter its slot in every hierarchy.

        v1: ``tasks``, which moves only the writing thread (the launcher has one): the kernel then skips
        the global lock that a ``cgroup.procs`` write takes, and the RCU grace period it waits for, which
        cost 7-14 ms per run measured here under load, against 0.7 ms. v2 has no such file for a domain
        group; the executor starts the launcher in its slot with clone3 (:func:`fork_into_cgroup`) and
        writes ``cgroup.procs`` only where clone3 is unavailable.
        """
        name = "tasks" if self.version == 1 else "cgroup.procs"
        return [os.path.join(d, f"slot{slot}", name) for d in self.dirs]

    def fd(self, slot: int) -> int:
        """An open directory fd of the slot's (v2) cgroup, for clone3(CLONE_INTO_CGROUP)."""
        if slot not in self.fds:
            self.fds[slot] = os.open(self.slot_dir("pids", slot), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return self.fds[slot]

    def setup(self, memory_bytes: int, cpus: float, pids: int) -> None:
        try:
            for d in self.dirs:
                _sweep_stale(os.path.dirname(d))
                os.mkdir(d)
                self.created.append(d)
            if self.version == 2:
                parent, base = self.parents["memory"], self.bases["memory"]
                enable = " ".join("+" + c for c in CG_CONTROLLERS)
                try:
                    have = set(_cg_read(os.path.join(base, "cgroup.controllers")).split())
                except FileNotFoundError:
                    have = set()
                if not set(CG_CONTROLLERS) <= have:  # fails (EBUSY) if the parent holds processes
                    _cg_write(os.path.join(parent, "cgroup.subtree_control"), enable)
                _cg_write(os.path.join(base, "cgroup.subtree_control"), enable)
            for ctrl, name, value, required in cgroup_base_files(self.version, self.slots):
                _cg_write(os.path.join(self.bases[ctrl], name), value, required)
            for slot in range(self.slots):
                for d in self.dirs:
                    os.mkdir(os.path.join(d, f"slot{slot}"))
                    self.created.append(os.path.join(d, f"slot{slot}"))
                for ctrl, name, value, required in cgroup_slot_files(self.version, memory_bytes, cpus, pids):
                    _cg_write(os.path.join(self.slot_dir(ctrl, slot), name), value, required)
                self.memory[slot] = memory_bytes
        except BaseException:
            self.remove()
            raise

    def set_memory(self, slot: int, memory_bytes: int) -> None:
        """Change a slot's memory limit (between runs; a call may ask for its own ``memory_mb``)."""
        if self.memory[slot] == memory_bytes:
            return
        files = [(os.path.join(self.slot_dir(c, slot), n), v, r)
                 for c, n, v, r in cgroup_slot_files(self.version, memory_bytes, 0, 0) if c == "memory"]
        if self.version == 1 and memory_bytes > self.memory[slot]:
            files.reverse()  # v1 wants memsw >= limit at every step: raise memsw first
        for path, value, required in files:
            _cg_write(path, value, required)
        self.memory[slot] = memory_bytes

    def procs(self, slot: int) -> list[int]:
        text = _cg_read(os.path.join(self.slot_dir("pids", slot), "cgroup.procs"))
        return [int(x) for x in text.split()]

    def count(self, slot: int) -> int:
        """Tasks charged to the slot, zombies included until reaped (``pids.current``)."""
        return int(_cg_read(os.path.join(self.slot_dir("pids", slot), "pids.current")))

    def kill(self, slot: int) -> None:
        """SIGKILL everything in the slot (one write on v2; on v1 each pid: call again until empty)."""
        kill_file = os.path.join(self.slot_dir("pids", slot), "cgroup.kill")
        if self.version == 2 and os.path.exists(kill_file):
            _cg_write(kill_file, "1")
            return
        for pid in self.procs(slot):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def remove(self) -> None:
        """Remove the (empty) slot groups and the executor's group; errors are ignored."""
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}
        for path in reversed(self.created):
            try:
                os.rmdir(path)
            except OSError:
                pass
        self.created = []

    def describe(self) -> dict:
        return {"version": self.version, "dirs": self.dirs, "bases": dict(self.bases)}


def _sweep_stale(parent: str) -> None:
    """Remove empty groups left by executors that died without cleaning up (their pid is gone)."""
    try:
        entries = os.listdir(parent)
    except OSError:
        return
    for entry in entries:
        if not entry.startswith(CG_PREFIX) or not entry[len(CG_PREFIX):].isdigit():
            continue
        if os.path.exists(f"/proc/{entry[len(CG_PREFIX):]}"):
            continue
        path = os.path.join(parent, entry)
        try:
            for sub in os.listdir(path):
                if os.path.isdir(os.path.join(path, sub)):
                    os.rmdir(os.path.join(path, sub))  # fails if still populated: then left alone
            os.rmdir(path)
        except OSError:
            pass


def _own_cgroups(text: str | None = None) -> dict:
    """This process's cgroup per controller (``""``: the v2 hierarchy), from ``/proc/self/cgroup``."""
    if text is None:
        text = _cg_read("/proc/self/cgroup")
    own = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for ctrl in parts[1].split(",") if parts[1] else [""]:
                own[ctrl] = parts[2]
    return own


def _mount_roots(text: str | None = None) -> dict:
    """Mount point -> root inside the cgroup filesystem, for cgroup mounts (``/proc/self/mountinfo``)."""
    if text is None:
        try:
            text = _cg_read("/proc/self/mountinfo")
        except OSError:
            return {}
    roots = {}
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) >= 5 and right.split()[:1] in (["cgroup"], ["cgroup2"]):
            roots[fields[4]] = fields[3]
    return roots


def _relative(path: str | None, mount: str, mounts: dict) -> str:
    """``path`` (as /proc/self/cgroup shows it) as a directory under ``mount``; the mount's root if unknown."""
    if not path:
        return mount
    root = mounts.get(mount, "/")
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root):] or "/"
    full = os.path.join(mount, path.lstrip("/"))
    return full.rstrip("/") if os.path.isdir(full) else mount


def _cgroup_candidates(version: int, root: str, own: dict, mounts: dict) -> list[dict]:
    """Where the executor's group may go, best first: ``[{controller: parent dir}]`` (raises LookupError)."""
    if version == 2:
        mount = next((d for d in (root, os.path.join(root, "unified"))
                      if os.path.isfile(os.path.join(d, "cgroup.controllers"))), None)
        if mount is None:
            raise LookupError(f"no cgroup2 hierarchy at {root}")
        have = _cg_read(os.path.join(mount, "cgroup.controllers")).split()
        if not set(CG_CONTROLLERS) <= set(have):
            raise LookupError(f"the cgroup2 hierarchy at {mount} has only {have or 'no controllers'}")
        mine = _relative(own.get(""), mount, mounts)
        # Under our own group only where it may have children with controllers (no processes in it,
        # or the root); else next to it (v2 forbids processes in a group that distributes resources).
        places = [mine] if mine == mount else [mine, os.path.dirname(mine)]
        return [{c: place for c in CG_CONTROLLERS} for place in places]
    parents = {}
    for ctrl in CG_CONTROLLERS:
        try:
            names = os.listdir(root)
        except OSError as exc:
            raise LookupError(f"no cgroup hierarchies at {root}: {exc.strerror}") from None
        mount = next((os.path.join(root, n) for n in sorted(names, key=lambda n: n != ctrl)
                      if ctrl in n.split(",") and os.path.isfile(os.path.join(root, n, "cgroup.procs"))), None)
        if mount is None:
            raise LookupError(f"no cgroup v1 hierarchy for {ctrl} at {root}")
        parents[ctrl] = _relative(own.get(ctrl), mount, mounts)
    return [parents]


def detect_cgroups(mode: str, root: str, slots: int, memory_bytes: int, cpus: float, pids: int,
                   self_cgroup: str | None = None, mountinfo: str | None = None):
    """Create the slot cgroups: cgroup v2 first, then v1 (``mode`` ``auto``), or only ``v2`` / ``v1``;
    ``off``: none. Returns ``(Cgroups, why earlier choices were skipped)``, or ``(None, why)`` when no
    hierarchy is usable here (not mounted, a controller missing, not writable...): the caller then falls
    back to rlimits."""
    if mode == "off":
        return None, "cgroups disabled (cgroup='off')"
    versions = {"auto": (2, 1), "v2": (2,), "v1": (1,)}.get(mode)
    if versions is None:
        raise ValueError(f"cgroup must be auto, v2, v1 or off, got {mode!r}")
    try:
        own = _own_cgroups(self_cgroup)
    except OSError:
        own = {}
    mounts = _mount_roots(mountinfo)
    notes = []
    for version in versions:
        try:
            candidates = _cgroup_candidates(version, root, own, mounts)
        except (LookupError, OSError) as exc:
            notes.append(f"v{version}: {exc}")
            continue
        for parents in candidates:
            cg = Cgroups(version, parents, slots)
            try:
                cg.setup(memory_bytes, cpus, pids)
                return cg, "; ".join(notes)  # why earlier choices were skipped
            except OSError as exc:
                notes.append(f"v{version} in {sorted(set(parents.values()))}: {exc}")
    return None, "; ".join(notes)


def _proc_files(name: str, exclude: int = -1):
    """(pid, contents of /proc/<pid>/<name>) for every live process but ``exclude`` (vanished ones skipped)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == exclude:
            continue
        try:
            with open(f"/proc/{entry}/{name}", "rb") as f:
                yield int(entry), f.read()
        except OSError:
            continue


def _children_of(ppid: int) -> list[int]:
    """Pids whose parent is ``ppid`` (zombies included), from ``/proc/*/stat``."""
    found = []
    for pid, stat in _proc_files("stat"):
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == ppid:
            found.append(pid)
    return found


UID_LOCK_DIR = "/tmp/gapo-sandbox-uids"


def _claim_uids(count: int, base: int, span: int) -> list[int]:
    """``count`` uids from [base, base + span) that no other live executor on this host holds.

    Each claim is an exclusive flock on a per-uid file, held (fd kept open, not inheritable) until this
    process exits, so the kernel releases it even after a crash. A uid is also skipped while processes of
    it still run (left by an executor that died).
    """
    os.makedirs(UID_LOCK_DIR, mode=0o700, exist_ok=True)
    uids = []
    for uid in range(base, base + span):
        fd = os.open(os.path.join(UID_LOCK_DIR, str(uid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if _tasks_of_uid(uid):
            os.close(fd)
            continue
        uids.append(uid)  # fd stays open: the lock lives as long as this process
        if len(uids) == count:
            return uids
    raise RuntimeError(f"no {count} free sandbox uids in [{base}, {base + span}): too many executors on this host")


def _tasks_of_uid(uid: int, exclude: int = -1) -> int:
    """Threads of all processes whose real uid is ``uid`` (from ``/proc/*/status``, which, unlike the
    owner of ``/proc/PID``, does not change when a process makes itself non-dumpable)."""
    count = 0
    for _, status in _proc_files("status", exclude):
        fields = dict(line.split(b":", 1) for line in status.splitlines() if b":" in line)
        if int(fields.get(b"Uid", b"-1").split()[0]) == uid:
            count += int(fields.get(b"Threads", b"1").strip())
    return count


def main() -> None:
    cfg = json.loads(sys.argv[1])
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wfd)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wake-up fd does the work
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    ex = Executor(cfg)
    ex.sel.register(rfd, selectors.EVENT_READ, "chld")
    try:
        send(("hello", ex.probe()))
        os.set_blocking(0, False)
        ex.sel.register(0, selectors.EVENT_READ, "stdin")
        ex.loop()
    except BrokenPipeError:
        pass  # the client went away
    finally:
        ex.shutdown()


if __name__ == "__main__":
    main()

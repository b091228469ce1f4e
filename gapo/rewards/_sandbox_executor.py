"""Sandbox executor: the dedicated process that launches, limits, times and reaps untrusted test runs.

Started by :mod:`gapo.rewards.sandbox` as ``python -I -S _sandbox_executor.py CONFIG_JSON`` (stdlib
only, never imported by the trainer). It reads requests from stdin and writes results to stdout,
both as length-prefixed ``marshal`` frames (plain data only; both ends are this project's code).

One process per test, launched with ``fork`` + ``execve`` from this single-threaded loop (so no lock
can be held across the fork), through this chain::

    rlimits (AS, CPU, FSIZE, NOFILE, NPROC, CORE) -> drop to the slot's own non-root uid
    -> PR_SET_PDEATHSIG -> execve(bwrap, minimal env) -> every namespace unshared, read-only /usr,
    program read-only at /main.py, small tmpfs /tmp, cleared env -> python3 -I -S /main.py

Why this process exists (each point was a measured failure of simpler designs):

- it is a child subreaper and reaps on every SIGCHLD: processes of killed sandboxes are re-parented
  here, not to the host's init (which reaped them seconds later, while they still counted against
  RLIMIT_NPROC, so later runs failed to fork and got false "wrong answer" rewards);
- a slot's uid is reused only when no process of that uid is left (a cleaner child running as that
  uid repeats ``kill(-1, SIGKILL)`` until nothing answers), so no test inherits another's leftovers;
  a killed run's result is sent only after that, so "the batch returned" means "nothing is running";
- bwrap is exec'ed with a minimal environment: bwrap's own pid 1 keeps the environment it was
  started with, readable as ``/proc/1/environ`` inside the sandbox.

Scheduling: groups (one per problem) run FIFO; a group's tests run in parallel on free slots. A group
stops at its first test that does not exit 0 (and when the client cancels it, e.g. on a wrong
answer); its remaining tests are reported as ``skipped``. Every test of a group is reported exactly
once. Deadlines: per test (from its start) and per group (from its first test's start).
"""

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
MINIMAL_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
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


def send(obj) -> None:
    data = marshal.dumps(obj)
    _write_all(1, FRAME.pack(len(data)))
    _write_all(1, data)


class Run:
    """One test process: its pipes, buffers, deadline and outcome."""

    def __init__(self, group, idx: int, slot: int):
        self.group, self.idx, self.slot = group, idx, slot
        self.pid = 0
        self.start = time.monotonic()
        self.deadline = min(self.start + group.limits["test_timeout_s"], group.deadline_from(self.start))
        self.stdin_view = memoryview(group.inputs[idx][0])
        self.cap = group.inputs[idx][1]
        self.stdin_fd = self.out_fd = self.err_fd = -1
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
        self.retry_clean: list[tuple[float, int, list[Run]]] = []
        self.stdin_buf = bytearray()
        self.stdin_open = True
        self.nproc = cfg["nproc"]
        # Several executors run at once on a node (one per reward worker, per test process...): each claims
        # its own uids, or one executor's cleaner would kill another's programs and count them as leftovers.
        self.uids = _claim_uids(cfg["slots"], cfg["uid_base"], cfg.get("uid_span", 4096)) if self.root else []
        if not self.root:
            # Shared-uid mode: NPROC counts every task of our uid (the trainer's threads too), so the
            # cap is "what exists now" plus a per-slot budget. Weaker than a uid per slot: see docs.
            self.nproc = _tasks_of_uid(os.getuid()) + cfg["nproc"] * cfg["slots"]
        self.argv_prefix = self._argv_prefix()

    # ----- launch ------------------------------------------------------------------------------
    def _argv_prefix(self) -> list[str]:
        py = [self.cfg["interpreter"], *self.cfg["python_args"]]
        if not self.sandboxed:
            return py + ["/dev/fd/3"]
        # --as-pid-1: the program is the namespace's init, so bwrap returns only once every process
        # in it is gone (with bwrap's own init, bwrap exits as soon as the program does, while that
        # init is still killing daemons: they would outlive the result).
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
        return a + py + [PROGRAM_PATH]

    def _uid(self, slot: int) -> int:
        return self.uids[slot]

    def start_run(self, group: Group, slot: int) -> None:
        idx = group.next
        group.next += 1
        run = Run(group, idx, slot)
        group.running.add(run)
        stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        code_fd = os.memfd_create("program", os.MFD_CLOEXEC)  # one per run: bwrap reads it from offset 0
        _write_all(code_fd, group.program)
        os.lseek(code_fd, 0, os.SEEK_SET)
        pid = os.fork()
        if pid == 0:  # child: never returns
            try:
                self._child(slot, group.limits, stdin_r, out_w, err_w, code_fd)
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
        run.stdin_fd, run.out_fd, run.err_fd = stdin_w, out_r, err_r
        for fd in (stdin_w, out_r, err_r):
            os.set_blocking(fd, False)
        if len(run.stdin_view):
            self.sel.register(stdin_w, selectors.EVENT_WRITE, ("in", run))
        else:
            self._close_stdin(run)
        self.sel.register(out_r, selectors.EVENT_READ, ("out", run))
        self.sel.register(err_r, selectors.EVENT_READ, ("err", run))

    def _child(self, slot, limits, stdin_r, out_w, err_w, code_fd) -> None:
        os.setsid()  # own process group: a kill reaches the whole launcher
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

    def _close_stdin(self, run: Run) -> None:
        if run.stdin_fd >= 0:
            self._unregister_close(run.stdin_fd)
            run.stdin_fd = -1

    def on_stdin(self, run: Run) -> None:
        try:
            n = os.write(run.stdin_fd, run.stdin_view[:READ_CHUNK])
        except BlockingIOError:
            return
        except OSError:  # EPIPE: the program closed stdin or exited; the rest is not needed
            self._close_stdin(run)
            return
        run.stdin_view = run.stdin_view[n:]
        if not len(run.stdin_view):
            self._close_stdin(run)

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
                self._close_stdin(run)
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
        # A killed run (or any run without namespaces) may leave processes of the slot's uid behind.
        if self.root and (run.reason or not self.sandboxed):
            self.spawn_cleaner(run.slot, [run])
        else:
            self.release(run.slot, [run])

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
                    if kind == "in":
                        self.on_stdin(run)
                    elif run.result is None:
                        self.on_output(run, kind)
            self.reap()

    def probe(self) -> dict:
        """Run one tiny program through the real launch path and check what it can see."""
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
        if self.root:
            for slot in range(self.cfg["slots"]):
                self.spawn_cleaner(slot, [])
            while self.cleaners and time.monotonic() < end:
                self.reap()
                time.sleep(0.002)
        self.reap()


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
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == exclude:
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as f:
                status = f.read()
        except OSError:
            continue
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

"""Sandbox executor: the dedicated process that launches, limits, times and reaps untrusted test runs; this
file is its loop (config, message protocol, slots, scheduling, deadlines, the main loop).

Started by :mod:`gapo.rewards.sandbox.client` as ``python -I -S _executor.py CONFIG_JSON`` (stdlib
only, never imported by the trainer). It reads requests from stdin and writes results to stdout,
both as length-prefixed ``marshal`` frames (plain data only; both ends are this project's code).

Its siblings, one job each, imported by plain name (this file puts their directory on ``sys.path``):

- ``policy``: what a run may see and do (the bubblewrap command line, environment, stdin, rlimits' values);
- ``process``: process control (clone3 into a cgroup, the launcher's steps to ``execve``, uids, finding and
  killing processes);
- ``cgroups``: the per-slot cgroups (v2 or v1: where, which limits, emptying, removal).

One process per test, launched with ``fork`` + ``execve`` from this single-threaded loop (so no lock
can be held across the fork), through the chain in ``policy``'s docstring.

Why this process exists (each point was a measured failure of simpler designs):

- it is a child subreaper and reaps on every SIGCHLD: processes of killed sandboxes are re-parented
  here, not to the host's init (which reaped them seconds later, while they still counted against
  RLIMIT_NPROC, so later runs failed to fork and got false "wrong answer" rewards);
- a slot is reused only when nothing of its previous run is left (below), so no test inherits
  another's leftovers; a killed run's result is sent only after that, so "the batch returned" means
  "nothing is running";
- bwrap is exec'ed with a minimal environment (see ``policy``);
- each slot has its own cgroup (``<own cgroup>/gapo-sandbox-<pid>/slot<N>``, v2 or v1, see
  :func:`cgroups.detect_cgroups`) with memory, CPU and pids limits, because rlimits are per process (numbers in
  ``cgroups``). The launcher starts in its slot's cgroup (v2: clone3 with CLONE_INTO_CGROUP) or moves itself
  there before dropping privileges (v1); everything it starts stays there.

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

import json
import marshal
import os
import selectors
import signal
import struct
import sys
import time

if __package__:  # imported as gapo.rewards.sandbox._executor (a test, a tool)
    from . import cgroups, policy, process
else:
    # Started as a script, `python -I -S _executor.py` (client.py): isolated mode leaves the script's own
    # directory off sys.path (-I implies -P) and -S leaves out site-packages, so the siblings are found only
    # once their directory is put there. First, as a plain `python _executor.py` would have it; none of their
    # names is a standard module's, and they import only the standard library and each other
    # (tests/test_layout.py checks both).
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import cgroups
    import policy
    import process

FRAME = struct.Struct("<Q")
READ_CHUNK = 1 << 16
EOF_GRACE_S = 0.5  # after the launcher exited, wait this long for its pipes to close, then close them
CLEAN_RETRY_S = 1.0  # a slot whose cleaner gave up is retried after this long
DRAIN_POLL_S = 0.002  # while a slot is being emptied, look again this often


def send(obj) -> None:
    """Write one length-prefixed ``marshal`` frame to stdout, the client's pipe."""
    data = marshal.dumps(obj)
    process.write_all(1, FRAME.pack(len(data)))
    process.write_all(1, data)


class Run:
    """One test process: its pipes, buffers, deadline and outcome."""

    def __init__(self, group, idx: int, slot: int):
        """Test ``idx`` of ``group`` on ``slot``; its clock starts now: the deadline is the earlier of
        ``test_timeout_s`` from now and the group's ``problem_timeout_s``; its stdout cap is the input's."""
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
        """``inputs``: ``(stdin bytes, stdout cap)`` per test; ``limits``: timeouts, memory and file limits of every
        test (the client's ``SandboxConfig.limits``)."""
        self.gid, self.program, self.inputs, self.limits = gid, program, inputs, limits
        self.next = 0
        self.running: set[Run] = set()
        self.reported = 0
        self.first_start: float | None = None
        self.stopped = False
        self.on_result = None  # internal groups (the probe) get a callback instead of a frame

    def deadline_from(self, now: float) -> float:
        """The problem's deadline: ``problem_timeout_s`` after its first test's start (``now`` if none started)."""
        if self.first_start is None:
            self.first_start = now
        return self.first_start + self.limits["problem_timeout_s"]

    def pending(self) -> bool:
        """Whether tests remain to be started (not stopped, not all started)."""
        return not self.stopped and self.next < len(self.inputs)


class Executor:
    """The executor's state and loop: free slots, queued groups, running tests, slots being emptied, and the
    isolation in use (``cgroup_v2``, ``cgroup_v1`` or ``rlimits``; see the module docstring)."""

    def __init__(self, cfg: dict):
        """Claim the slots' uids (as root), create the slot cgroups (or fall back to rlimits) and build the launch
        command from ``cfg``, the client's JSON config (mode, slots, limits, cgroup settings)."""
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
        self.uids = process.claim_uids(cfg["slots"], cfg["uid_base"], cfg.get("uid_span", 4096)) if self.root else []
        self.clone3 = True  # v2: start each run in its slot with clone3(CLONE_INTO_CGROUP) until it fails
        cg, note = cgroups.detect_cgroups(cfg.get("cgroup", "auto"), cfg.get("cgroup_root", "/sys/fs/cgroup"),
                                          cfg["slots"], cfg.get("slot_memory_bytes", 1 << 31),
                                          cfg.get("slot_cpus", 1.0), cfg.get("slot_pids", cfg["nproc"]))
        self._set_isolation(cg, note)
        self._argv: dict[int, list[str]] = {}  # a run's RLIMIT_AS -> its command line (tmpfs sizes follow it)

    def _set_isolation(self, cg: cgroups.Cgroups | None, note: str = "") -> None:
        """Per-slot cgroups, or (``rlimits``) a tighter RLIMIT_NPROC: without a memory limit per slot,
        a test's memory is bounded only by its process count times RLIMIT_AS."""
        self.cg, self.cg_note = cg, note
        self.isolation = f"cgroup_v{cg.version}" if cg is not None else "rlimits"
        nproc = self.cfg["nproc"] if cg is not None else min(self.cfg["nproc"], self.cfg.get("rlimits_nproc", 8))
        self.nproc = nproc
        if not self.root:
            # Shared-uid mode: NPROC counts every task of our uid (the trainer's threads too), so the
            # cap is "what exists now" plus a per-slot budget. Weaker than a uid per slot: see docs.
            self.nproc = process.tasks_of_uid(os.getuid()) + nproc * self.cfg["slots"]

    # ----- launch ------------------------------------------------------------------------------
    def _uid(self, slot: int) -> int:
        return self.uids[slot]

    def start_run(self, group: Group, slot: int) -> None:
        """Start ``group``'s next test on ``slot``: the program in a memfd, pipes for stdout and stderr, and a launcher
        child (on v2 born in the slot's cgroup by clone3) that applies the limits and uid and execs the sandbox."""
        idx = group.next
        group.next += 1
        run = Run(group, idx, slot)
        group.running.add(run)
        stdin_r = policy.stdin_file(group.inputs[idx][0])
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
                    pid = process.fork_into_cgroup(self.cg.fd(slot))  # born in the slot: nothing to join
                except OSError as exc:  # before Linux 5.7, or clone3 filtered by seccomp (Docker: ENOSYS)
                    self.clone3 = False
                    self.cg_note = (self.cg_note + "; " if self.cg_note else "") + f"clone3 unavailable: {exc}"
            if pid < 0:
                cg_join = self.cg.join_files(slot)
        process.write_all(code_fd, group.program)
        os.lseek(code_fd, 0, os.SEEK_SET)
        argv = self.argv(group.limits)
        if pid < 0:
            pid = os.fork()
        if pid == 0:  # child: never returns
            try:
                self._child(slot, group.limits, argv, stdin_r, out_w, err_w, code_fd, cg_join)
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

    def argv(self, limits: dict) -> list[str]:
        """The command line of a run under ``limits`` (built once per memory limit: each writable tmpfs is at most
        the run's RLIMIT_AS, :func:`policy.tmpfs_sizes`)."""
        mem = limits["memory_bytes"]
        argv = self._argv.get(mem)
        if argv is None:
            if len(self._argv) >= 64:  # a few memory limits in practice; never an unbounded table
                self._argv.clear()
            argv = self._argv[mem] = policy.launch_argv(self.cfg, self.sandboxed, mem)
        return argv

    def _child(self, slot, limits, argv, stdin_r, out_w, err_w, code_fd, cg_join) -> None:
        uid = self._uid(slot) if self.root else None  # RLIMIT_NPROC is not enforced for root, and counts per uid
        process.launch((stdin_r, out_w, err_w, code_fd), cg_join, policy.rlimits(limits, self.nproc), uid, self.pid,
                       None if self.sandboxed else "/tmp", argv, policy.MINIMAL_ENV)

    # ----- I/O events -------------------------------------------------------------------------
    def _unregister_close(self, fd: int) -> None:
        try:
            self.sel.unregister(fd)
        except (KeyError, ValueError):
            pass
        os.close(fd)

    def on_output(self, run: Run, which: str) -> None:
        """Read what ``run`` wrote on stdout or stderr (``which``): stderr keeps its last ``stderr_bytes``; stdout
        past the run's cap kills it (``output_limit``). End of file closes the pipe and may finish the run."""
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
        """Read the client's bytes and handle each complete frame; end of file marks stdin closed (the loop ends)."""
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
        """A client message: ``("run", gid, program, inputs, limits)`` queues a group, ``("cancel", gid)`` stops it."""
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
        """Register and queue a group (one without tests is dropped: nothing to report)."""
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
        """SIGKILL ``run``'s process group and, with cgroups, all of its slot; the first ``reason`` is reported."""
        if not run.reason:
            run.reason = reason
        if run.exit_status is None:
            process.kill_group(run.pid)
        if self.cg is not None:
            self.cg.kill(run.slot)  # the slot is this run's alone: its setsid() children too, at once

    def reap(self) -> None:
        """Reap every exited child: a launcher's status finishes its run, a cleaner's exit releases its slot (or retries
        it), anything else is an orphan of a sandbox re-parented to this subreaper."""
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
        """``run``'s result, once it exited and its pipes are closed (``force``: close them now). A failed or killed run
        stops its group; the result is reported only once the slot is empty (``settle``)."""
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
            orphans = [pid for pid in process.children_of(self.pid) if pid not in tracked]
            if orphans:
                process.kill_all(orphans)
            else:
                draining, self.draining = self.draining, {}
                for slot, runs in draining.items():
                    self.release(slot, runs)
        return bool(self.draining)

    def spawn_cleaner(self, slot: int, runs: list[Run]) -> None:
        """Fork a cleaner that kills every process of the slot's uid; ``runs`` are reported once it succeeds."""
        self.cleaners[process.fork_cleaner(self._uid(slot))] = (slot, runs)

    def release(self, slot: int, runs: list[Run]) -> None:
        """Report ``runs`` and give their (empty) slot back."""
        for run in runs:
            self.report(run.group, run.idx, run.result)
        self.free_slots.append(slot)

    def report(self, group: Group, idx: int, result: dict) -> None:
        """Send test ``idx``'s result (or pass it to the group's callback); a group ends once all are reported."""
        group.reported += 1
        if group.on_result is not None:
            group.on_result(idx, result)
        else:
            send(("result", group.gid, idx, result))
        if group.reported >= len(group.inputs):
            self.groups.pop(group.gid, None)

    def schedule(self) -> None:
        """Start queued tests on the free slots, groups in FIFO order (a group's tests run in parallel)."""
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
        """The event loop: schedule, enforce deadlines, wait for child exits, client frames and test output, reap.
        Returns once ``until()`` is true or, without ``until``, once the client closed stdin."""
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
            extra = set(seen) - policy.visible_root(self.cfg)
            if extra:
                ok = False
                info["stderr"] += f"\nthe sandbox sees host paths: {sorted(extra)}"
        info["ok"] = ok
        return info

    def shutdown(self) -> None:
        """Kill every run and leave nothing behind (within about 5 s): empty and remove the slot cgroups, or run a
        cleaner per slot uid, or kill the re-parented orphans."""
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
                orphans = process.children_of(self.pid)
                if not orphans:
                    break
                process.kill_all(orphans)
                time.sleep(DRAIN_POLL_S)
        self.reap()


def main() -> None:
    """Entry point (``python -I -S _executor.py CONFIG_JSON``): become a child subreaper, probe the sandbox and send
    ``("hello", probe)``, serve the client until it closes stdin, and shut down whatever happens."""
    cfg = json.loads(sys.argv[1])
    process.prctl(process.PR_SET_CHILD_SUBREAPER, 1)
    # The client's thread may block signals (the mask survives exec): a blocked SIGCHLD left tests' ends unseen until
    # the loop's 1 s timeout (10 runs of 3 one-line tests, started from a thread that blocks SIGCHLD: 2.4-6.4 s
    # instead of 0.4 s).
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
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

"""Process control for the sandbox executor: how it starts, identifies, finds, kills and reaps processes.

- starting: :func:`fork_into_cgroup` (clone3 with CLONE_INTO_CGROUP: a v2 launcher born in its slot) and
  :func:`launch`, the launcher's own steps between fork and ``execve`` (own session, slot cgroup, fds,
  rlimits, uid drop, parent-death signal); what it gets (argv, environment, limits' values) is
  :mod:`policy`'s;
- identity: :func:`claim_uids` (a uid per slot that no other executor on the host holds), :func:`drop_to`;
- finding: :func:`children_of` (this subreaper's children, orphans of killed runs included),
  :func:`tasks_of_uid`, from ``/proc``;
- killing: :func:`kill_group`, :func:`kill_all`, and :func:`fork_cleaner` (kills every process of a uid,
  as that uid; the slot's cleaner where there are no cgroups); reaping is the executor's (it knows whose
  child each pid is);
- signals: :func:`default_signals` (what a program starts with), :func:`ignored_signals` and :func:`signal_set`
  (from ``/proc``), :func:`raw_sigaction` (the C library's own signals too);
- :func:`prctl` (child subreaper, parent-death signal) and :func:`write_all` (pipes and memfds).

Standard library only (see ``_executor.py``).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import resource
import signal
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

_libc = ctypes.CDLL(None, use_errno=True)


def prctl(option: int, arg: int) -> None:
    """``prctl(option, arg)`` on this process (PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG); OSError on failure."""
    if _libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def write_all(fd: int, data) -> None:
    """Write all of ``data`` to ``fd`` (``os.write`` may write part of it)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


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


def launch(fds, cg_join: list[str], rlimits, uid: int | None, parent: int, cwd: str | None, argv: list[str],
           env: dict) -> None:
    """The launcher, in the child of a fork: from here to ``execve(argv)``, in this order (never returns; a
    setup failure raises, and the caller exits).

    Its own session (a kill of its process group reaches all of it), into the slot's cgroup through
    ``cg_join`` (while still privileged; all it starts stays there), default signal handling, ``fds`` as
    0, 1, 2... and nothing else open, ``rlimits`` (``[(RLIMIT_*, value)]``, soft = hard), the uid drop
    (``uid``; ``None``: keep ours), then PR_SET_PDEATHSIG (after the uid change, which clears it) and a
    check that ``parent`` did not die before it was set.
    """
    os.setsid()  # own process group: a kill reaches the whole launcher
    for path in cg_join:  # into the slot's cgroup (while still privileged); all it starts stays there
        with open(path, "w") as f:
            f.write("0")  # "0": this thread (see Cgroups.join_files)
    signal.set_wakeup_fd(-1)
    default_signals()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    os.closerange(len(fds), 1 << 20)
    for res, value in rlimits:
        resource.setrlimit(res, (value, value))
    if uid is not None:
        drop_to(uid)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid change, which clears it
    if os.getppid() != parent:
        os._exit(125)
    if cwd is not None:
        os.chdir(cwd)
    os.execve(argv[0], argv, env)


def default_signals() -> None:
    """Every signal back to its default action and none blocked, as on a judge. ``execve`` resets the signals
    this process catches but keeps the ignored ones and the blocked mask, so those two are what is reset here:
    without it, a trainer run under ``nohup`` (SIGHUP ignored) handed that to every program, and one that printed
    the right answer and then SIGHUPed its group exited 0 and scored 1.0. GNU make 4.3 ignores the C library's own
    real-time signals (32, 33) in all it starts (``make test``), and Python cannot set those: they are reset with
    the system call itself (:func:`raw_sigaction`)."""
    for sig in ignored_signals():
        if sig in _PYTHON_SETTABLE:
            signal.signal(sig, signal.SIG_DFL)
        else:
            raw_sigaction(sig, kernel_sigaction(signal.SIG_DFL))
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


_PYTHON_SETTABLE = signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}  # valid_signals() lacks 32 and 33


def signal_set(status: str, field: str) -> set[int]:
    """The signal numbers of one mask line of a ``/proc/PID/status`` text (``SigIgn``, ``SigBlk``...: hex, bit
    N-1 = signal N)."""
    line = next(line for line in status.splitlines() if line.startswith(f"{field}:"))
    mask = int(line.split()[1], 16)
    return {n + 1 for n in range(64) if mask >> n & 1}


def ignored_signals() -> set[int]:
    """The signals this process ignores (``SigIgn`` of ``/proc/self/status``)."""
    with open("/proc/self/status") as f:
        return signal_set(f.read(), "SigIgn")


# rt_sigaction's system call number per architecture (arm64 and riscv64 share the generic table)
_SYS_RT_SIGACTION = {"x86_64": 13, "aarch64": 134, "riscv64": 134, "ppc64le": 173, "ppc64": 173, "s390x": 174}
_KSIGACTION_BYTES = 64  # more than the kernel's struct sigaction on any 64-bit architecture (32 bytes); it reads its own
_libc.syscall.restype = ctypes.c_long


def kernel_sigaction(handler: int) -> bytes:
    """The kernel's ``struct sigaction`` for SIG_DFL (0) or SIG_IGN (1): the handler first, no flags, empty mask."""
    return bytes(ctypes.c_ulong(int(handler))).ljust(_KSIGACTION_BYTES, b"\0")


def raw_sigaction(sig: int, action: bytes) -> bytes:
    """``rt_sigaction(sig, action)`` by system call, past the C library (whose ``sigaction`` refuses its own
    signals 32 and 33 with EINVAL); returns the previous action in the same form. OSError on failure or on an
    architecture whose system call number is not known here."""
    number = _SYS_RT_SIGACTION.get(os.uname().machine)
    if number is None:
        raise OSError(f"signal {sig} is ignored and cannot be reset on {os.uname().machine} (no rt_sigaction "
                      "number known): start the trainer outside GNU make, which ignores signals 32 and 33")
    new = ctypes.create_string_buffer(action, _KSIGACTION_BYTES)
    old = ctypes.create_string_buffer(_KSIGACTION_BYTES)
    if _libc.syscall(ctypes.c_long(number), ctypes.c_long(sig), new, old, ctypes.c_size_t(8)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"rt_sigaction({sig}): {os.strerror(err)}")
    return old.raw


def drop_to(uid: int) -> None:
    """Become ``uid`` (real, effective and saved; group the same number; no supplementary groups), for good."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads (a launcher's: it called setsid), then ``pid`` itself."""
    for fn in (os.killpg, os.kill):
        try:
            fn(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def kill_all(pids) -> None:
    """SIGKILL each of ``pids`` (those already gone are skipped)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def fork_cleaner(uid: int) -> int:
    """Fork a cleaner that, as ``uid``, kills every process of ``uid`` until none is left (at most 5 s); its
    exit status is 0 once none is, else 1 (2: it could not become ``uid``). Returns its pid."""
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            drop_to(uid)
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
                if tasks_of_uid(uid, exclude=os.getpid()) == 0:
                    code = 0
                    break
                time.sleep(0.002)
        finally:
            os._exit(code)
    return pid


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


def children_of(ppid: int) -> list[int]:
    """Pids whose parent is ``ppid`` (zombies included), from ``/proc/*/stat``."""
    found = []
    for pid, stat in _proc_files("stat"):
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == ppid:
            found.append(pid)
    return found


UID_LOCK_DIR = "/tmp/gapo-sandbox-uids"


def claim_uids(count: int, base: int, span: int) -> list[int]:
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
        if tasks_of_uid(uid):
            os.close(fd)
            continue
        uids.append(uid)  # fd stays open: the lock lives as long as this process
        if len(uids) == count:
            return uids
    raise RuntimeError(f"no {count} free sandbox uids in [{base}, {base + span}): too many executors on this host")


def tasks_of_uid(uid: int, exclude: int = -1) -> int:
    """Threads of all processes whose real uid is ``uid`` (from ``/proc/*/status``, which, unlike the
    owner of ``/proc/PID``, does not change when a process makes itself non-dumpable)."""
    count = 0
    for _, status in _proc_files("status", exclude):
        fields = dict(line.split(b":", 1) for line in status.splitlines() if b":" in line)
        if int(fields.get(b"Uid", b"-1").split()[0]) == uid:
            count += int(fields.get(b"Threads", b"1").strip())
    return count


"""What a sandboxed run may see and do: the bubblewrap command line (namespaces, mounts, environment, pid 1),
its stdin, and the values of its rlimits. The executor applies them (:func:`process.launch`); the slot
cgroups' limits are :mod:`cgroups`'.

Each run, through this chain::

    rlimits (AS, CPU, FSIZE, NOFILE, NPROC, CORE) -> drop to the slot's own non-root uid
    -> PR_SET_PDEATHSIG -> execve(bwrap, minimal env) -> every namespace unshared, read-only /usr,
    program read-only at /main.py, small sized tmpfs /tmp and /dev/shm (the only writable places: / and
    /dev read-only), cleared env -> python3 -I -S /main.py
    (pid 1 a shell, the program its child: normal signal semantics; its stdin a sealed regular file, as on a judge)

Writable space is memory that RLIMIT_AS does not count (tmpfs pages belong to no process), so every writable
mount has a size (:func:`tmpfs_sizes`). bwrap's own root and its ``--dev`` are tmpfs without one (half the
host's RAM): a program that filled ``/dev/shm``, ``/dev`` or ``/`` held gigabytes past its memory limit
where no slot cgroup charges it, and was paid; both are remounted read-only once the mounts are made.

bwrap is exec'ed with a minimal environment too: bwrap's own pid 1 keeps the environment it was started with,
readable as ``/proc/1/environ`` inside the sandbox. Nothing of this package is mounted in the sandbox: the
program arrives as fd 3 (``--ro-bind-data``). Standard library only (see ``_executor.py``).
"""

from __future__ import annotations

import fcntl
import os
import resource

if __package__:  # imported as gapo.rewards.sandbox.policy
    from . import process
else:  # a sibling of the executor script, which put this directory on sys.path (see _executor.py)
    import process

# One thread per numeric library: a slot gets about one CPU (cgroup quota) and a few tasks (pids.max,
# RLIMIT_NPROC); OpenBLAS would otherwise start one thread per host core at `import numpy`.
MINIMAL_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1"}
PROGRAM_PATH = "/main.py"  # where the program appears inside the sandbox
# The host's top-level directories mounted in the sandbox (read-only, or as the same symlink), where they exist.
SYSTEM_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")

# PID 1 of a test's namespace: a shell that runs the program as its child and exits with its status (128 + N
# for a death by signal N); its exit ends the namespace (the kernel kills what is left, and bwrap returns
# once all is gone). Not bwrap's own init: measured 20-40% lower throughput here (15-25% slower per 15-test
# problem), against 7-9% for the shell (python -m recipe.bench.sandbox --repeats 5 --tests 300).
INIT_SHELL = ["/bin/sh", "-c", '"$@"; exit $?', "sh"]  # not a lone "$@": a shell may exec a last command


def tmpfs_sizes(cfg: dict, memory_bytes: int) -> dict[str, int]:
    """The writable mounts of a run and their sizes in bytes: ``/tmp`` (``tmpfs_bytes``) and ``/dev/shm``
    (``shm_bytes``), each at most the run's ``memory_bytes`` (RLIMIT_AS). Together they add at most
    ``tmpfs_bytes + shm_bytes`` to what a run's processes hold: the share the slot cgroup's limit adds to the
    test's memory (``SandboxConfig.slot_memory_bytes``), and, without cgroups, the whole bound on them."""
    return {"/tmp": min(int(cfg["tmpfs_bytes"]), memory_bytes),
            "/dev/shm": min(int(cfg["shm_bytes"]), memory_bytes)}


def launch_argv(cfg: dict, sandboxed: bool, memory_bytes: int | None = None) -> list[str]:
    """The command line of a run (the program is fd 3): bwrap, then INIT_SHELL, then the interpreter; or,
    unsandboxed, the interpreter alone on ``/dev/fd/3``. ``memory_bytes``: the run's RLIMIT_AS, which bounds
    each writable tmpfs (:func:`tmpfs_sizes`; ``None``: no bound but their own sizes)."""
    py = [cfg["interpreter"], *cfg["python_args"]]
    if not sandboxed:
        return py + ["/dev/fd/3"]
    # --as-pid-1: bwrap returns only once every process in the namespace is gone (with bwrap's own init
    # it returns when the program does). PID 1 is INIT_SHELL, the program its child: a normal process.
    # As pid 1 the program ignored the signals it has no handler for, so one that printed the right output
    # and then SIGKILLed or SIGTERMed itself exited 0 here, while a judge reports a runtime error.
    a = [cfg["bwrap"], "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--as-pid-1"]
    if cfg.get("disable_userns", True):
        a.append("--disable-userns")  # no nested user namespaces: less kernel surface
    a += ["--ro-bind", "/usr", "/usr"]
    for name in SYSTEM_DIRS:
        path = "/" + name
        if os.path.islink(path):
            a += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            a += ["--ro-bind", path, path]
    for path in cfg.get("extra_ro_binds", []):
        a += ["--ro-bind", path, path]
    a += ["--proc", "/proc", "--dev", "/dev"]
    # --dev's /dev/shm is a directory of /dev's own tmpfs: an explicit tmpfs over it carries a size.
    for path, size in tmpfs_sizes(cfg, memory_bytes if memory_bytes is not None else 1 << 62).items():
        a += ["--size", str(size), "--tmpfs", path]
    a += ["--perms", "0444", "--ro-bind-data", "3", PROGRAM_PATH,
          # last, once every mount point exists: bwrap's root and /dev are tmpfs without a size
          "--remount-ro", "/dev", "--remount-ro", "/",
          "--chdir", "/tmp", "--clearenv"]
    for key, value in MINIMAL_ENV.items():
        a += ["--setenv", key, value]
    a += ["--setenv", "HOME", "/tmp", "--"]
    return a + INIT_SHELL + py + [PROGRAM_PATH]


def visible_root(cfg: dict) -> set[str]:
    """What the sandbox's ``/`` may list (the mounts of :func:`launch_argv`); the probe fails on anything else."""
    allowed = {"usr", *SYSTEM_DIRS, "proc", "dev", "tmp", PROGRAM_PATH.strip("/")}
    return allowed | {p.strip("/").split("/")[0] for p in cfg.get("extra_ro_binds", [])}


def rlimits(limits: dict, nproc: int) -> list[tuple[int, int]]:
    """The rlimits of a run (soft = hard): ``[(RLIMIT_*, value)]``. RLIMIT_CPU is the test's wall-clock limit
    + 1 s; ``nproc`` is the executor's (it depends on the isolation in use and on the uid)."""
    mem = limits["memory_bytes"]
    cpu = int(limits["test_timeout_s"]) + 1
    return [(resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu),
            (resource.RLIMIT_FSIZE, limits["fsize_bytes"]), (resource.RLIMIT_NOFILE, limits["nofile"]),
            (resource.RLIMIT_NPROC, nproc), (resource.RLIMIT_CORE, 0)]


_STDIN_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


def stdin_file(data: bytes) -> int:
    """A test's input as a regular file, sealed read-only, at offset 0 (it becomes the program's fd 0).

    A regular file, not a pipe, because the judges whose problems these are (Codeforces, AtCoder, LeetCode's
    stdin runs) give stdin as a file: the fast-input idiom ``os.read(0, os.fstat(0).st_size)`` reads it all
    there and reads nothing from a pipe (size 0), so a right program scored 0. Sealed (no write, grow or
    shrink; the seals themselves sealed), so a program cannot change what it reads, even through /proc."""
    fd = os.memfd_create("stdin", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        process.write_all(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _STDIN_SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd

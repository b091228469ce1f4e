"""Per-slot cgroups of the sandbox executor: where they can go (v2 first, then v1), what limits they hold, and
how they are created, emptied and removed.

Why they exist: rlimits are per process, so a test that forks multiplies them (one test forking 12 children of
150 MB each took 1.8 GB at ``memory_mb=256``, and busy ``setsid()`` children in one slot made a correct program
in another slot time out). Each slot of an executor gets its own group, ``<own cgroup>/gapo-sandbox-<pid>/slot<N>``,
with a memory limit, a CPU quota and a task limit; the executor's group weighs, against the rest of the host,
what one process per slot did. No cgroup file is reachable from the sandbox, none is writable by a slot's uid.

The whole v1/v2 difference in limits is the list of files written (:func:`cgroup_slot_files`,
:func:`cgroup_base_files`); where the group goes is read from ``/proc/self/cgroup`` and ``/proc/self/mountinfo``
(:func:`detect_cgroups`, which the executor calls once; ``None`` there means rlimits only). How a launcher
enters its slot: :meth:`Cgroups.join_files` (v1, and v2 without clone3) or
:func:`process.fork_into_cgroup` (v2). Standard library only (see ``_executor.py``).
"""

from __future__ import annotations

import os

if __package__:  # imported as gapo.rewards.sandbox.cgroups
    from . import process
else:  # a sibling of the executor script, which put this directory on sys.path (see _executor.py)
    import process

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


class Cgroups:
    """One executor's slot cgroups: ``<parent>/gapo-sandbox-<pid>/slot<N>`` in every hierarchy that holds
    one of memory, cpu, pids (v2: a single one holds all three; v1: usually one per controller)."""

    def __init__(self, version: int, parents: dict, slots: int, name: str | None = None):
        """Nothing is created before :meth:`setup`. ``parents``: controller -> the directory the executor's group goes
        in; ``slots``: slot groups; ``name``: the executor's group (default ``gapo-sandbox-<pid>``)."""
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
        """A slot's cgroup directory in the hierarchy that holds ``controller``."""
        return os.path.join(self.bases[controller], f"slot{slot}")

    def join_files(self, slot: int) -> list[str]:
        """The files a launcher writes ``0`` (itself) to, to enter its slot in every hierarchy.

        v1: ``tasks``, which moves only the writing thread (the launcher has one): the kernel then skips
        the global lock that a ``cgroup.procs`` write takes, and the RCU grace period it waits for, which
        cost 7-14 ms per run measured here under load, against 0.7 ms. v2 has no such file for a domain
        group; the executor starts the launcher in its slot with clone3 (:func:`process.fork_into_cgroup`) and
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
        """Create the executor's group and one group per slot with its limits (stale groups of dead executors swept
        first); on any error, remove what was created and raise."""
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
        """Pids in the slot's cgroup (``cgroup.procs``)."""
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
        process.kill_all(self.procs(slot))

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
        """The groups in use (version, directories), for the executor's probe."""
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


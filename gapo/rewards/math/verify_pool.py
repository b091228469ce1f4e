"""A persistent pool of math-verify worker processes with a hard wall-clock timeout per item.

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot kill one stuck worker (an item hung
inside C code, where no signal reaches it) without breaking the whole executor, and with ``spawn`` /
``forkserver`` it re-imports the caller's ``__main__`` (the trainer) in every worker. Here each worker
is a plain ``subprocess`` running :mod:`gapo.rewards.math._worker` (stdlib + math-verify only).

Two time limits:

- **soft** (``soft_timeout_s``): an alarm in the worker's main thread interrupts math-verify; the
  worker answers ``timeout`` and keeps serving;
- **hard** (``hard_timeout_s``, counted from when a worker takes the item, not from submission, so
  a long queue never causes false timeouts): the manager thread SIGKILLs the worker, answers
  ``timeout`` for its item and starts a replacement; the other workers keep going.

Threading: any number of threads may call :meth:`VerifyPool.submit` / :meth:`VerifyPool.verify_many`
at once. Submission appends to a deque and writes one byte to a wake-up pipe (no lock); one manager
thread owns every worker, pipe and deadline. Workers receive SIGKILL if that thread ends
(``PR_SET_PDEATHSIG``), and read end-of-file if the parent process dies, so nothing outlives the pool.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path

WORKER_SCRIPT = Path(__file__).with_name("_worker.py")
HOOK_PREFIX = "__gapo_test_hook__:"  # same constant as in _worker (which imports nothing of ours)
STARTUP_TIMEOUT_S = 60.0  # a worker not ready by then is killed and counted as a failed start
MAX_FAILED_STARTS = 3  # consecutive failed starts before the pool gives up and raises


@dataclass(frozen=True)
class Verdict:
    """Outcome of one check. ``status``: ``ok``, ``timeout`` (soft or hard) or ``error``."""

    equal: bool
    status: str = "ok"
    detail: str = ""

    @property
    def timed_out(self) -> bool:
        """True when the check ran out of time (the soft alarm or the hard kill)."""
        return self.status == "timeout"


class PoolBroken(RuntimeError):
    """Workers cannot start (math-verify missing, no processes allowed, ...): see the pool's stderr."""


@dataclass
class _Task:
    future: Future
    gold: str
    pred: str
    options: dict | None = None


class _Worker:
    """One worker process and the parent's ends of its two pipes. Touched by the manager thread only."""

    def __init__(self, pool: VerifyPool):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        args = [sys.executable, str(WORKER_SCRIPT), str(to_child_r), str(from_child_w),
                repr(pool.soft_timeout_s), str(pool.memory_limit_mb), "1" if pool.test_hooks else "0"]
        try:
            self.proc = subprocess.Popen(args, pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL,
                                         close_fds=True)
        finally:
            # The parent must not hold the child's ends, or a dead child would never read as EOF.
            os.close(to_child_r)
            os.close(from_child_w)
        self.send_conn = Connection(to_child_w, readable=False)
        self.recv_conn = Connection(from_child_r, writable=False)
        self.started = time.monotonic()
        self.ready = False
        self.task_id: int | None = None
        self.task: _Task | None = None
        self.deadline = self.started + STARTUP_TIMEOUT_S

    def kill(self) -> None:
        for conn in (self.send_conn, self.recv_conn):
            try:
                conn.close()
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)  # reap now: no zombies
        except subprocess.TimeoutExpired:
            pass


class VerifyPool:
    """Checks ``(gold, pred)`` answer pairs with math-verify in worker processes.

    Args:
        num_workers: worker processes (default: ``min(2, cpu count)``; verl runs ``reward.num_workers``
            reward actors, 8 by default, each with its own pool, so a node gets 8x this many).
        soft_timeout_s: per-item budget inside the worker (parse + verify), interrupted by an alarm.
        hard_timeout_s: per-item wall-clock limit from dispatch; past it the worker is killed.
        memory_limit_mb: ``RLIMIT_AS`` of each worker (0: none).
        test_hooks: let requests whose gold starts with ``HOOK_PREFIX`` drive test behaviours.
    """

    def __init__(self, num_workers: int | None = None, soft_timeout_s: float = 3.0, hard_timeout_s: float = 6.0,
                 memory_limit_mb: int = 1024, test_hooks: bool = False):
        if soft_timeout_s <= 0 or hard_timeout_s <= soft_timeout_s:
            raise ValueError(f"need 0 < soft_timeout_s < hard_timeout_s, got {soft_timeout_s}, {hard_timeout_s}")
        self.num_workers = num_workers or max(1, min(2, os.cpu_count() or 1))
        self.soft_timeout_s = float(soft_timeout_s)
        self.hard_timeout_s = float(hard_timeout_s)
        self.memory_limit_mb = int(memory_limit_mb)
        self.test_hooks = test_hooks
        self.pid = os.getpid()  # a forked child must build its own pool (see get_pool)
        self.stats = collections.Counter()  # hard_kills, crashes, started: read by tests and benchmarks
        self._pending: collections.deque[_Task] = collections.deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._ids = itertools.count()
        self._closing = False
        self._broken: str | None = None
        self._workers: list[_Worker] = []
        self._thread = threading.Thread(target=self._run, name="gapo-verify-pool", daemon=True)
        self._thread.start()

    # ---- public API (any thread) ----

    def submit(self, gold: str, pred: str, options: dict | None = None) -> Future:
        """Queue one check; the future resolves to a :class:`Verdict` (or raises :class:`PoolBroken`).

        ``options``: ``None`` or a small dict for the worker (``{"numeric_tolerance": True}``).
        """
        if self._broken:
            raise PoolBroken(self._broken)
        if self._closing:
            raise RuntimeError("VerifyPool is closed")
        future: Future = Future()
        self._pending.append(_Task(future, str(gold), str(pred), dict(options) if options else None))
        self._wake()
        return future

    def verify(self, gold: str, pred: str, options: dict | None = None) -> Verdict:
        """Check one ``(gold, pred)`` pair and wait for its :class:`Verdict` (``options`` as in :meth:`submit`)."""
        return self.result(self.submit(gold, pred, options))

    def verify_many(self, pairs) -> list[Verdict]:
        """Check many ``(gold, pred)`` pairs at once, in parallel over the workers; same order out."""
        futures = [self.submit(gold, pred) for gold, pred in pairs]
        return [self.result(f) for f in futures]

    def result(self, future: Future) -> Verdict:
        """Wait for a submitted check. Never waits forever: a dead manager thread raises instead."""
        while True:
            try:
                return future.result(timeout=1.0)
            except FutureTimeout:
                if not self._thread.is_alive() and not future.done():
                    raise RuntimeError("VerifyPool manager thread ended; check not done") from None

    def worker_pids(self) -> list[int]:
        """Process ids of the current workers (tests check with them that a stuck worker was replaced)."""
        return [w.proc.pid for w in list(self._workers)]

    def close(self, timeout: float = 10.0) -> None:
        """Stop the manager, end every worker (EOF, then SIGKILL) and fail what is still queued."""
        self._closing = True
        self._wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- manager thread ----

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):
            pass  # pipe full: the manager is awake anyway; closed: pool is gone

    def _run(self) -> None:
        failed_starts = 0
        try:
            while not self._closing:
                while len(self._workers) < self.num_workers and not self._broken:
                    self._workers.append(_Worker(self))
                    self.stats["started"] += 1
                self._dispatch()
                now = time.monotonic()
                # Sleep until the next deadline (busy or starting worker) or a wake-up; 1 s at most.
                timeout = max(0.0, min([w.deadline for w in self._workers if w.task or not w.ready]
                                       + [now + 1.0]) - now)
                ready = wait([self._wake_r] + [w.recv_conn for w in self._workers], timeout)
                if self._wake_r in ready:
                    os.read(self._wake_r, 65536)
                for worker in list(self._workers):
                    if worker.recv_conn in ready:
                        failed_starts = self._receive(worker, failed_starts)
                now = time.monotonic()
                for worker in list(self._workers):
                    if worker.task is not None and now > worker.deadline:
                        self.stats["hard_kills"] += 1
                        self._retire(worker, Verdict(False, "timeout", f"hard timeout {self.hard_timeout_s:g} s"))
                    elif not worker.ready and now > worker.deadline:
                        failed_starts += 1
                        self._retire(worker, Verdict(False, "error", "worker did not start"))
                if failed_starts >= MAX_FAILED_STARTS and not self._broken:
                    self._broken = f"{failed_starts} math-verify workers failed to start (see stderr)"
                    self._fail_pending(PoolBroken(self._broken))
        except BaseException as exc:  # a bug here must not leave callers waiting
            self._broken = f"manager thread failed: {exc!r}"
            raise
        finally:
            self._shutdown_workers()
            self._fail_pending(RuntimeError(self._broken or "VerifyPool closed"))

    def __del__(self) -> None:
        # Closed here, not when the manager ends: a late submit() may still write to the wake-up pipe,
        # and a closed descriptor number can be reused by an unrelated file.
        for fd in (getattr(self, "_wake_r", None), getattr(self, "_wake_w", None)):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _dispatch(self) -> None:
        for worker in list(self._workers):  # a copy: _retire() below removes from the list
            if not self._pending:
                return
            if not worker.ready or worker.task is not None:
                continue
            while self._pending:
                task = self._pending.popleft()
                if not task.future.set_running_or_notify_cancel():
                    continue  # cancelled by the caller
                worker.task, worker.task_id = task, next(self._ids)
                worker.deadline = time.monotonic() + self.hard_timeout_s
                try:
                    worker.send_conn.send((worker.task_id, task.gold, task.pred, task.options))
                except OSError:
                    self._retire(worker, Verdict(False, "error", "worker pipe closed"))
                break

    def _receive(self, worker: _Worker, failed_starts: int) -> int:
        try:
            message = worker.recv_conn.recv()
        except (EOFError, OSError):
            code = worker.proc.poll()
            if not worker.ready:
                failed_starts += 1
            self.stats["crashes"] += 1
            self._retire(worker, Verdict(False, "error", f"worker exited (code {code})"))
            return failed_starts
        if message[0] == "ready":
            worker.ready = True
            return 0
        task_id, status, equal, detail = message
        if worker.task is not None and task_id == worker.task_id:
            task, worker.task, worker.task_id = worker.task, None, None
            task.future.set_result(Verdict(bool(equal), status, detail))
        return failed_starts

    def _retire(self, worker: _Worker, verdict: Verdict) -> None:
        """Kill a worker and answer its item; the main loop starts a replacement."""
        worker.kill()
        if worker in self._workers:
            self._workers.remove(worker)
        if worker.task is not None and not worker.task.future.done():
            worker.task.future.set_result(verdict)
        worker.task = None

    def _fail_pending(self, exc: Exception) -> None:
        while self._pending:
            task = self._pending.popleft()
            if not task.future.done():
                task.future.set_exception(exc)

    def _shutdown_workers(self) -> None:
        for worker in self._workers:
            try:
                worker.send_conn.send(None)  # polite stop; kill() below covers a worker that is busy
            except OSError:
                pass
        deadline = time.monotonic() + 0.5
        for worker in self._workers:
            try:
                worker.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            if worker.task is not None and not worker.task.future.done():
                worker.task.future.set_exception(RuntimeError("VerifyPool closed"))
            worker.kill()
        self._workers.clear()


# ---- the process-wide pool used by gapo.rewards ----

_POOL: VerifyPool | None = None
_POOL_LOCK = threading.Lock()


def _env_number(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


def get_pool() -> VerifyPool:
    """The shared pool, started on first use; sized and timed by ``GAPO_MATH_WORKERS``,
    ``GAPO_MATH_SOFT_TIMEOUT_S``, ``GAPO_MATH_HARD_TIMEOUT_S``, ``GAPO_MATH_MEMORY_MB`` if set."""
    global _POOL
    pool = _POOL
    if pool is not None and pool.pid == os.getpid() and not pool._broken and not pool._closing:
        return pool
    with _POOL_LOCK:
        pool = _POOL
        if pool is None or pool.pid != os.getpid() or pool._broken or pool._closing:
            if pool is not None and pool.pid == os.getpid():
                pool.close()
            pool = _POOL = VerifyPool(
                num_workers=int(_env_number("GAPO_MATH_WORKERS", 0)) or None,
                soft_timeout_s=_env_number("GAPO_MATH_SOFT_TIMEOUT_S", 3.0),
                hard_timeout_s=_env_number("GAPO_MATH_HARD_TIMEOUT_S", 6.0),
                memory_limit_mb=int(_env_number("GAPO_MATH_MEMORY_MB", 1024)),
            )
        return pool


def shutdown_pool() -> None:
    """Close the shared pool (registered with atexit; safe to call twice)."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None and pool.pid == os.getpid():
        pool.close()


def _forget_pool_in_child() -> None:
    # After os.fork() the child has the pool object but not its manager thread nor its workers.
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


atexit.register(shutdown_pool)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)

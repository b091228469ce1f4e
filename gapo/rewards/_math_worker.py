"""Worker process of :mod:`gapo.rewards.verify_pool`: checks ``(gold, pred)`` answers with math-verify.

Run as a script by the pool (``python _math_worker.py FD_IN FD_OUT SOFT_TIMEOUT_S MEMORY_MB HOOKS``),
never imported by the trainer. It imports only the standard library and math-verify, so it starts in
~0.3 s without torch. Why a separate process at all:

- math-verify interrupts slow parses with ``signal`` alarms, which only work in a main thread; here
  every check runs in this process's main thread, whatever thread the trainer called from;
- some inputs hang inside C code (``9^{9^{9^9}}`` is one big-integer power) where no signal is
  delivered: the pool then kills this process, which only a process allows;
- ``RLIMIT_AS`` turns a memory blow-up into a ``MemoryError`` here instead of in the trainer.

Protocol (pickled tuples over two pipes): the worker first sends ``("ready", pid)``; then for each
request ``(task_id, gold, pred)`` it answers ``(task_id, status, equal, detail)`` with status one of
``ok`` / ``timeout`` / ``error``. ``None`` or end-of-file on the input pipe ends the worker, so it also
exits when the parent dies.
"""

import os
import sys

# Run as a script, Python puts this file's folder first on sys.path; a sibling module named like a
# stdlib one (``code.py``, ``math.py``) would then shadow it in every import below.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

import logging
import resource
import signal
import time
from collections import OrderedDict
from multiprocessing.connection import Connection

GOLD_CACHE_SIZE = 4096  # parsed gold answers kept; a prompt's k rollouts share one gold
HOOK_PREFIX = "__gapo_test_hook__:"  # requests with this gold drive test behaviours (only when enabled)


class SoftTimeout(BaseException):
    """Raised by the alarm. A BaseException, so math-verify's ``except Exception`` cannot swallow it."""


def _on_alarm(signum, frame):
    raise SoftTimeout()


def _set_memory_limit(memory_mb: int) -> None:
    if memory_mb <= 0:
        return
    limit = memory_mb * 1024 * 1024
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _die_with_parent() -> None:
    """Best effort (Linux): get SIGKILL when the pool's manager thread / parent process goes away."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001, S110  not Linux / no libc: the EOF on the input pipe still ends us
        pass


class Checker:
    """math-verify with its own alarms off: one alarm here bounds parse + verify of one item."""

    def __init__(self, soft_timeout_s: float, hooks: bool):
        # math-verify warns once when its alarms are off, and on every parse failure at debug level:
        # the alarm below replaces its timeouts, and failures are reported through the status.
        logging.getLogger("math_verify").setLevel(logging.ERROR)
        from math_verify import parse, verify

        self._parse, self._verify = parse, verify
        self.soft_timeout_s = soft_timeout_s
        self.hooks = hooks
        self._gold = OrderedDict()
        signal.signal(signal.SIGALRM, _on_alarm)
        self._parse("$1$", parsing_timeout=None)  # ANTLR warm-up (~60 ms) before reporting ready

    def _parse_math(self, text: str):
        # Inline-math delimiters: measured best wrapping (``\boxed{}`` loses ``25\%``, bare text loses
        # ``\frac12`` and intervals); see gapo.rewards.math_answer.
        return self._parse("$" + text + "$", parsing_timeout=None)

    def _parsed_gold(self, gold: str):
        if gold in self._gold:
            self._gold.move_to_end(gold)
            return self._gold[gold]
        try:
            parsed = self._parse_math(gold)
        except SoftTimeout:
            # Remembered as unparseable: the k rollouts of this prompt then fail fast, not k alarms.
            self._gold[gold] = []
            raise
        self._gold[gold] = parsed
        if len(self._gold) > GOLD_CACHE_SIZE:
            self._gold.popitem(last=False)
        return parsed

    def _hook(self, command: str):
        """Test behaviours: ``sleep_blocked:S`` ignores the alarm for S seconds (a stuck worker)."""
        name, _, arg = command.partition(":")
        if name == "sleep_blocked":
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(float(arg))
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
            return "ok", False, "slept"
        if name == "crash":
            os._exit(3)
        return "error", False, f"unknown hook {name!r}"

    def check(self, gold: str, pred: str) -> tuple[str, bool, str]:
        if self.hooks and gold.startswith(HOOK_PREFIX):
            return self._hook(gold[len(HOOK_PREFIX):])
        try:
            signal.setitimer(signal.ITIMER_REAL, self.soft_timeout_s)
            try:
                parsed_gold = self._parsed_gold(gold)
                if not parsed_gold:
                    return "error", False, "gold not parsed"
                parsed_pred = self._parse_math(pred)
                if not parsed_pred:
                    return "ok", False, "pred not parsed"
                # Gold first: math-verify is not symmetric (assignments, intervals from relations).
                equal = bool(self._verify(parsed_gold, parsed_pred, timeout_seconds=None, allow_set_relation_comp=True))
                return "ok", equal, ""
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except SoftTimeout:
            # Also reached when the one-shot alarm fires inside the ``finally`` above.
            return "timeout", False, f"over {self.soft_timeout_s:g} s"
        except MemoryError:
            return "error", False, "memory limit"
        except Exception as exc:  # noqa: BLE001  a parser bug on odd input must not end the worker
            return "error", False, f"{type(exc).__name__}: {exc}"[:200]


def main(argv: list[str]) -> int:
    fd_in, fd_out, soft_timeout_s, memory_mb, hooks = argv[1:6]
    conn_in = Connection(int(fd_in), writable=False)
    conn_out = Connection(int(fd_out), readable=False)
    _die_with_parent()
    checker = Checker(float(soft_timeout_s), hooks == "1")
    _set_memory_limit(int(memory_mb))  # after the imports: they are trusted and need their memory
    conn_out.send(("ready", os.getpid()))
    while True:
        try:
            request = conn_in.recv()
        except (EOFError, OSError):
            return 0
        if request is None:
            return 0
        task_id, gold, pred = request
        conn_out.send((task_id, *checker.check(gold, pred)))


if __name__ == "__main__":
    sys.exit(main(sys.argv))

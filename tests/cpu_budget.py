"""A CPU-time budget for a block of code in the test process (``ITIMER_PROF``): the block is interrupted once the
process has used ``seconds`` of CPU in it, whatever else the machine runs (a wall-clock bound would depend on the
machine being idle). CPython's regular-expression engine checks for signals while it matches, so a runaway match is
interrupted too. Main thread only (signals)."""

from __future__ import annotations

import contextlib
import signal


class OutOfCPU(Exception):
    """The block used its CPU budget."""


@contextlib.contextmanager
def cpu_budget(seconds: float):
    """Raise :class:`OutOfCPU` inside the block once it has used ``seconds`` CPU seconds."""
    def on_prof(signum, frame):
        raise OutOfCPU(f"over {seconds} CPU seconds")

    old = signal.signal(signal.SIGPROF, on_prof)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)


def over_budget(fn, seconds: float) -> bool:
    """Whether ``fn()`` needs more than ``seconds`` CPU seconds (it is interrupted there)."""
    try:
        with cpu_budget(seconds):
            fn()
    except OutOfCPU:
        return True
    return False

"""Room for a loaded machine in the math reward's worker pool, for tests whose items are all legitimate.

The pool's default soft timeout (3 s a parse + verify, wall clock) is right for training and wrong for a test suite
that runs beside trainings on 2 cores: CI saw it fire on items needing milliseconds to a second of CPU
(polynomial_factored, solved_radical_bounds, and a SmolLM2 answer, "To solve this arithmetic logic expression (5 - 3)
followed by 2", at f3832d1). A 60 s soft / 120 s hard limit no load uses up on such items. Only the tests of the timeout
paths use short limits, and what they expect to time out is slow by construction.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest

ROOMY_SOFT_S, ROOMY_HARD_S = 60.0, 120.0
ROOMY = {"soft_timeout_s": ROOMY_SOFT_S, "hard_timeout_s": ROOMY_HARD_S}


@contextmanager
def roomy_shared_pool():
    """The shared pool (``get_pool``: what ``compute_score`` grades with) built with :data:`ROOMY` through its
    environment variables, and closed after (the next user builds one with the defaults again)."""
    from gapo.rewards.math import verify_pool

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GAPO_MATH_SOFT_TIMEOUT_S", str(ROOMY_SOFT_S))
        mp.setenv("GAPO_MATH_HARD_TIMEOUT_S", str(ROOMY_HARD_S))
        verify_pool.shutdown_pool()  # one built earlier, with other limits
        try:
            yield
        finally:
            verify_pool.shutdown_pool()

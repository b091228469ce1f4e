"""gapo.supervisor: hard wall-clock limit, rollout-server failure detection, process and shared-memory clean-up.

Small stand-in commands (python -c) play the run: one that hangs, one that logs a vLLM engine's fatal error and
then hangs as verl does, one that leaves a grandchild in another session, one that leaks a /dev/shm segment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid

import psutil
import pytest

from gapo.supervisor import (
    MARKER_ENV,
    RolloutServerFailed,
    RunTimedOut,
    SupervisedRun,
    find_fatal_error,
)


def run(tmp_path, code: str, **kwargs) -> SupervisedRun:
    return SupervisedRun([sys.executable, "-c", code], dict(os.environ), tmp_path / "run.log", **kwargs)


def _wait_for_flag(flag) -> str:
    """Python lines that wait until ``flag`` exists (60 s at most): a run that must be seen by the supervisor's
    sampler holds what it shows until the test saw the sampler see it, instead of for a fixed time that a sampler
    delayed by load could miss."""
    return (f"end = time.time() + 60\nwhile not os.path.exists({str(flag)!r}) and time.time() < end:\n"
            "    time.sleep(0.05)\n")


def _raise_flag_when(seen, flag) -> threading.Thread:
    """Touch ``flag`` once ``seen()`` is true (or after 60 s, so the run ends and the test's assertion tells)."""
    def watch():
        end = time.monotonic() + 60
        while not seen() and time.monotonic() < end:
            time.sleep(0.05)
        flag.touch()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_normal_run_returns_its_exit_code_and_memory(tmp_path):
    # it holds its 50 MiB until the sampler saw them (it slept 3 s: a sampler slowed by load could miss them)
    flag = tmp_path / "seen"
    code = f"import os, time\nx = bytearray(50 * 2**20)\n{_wait_for_flag(flag)}raise SystemExit(3)\n"
    supervised = run(tmp_path, code, sample_memory_s=0.2)
    watcher = _raise_flag_when(lambda: supervised.peak_pss > 50 * 2**20, flag)
    result = supervised.wait(poll_s=0.1)
    watcher.join()
    assert result.returncode == 3
    assert result.peak_pss_bytes > 50 * 2**20  # the 50 MiB buffer was seen
    assert result.leaked_shm_removed == []


def test_a_hanging_run_is_killed_at_its_wall_clock_limit(tmp_path):
    # The run must print before its 3 s limit (the tail is checked): 100x the 0.03 s an interpreter takes here to
    # start and print. It then sleeps 600 s, so only the limit ends it within the bound of 60 s.
    start = time.time()
    supervised = run(tmp_path, "import time; print('working', flush=True); time.sleep(600)", timeout_s=3)
    with pytest.raises(RunTimedOut, match="wall-clock limit of 3 s") as err:
        supervised.wait(poll_s=0.1)
    assert time.time() - start < 60
    assert "working" in str(err.value)  # the log's tail is quoted
    assert supervised.processes() == []


def test_a_fatal_server_error_ends_a_run_that_would_hang_within_the_grace(tmp_path):
    code = ("import time; print('(vLLMHttpServer pid=1) (Worker pid=2) ERROR AssertionError: Attempted to load "
            "weight (torch.Size([64, 64])) into parameter (torch.Size([0]))', flush=True); time.sleep(600)")
    start = time.time()
    supervised = run(tmp_path, code, timeout_s=300, grace_s=2)
    with pytest.raises(RolloutServerFailed, match="vLLM weight sync failed; the run did not exit within 2 s"):
        supervised.wait(poll_s=0.1)
    assert time.time() - start < 60  # far below the 300 s limit
    assert supervised.processes() == []


def test_a_fatal_line_written_across_several_polls_is_still_found(tmp_path):
    # the log is read incrementally: a line cut between two reads must still match
    code = ("import sys, time; sys.stdout.write('(Worker pid=2) ERROR EngineDe'); sys.stdout.flush(); time.sleep(1); "
            "print('adError: engine core died', flush=True); time.sleep(600)")
    supervised = run(tmp_path, code, timeout_s=300, grace_s=1)
    with pytest.raises(RolloutServerFailed, match="vLLM engine died"):
        supervised.wait(poll_s=0.1)
    assert supervised.processes() == []


def test_a_run_that_exits_by_itself_after_an_error_returns_normally(tmp_path):
    result = run(tmp_path, "print('EngineDeadError: engine core died', flush=True); raise SystemExit(1)",
                 grace_s=30).wait(poll_s=0.1)
    assert result.returncode == 1  # the caller sees the exit code and the log; nothing was killed early


def test_every_process_of_the_run_dies_even_outside_its_process_group(tmp_path):
    # a grandchild in a session of its own (as some servers start themselves) still carries the run's marker
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
            "start_new_session=True); print('started', flush=True); time.sleep(600)")
    supervised = run(tmp_path, code, timeout_s=4)
    with pytest.raises(RunTimedOut):
        supervised.wait(poll_s=0.1)
    leftovers = [p for p in psutil.process_iter() if _marker(p) == supervised.token]
    assert leftovers == []


def _marker(proc):
    try:
        return proc.environ().get(MARKER_ENV)
    except psutil.Error:
        return None


def _make_segment(name: str, var: str = "m") -> str:
    """Python that creates the segment and leaves it behind at exit (not cleaned up by the resource tracker)."""
    return ("from multiprocessing import shared_memory as s, resource_tracker as r; "
            f"{var} = s.SharedMemory(name='{name}', create=True, size=4096); r.unregister({var}._name, 'shared_memory')")


def test_leaked_shared_memory_is_removed_and_other_programs_segments_are_kept(tmp_path):
    tag = uuid.uuid4().hex[:8]
    seen, unseen = f"gapo_test_seen_{tag}", f"psm_gapo_test_{tag}"  # held while sampled; a leaky prefix, never seen
    held, other = f"gapo_test_held_{tag}", f"gapo_test_other_{tag}"
    # another program holds one segment for the whole run, and leaves one (unheld) while the run is alive: a POSIX
    # semaphore's creator looks like that (mapped under a temporary name). Neither may be removed.
    holder = subprocess.Popen([sys.executable, "-c", (
        f"import time; {_make_segment(held)}; {_make_segment(other, 'o')}; o.close(); "
        "print('ok', flush=True); time.sleep(600)")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ok"
        # `seen` is held until the sampler saw it (it was held 1.5 s: a sampler slowed by load could miss it)
        flag = tmp_path / "seen"
        supervised = run(tmp_path, f"import os, time; {_make_segment(seen)}\n{_wait_for_flag(flag)}"
                                   f"{_make_segment(unseen, 'u')}\n", sample_memory_s=0.2)
        watcher = _raise_flag_when(lambda: seen in supervised.shm_held, flag)
        result = supervised.wait(poll_s=0.1)
        watcher.join()
        assert result.returncode == 0
        assert result.leaked_shm_removed == sorted([seen, unseen])
        assert not os.path.exists(f"/dev/shm/{seen}") and not os.path.exists(f"/dev/shm/{unseen}")
        assert os.path.exists(f"/dev/shm/{held}") and os.path.exists(f"/dev/shm/{other}")
    finally:
        holder.kill()
        holder.wait()
        for name in (held, other, seen, unseen):
            if os.path.exists(f"/dev/shm/{name}"):
                os.unlink(f"/dev/shm/{name}")


@pytest.mark.parametrize("line, name", [
    ("(vLLMHttpServer pid=7) RuntimeError: Engine core initialization failed. See root cause above.",
     "vLLM engine failed to start"),
    ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.", "vLLM engine died"),
    ("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.", "a Ray actor died"),
    ("ValueError: Unsupported CPU attention configuration: head_dim=16", "vLLM rejected the model"),
])
def test_fatal_errors_are_named(line, name):
    found = find_fatal_error(f"step 1 ok\n{line}\nmore\n")
    assert found is not None and found[0] == name and line in found[1]


def test_ordinary_logs_are_not_fatal():
    log = ("INFO update_weights took 0.02 s\nWARNING: kv cache usage 3%\n(vLLMHttpServer pid=1) INFO engine ready\n"
           "training/rollout_probs_diff_max: 1.5e-08\n")
    assert find_fatal_error(log) is None

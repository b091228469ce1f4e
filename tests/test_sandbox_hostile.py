"""Hostile programs against the code sandbox: each scores 0 and leaves the host as it was.

Each attack runs many times in a row (``REPEAT``, as one batch over the sandbox's slots) because the
leaks found earlier (zombies counted against RLIMIT_NPROC) only broke runs after ~15 repetitions;
after every batch, no process of a slot uid may be left and a correct program must still pass.
Needs bubblewrap and user namespaces (skipped otherwise, with the reason).
"""

import json
import os
import socket
import threading
import time

import pytest

from gapo.rewards.code.score import score_code_batch
from gapo.rewards.sandbox.client import Sandbox, SandboxConfig, SandboxUnavailable
from tests.conftest import missing_tool, started_sandbox

REPEAT = 20
SUM_TESTS = json.dumps({"inputs": ["3\n1 2 3\n"], "outputs": ["6\n"]})  # TACO stdin/stdout shape
SUM_RIGHT = "import sys\nprint(sum(map(int, sys.stdin.read().split()[1:])))\n"
CALL_TESTS = json.dumps([{"type": "function_call", "fn_name": "f", "input": [2, 3], "output": [5]}])
HE_TESTS = {"prompt": "def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n",
            "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
            "entry_point": "add"}
# The box's own limits are short (0.5 s a test), for the attacks: each is slow by construction (it loops, sleeps
# 600 s, forks or allocates forever) or fails by itself, so only its score is checked. Programs that must finish (the
# right answers, the probes whose output is checked) get ROOMY limits, which no load uses up on a program that needs
# well under a second.
CONFIG = SandboxConfig(test_timeout_s=0.5, problem_timeout_s=2.0, memory_mb=256)
ROOMY = {"test_timeout_s": 30.0, "problem_timeout_s": 60.0}
# An attack batch must end within this bound: REPEAT runs over the slots, each stopped at its 0.5 s limit, take 8 s at
# most here beside another test run (a fork bomb); one run that escaped its limits would hold the batch until the
# scorer's batch limit (BATCH_LIMIT_S, which its sleeps of 600 s outlast). 120 s is 15x the first and half the second.
ATTACK_BOUND_S = 120.0
BATCH_LIMIT_S = 240.0


def _fence(code: str) -> str:
    return f"```python\n{code}```"


def test_concurrent_executors_claim_distinct_uids():
    """Reward workers each run an executor: they must never share a slot uid (a cleaner would kill the other's
    programs). A second executor started while the first lives gets other uids."""
    if os.geteuid() != 0:
        pytest.skip("uids per slot need root")
    first, second = Sandbox(CONFIG), Sandbox(CONFIG)
    try:
        first.start()
        second.start()
    except SandboxUnavailable as exc:
        missing_tool(f"no code sandbox here: {exc}")
    try:
        a, b = set(first.probe["uids"]), set(second.probe["uids"])
        assert len(a) == CONFIG.slots and len(b) == CONFIG.slots and not a & b
    finally:
        first.close()
        second.close()


@pytest.fixture(scope="module")
def box():
    sandbox = started_sandbox(CONFIG)
    yield sandbox
    sandbox.close()


def slot_processes(sandbox: Sandbox) -> list[str]:
    """Processes (pid: name) whose real uid is one of the uids this sandbox's executor claimed."""
    found = []
    uids = set(sandbox.probe.get("uids", []))
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["Uid"].split()[0]) in uids:
            found.append(f"{entry}: {fields['Name'].strip()}")
    return found


def run_hostile(box, code: str, tests=SUM_TESTS, repeat: int = REPEAT, **limits) -> list[dict]:
    """``code`` ``repeat`` times in one batch (under the box's short limits unless ``limits`` says otherwise, and the
    scorer's batch limit BATCH_LIMIT_S), then nothing of it may be left and a right program must still pass."""
    results = score_code_batch([_fence(code)] * repeat, [tests] * repeat, sandbox=box, batch_timeout_s=BATCH_LIMIT_S,
                               **limits)
    assert slot_processes(box) == [], "a sandboxed process outlived its batch"
    healthy = score_code_batch([_fence(SUM_RIGHT)] * 4, [SUM_TESTS] * 4, sandbox=box, **ROOMY)
    assert [r["score"] for r in healthy] == [1.0] * 4, "the sandbox stopped working after the attack"
    return results


ATTACKS = {
    "infinite_loop": "while True:\n    pass\n",
    "sleep": "import time\ntime.sleep(600)\nprint(6)\n",
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "thread_bomb": ("import threading, time\nwhile True:\n"
                    "    threading.Thread(target=time.sleep, args=(600,)).start()\n"),
    "memory_bomb": "x = []\nwhile True:\n    x.append(bytearray(10 ** 7))\n",
    "output_flood": "while True:\n    print('6' * 10000)\n",
    "daemonise_then_answer_wrong": ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                                    "        time.sleep(600)\n    os._exit(0)\nprint(7)\n"),
    "kill_parents": ("import os, signal\nfor pid in (os.getppid(), 1, -1, 0):\n    try:\n"
                     "        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\nprint(7)\n"),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_scores_zero_and_leaves_nothing(box, name):
    start = time.monotonic()
    executor = box._proc
    results = run_hostile(box, ATTACKS[name])
    assert [r["score"] for r in results] == [0.0] * REPEAT
    assert box._proc is executor and executor.poll() is None, "the executor was killed"
    # REPEAT runs over the slots, each bounded by the per-test limit (+ launch and cleanup): see ATTACK_BOUND_S (it
    # was REPEAT / slots x (limit + 0.5 s) + 5 s, 15 s here: 2x what a fork bomb takes beside another test run)
    assert time.monotonic() - start < ATTACK_BOUND_S


def test_timeouts_are_flagged(box):
    results = score_code_batch([_fence(ATTACKS["sleep"])] * 2, [SUM_TESTS] * 2, sandbox=box)
    assert all(r["timeout"] and r["score"] == 0.0 for r in results)


def test_host_files_cannot_be_written_read_or_deleted(box, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("original\n")
    answers = tmp_path / "expected_outputs.json"
    answers.write_text('{"secret_expected": "6"}')
    os.chmod(tmp_path, 0o777)
    code = (
        "import os, glob\nhits = []\n"
        f"for act in ('write', 'delete'):\n    try:\n"
        f"        if act == 'write':\n            open({str(victim)!r}, 'w').write('pwned')\n"
        f"        else:\n            os.remove({str(victim)!r})\n        hits.append(act)\n    except OSError:\n        pass\n"
        f"for path in ({str(answers)!r}, '/etc/passwd', '/root/.bashrc'):\n    try:\n"
        "        hits.append(open(path).read())\n    except OSError:\n        pass\n"
        "for top in set(os.listdir('/')) - {'proc', 'usr', 'dev', 'sys', 'bin', 'sbin', 'lib', 'lib64'}:\n"
        "    hits += glob.glob(f'/{top}/**/*expected*', recursive=True)\n"
        "for path in ('/usr/pwned', '/main.py'):\n    try:\n        open(path, 'w').write('x')\n"
        "        hits.append(path)\n    except OSError:\n        pass\n"
        "print(6 if hits else 0)\nprint(hits)\n"
    )
    results = run_hostile(box, code, **ROOMY)  # room to finish: a score of 0 is then "nothing found", not a timeout
    assert [r["score"] for r in results] == [0.0] * REPEAT
    assert victim.read_text() == "original\n"
    assert not os.path.exists("/usr/pwned")
    raw = box.run(code, ["3\n1 2 3\n"], **ROOMY)[0]
    assert raw.exited_ok and raw.stdout.decode().split("\n")[1] == "[]", raw


def test_environment_and_proc_do_not_leak_secrets(monkeypatch):
    secret = "gapo-secret-" + os.urandom(8).hex()
    monkeypatch.setenv("GAPO_TEST_SECRET", secret)
    sandbox = Sandbox(CONFIG)  # started with the secret in this process's environment
    try:
        sandbox.start()
    except SandboxUnavailable as exc:
        missing_tool(f"no code sandbox here: {exc}")
    code = ("import os, glob\nprint(dict(os.environ))\n"
            "for path in glob.glob('/proc/*/environ') + glob.glob('/proc/*/cmdline') + ['/proc/1/environ']:\n"
            "    try:\n        print(path, open(path, 'rb').read())\n    except OSError as e:\n        print(path, e)\n")
    try:
        for result in sandbox.run(code, [""] * REPEAT, **ROOMY):
            assert result.exited_ok, result
            assert b"/proc/1/environ" in result.stdout
            assert secret.encode() not in result.stdout and secret.encode() not in result.stderr
            assert b"GAPO_TEST_SECRET" not in result.stdout
    finally:
        sandbox.close()


def test_network_is_unreachable(box):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    connections = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                connections.append(listener.accept()[1])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    code = ("import socket\nok = 0\n"
            f"for host in ('127.0.0.1', 'localhost', {socket.gethostname()!r}, '1.1.1.1'):\n"
            "    try:\n        s = socket.create_connection((host, "
            f"{port}), timeout=0.2)\n        ok = 1\n    except OSError:\n        pass\nprint(6 if ok else 0)\n")
    try:
        results = run_hostile(box, code, **ROOMY)  # room to try every host: a score of 0 is then "unreachable"
    finally:
        stop.set()
        thread.join()
        listener.close()
    assert [r["score"] for r in results] == [0.0] * REPEAT
    assert connections == []


def test_big_unread_stdin_does_not_hang(box):
    # Right programs, under ROOMY's 30 s a test (a hang scores 0 there); the call's bound, 25 s, is 20x what it takes
    # beside another test run and below that limit (it was 5 s, under 0.5 s a test: 4x, and a start under load could
    # miss the limit).
    tests = json.dumps({"inputs": ["x" * (10 << 20)], "outputs": ["6\n"]})
    start = time.monotonic()
    results = score_code_batch([_fence("print(6)\n")] * 4, [tests] * 4, sandbox=box, **ROOMY)
    assert [r["score"] for r in results] == [1.0] * 4
    assert time.monotonic() - start < 25


CALL_ATTACKS = {
    "exit_before_checks": "import sys\nsys.exit(0)\n",
    "os_exit_before_checks": "import os\nos._exit(0)\n",
    "eq_always_true": "class A:\n    def __eq__(self, other):\n        return True\ndef f(a, b):\n    return A()\n",
    "int_subclass_eq": "class I(int):\n    def __eq__(self, other):\n        return True\ndef f(a, b):\n    return I(0)\n",
    "atexit_fake_marker": ("import atexit, os\natexit.register(lambda: (print('5'), os._exit(0)))\n"
                           "def f(a, b):\n    raise SystemExit(0)\n"),
}


@pytest.mark.parametrize("name", sorted(CALL_ATTACKS))
def test_call_based_cheats_fail(box, name):
    results = run_hostile(box, CALL_ATTACKS[name], tests=CALL_TESTS, repeat=5)
    assert [r["score"] for r in results] == [0.0] * 5
    right = score_code_batch([_fence("def f(a, b):\n    return a + b\n")], [CALL_TESTS], sandbox=box, **ROOMY)
    assert right[0]["score"] == 1.0


HE_ATTACKS = {
    "exit_before_checks": "import sys\nsys.exit(0)\n",
    "eq_always_true": "class A:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return A()\n",
    "metaclass_eq": ("class M(type):\n    def __eq__(cls, other):\n        return True\n    __hash__ = type.__hash__\n"
                     "class A(metaclass=M):\n    def __eq__(self, other):\n        return True\n"
                     "def add(a, b):\n    return A()\n"),
    "atexit_exit_zero": ("import atexit, os, sys\n"
                         "atexit.register(lambda: (print(open('/main.py').read()[-80:]), os._exit(0)))\n"
                         "def add(a, b):\n    return 0\n"),
    "read_token_from_stdin": "import sys\nprint(sys.stdin.read())\ndef add(a, b):\n    return 0\n",
}


@pytest.mark.parametrize("name", sorted(HE_ATTACKS))
def test_humaneval_cheats_fail(box, name):
    results = run_hostile(box, HE_ATTACKS[name], tests=HE_TESTS, repeat=5)
    assert [r["score"] for r in results] == [0.0] * 5
    right = score_code_batch([_fence("def add(a, b):\n    return a + b\n")], [HE_TESTS], sandbox=box, **ROOMY)
    assert right[0]["score"] == 1.0


def test_refuses_without_isolation(monkeypatch):
    monkeypatch.delenv("GAPO_ALLOW_UNSANDBOXED", raising=False)
    sandbox = Sandbox(SandboxConfig(bwrap="/nonexistent/bwrap"))
    with pytest.raises(SandboxUnavailable, match="GAPO_ALLOW_UNSANDBOXED=1") as info:
        score_code_batch([_fence(SUM_RIGHT)], [SUM_TESTS], sandbox=sandbox)
    assert "Refusing to run untrusted code" in str(info.value)
    assert "bubblewrap not found" in str(info.value)


def test_unsandboxed_only_when_allowed(monkeypatch):
    monkeypatch.setenv("GAPO_ALLOW_UNSANDBOXED", "1")
    sandbox = Sandbox(SandboxConfig(bwrap="/nonexistent/bwrap", test_timeout_s=0.5, problem_timeout_s=2.0,
                                    memory_mb=256))
    with pytest.warns(RuntimeWarning, match="WITHOUT isolation"):
        sandbox.start()
    try:
        assert sandbox.mode == "unsandboxed"
        # the right program under ROOMY limits, the daemon under the box's own (its sleep outlasts them)
        results = score_code_batch([_fence(SUM_RIGHT)], [SUM_TESTS], sandbox=sandbox, **ROOMY)
        results += score_code_batch([_fence(ATTACKS["daemonise_then_answer_wrong"])], [SUM_TESTS], sandbox=sandbox)
        assert [r["score"] for r in results] == [1.0, 0.0]
        if os.geteuid() == 0:
            assert slot_processes(sandbox) == []  # the uid cleaner still removes daemons
    finally:
        sandbox.close()

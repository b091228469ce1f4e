"""Cluster launch (launch/): submit.sh against a real Ray cluster on this machine (train, then resume across an
epoch boundary, with hydra overrides from the submit command line), and static / stubbed checks of the
shell scripts, the runtime env, the Slurm bootstrap and the KubeRay manifest."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from recipe.smoke import missing_shards
from tests.conftest import missing_tool
import yaml

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "launch"
SUBMIT = LAUNCH / "submit.sh"
SBATCH = LAUNCH / "slurm_ray.sbatch"
VENV_BIN = Path(sys.executable).parent  # the python running the tests: its `ray` and `python3` start the cluster

spec = importlib.util.spec_from_file_location("launch_ray_job", LAUNCH / "ray_job.py")
ray_job = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ray_job)


def _env(**extra) -> dict:
    """This environment with the venv first on PATH (an activated venv) and no Ray address of the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def _run(cmd, env, timeout=240, **kw) -> subprocess.CompletedProcess:
    """The command, waited for; ``timeout`` only stops a hang (a few seconds idle: no load reaches 240 s)."""
    return subprocess.run([str(c) for c in cmd], check=False, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, **kw)


# --------------------------------------------------------------------------------------- static checks
@pytest.mark.parametrize("script", [SUBMIT, SBATCH], ids=lambda p: p.name)
def test_shellcheck(script):
    if shutil.which("shellcheck") is None:
        missing_tool("shellcheck not installed (Debian/Ubuntu: apt-get install shellcheck)")
    proc = subprocess.run(["shellcheck", "--shell=bash", str(script)], check=False, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_unknown_experiment_is_refused_with_the_list_of_experiments():
    proc = _run([SUBMIT, "math/no_such_run", "trainer.total_epochs=1"], _env(RAY_ADDRESS="http://127.0.0.1:1"))
    assert proc.returncode == 2
    assert "unknown experiment 'math/no_such_run'" in proc.stderr
    listed = set(re.findall(r"^  (\S+)$", proc.stderr, flags=re.MULTILINE))
    assert {"gapo_trainer", "smoke_cpu", "math/r1_1.5b_gapo"} <= listed
    assert not listed & {"base/gapo", "model/r1_distill_qwen_1.5b", "platform/cpu"}  # config groups are no runs


def test_ray_address_is_required():
    proc = _run([SUBMIT, "smoke_cpu"], _env())
    assert proc.returncode == 2 and "RAY_ADDRESS is not set" in proc.stderr


def test_submit_command_line_runtime_env_and_overrides(tmp_path):
    """submit.sh with a recording `ray`: what it hands to `ray job submit`."""
    calls = tmp_path / "calls.jsonl"
    fake_ray = tmp_path / "ray"
    fake_ray.write_text(f'#!{sys.executable}\nimport json, sys\n'
                        f'open({str(calls)!r}, "a").write(json.dumps(sys.argv[1:]) + "\\n")\n')
    fake_ray.chmod(0o755)
    env = _env(RAY_ADDRESS="http://10.1.2.3:8265", RAY=str(fake_ray), PYTHON=sys.executable, JOB_ID="job-1",
               CKPT_ROOT="/shared/ckpt", WANDB_MODE="offline", GAPO_DATA_DIR="/shared/data",
               EXTRA_ENV="VERL_PLATFORM=cpu NCCL_SOCKET_IFNAME='eth0 ib0'")
    proc = _run([SUBMIT, "--no-wait", "math/r1_1.5b_gapo.yaml", "trainer.total_epochs=1", "data.seed=3"], env)
    assert proc.returncode == 0, proc.stderr
    assert "submitted job: job-1" in proc.stdout and "job logs --address http://10.1.2.3:8265 --follow job-1" in proc.stdout
    (argv,) = [json.loads(line) for line in calls.read_text().splitlines()]
    sep = argv.index("--")
    opts, entry = argv[:sep], argv[sep + 1:]
    assert opts[:2] == ["job", "submit"] and "--no-wait" in opts
    assert opts[opts.index("--address") + 1] == "http://10.1.2.3:8265"
    assert opts[opts.index("--submission-id") + 1] == "job-1"
    assert opts[opts.index("--working-dir") + 1] == str(ROOT)
    runtime_env = json.loads(opts[opts.index("--runtime-env-json") + 1])
    env_vars = runtime_env["env_vars"]
    assert env_vars["WANDB_MODE"] == "offline" and env_vars["GAPO_DATA_DIR"] == "/shared/data"  # passed through
    assert env_vars["VERL_PLATFORM"] == "cpu" and env_vars["NCCL_SOCKET_IFNAME"] == "eth0 ib0"  # EXTRA_ENV
    assert env_vars["TOKENIZERS_PARALLELISM"] == "false" and env_vars["RAY_OVERRIDE_JOB_RUNTIME_ENV"] == "1"
    assert "/data" in runtime_env["excludes"] and "RAY_ADDRESS" not in env_vars
    assert entry[:5] == ["python3", "-m", "recipe.main_gapo", "--config-name", "math/r1_1.5b_gapo"]
    assert entry[5:] == ["++ray_kwargs.ray_init.num_cpus=null", "++ray_kwargs.ray_init.num_gpus=null",
                         "trainer.default_local_dir=/shared/ckpt/${trainer.project_name}/${trainer.experiment_name}",
                         "trainer.total_epochs=1", "data.seed=3"]  # the user's overrides last: they win


def test_runtime_env_merge_rules():
    base = {"excludes": ["/data"], "env_vars": {"A": 1, "B": "base"}}
    env = ray_job.build_runtime_env(base, ["B", "C", "UNSET"], ray_job.parse_assignments("C=x D='two words'"),
                                    environ={"B": "shell", "C": "shell"})
    assert env == {"excludes": ["/data"], "env_vars": {"A": "1", "B": "shell", "C": "x", "D": "two words"}}
    with pytest.raises(ray_job.LaunchError, match="NAME=VALUE"):
        ray_job.parse_assignments("JUSTANAME")
    with pytest.raises(ray_job.LaunchError, match="RAY_ADDRESS"):
        ray_job.build_runtime_env(base, [], {"RAY_ADDRESS": "x"}, environ={})
    assert ray_job.relative_paths({"GAPO_DATA_DIR": "data", "HF_HOME": "/h", "WANDB_MODE": "offline"}) == [
        "GAPO_DATA_DIR"]


def test_working_dir_upload_keeps_the_code_and_skips_the_rest():
    """Ray's own packaging walk with launch/runtime_env.yaml's excludes and no .gitignore: what a job uploads."""
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    excludes = yaml.safe_load((LAUNCH / "runtime_env.yaml").read_text())["excludes"]
    files = []
    _dir_travel(ROOT, [_get_excludes(ROOT, excludes)], lambda p: p.is_file() and files.append(p),
                include_gitignore=False)
    rel = {p.relative_to(ROOT).as_posix() for p in files}
    git = subprocess.run(["git", "ls-files"], check=False, cwd=ROOT, capture_output=True, text=True)
    tracked = set(git.stdout.split())
    if tracked:
        assert tracked - {".gitignore"} <= rel, sorted(tracked - rel)[:10]
    for needed in ("recipe/main_gapo.py", "gapo/data/__init__.py", "configs/smoke_cpu.yaml", "launch/ray_job.py"):
        assert needed in rel, needed  # "/data" is anchored: the package gapo/data is uploaded
    top = {r.split("/")[0] for r in rel}
    assert not top & {".venv", ".venv-vllm", ".git", "runs", "outputs", "checkpoints", "data", "wandb"}, top
    assert not any("__pycache__" in r for r in rel)
    assert sum(p.stat().st_size for p in files) < 64 * 2**20  # Ray refuses more than 512 MiB


def test_wait_for_resources_polls_until_all_gpus_or_times_out():
    now = [0.0]
    seen = iter([0, 8, 16, 24])
    assert ray_job.wait_for(lambda: next(seen), 24, timeout=100, interval=5, clock=lambda: now[0],
                            sleep=lambda s: now.__setitem__(0, now[0] + s)) == 24
    now[0] = 0.0
    with pytest.raises(TimeoutError, match="8 of 16 GPUs joined the Ray cluster within 10 s"):
        ray_job.wait_for(lambda: 8, 16, timeout=10, interval=5, clock=lambda: now[0],
                         sleep=lambda s: now.__setitem__(0, now[0] + s))


# --------------------------------------------------------------------------------------- KubeRay manifest
# (path, type) pairs every GAPO RayJob must have; "[]" steps into each element of a list.
RAYJOB_SCHEMA = [
    ("apiVersion", str), ("kind", str), ("metadata.name", str),
    ("spec.entrypoint", str), ("spec.shutdownAfterJobFinishes", bool), ("spec.ttlSecondsAfterFinished", int),
    ("spec.runtimeEnvYAML", str),
    ("spec.rayClusterSpec.headGroupSpec.rayStartParams", dict),
    ("spec.rayClusterSpec.headGroupSpec.template.spec.containers", list),
    ("spec.rayClusterSpec.headGroupSpec.template.spec.containers.[].name", str),
    ("spec.rayClusterSpec.headGroupSpec.template.spec.containers.[].image", str),
    ("spec.rayClusterSpec.workerGroupSpecs", list),
    ("spec.rayClusterSpec.workerGroupSpecs.[].groupName", str),
    ("spec.rayClusterSpec.workerGroupSpecs.[].replicas", int),
    ("spec.rayClusterSpec.workerGroupSpecs.[].minReplicas", int),
    ("spec.rayClusterSpec.workerGroupSpecs.[].maxReplicas", int),
    ("spec.rayClusterSpec.workerGroupSpecs.[].rayStartParams", dict),
    ("spec.rayClusterSpec.workerGroupSpecs.[].template.spec.containers.[].image", str),
    ("spec.rayClusterSpec.workerGroupSpecs.[].template.spec.containers.[].resources.limits", dict),
]


def _at(doc, path: str) -> list:
    """Values at a dotted path; "[]" fans out over a list. Raises KeyError naming the missing path."""
    values = [doc]
    for i, key in enumerate(path.split(".")):
        if key == "[]":
            values = [v for value in values for v in value]
            continue
        missing = [v for v in values if not isinstance(v, dict) or key not in v]
        if missing:
            raise KeyError(".".join(path.split(".")[: i + 1]))
        values = [v[key] for v in values]
    return values


def test_kuberay_rayjob_manifest():
    doc = yaml.safe_load((LAUNCH / "kuberay_rayjob.yaml").read_text())
    problems = []
    for path, typ in RAYJOB_SCHEMA:
        try:
            values = _at(doc, path)
        except KeyError as err:
            problems.append(f"missing {err}")
            continue
        problems += [f"{path}: {type(v).__name__}, expected {typ.__name__}" for v in values if type(v) is not typ]
    assert not problems, problems
    spec = doc["spec"]
    assert (doc["apiVersion"], doc["kind"]) == ("ray.io/v1", "RayJob") and spec["shutdownAfterJobFinishes"] is True
    # rayStartParams are strings for KubeRay
    params = [spec["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]]
    params += [g["rayStartParams"] for g in spec["rayClusterSpec"]["workerGroupSpecs"]]
    assert all(isinstance(v, str) for p in params for v in p.values())
    # the entry point is the recipe's, with a real experiment, and its node/GPU counts match the worker group
    entry = spec["entrypoint"].split()
    assert entry[:3] == ["python3", "-m", "recipe.main_gapo"] and entry[3] == "--config-name"
    assert (ROOT / "configs" / f"{entry[4]}.yaml").exists()
    overrides = dict(arg.split("=", 1) for arg in entry[5:])
    (group,) = spec["rayClusterSpec"]["workerGroupSpecs"]
    (container,) = group["template"]["spec"]["containers"]
    gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert int(overrides["trainer.nnodes"]) == group["replicas"] == group["minReplicas"] == group["maxReplicas"]
    assert int(overrides["trainer.n_gpus_per_node"]) == gpus == int(group["rayStartParams"]["num-gpus"])
    assert overrides["trainer.default_local_dir"].startswith("/")  # resume needs a path later jobs see
    # the runtime env has the launch env vars of launch/runtime_env.yaml, as strings
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    base = yaml.safe_load((LAUNCH / "runtime_env.yaml").read_text())["env_vars"]
    assert {k: str(v) for k, v in base.items()}.items() <= runtime_env["env_vars"].items()
    assert all(isinstance(v, str) for v in runtime_env["env_vars"].values())


# --------------------------------------------------------------------------------------- Slurm bootstrap
STUBS = {
    # scontrol show hostnames NODELIST -> the fake allocation's nodes
    "scontrol": '[[ "$1 $2" == "show hostnames" ]] && printf "%s\\n" $FAKE_NODES',
    # srun: record; `hostname` answers an address; `ray start --block` blocks like the real step
    "srun": 'echo "srun $*" >> "$FAKE_LOG"\n'
            'case " $* " in *" hostname "*) echo "10.0.0.1 fe80::1";;\n'
            '  *" start "*) echo "step $$" >> "$FAKE_LOG"; exec sleep 300;; esac',
    # the python helper: record; the wait for GPUs succeeds unless FAKE_JOIN_RC says otherwise. Like the real wait,
    # it returns only once the steps that bring those GPUs have started (the head's for one node's GPUs, the workers'
    # too for more): the script's teardown must not race a step's start (60 s at most, then it returns anyway)
    "python": 'echo "python $*" >> "$FAKE_LOG"\n'
              'if [[ " $* " =~ " wait-resources ".*--gpus\\ ([0-9]+) ]]; then\n'
              '  want=1; (( BASH_REMATCH[1] > GPUS_PER_NODE )) && want=2\n'
              '  for _ in $(seq 600); do (( $(grep -c "^step " "$FAKE_LOG") >= want )) && break; sleep 0.1; done\n'
              'fi\n'
              'exit "${FAKE_JOIN_RC:-0}"',
    # submit.sh: record args and the env it got; FAKE_SUBMIT_SLEEP makes it run long
    "submit": 'echo "submit $* | RAY_ADDRESS=$RAY_ADDRESS JOB_ID=$JOB_ID AUTH=$RAY_AUTH_MODE:${#RAY_AUTH_TOKEN}" '
              '>> "$FAKE_LOG"; sleep "${FAKE_SUBMIT_SLEEP:-0}"; exit "${FAKE_SUBMIT_RC:-0}"',
    "ray": 'echo "ray $*" >> "$FAKE_LOG"',
}


@pytest.fixture
def fake_slurm(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls.log"
    log.touch()
    env = _env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", FAKE_LOG=str(log), FAKE_NODES="gpu-a gpu-b gpu-c",
               SLURM_JOB_NODELIST="gpu-[a-c]", SLURM_JOB_ID="4242", SLURM_SUBMIT_DIR=str(ROOT), GPUS_PER_NODE="8",
               PYTHON=str(bin_dir / "python"), SUBMIT=str(bin_dir / "submit"), RAY="ray")

    def run(*args, wait=True, **extra):
        cmd = ["bash", str(SBATCH), *args]
        if not wait:
            return subprocess.Popen(cmd, env={**env, **extra}, cwd=ROOT, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
        return subprocess.run(cmd, check=False, env={**env, **extra}, cwd=ROOT, capture_output=True, text=True,
                              timeout=240)  # stops a hang only (the stubs answer at once)

    def calls():
        return log.read_text().splitlines()

    run.log = log
    return run, calls


def _stubs_alive(log: Path) -> list[int]:
    """Pids of this test's stub processes still running (they carry FAKE_LOG=log in their environment)."""
    alive = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get("FAKE_LOG") == str(log):
                alive.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return alive


def _torn_down(log: Path) -> bool:
    # a wait, not a bound: it returns as soon as the stubs are gone (at once idle); 60 s leaves load no say
    deadline = time.time() + 60
    while _stubs_alive(log) and time.time() < deadline:
        time.sleep(0.1)
    return not _stubs_alive(log)


def test_slurm_bootstrap_head_workers_wait_submit_teardown(fake_slurm):
    run, calls = fake_slurm
    proc = run("math/r1_1.5b_gapo", "trainer.total_epochs=1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = calls()
    srun = [c for c in log if c.startswith("srun ")]
    assert srun[0] == "srun --nodes=1 --ntasks=1 -w gpu-a hostname --ip-address"
    # The head and worker steps run in the background, so their stubs may log in either order: find them by
    # content, and check the order that matters (workers start only after the head's GPUs are up).
    (head,) = [c for c in srun if " ray start --head " in c]
    (workers,) = [c for c in srun if " ray start --address=" in c]
    assert head.startswith("srun --nodes=1 --ntasks=1 -w gpu-a ray start --head --node-ip-address=10.0.0.1 "
                           "--port=6379 ") and "--num-gpus=8" in head and head.endswith("--block")
    assert workers.startswith("srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --exclude=gpu-a ray start "
                              "--address=10.0.0.1:6379 --num-gpus=8") and workers.endswith("--block")
    waits = [c for c in log if "wait-resources" in c]
    assert [w.split("--gpus ")[1].split()[0] for w in waits] == ["8", "24"]  # head up, then all 3 x 8 GPUs
    assert log.index(waits[0]) < log.index(workers)
    assert all("--address 10.0.0.1:6379" in w for w in waits)
    (submit,) = [c for c in log if c.startswith("submit ")]
    assert submit.startswith("submit math/r1_1.5b_gapo trainer.nnodes=3 trainer.n_gpus_per_node=8 "
                             "trainer.total_epochs=1 | RAY_ADDRESS=http://10.0.0.1:8265 JOB_ID=gapo-slurm-4242 "
                             "AUTH=token:64")
    assert log.index(waits[-1]) < log.index(submit)  # submitted only once every GPU joined
    assert any(c.startswith("step ") for c in log) and _torn_down(run.log), "Ray steps left running"


def test_slurm_single_node_and_failing_job(fake_slurm):
    run, calls = fake_slurm
    proc = run("smoke_cpu", FAKE_NODES="gpu-a", SLURM_JOB_NODELIST="gpu-a", FAKE_SUBMIT_RC="1")
    assert proc.returncode == 1  # the job's status
    assert not any("--exclude" in c for c in calls())  # no worker step on one node
    assert any(c.startswith("submit smoke_cpu trainer.nnodes=1 trainer.n_gpus_per_node=8 |") for c in calls())
    assert _torn_down(run.log)


def test_slurm_gives_up_when_gpus_do_not_join(fake_slurm):
    run, calls = fake_slurm
    proc = run("smoke_cpu", FAKE_JOIN_RC="1")
    assert proc.returncode == 1
    assert not any(c.startswith("submit ") for c in calls())
    assert _torn_down(run.log)


def test_slurm_cancel_stops_the_job_and_the_cluster(fake_slurm):
    run, calls = fake_slurm
    proc = run("smoke_cpu", wait=False, FAKE_SUBMIT_SLEEP="60")
    deadline = time.time() + 120  # waits for the submission (a second idle), however busy the machine
    while time.time() < deadline and not any(c.startswith("submit ") for c in calls()):
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)  # what scancel / the time limit sends
    assert proc.wait(timeout=120) == 143
    assert "ray job stop --address http://10.0.0.1:8265 gapo-slurm-4242" in calls()
    assert _torn_down(run.log)


# --------------------------------------------------------------------------------------- real Ray cluster
# End to end: the session's submitted 2-node run (conftest's ``lost_node``, tests/cluster_runs.py), which
# tests/test_cluster_nodes.py also reads: a `ray start` cluster with token auth, run1 followed by submit.sh (it lost a
# node in step 3 and FAILED), run2 submitted with --no-wait and polled, resuming at the epoch boundary.


@pytest.mark.slow
def test_overrides_from_the_submit_command_line_reach_the_trainer(lost_node):
    log = lost_node["run1_log"]
    # the trainer's resolved config (printed by verl's task runner) and what it did with it
    assert "'experiment_name': 'launch_e2e'" in log and "'train_max_samples': 16" in log
    assert "'total_training_steps': 3" in log and "'nnodes': 2" in log
    assert "train dataset size: 16" in log and "Total training steps: 3" in log


@pytest.mark.slow
def test_a_no_wait_submission_prints_its_id_and_returns(lost_node):
    assert lost_node["run2_submit_exit"] == 0, lost_node["run2_submit_log"][-3000:]
    assert re.fullmatch(r"gapo-smoke_cpu-\d{8}-\d{6}-\d+", lost_node["run2_job_id"] or ""), lost_node["run2_job_id"]
    assert "Training from scratch" not in lost_node["run2_submit_log"]  # it returned at submission, not at the end


@pytest.mark.slow
def test_first_job_trains_and_checkpoints(lost_node):
    assert "Training from scratch" in lost_node["run1_log"]
    assert sorted(lost_node["run1_metrics"]) == [1, 2]
    assert all(m["training/epoch"] == 0 for m in lost_node["run1_metrics"].values())
    assert missing_shards(lost_node["ckpt"], 2, world_size=2) == []
    assert (lost_node["ckpt"] / "global_step_2" / "data.pt").exists()


@pytest.mark.slow
def test_second_job_resumes_at_the_epoch_boundary_and_trains_the_next_epoch(lost_node):
    ckpt = lost_node["ckpt"]
    assert lost_node["run2_status"] == "SUCCEEDED", lost_node["run2_log"][-4000:]
    assert f"Resuming from {ckpt}/global_step_2, setting global step to 2" in lost_node["run2_log"]
    # verl issues #5725/#7401 (0 steps after an epoch-boundary resume) would show here as no step 3
    assert sorted(lost_node["run2_metrics"]) == [3]
    assert lost_node["run2_metrics"][3]["training/epoch"] == 1
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"

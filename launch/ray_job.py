#!/usr/bin/env python3
"""Helpers for the launch scripts (launch/submit.sh, launch/slurm_ray.sbatch); stdlib + PyYAML + Ray only.

    python launch/ray_job.py runtime-env [--base launch/runtime_env.yaml] [--passthrough "A B"] [--extra "K=V ..."]
        print the job's runtime env as JSON: the base file, the passed-through variables of this shell that are
        set, then the EXTRA_ENV assignments (later wins)
    python launch/ray_job.py status --address http://HEAD:8265 JOB_ID
        print the job's status (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED)
    python launch/ray_job.py wait-resources --address HEAD:6379 --gpus N [--timeout 600]
        wait until the cluster reports at least N GPUs (all nodes joined); exit 1 with what is there on timeout
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BASE = ROOT / "launch" / "runtime_env.yaml"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Set by Ray in the job itself: a value given here would point the job's driver at the wrong place.
RESERVED = {"RAY_ADDRESS", "RAY_JOB_CONFIG_JSON_ENV_VAR"}


class LaunchError(ValueError):
    """A launch setting that cannot work; the message says which and why."""


def parse_assignments(text: str) -> dict[str, str]:
    """``"A=1 B='x y'"`` -> ``{"A": "1", "B": "x y"}`` (shell quoting rules); rejects anything else."""
    env = {}
    for item in shlex.split(text or ""):
        name, sep, value = item.partition("=")
        if not sep or not ENV_NAME.fullmatch(name):
            raise LaunchError(f"EXTRA_ENV: {item!r} is not NAME=VALUE")
        env[name] = value
    return env


def build_runtime_env(base: dict, passthrough: list[str], extra: dict[str, str], environ=None) -> dict:
    """The job's runtime env: ``base`` with its env_vars updated by the set passthrough variables, then ``extra``.

    Values become strings (Ray's env_vars must be str). working_dir is left to ``ray job submit --working-dir``.
    """
    environ = os.environ if environ is None else environ
    env = {k: str(v) for k, v in (base.get("env_vars") or {}).items()}
    env.update({name: environ[name] for name in passthrough if name in environ})
    env.update(extra)
    bad = sorted(RESERVED & env.keys())
    if bad:
        raise LaunchError(f"{', '.join(bad)} must not be set in the job's env: Ray sets it for the job")
    return {**base, "env_vars": env}


def relative_paths(env: dict[str, str]) -> list[str]:
    """Names of *_DIR / *_PATH variables with a relative value: the job resolves them in its uploaded copy."""
    return [k for k, v in env.items() if re.search(r"_(DIR|PATH|HOME)$", k) and v and not v.startswith(("/", "~"))
            and "://" not in v]


def runtime_env_main(args) -> None:
    import yaml

    base = yaml.safe_load(Path(args.base).read_text()) or {}
    runtime_env = build_runtime_env(base, args.passthrough.split(), parse_assignments(args.extra))
    for name in relative_paths(runtime_env["env_vars"]):
        print(f"warning: {name}={runtime_env['env_vars'][name]} is relative; the job resolves it inside its "
              "uploaded working dir, which is neither shared nor kept: give an absolute path", file=sys.stderr)
    print(json.dumps(runtime_env))


def status_main(args) -> None:
    from ray.job_submission import JobSubmissionClient

    print(JobSubmissionClient(args.address).get_job_status(args.job_id).value)


def wait_for(get_gpus: Callable[[], float], gpus: float, timeout: float, interval: float = 5.0,
             clock=time.monotonic, sleep=time.sleep) -> float:
    """Poll ``get_gpus()`` until it reaches ``gpus``; return it, or raise TimeoutError after ``timeout`` seconds."""
    deadline = clock() + timeout
    while True:
        have = get_gpus()
        if have >= gpus:
            return have
        if clock() >= deadline:
            raise TimeoutError(f"{have:g} of {gpus:g} GPUs joined the Ray cluster within {timeout:g} s")
        sleep(interval)


def wait_resources_main(args) -> None:
    import ray

    deadline = time.monotonic() + args.timeout
    while True:  # the head may still be starting
        try:
            ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
            break
        except (ConnectionError, RuntimeError) as err:
            if time.monotonic() >= deadline:
                sys.exit(f"error: no Ray head at {args.address} within {args.timeout:g} s: {err}")
            time.sleep(args.interval)
    try:
        left = max(deadline - time.monotonic(), 0.0)
        have = wait_for(lambda: ray.cluster_resources().get("GPU", 0.0), args.gpus, left, args.interval)
    except TimeoutError as err:
        sys.exit(f"error: {err}; nodes alive: {sum(n['Alive'] for n in ray.nodes())}")
    finally:
        ray.shutdown()
    print(f"Ray cluster ready: {have:g} GPUs", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="launch/ray_job.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("runtime-env", help="print the job's runtime env as JSON")
    p.add_argument("--base", default=str(DEFAULT_BASE))
    p.add_argument("--passthrough", default="", help="names of variables of this shell to pass on when set")
    p.add_argument("--extra", default="", help="NAME=VALUE assignments, shell-quoted, e.g. \"A=1 B='x y'\"")
    p.set_defaults(run=runtime_env_main)
    p = sub.add_parser("status", help="print a job's status")
    p.add_argument("--address", required=True, help="the Ray dashboard, http://HEAD:8265")
    p.add_argument("job_id")
    p.set_defaults(run=status_main)
    p = sub.add_parser("wait-resources", help="wait until N GPUs have joined")
    p.add_argument("--address", required=True, help="the Ray head, HEAD:6379")
    p.add_argument("--gpus", type=float, required=True)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--interval", type=float, default=5.0)
    p.set_defaults(run=wait_resources_main)
    args = parser.parse_args(argv)
    try:
        args.run(args)
    except LaunchError as err:
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()

"""Run untrusted (model-written) programs isolated by bubblewrap, with per-run limits and nothing left behind.

- ``client``: the reward process's side (``Sandbox``, ``SandboxConfig``, ``RunResult``, ``get_sandbox``); stdlib
  only, and nothing of this package (it also runs alone, loaded by its path);
- ``_executor``: the dedicated executor process's loop (config, message protocol, slots, scheduling, deadlines),
  started as ``python -I -S`` by the client; it launches, limits, times and reaps the runs with its siblings:
- ``policy``: what a run may see and do (the bubblewrap command line, environment, stdin, rlimits' values);
- ``process``: process control (clone3 into a cgroup, the launcher's steps to ``execve``, slot uids, finding and
  killing processes);
- ``cgroups``: the per-slot cgroups (v2 or v1: where they go, their limits, emptying and removal).

The executor and its siblings import only the standard library and each other, by plain name when run as a script
(``_executor`` puts their folder on ``sys.path``). Guarantees and their tests: docs/rewards.md.
"""

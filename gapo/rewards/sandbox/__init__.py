"""Run untrusted (model-written) programs isolated by bubblewrap, with per-run limits and nothing left behind.

- ``client``: the reward process's side (``Sandbox``, ``SandboxConfig``, ``RunResult``, ``get_sandbox``); stdlib only;
- ``_executor``: the dedicated executor process that launches, limits, times and reaps the runs (started as
  ``python -I -S`` by the client; stdlib only, so it imports nothing of this package).
Guarantees and their tests: docs/rewards.md.
"""

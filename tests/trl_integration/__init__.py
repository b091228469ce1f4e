"""Tests run in .venv-trl (make test-trl). Not named `trl`: a script run from tests/ (tests/actor_update_cpu_run.py)
has tests/ on its path and would import this folder as the trl package."""

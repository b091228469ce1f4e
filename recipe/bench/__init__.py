"""Benchmarks, each run as `python -m recipe.bench.<name>` (`make bench`, `make bench-rollout`)."""

"""Seeded studies on CPU, each run as `python -m recipe.studies.<name>` (`make study`, `make study-vigor`)."""

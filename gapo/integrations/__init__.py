"""GAPO for training frameworks other than verl; each submodule imports its framework, none imports verl.

- `gapo.integrations.trl`: `GAPOGRPOTrainer` and `GAPOTRLConfig`, GAPO as Hugging Face TRL's `GRPOTrainer` loss
  (`pip install -e '.[trl]'`; docs/trl.md).
"""

"""verl's start-up chatter that says nothing about a GAPO run, lowered in every process that loads the plug-in.

`import verl` loads this plug-in (gapo/verl_plugin/__init__.py calls :func:`quiet_verl_startup` first) before verl
imports its engines or detects its platform, so the filters below are in place in the driver of every entry point
and in every Ray worker. Only these messages go, each named exactly:

- ``verl.workers.engine`` (warnings module, UserWarning): "<name> engine is not available: ModuleNotFoundError(...)",
  one for each optional training engine verl probes on import (torchtitan, veomni, automodel, mindspeed, megatron);
  GAPO trains with FSDP. Ten lines per process, before any message of ours.
- logger ``verl.plugin.platform.platform_manager``: "No supported accelerator detected ... Falling back to 'nvidia'"
  and "Platform ... is registered but not available" (a driver or actor without GPUs: the cluster's GPUs are
  checked, with the fix, by gapo.verl_plugin.preflight.check_cluster_gpus), and the INFO "Platform override from
  VERL_PLATFORM" (the variable the user set).

Every other warning and log record of verl stays. To see these again: run python with ``-W`` or ``PYTHONWARNINGS``
(then the warning filters are left as given), or set ``VERL_LOGGING_LEVEL`` (then the platform logger is left alone).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

ENGINE_WARNING = r"\w+ engine is not available: "  # verl/workers/engine/__init__.py, one per optional engine
ENGINE_MODULE = r"verl\.workers\.engine$"
PLATFORM_LOGGER = "verl.plugin.platform.platform_manager"
PLATFORM_MESSAGES = (  # the records' unformatted msg, as verl/plugin/platform/platform_manager.py logs them
    "No supported accelerator detected.",
    "Platform '%s' (%s) is registered but not available.",
    "Platform override from VERL_PLATFORM:",
)


class _DropPlatformChatter(logging.Filter):
    """Drops the platform manager's records that start with one of PLATFORM_MESSAGES."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(PLATFORM_MESSAGES)


def quiet_verl_startup() -> None:
    """Install the filters (idempotent); see the module docstring for what goes and how to see it again."""
    if not sys.warnoptions:
        warnings.filterwarnings("ignore", message=ENGINE_WARNING, category=UserWarning, module=ENGINE_MODULE)
    if "VERL_LOGGING_LEVEL" not in os.environ:
        logger = logging.getLogger(PLATFORM_LOGGER)
        if not any(isinstance(f, _DropPlatformChatter) for f in logger.filters):
            logger.addFilter(_DropPlatformChatter())

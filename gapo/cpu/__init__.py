"""CPU support for running verl's stock trainer without accelerators (development and tests only).

Importing this package registers, in the importing process:
- the verl platform "cpu" (``gapo.cpu.platform``), used when ``VERL_PLATFORM=cpu``;
- the rollout engine "hf" (``gapo.cpu.hf_rollout``) in verl's two rollout registries.
Both registrations are inert unless selected. Only when ``VERL_PLATFORM=cpu`` is set does it also make
verl's worker process group plain "gloo" (see ``platform.use_plain_gloo_process_group``).

Registries are per process, so this must be imported in every Ray worker too: set
``VERL_USE_EXTERNAL_MODULES=gapo.cpu`` (workers inherit it; ``import verl`` imports the module).
"""

from verl.workers.rollout.base import _ROLLOUT_REGISTRY
from verl.workers.rollout.replica import RolloutReplicaRegistry

from gapo.cpu.platform import PlatformCPU, cpu_platform_requested, use_plain_gloo_process_group


def _load_hf_replica():
    from gapo.cpu.hf_rollout import HFReplica

    return HFReplica


_ROLLOUT_REGISTRY[("hf", "async")] = "gapo.cpu.hf_rollout.HFServerAdapter"
RolloutReplicaRegistry.register("hf", _load_hf_replica)

if cpu_platform_requested():
    use_plain_gloo_process_group()

__all__ = ["PlatformCPU"]

"""CPU platform for verl: lets the stock trainer (Ray, FSDP2 actor) run on machines without accelerators.

Role: development and tests only. Selected with ``VERL_PLATFORM=cpu`` (verl's platform manager reads it);
``VERL_ENGINE_DEVICE=cuda`` must be set as well, because verl registers its FSDP engine for the device
names "cuda"/"npu" only and picks the engine by device name.

verl talks to the accelerator through ``get_platform().device_module`` with torch.cuda-style calls
(memory stats, rng state, streams, ...). ``torch.cpu`` answers only some of them, so ``CPUDeviceModule``
adds the rest with CPU meanings (no device memory, the CPU RNG).
"""

import os
from contextlib import contextmanager
from typing import Any, Optional

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

PLATFORM_NAME = "cpu"


def cpu_platform_requested() -> bool:
    """True when this process is configured to run verl on the CPU platform."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME


class CPUDeviceModule:
    """torch.cuda-like namespace for the CPU: what torch.cpu lacks is answered here, the rest delegated.

    Answers: the allocator statistics (``memory_allocated``, ``memory_reserved``, ``max_memory_*``) are 0 and their
    resets (``reset_peak_memory_stats``, ``empty_cache``, ...) and ``set_per_process_memory_fraction`` do nothing,
    as there is no device memory apart from host memory; ``mem_get_info`` reports host memory;
    ``get_device_name`` is "cpu"; the RNG calls (``get_rng_state``, ``set_rng_state``, ``manual_seed``,
    ``manual_seed_all``) act on the CPU generator. Any other attribute is ``torch.cpu``'s.
    """

    # No device memory separate from host memory: the allocator statistics are all zero.
    @staticmethod
    def memory_allocated(device=None) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def reset_peak_memory_stats(device=None) -> None:
        pass

    reset_accumulated_memory_stats = empty_cache = ipc_collect = reset_peak_memory_stats

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device=None) -> None:
        pass

    @staticmethod
    def mem_get_info(device=None) -> tuple[int, int]:
        """(free, total) bytes of host memory, so memory logging reports something meaningful."""
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page

    @staticmethod
    def get_device_name(device=None) -> str:
        return "cpu"

    # The device RNG is the CPU generator.
    @staticmethod
    def get_rng_state(device=None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device=None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    def __getattr__(self, name: str) -> Any:
        # is_available, synchronize, current_device, set_device, device_count, Stream, stream, Event, ...
        return getattr(torch.cpu, name)


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl platform whose device is the host CPU; collectives over gloo.

    Each method answers verl's ``PlatformBase`` interface with the CPU's value: the device is "cpu" (name, vendor,
    ``current_device``; one device; no capability), ``device_module`` is a ``CPUDeviceModule``; the platform is
    always available but never auto-detected (``is_platform_available`` is False: only ``VERL_PLATFORM=cpu``
    selects it); seeding seeds the CPU generator; device selection, synchronisation, allocator settings, cache
    release, NVTX ranges and the profiler do nothing; no CUDA IPC and no cudart. Ray places workers on logical
    "GPU" resources under ``CUDA_VISIBLE_DEVICES`` (no ``ray_noset_envvars``), so verl's resource pools need no
    change.
    """

    _device_module = CPUDeviceModule()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> CPUDeviceModule:
        return self._device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        # Never auto-detected: only an explicit VERL_PLATFORM=cpu selects it (GPU runs stay untouched).
        return False

    def current_device(self) -> str:
        # "cpu", like torch.cpu.current_device(): verl passes this to tensor.to(...), where an int means cuda:N.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        pass

    def synchronize(self, device_index: Optional[int] = None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets CUDA_VISIBLE_DEVICES for the logical GPUs it hands out; harmless without CUDA.
        return "CUDA_VISIBLE_DEVICES"

    def ray_resource_name(self) -> str:
        # Workers are placed on logical GPUs (ray_init.num_gpus=N) so verl's resource pools need no change.
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def cudart(self) -> Any:
        return None


def use_plain_gloo_process_group() -> None:
    """Make verl's worker process group plain "gloo" (targeted monkeypatch, CPU platform only).

    ``verl.utils.distributed.initialize_global_process_group_ray`` defaults its backend to
    ``f"cpu:gloo,{device}:{backend}"``, which is ``"cpu:gloo,cpu:gloo"`` here, and torch rejects the
    duplicate device type. verl offers no hook for it (the FSDP worker calls the function with no backend),
    so we change the function's default ``backend`` argument in place. Editing ``__defaults__`` of the
    function object, rather than rebinding the name, also reaches modules that imported it already.
    """
    from verl.utils import distributed

    fn = distributed.initialize_global_process_group_ray
    names = fn.__code__.co_varnames[: fn.__code__.co_argcount]
    assert names == ("timeout_second", "backend") and fn.__defaults__ == (None, None), (
        f"verl's initialize_global_process_group_ray changed ({names}, {fn.__defaults__}); revisit this patch"
    )
    fn.__defaults__ = (None, "gloo")

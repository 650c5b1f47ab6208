"""verl's platform abstraction for a machine without accelerators (registered as ``"cpu"``).

verl 0.9.1 routes every device question through ``verl.plugin.platform.get_platform()`` and
ships platforms for CUDA, NPU and ROCm only; ``VERL_PLATFORM=cpu`` selects this one once it is
registered (``PlatformRegistry.register``, an extension point of verl). What verl asks of it:

* ``device_name`` ``"cpu"`` and ``current_device()`` ``"cpu"``: verl moves batches with
  ``.to(get_device_id())``, so the id must name the CPU (an int would mean ``cuda:<n>``);
* the Ray resource stays ``"GPU"``: verl's resource pools and worker groups ask Ray for GPUs,
  so a CPU run declares *logical* GPUs (``ray_init.num_gpus``), one per training process;
* backend ``gloo``;
* ``device_module``: a stand-in for ``torch.cuda`` with the calls verl makes on it (memory
  statistics, caches, streams, RNG, ``get_device_name``) as CPU no-ops or host equivalents.
"""

from __future__ import annotations

import contextlib
import os
import types
from typing import Any

import torch
from verl.plugin.platform import PlatformBase

__all__ = ["PlatformCPU", "CPU_DEVICE_MODULE", "PLATFORM_NAME"]

PLATFORM_NAME = "cpu"


def _host_memory() -> tuple[int, int]:
    """(free, total) bytes of host memory, for verl's memory logging."""
    try:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)
    except ImportError:  # pragma: no cover - psutil comes with ray
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return pages * size, pages * size


def _noop(*_args: Any, **_kwargs: Any) -> None:
    return None


def _zero(*_args: Any, **_kwargs: Any) -> int:
    return 0


def _build_device_module() -> types.ModuleType:
    """``torch.cpu`` plus the ``torch.cuda`` calls verl 0.9.1 makes on its device module."""
    module = types.ModuleType("recallm_cpu_device", "torch.cpu with the torch.cuda calls verl makes, as CPU no-ops")
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(module, name, getattr(torch.cpu, name))
    module.current_device = lambda: "cpu"
    module.device_count = lambda: 1
    module.is_available = lambda: True
    module.set_device = _noop
    module.synchronize = _noop
    module.empty_cache = _noop
    module.ipc_collect = _noop
    module.set_per_process_memory_fraction = _noop
    module.reset_peak_memory_stats = _noop
    module.memory_allocated = _zero
    module.memory_reserved = _zero
    module.max_memory_allocated = _zero
    module.max_memory_reserved = _zero
    module.mem_get_info = lambda *_a, **_k: _host_memory()
    module.get_device_name = lambda *_a, **_k: "CPU"
    module.get_device_capability = lambda *_a, **_k: (None, None)
    module.manual_seed = torch.manual_seed
    module.manual_seed_all = torch.manual_seed
    module.get_rng_state = lambda *_a, **_k: torch.get_rng_state()
    module.set_rng_state = lambda state, *_a, **_k: torch.set_rng_state(state)
    return module


CPU_DEVICE_MODULE = _build_device_module()


class PlatformCPU(PlatformBase):
    """verl platform for CPU-only hosts (see module doc)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return CPU_DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return True

    def current_device(self) -> str:  # type: ignore[override]  # a device string: "cpu", not an index
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets it for actors holding logical GPUs; a CPU build of torch ignores it.
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def register() -> None:
    """Register ``PlatformCPU`` under ``"cpu"`` (selected by ``VERL_PLATFORM=cpu``)."""
    from verl.plugin.platform import PlatformRegistry

    if PlatformRegistry.get(PLATFORM_NAME) is not PlatformCPU:
        PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)

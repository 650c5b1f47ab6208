"""What a plan is checked against: GPUs per node and their memory, nodes, host RAM, the free disk and the
write bandwidth at the checkpoint directory; given as flags (``recallm-plan``) or read from this node
(:func:`node_cluster`: torch's CUDA devices, ``sysconf``, a 256 MiB fsynced write). A run on the CPU is checked
against the memory this machine has available now (:func:`host_memory`: ``/proc/meminfo``)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Cluster", "node_cluster", "measure_write_bandwidth", "host_memory", "gpu_driver_loaded"]

#: where a loaded GPU driver shows itself: NVIDIA's (also inside a container given GPUs), WSL2's CUDA libraries
#: (WSL has no /proc/driver/nvidia), AMD's for ROCm
GPU_DRIVER_PATHS = ("/proc/driver/nvidia", "/usr/lib/wsl/lib", "/sys/module/amdgpu")


@dataclass(frozen=True)
class Cluster:
    """What the plan is checked against; ``source`` says where each value came from."""

    gpus_per_node: int
    nodes: int
    gpu_memory: int  # bytes per GPU
    host_ram: int  # bytes per node
    disk_free: int  # bytes at the checkpoint directory
    write_bandwidth: float  # bytes per second, one node's ranks together
    source: Mapping[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes


def _existing_parent(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def measure_write_bandwidth(directory: Path, size: int = 256 * 2**20) -> float:
    """Bytes per second of one ``size``-byte file written and fsynced in ``directory`` (removed after)."""
    target = _existing_parent(directory)
    probe = target / f".recallm-plan-probe-{os.getpid()}"
    block = os.urandom(min(size, 16 * 2**20))
    start = time.perf_counter()
    try:
        with open(probe, "wb") as fh:
            written = 0
            while written < size:
                fh.write(block)
                written += len(block)
            fh.flush()
            os.fsync(fh.fileno())
        elapsed = time.perf_counter() - start
    finally:
        probe.unlink(missing_ok=True)
    return written / max(elapsed, 1e-6)


def gpu_driver_loaded(paths: tuple[str, ...] = GPU_DRIVER_PATHS) -> bool:
    """Whether a GPU driver is loaded here: without one, torch cannot see a GPU, so the plan does not import
    torch (a second or two) to ask it."""
    return any(os.path.exists(path) for path in paths)


def host_memory(meminfo: str | Path = "/proc/meminfo") -> tuple[int, int | None]:
    """(total, available) bytes of this machine's memory: ``MemTotal`` and ``MemAvailable`` of ``/proc/meminfo``
    (available: what the kernel can give new processes without swapping, free pages and the caches it can drop;
    on a shared machine what a run started now can use). Where the file does not say: the total from ``sysconf``
    and no available figure (None)."""
    found: dict[str, int] = {}
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                name, _, rest = line.partition(":")
                fields = rest.split()
                if name in ("MemTotal", "MemAvailable") and fields and fields[0].isdigit():
                    found[name] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    except (OSError, ValueError):
        pass
    total = found.get("MemTotal") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total, found.get("MemAvailable")


def node_cluster(
    checkpoint_dir: str | None, *, measure_write: bool = True, gpus: bool = True
) -> dict[str, tuple[Any, str]]:
    """What this node says about itself: value and source per :class:`Cluster` field (missing: unknown).
    ``gpus=False`` leaves out the GPUs (asking torch costs a second or two of imports: skipped where the flags
    give both GPU values, the run trains on the CPU, or no GPU driver is loaded)."""
    found: dict[str, tuple[Any, str]] = {}
    if gpus and gpu_driver_loaded():
        try:
            import torch

            if torch.cuda.is_available():
                count = torch.cuda.device_count()
                found["gpus_per_node"] = (count, "this node (torch.cuda)")
                found["gpu_memory"] = (torch.cuda.get_device_properties(0).total_memory, "this node (torch.cuda)")
        except ImportError:
            pass
    try:
        found["host_ram"] = (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this node (sysconf)")
    except (ValueError, OSError, AttributeError):
        pass
    if checkpoint_dir not in (None, "", "???"):
        where = _existing_parent(Path(str(checkpoint_dir)))
        found["disk_free"] = (shutil.disk_usage(where).free, f"free space at {where}")
        if measure_write:
            try:
                found["write_bandwidth"] = (measure_write_bandwidth(where), f"measured at {where} (256 MiB, fsync)")
            except OSError:
                pass
    return found

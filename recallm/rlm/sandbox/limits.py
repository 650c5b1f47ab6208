"""The limits of one sandboxed REPL (all its processes together) and of each cell it runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from recallm.config import MAX_CHARS, MAX_MB, MAX_SECONDS, MAX_WORKERS, typed
from recallm.errors import RecallmError

__all__ = ["SandboxLimits"]


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one REPL (all its processes together) and of each cell it runs."""

    cpu_s: float = field(default=60.0, metadata={"max": MAX_SECONDS})
    """CPU seconds per cell"""
    wall_s: float = field(default=120.0, metadata={"max": MAX_SECONDS})
    """wall-clock seconds per cell (also cut to the task's remaining wall time)"""
    memory_mb: int = field(default=2048, metadata={"max": MAX_MB})
    """address space of each REPL process (RLIMIT_AS) and resident memory of all of them together, in MiB"""
    max_processes: int = field(default=64, metadata={"max": MAX_WORKERS})
    """processes and threads of the REPL together (and sub-calls the host serves for it at once)"""
    max_output_chars: int = field(default=100_000, metadata={"max": MAX_CHARS})
    """characters of a cell's output that leave the sandbox (the rest is counted, not sent)"""
    max_file_mb: int = field(default=256, metadata={"max": MAX_MB})
    """largest file a cell may write (RLIMIT_FSIZE), in MiB"""
    home_mb: int = field(default=256, metadata={"max": MAX_MB})
    """size of the private directory /home/rlm (a tmpfs, counted in memory_mb), in MiB"""
    tmp_mb: int = field(default=256, metadata={"max": MAX_MB})
    """size of /tmp inside the namespaces (a tmpfs, counted in memory_mb), in MiB"""
    max_message_mb: int = field(default=64, metadata={"max": MAX_MB})
    """longest message the host accepts from the REPL (a sub-call's arguments), in MiB"""
    kill_grace_s: float = field(default=2.0, metadata={"max": MAX_SECONDS})
    """after the wall-clock limit, seconds the worker gets to stop the cell before it is killed"""
    startup_timeout_s: float = field(default=30.0, metadata={"max": MAX_SECONDS})
    """seconds a fresh REPL may take to load its context"""

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any] | None, where: str = "sandbox") -> SandboxLimits:
        limits = typed(cls, cfg, where)  # (the fields' metadata ranges too)
        for name in limits.__dataclass_fields__:
            if getattr(limits, name) <= 0:
                raise RecallmError(f"{where}.{name} must be > 0, got {getattr(limits, name)}")
        if limits.memory_mb < 64:
            raise RecallmError(f"{where}.memory_mb must be >= 64 (Python itself needs some), got {limits.memory_mb}")
        if limits.max_processes < 4:
            raise RecallmError(
                f"{where}.max_processes must be >= 4 (the REPL itself uses 2 threads), got {limits.max_processes}"
            )
        return limits

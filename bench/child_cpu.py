"""CPU time of a fresh process, for the benchmarks that time commands (``bench/imports.py``,
``bench/grpo_compose.py``): on a shared machine a process's wall time is mostly waiting for a core, its CPU time
(user + system) is what it costs."""

from __future__ import annotations

import resource
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


def run_cpu_seconds(
    argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None, quiet: bool = False
) -> tuple[float, float]:
    """Run ``argv`` to completion (an error if it fails); ``(CPU seconds, wall seconds)``. ``quiet``: its output
    is captured instead of shown."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(list(argv), cwd=cwd, env=None if env is None else dict(env), check=True, capture_output=quiet)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall

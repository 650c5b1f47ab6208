"""DeepSpeed's C++ ops in the tests: where they are built, and why they cannot be.

On a CPU DeepSpeed builds two ops (shared-memory comm, ``cpu_adam``) with torch's JIT extension builder the
first time a run needs them (about 40 s alone on two cores, 75 s within ``make test``). The tests build them once
per machine and environment into
``$RECALLM_TEST_EXT_DIR``, else ``<recallm cache>/torch_extensions/<environment>`` (``recallm.gguf.cache_dir``: the
cache that ``recallm-create-model --fetch`` uses, outside the checkout; one directory per Python environment, named
by a hash of its prefix: torch rebuilds an op whose sources moved, so two checkouts' ``.venv`` sharing one directory
would rebuild each other's), shared by ``make test`` and ``make test-cluster``; torch rebuilds an op there when its
sources or flags change, and locks the directory while it builds."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import sysconfig
from pathlib import Path


def torch_extensions_dir() -> Path:
    if os.environ.get("RECALLM_TEST_EXT_DIR"):
        return Path(os.environ["RECALLM_TEST_EXT_DIR"])
    from recallm.gguf import cache_dir

    return cache_dir() / "torch_extensions" / hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]


def cpp_build_missing() -> str | None:
    """Why DeepSpeed cannot build its C++ ops on this machine (None: it can). It builds them with the C++
    compiler torch uses (``$CXX``, else ``c++``) against the Python headers; ``make test`` installs both with
    apt-get where it can (``make system-deps``)."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"DeepSpeed builds C++ ops on a CPU, but there is no C++ compiler ({compiler}): apt-get install g++"
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not header.is_file():
        return f"DeepSpeed builds C++ ops on a CPU, but there are no Python headers ({header}): apt-get install python3-dev"
    return None

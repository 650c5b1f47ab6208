"""Where the Hydra config tree lives."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CONFIG_DIR", "config_dir"]

#: ``configs/`` of the source tree (the package is installed in editable mode).
CONFIG_DIR = Path(os.environ.get("RECALLM_CONFIG_DIR", Path(__file__).resolve().parents[1] / "configs"))


def config_dir() -> Path:
    """The config tree; raises with a clear message when it is missing."""
    if not (CONFIG_DIR / "demo.yaml").is_file():
        from recallm.errors import RecallmError

        raise RecallmError(
            f"config tree not found at {CONFIG_DIR}; install recallm from its source tree (pip install -e .) "
            "or set RECALLM_CONFIG_DIR"
        )
    return CONFIG_DIR

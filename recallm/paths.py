"""Where the Hydra config tree lives.

The tree is the top-level ``configs/`` of the source checkout; a wheel carries the same files as
``recallm/configs/`` (``pyproject.toml``: hatch's ``force-include``). The lookup takes, in order,
``$RECALLM_CONFIG_DIR``, the copy inside the installed package, the source checkout's ``configs/``
(editable installs and a plain checkout on ``sys.path``).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CONFIG_DIR", "config_dir"]

_PACKAGE = Path(__file__).resolve().parent


def _find_config_dir() -> Path:
    if os.environ.get("RECALLM_CONFIG_DIR"):
        return Path(os.environ["RECALLM_CONFIG_DIR"])
    for candidate in (_PACKAGE / "configs", _PACKAGE.parent / "configs"):
        if (candidate / "demo.yaml").is_file():
            return candidate
    return _PACKAGE / "configs"  # missing: config_dir() says so


#: the config tree: inside the installed wheel, or ``configs/`` of the source checkout (module doc)
CONFIG_DIR = _find_config_dir()


def config_dir() -> Path:
    """The config tree; raises with a clear message when it is missing."""
    if not (CONFIG_DIR / "demo.yaml").is_file():
        from recallm.errors import RecallmError

        raise RecallmError(
            f"config tree not found at {CONFIG_DIR}; install recallm as a wheel (it carries recallm/configs) or from "
            "its source tree (pip install -e .), or set RECALLM_CONFIG_DIR"
        )
    return CONFIG_DIR

"""W&B's mode for a run that logs to it: online only where credentials are configured.

``wandb.init`` on a node without credentials (no ``WANDB_API_KEY``, no ``api.wandb.ai`` entry in
``~/.netrc``, where ``wandb login`` writes the key) stops the run in its first seconds, or waits for a
key on a terminal. :func:`wandb_mode` decides before anything starts, and says which in one line:

* ``WANDB_MODE`` already set: it is kept (``offline``, ``online``, ``disabled``);
* credentials found: ``online``;
* none: ``offline`` (the run writes under ``WANDB_DIR``; ``wandb sync`` uploads it later).

Used by the GRPO launcher (``recallm.grpo.app``) and SFT (``recallm.sft.train``).
"""

from __future__ import annotations

import netrc
import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["wandb_mode", "has_credentials"]

WANDB_HOST = "api.wandb.ai"


def has_credentials(env: Mapping[str, str] | None = None) -> str | None:
    """Where W&B credentials are configured (``WANDB_API_KEY``, a netrc entry), or None."""
    env = os.environ if env is None else env
    if env.get("WANDB_API_KEY"):
        return "WANDB_API_KEY"
    path = Path(env.get("NETRC") or Path(env.get("HOME") or Path.home()) / ".netrc")
    try:
        if netrc.netrc(str(path)).authenticators(WANDB_HOST):
            return str(path)
    except (OSError, netrc.NetrcParseError):
        return None
    return None


def wandb_mode(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(mode, one line saying why) for a run that logs to W&B (module doc)."""
    env = os.environ if env is None else env
    if env.get("WANDB_MODE"):
        return env["WANDB_MODE"], f"W&B {env['WANDB_MODE']} (WANDB_MODE from the environment)"
    where = has_credentials(env)
    if where:
        return "online", f"W&B online (credentials in {where})"
    return "offline", (
        "W&B offline: no credentials (WANDB_API_KEY or `wandb login`); the run is written under WANDB_DIR, "
        "upload it later with `wandb sync`"
    )

"""Step 1 of the GRPO launch (``recallm.grpo.app``), **compose**: one Hydra composition of the command's config
(verl's own ``ppo_trainer``, our reward table ``recallm.reward`` — the same ``configs/reward/*.yaml`` the data
and the scorer use —, a recipe from ``configs/grpo/`` or ``configs/rlm_train/`` and the platform it chooses from
``configs/grpo/platform/``: ``gpu``, ``cpu``, ``vllm_cpu``), every override checked
(``recallm.config.check_overrides``). The command line does it once (``recallm.cli.common.hydra_command``) and
passes the object down; :func:`compose` is the same call for code and tests. Any verl key can be overridden.
"""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig

from recallm.grpo.settings import closed

__all__ = ["compose"]


def compose(overrides: Sequence[str], *, config_name: str = "grpo") -> DictConfig:
    """The one composition of a GRPO launch: ``configs/<config_name>.yaml`` (``grpo`` or
    ``rlm_train``) with the overrides, each checked (``recallm.config.check_overrides``; register the
    schemas first, ``recallm.cli.schemas.register``). What the command line does before :func:`run`."""
    from recallm.config import check_overrides

    return check_overrides(config_name, list(overrides), closed=closed)

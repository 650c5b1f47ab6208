"""The schema of the ``recallm`` section of ``configs/grpo.yaml`` (and ``configs/rlm_train.yaml``):
RecaLLM's own keys of a GRPO run. Every other key of those configs is verl's ``ppo_trainer``
tree, typed and checked by verl (``verl.utils.config.validate_config``), not here.

Read with ``recallm.config.typed`` (``settings_of``): an unknown key under ``recallm.`` or a value of
the wrong kind is one line. The booleans have no default here: each app's YAML sets them (GRPO and
RLM training differ), so each value lives in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["GRPOSettings", "settings_of"]


@dataclass(frozen=True)
class GRPOSettings:
    """``recallm.*`` of a GRPO run."""

    recall: bool
    """the recall logits processor in rollouts and masked log-probs in training (false: the ablation)"""
    reward_manager: bool
    """the RecaLLM reward manager with the ``reward`` table (false: the agent loop scores, RLM training)"""
    cpu: bool
    """run on CPUs: the out-of-tree CPU plugin and its overrides (``recallm.grpo.cpu``)"""
    check_data: bool
    """check every data row's ground truth before Ray starts"""
    reward: dict[str, Any] = field(default_factory=dict)
    """the composite reward's table (``configs/reward/``; ``rewards.config`` is its schema)"""
    eval_step: int | None = field(default=None, metadata={"min": 1})
    """the step whose checkpoint the paper evaluates: it must be saved and kept"""
    rlm: dict[str, Any] | None = None
    """``recallm-rlm train``: the RLM sections (``recallm.rlm.train``)"""


def settings_of(cfg: Any) -> GRPOSettings:
    """The ``recallm`` section of a composed GRPO config, checked."""
    from omegaconf import OmegaConf

    from recallm.config import typed

    section = cfg.recallm
    if OmegaConf.is_config(section):
        section = OmegaConf.to_container(section, resolve=True)
    return typed(GRPOSettings, section, "recallm")

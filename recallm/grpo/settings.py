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

from recallm.config import MAX_COUNT

__all__ = ["GRPOSettings", "settings_of", "closed", "PLATFORMS"]


#: the platforms: ``configs/grpo/platform/<name>.yaml``, chosen with ``grpo/platform=<name>``
PLATFORMS = ("gpu", "cpu", "vllm_cpu")


@dataclass(frozen=True)
class GRPOSettings:
    """``recallm.*`` of a GRPO run."""

    recall_constrained: bool
    """the recall constraint: the rollout's recall logits processor and the masked log-probs of actor and
    reference (false: the "no logit masking" ablation). The one setting every engine follows: the launcher
    derives verl's keys from it (``recallm.grpo.app.recall_constraint``)."""
    reward_manager: bool
    """the RecaLLM reward manager with the ``reward`` table (false: the agent loop scores, RLM training)"""
    check_data: bool
    """check every data row's ground truth before Ray starts"""
    platform: str = field(default="gpu", metadata={"choices": PLATFORMS})
    """set by the platform group (``configs/grpo/platform/``): ``cpu`` adds the CPU plugin's environment,
    ``vllm_cpu`` also vLLM's CPU build's"""
    reward: dict[str, Any] = field(default_factory=dict)
    """the composite reward's table (``configs/reward/``; ``rewards.config.RewardConfig`` is its schema)"""
    eval_step: int | None = field(default=None, metadata={"min": 1, "max": MAX_COUNT})
    """the step whose checkpoint the paper evaluates: it must be saved and kept"""
    keep_checkpoints: int | None = field(default=None, metadata={"min": 1, "max": MAX_COUNT})
    """how many of the newest checkpoints stay on disk (``recallm.grpo.retention``, after every save, across
    requeues); the ``eval_step`` one is kept too, as weights only. null: every save is kept"""
    model_name: str | None = None
    """the paper base (``recallm.plan.PAPER_MODELS``) ``recallm-plan`` sizes the run for while
    ``actor_rollout_ref.model.path`` is not set yet"""
    console: str = field(default="summary", metadata={"choices": ("summary", "full")})
    """summary: one line per step on the console, verl's and Ray's output in
    ``<trainer.default_local_dir>/grpo.log`` (``recallm.grpo.console``); full: everything on the console"""
    rlm: dict[str, Any] | None = None
    """``recallm-rlm train``: the RLM sections (``recallm.rlm.train``)"""

    @property
    def cpu(self) -> bool:
        """Training on CPUs (the CPU plugin): platforms ``cpu`` and ``vllm_cpu``."""
        return self.platform in ("cpu", "vllm_cpu")


def closed(key: str) -> bool:
    """The keys of a GRPO config whose names ``recallm.config.check_overrides`` knows: ours, under
    ``recallm.`` (verl's keys are typed by verl's own config)."""
    return key.split(".")[0] == "recallm"


def settings_of(cfg: Any) -> GRPOSettings:
    """The ``recallm`` section of a composed GRPO config, checked."""
    from omegaconf import OmegaConf

    from recallm.config import typed

    section = cfg.recallm
    if OmegaConf.is_config(section):
        section = OmegaConf.to_container(section, resolve=True)
    return typed(GRPOSettings, section, "recallm")

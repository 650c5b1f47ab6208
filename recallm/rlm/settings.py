"""The schema of ``recallm-rlm``'s config: ``configs/rlm.yaml``'s own keys (``RLMRun``). Its
sections have their own (``RLMRun``'s doc); ``recallm-rlm train``'s ``recallm.rlm`` section is
``recallm.rlm.train.RLMTrainSettings``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recallm.config import MAX_COUNT, MAX_WORKERS

__all__ = ["MODES", "RLMRun"]

MODES = ("run", "generate", "show", "to-sft")


@dataclass(frozen=True)
class RLMRun:
    """The schema of ``configs/rlm.yaml``'s own keys, ``recallm-rlm``'s (``recallm.config.typed``;
    registered with Hydra by ``recallm.cli.schemas``). Its sections have
    theirs: ``tasks`` ``recallm.rlm.tasks.TaskRun``, ``sft_data`` ``recallm.rlm.sft_data.SFTDataSettings``,
    ``rlm``/``subcalls``/``sandbox``/``budget`` the settings classes of ``recallm.rlm``, ``root``/``sub``
    ``recallm.rlm.models.make_model``."""

    out_dir: str
    mode: str = field(default="run", metadata={"choices": MODES})
    models_dir: str = "outputs/models"
    overwrite: bool = False
    limit: int | None = field(default=None, metadata={"min": 1, "max": MAX_COUNT})
    parallel: int = field(default=1, metadata={"min": 1, "max": MAX_WORKERS})
    progress: bool = True
    tasks: dict[str, Any] = field(default_factory=dict)
    root: dict[str, Any] = field(default_factory=dict)
    sub: dict[str, Any] | None = None
    rlm: dict[str, Any] | None = None
    subcalls: dict[str, Any] | None = None
    sandbox: dict[str, Any] | None = None
    budget: dict[str, Any] | None = None
    trajectory: str | None = None
    """mode=show: the trajectory file"""
    html: str | None = None
    """mode=show: the page to write (None: next to the trajectory)"""
    sft_data: dict[str, Any] = field(default_factory=dict)
    """mode=to-sft: which trajectories, the file to write (``SFTDataSettings``)"""

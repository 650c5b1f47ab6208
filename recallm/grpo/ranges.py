"""The ranges of the verl keys a RecaLLM GRPO launch reads or sizes: each checked before Ray starts
(:func:`check_ranges`, one of ``recallm.grpo.app.CHECKS``), one line naming the key and what would work.

verl's config is typed by verl (an integer where it wants one) but not ranged: ``trainer.save_freq=-5``
never saves, ``trainer.total_training_steps=-1`` and ``actor_rollout_ref.model.lora_rank=-1`` ran as if
unset, and a LoRA rank above the model's width, or sequences longer than its positions, cost memory and time
before anything failed (``trainer.resume_mode`` is checked with the run directory:
``recallm.grpo.checkpoints.check_run_dir``).
:data:`RANGES` holds the bounds (an entry per key, the one table; ``docs/guide/safety.md`` lists it); the
model's own limits (:func:`model_problems`) come from its config, read without loading weights.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

__all__ = ["Range", "RANGES", "check_ranges", "model_problems"]


@dataclass(frozen=True)
class Range:
    """``low <= value <= high`` (``low_open``: ``low < value``); ``off``: one more value that means "never"
    (verl's ``-1``); ``null``: null allowed (verl's "not set")."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    off: int | None = None
    null: bool = False

    def problem(self, key: str, value: Any) -> str | None:
        if value is None:
            return None if self.null else f"{key} must be set, got null"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None  # verl's own typing says it (recallm.config.check_overrides)
        if isinstance(value, float) and not math.isfinite(value):
            return f"{key} must be a finite number, got {value}"
        if self.off is not None and value == self.off:
            return None
        low_ok = self.low is None or (value > self.low if self.low_open else value >= self.low)
        if low_ok and (self.high is None or value <= self.high):
            return None
        return f"{key}={value} is out of range: {self.describe()}"

    def describe(self) -> str:
        parts = []
        if self.low is not None and self.high is not None:
            parts.append(f"{'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}]")
        elif self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {_num(self.low)}")
        elif self.high is not None:
            parts.append(f"<= {_num(self.high)}")
        if self.off is not None:
            parts.append(f"or {self.off} (never)")
        if self.null:
            parts.append("or null")
        return "use " + " ".join(parts)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


#: verl keys and their ranges (``Range``); a key missing from a config (another trainer's tree) is skipped
RANGES: dict[str, Range] = {
    "trainer.total_training_steps": Range(1, null=True),
    "trainer.total_epochs": Range(1),
    "trainer.save_freq": Range(1, off=-1),
    "trainer.test_freq": Range(1, off=-1),
    "trainer.nnodes": Range(1),
    "trainer.n_gpus_per_node": Range(1),
    "trainer.max_actor_ckpt_to_keep": Range(1, null=True),
    "data.train_batch_size": Range(1),
    "data.max_prompt_length": Range(1, null=True),
    "data.max_response_length": Range(1, null=True),
    "actor_rollout_ref.model.lora_rank": Range(0),
    "actor_rollout_ref.model.lora_alpha": Range(0, low_open=True),
    "actor_rollout_ref.actor.ppo_mini_batch_size": Range(1),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": Range(1, null=True),
    "actor_rollout_ref.actor.ppo_epochs": Range(1),
    "actor_rollout_ref.actor.optim.lr": Range(0, low_open=True),
    "actor_rollout_ref.actor.clip_ratio": Range(0, low_open=True),
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": Range(1, null=True),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": Range(1, null=True),
    "actor_rollout_ref.rollout.n": Range(1, 1024),
    "actor_rollout_ref.rollout.temperature": Range(0),
    "actor_rollout_ref.rollout.top_p": Range(0, 1, low_open=True),
    "actor_rollout_ref.rollout.gpu_memory_utilization": Range(0, 1, low_open=True),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": Range(1),
}


def check_ranges(cfg: DictConfig) -> Iterator[str]:
    """Each key of :data:`RANGES` in its range, and the sizes the model bounds (:func:`model_problems`): one
    line each."""
    for key, bound in RANGES.items():
        value = OmegaConf.select(cfg, key, default="<absent>", throw_on_missing=False)
        if isinstance(value, str):  # absent here (another trainer's tree), `???`, or a string verl types itself
            continue
        problem = bound.problem(key, value)
        if problem:
            yield problem
    yield from model_problems(cfg)


def model_problems(cfg: DictConfig) -> Iterator[str]:
    """What the model allows: a LoRA rank within its width (``recallm.modeling.lora_rank_problem``), and
    the longest sequence (prompt + response) within its positions. Read from its ``config.json`` (no
    weights loaded); a model that does not read is the model check's to say."""
    from recallm.errors import RecallmError

    path = OmegaConf.select(cfg, "actor_rollout_ref.model.path", default=None)
    if not path or not Path(str(path)).is_dir():
        return
    from recallm.modeling import lora_rank_problem, read_model_config

    try:
        config = read_model_config(Path(str(path)))
    except RecallmError:
        return
    rank = OmegaConf.select(cfg, "actor_rollout_ref.model.lora_rank", default=0)
    if isinstance(rank, int) and not isinstance(rank, bool) and rank > 0:
        problem = lora_rank_problem(rank, config, "actor_rollout_ref.model.lora_rank")
        if problem:
            yield problem
    prompt, response = cfg.data.get("max_prompt_length"), cfg.data.get("max_response_length")
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(prompt, int) and isinstance(response, int) and isinstance(positions, int) and prompt + response > positions:
        yield (
            f"data.max_prompt_length + data.max_response_length = {prompt + response} is longer than the model's "
            f"{positions} positions (max_position_embeddings of {path}): lower them to {positions} together"
        )

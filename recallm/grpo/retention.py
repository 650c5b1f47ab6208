"""Which GRPO checkpoints stay on disk: the newest ``recallm.keep_checkpoints`` ones, and the evaluated
step (``recallm.eval_step``) as weights only.

Why our own: verl 0.9.1's ``trainer.max_actor_ckpt_to_keep`` removes only the checkpoints saved by the
running process (``BaseCheckpointManager.previous_saved_paths`` starts empty), so every requeue of a
SLURM job leaves the earlier ones behind; and it would remove the step the Llama recipe is evaluated
at. :func:`prune` scans ``trainer.default_local_dir`` instead, after every save of the trainer
(``recallm.grpo.checkpoints`` wraps ``RayPPOTrainer._save_checkpoint``), so the bound holds across requeues:

* the ``keep`` newest ``global_step_N`` directories stay whole (model, optimizer, extra, data.pt: any of
  them can be resumed from);
* the one verl's tracker names (``recallm.paths.TRACKER``) is never touched (verl resumes from it);
* the ``eval_step`` directory, once older than those, keeps its model shards and Hugging Face config
  (``recallm-export --step N`` reads them) and loses its optimizer state (two thirds of its size:
  ``optim_world_size_*`` files, dropped from its manifest too), which only a resume would need;
* every other one is removed.

The launcher passes the settings to the trainer's process through the environment
(:data:`KEEP_ENV`, :data:`EVAL_STEP_ENV`).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from recallm.io import forget_files
from recallm.paths import saved_steps, step_of, tracked_step

__all__ = ["KEEP_ENV", "EVAL_STEP_ENV", "prune", "saved_steps", "settings", "step_of"]

KEEP_ENV = "RECALLM_KEEP_CHECKPOINTS"
EVAL_STEP_ENV = "RECALLM_EVAL_STEP"
_OPTIMIZER_FILE = re.compile(r"optim_world_size_\d+_rank_\d+\.pt")


def prune(root: str | Path, keep: int, eval_step: int | None = None) -> list[str]:
    """Apply the retention of the module doc to ``root``; returns what it removed (paths)."""
    root = Path(root)
    steps = saved_steps(root)
    newest = sorted(steps, reverse=True)[:keep]
    latest = tracked_step(root)  # (-1, unreadable: names no step)
    removed: list[str] = []
    for step, path in sorted(steps.items()):
        if step in newest or step == latest:
            continue
        if step == eval_step:
            optimizer = [f for f in path.rglob("*") if f.is_file() and _OPTIMIZER_FILE.fullmatch(f.name)]
            forget_files(path, [str(f.relative_to(path)) for f in optimizer])  # the rest stays verifiable
            for file in optimizer:
                file.unlink()
                removed.append(str(file))
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(str(path))
    return removed


def settings() -> tuple[int | None, int | None]:
    def number(name: str) -> int | None:
        try:
            return int(os.environ[name])
        except (KeyError, ValueError):
            return None

    return number(KEEP_ENV), number(EVAL_STEP_ENV)

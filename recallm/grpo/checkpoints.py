"""verl's GRPO checkpoints (``<trainer.default_local_dir>/global_step_N``): checksummed when saved,
verified before a run resumes from one or ``recallm-export`` reads one, then pruned
(``recallm.grpo.retention``).

* **Save.** verl's ``RayPPOTrainer._save_checkpoint`` is wrapped in the trainer's process
  (``recallm.grpo.worker_hooks``). Before verl writes a step, that step's old manifest is removed (a save
  into an existing directory, after a resume from an earlier step, must not leave a manifest that
  would vouch for a mix of files). After verl has written the actor's shards, ``data.pt`` and the
  tracker (``recallm.paths.TRACKER``), the size and CRC-32 of every file of the step
  go into its ``recallm_files.json`` (``recallm.io.write_manifest``: each file fsynced, the
  manifest written atomically), then the retention prunes. The manifest is written last, so a step
  without one was cut short. With ``actor_rollout_ref.actor.checkpoint.async_save`` the shards are
  still being written when the save returns: no manifest, and one line says so.
* **Resume** (``trainer.resume_mode=auto``, before Ray starts: :func:`prepare_resume`, called by
  ``recallm.grpo.app.run``). The step the tracker names is verified: every listed file there, with
  its size and CRC-32. A damaged step (a file missing, truncated or changed since the save; no
  manifest while an older step has one; the directory the tracker names is gone) is moved aside as
  ``corrupt-global_step_N`` with one line saying why, and the newest intact older step is written
  into the tracker (atomically), so verl resumes there and never from a partial save. Without an
  intact step the launch stops with one line and moves nothing. An unreadable tracker (a kill
  while verl rewrote it) counts as naming the newest step. ``resume_mode=resume_path``: that step
  is verified and a damaged one refused.
* Steps saved before this existed (no step of the directory has a manifest) are resumed from as
  they are, with one line saying they are unverified.
* A manifest vouches only for a whole step: one that does not list every file of the step (empty, or cut)
  counts as none; a step directory that is a link, or resolves outside its run directory, is refused (a link
  to another step verified as that step); a tracker that is not a file is one line; ``trainer.resume_mode``
  must be one of :data:`RESUME_MODES` (verl resumed as ``auto`` on a typo).
* One launch per run directory (:func:`hold_run_dir`, the lock data, SFT, eval and the pipeline take on
  theirs): held from the resume check to the end of training; :func:`check_run_dir`, one of the launch's
  checks, refuses a directory another launch holds before Ray starts.

Model weights are not re-checked for non-finite values here: verl's actor skips an update whose
gradient norm is not finite, and ``recallm-grpo`` refuses a starting model with non-finite weights
(``recallm.modeling.check_recallm_model``); ``recallm-export`` checks the exported weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from recallm.errors import RecallmError
from recallm.grpo.retention import prune, settings
from recallm.io import MANIFEST_FILE, move_aside, verify_manifest, write_manifest, write_text_atomic
from recallm.paths import TRACKER, saved_steps, step_name, step_of, tracked_step
from recallm.paths import step_dir as _step_dir

__all__ = [
    "TRACKER",
    "RESUME_MODES",
    "Resume",
    "step_problem",
    "check_step",
    "prepare_resume",
    "check_run_dir",
    "hold_run_dir",
    "install",
]

#: ``trainer.resume_mode``: verl 0.9.1's values (``RayPPOTrainer._load_checkpoint``); it resumed as auto on any other
RESUME_MODES = ("auto", "disable", "resume_path")


def _tracked(root: Path) -> int | None:
    """The step the tracker names (``recallm.paths.tracked_step``: None when there is none, -1 when it does not
    read), refusing a tracker that is not a regular file (a directory, a link) in one line."""
    tracker = root / TRACKER
    if (tracker.exists() or tracker.is_symlink()) and (not tracker.is_file() or tracker.is_symlink()):
        raise RecallmError(
            f"{tracker} is not a file (verl's tracker of the newest step, which it rewrites after each save): "
            "remove it, or set trainer.resume_mode=disable"
        )
    return tracked_step(root)


def _checksummed(steps: dict[int, Path]) -> bool:
    """Whether any of a directory's ``steps`` (``saved_steps``) has a manifest (then every step must have one)."""
    return any((path / MANIFEST_FILE).is_file() for path in steps.values())


def step_problem(step_dir: str | Path, *, need_manifest: bool = True) -> str | None:
    """What is wrong with one ``global_step_N`` directory, or None if it is intact: a symbolic link, or a
    directory that resolves outside its run directory (another step's files would be vouched for under
    this step's name); a file missing, truncated or changed since the save; no manifest listing every
    file of the step (with ``need_manifest``: an empty or partial one counts as none); no actor directory."""
    step_dir = Path(step_dir)
    if step_dir.is_symlink() or (step_dir.is_dir() and step_dir.resolve() != step_dir.parent.resolve() / step_dir.name):
        return f"not a directory of its run: it resolves to {step_dir.resolve()}; a step is never a link"
    if not step_dir.is_dir():
        return "missing"
    try:
        verified = verify_manifest(step_dir, complete=True)
    except RecallmError as exc:
        return f"damaged: {exc}"
    if not verified and need_manifest:
        return (
            f"incomplete: no {MANIFEST_FILE} listing every file of the step (the checksums written after a save "
            "ends): the save was cut short, or the manifest was cut"
        )
    if not (step_dir / "actor").is_dir():
        return "incomplete: no actor directory"
    return None


def _weights_only(step_dir: Path) -> bool:
    """A step the retention kept as weights only (``recallm.eval_step``): exportable, not resumable."""
    actor = step_dir / "actor"
    return any(actor.glob("model_world_size_*")) and not any(actor.glob("optim_world_size_*"))


def check_step(step_dir: str | Path) -> bool:
    """Raise ``RecallmError`` (one line) unless ``step_dir`` is intact; True if it was verified
    against its manifest, False if it has none (saved before checksums existed)."""
    step_dir = Path(step_dir)
    need = _checksummed(saved_steps(step_dir.parent))
    problem = step_problem(step_dir, need_manifest=need)
    if problem:
        raise RecallmError(f"checkpoint {step_dir} is {problem}")
    return need


@dataclass(frozen=True)
class Resume:
    """Where a launch resumes: ``step`` (None: from scratch), whether it was verified, what was moved aside."""

    step: int | None
    verified: bool = False
    moved: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.step is None:
            return "from scratch (no checkpoint)"
        how = "checksums verified" if self.verified else "saved without checksums: unverified"
        return f"{step_name(self.step)} ({how})"


def prepare_resume(root: str | Path, resume_mode: str = "auto", resume_from_path: str | None = None) -> Resume:
    """Verify what a launch will resume from and make verl's tracker name the newest intact step
    (module doc). Raises ``RecallmError`` (one line) when no intact step is left; then nothing moves."""
    root = Path(root)
    if resume_mode not in RESUME_MODES:
        raise RecallmError(_resume_mode_problem(resume_mode))
    if resume_mode == "disable":
        return Resume(None)
    if resume_mode == "resume_path":
        if not resume_from_path:
            raise RecallmError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<dir>/global_step_N")
        step = step_of(resume_from_path)
        if step is None:
            raise RecallmError(f"trainer.resume_from_path={resume_from_path} is not a global_step_N directory")
        return Resume(step, check_step(resume_from_path))
    steps = saved_steps(root)
    tracked = _tracked(root)
    if tracked is None:
        return Resume(None)  # verl starts from scratch: nothing was ever saved here (its tracker comes last)
    need = _checksummed(steps)
    newest = tracked if tracked >= 0 else max(steps, default=-1)
    candidates = sorted((s for s in steps if s <= newest), reverse=True)
    if tracked >= 0 and tracked not in steps:
        damaged = [(_step_dir(root, tracked), "missing")]
    else:
        damaged = []
    for step in candidates:
        problem = step_problem(steps[step], need_manifest=need)
        if problem is None and not _weights_only(steps[step]):
            break
        if problem is not None:  # (an intact step kept as weights only, recallm.eval_step, stays for export)
            damaged.append((steps[step], problem))
    else:
        listed = "; ".join(f"{p.name} is {why}" for p, why in damaged) or "no step with its optimizer state"
        raise RecallmError(
            f"no intact checkpoint to resume from in {root}: {listed}; move them away or set trainer.resume_mode=disable"
        )
    moved = []
    for path, why in damaged:
        if path.exists():
            target = move_aside(path)
            moved.append(f"{path.name} is {why}: moved it to {target.name}")
        else:
            moved.append(f"{path.name} (named by {TRACKER}) is {why}")
    if step != tracked:
        write_text_atomic(root / TRACKER, str(step))
    return Resume(step, need, tuple(moved))


def _resume_mode_problem(mode: object) -> str:
    return (
        f"trainer.resume_mode={mode} is not one of {', '.join(RESUME_MODES)} (verl would resume as auto): auto "
        "resumes the newest step, disable starts afresh, resume_path takes trainer.resume_from_path"
    )


def check_run_dir(cfg) -> Iterator[str]:
    """One of ``recallm.grpo.app``'s checks: ``trainer.resume_mode`` is one of :data:`RESUME_MODES`; no other
    launch writes ``trainer.default_local_dir`` now (:func:`hold_run_dir`); its tracker, if any, is a file."""
    from omegaconf import OmegaConf

    from recallm.io import check_unlocked

    mode = OmegaConf.select(cfg, "trainer.resume_mode", default="auto")
    if str(mode) not in RESUME_MODES:
        yield _resume_mode_problem(mode)
    root = OmegaConf.select(cfg, "trainer.default_local_dir", default=None)
    if root:
        check_unlocked(Path(str(root)))  # (a RecallmError: the checks collect it as one line)
        if str(mode) == "auto":
            _tracked(Path(str(root)))


@contextmanager
def hold_run_dir(cfg) -> Iterator[None]:
    """One writer per GRPO run directory: ``trainer.default_local_dir`` locked (``recallm.io.lock_dir``) from
    the resume's check to the end of training, as SFT, eval, data and the pipeline lock theirs. A second
    launch on the same directory is refused with one line naming the holder (two trainers saving into one
    directory would interleave steps, tracker and manifests); a killed launch leaves no stale lock."""
    from recallm.io import lock_dir

    with lock_dir(Path(str(cfg.trainer.default_local_dir)), "recallm-grpo"):
        yield


# --------------------------------------------------------------------------- in verl's trainer
def _async_save(config) -> bool:
    try:
        return bool(config.actor_rollout_ref.actor.checkpoint.get("async_save", False))
    except AttributeError:
        return False


def _wrap_trainer(module) -> None:
    cls = getattr(module, "RayPPOTrainer", None)
    original = getattr(cls, "_save_checkpoint", None)
    if original is None or getattr(original, "_recallm", False):
        return

    def _save_checkpoint(self, *args, **kwargs):
        saved = _step_dir(str(self.config.trainer.default_local_dir), self.global_steps)
        (saved / MANIFEST_FILE).unlink(missing_ok=True)  # a re-save must not keep the old step's checksums
        result = original(self, *args, **kwargs)
        if _async_save(self.config):
            print(f"[recallm] async_save: {saved.name} is written in the background, without checksums", flush=True)
        else:
            write_manifest(saved)
        keep, eval_step = settings()
        if keep:
            removed = prune(saved.parent, keep, eval_step)
            if removed:
                print(f"[recallm] checkpoint retention (keep {keep}): removed {len(removed)} path(s)", flush=True)
        return result

    _save_checkpoint._recallm = True  # type: ignore[attr-defined]
    cls._save_checkpoint = _save_checkpoint


def install() -> None:
    """Wrap verl's trainer's save (``recallm.grpo.worker_hooks``, in every verl process)."""
    from recallm.grpo.cpu.patches import after_import

    after_import("verl.trainer.ppo.ray_trainer", _wrap_trainer)

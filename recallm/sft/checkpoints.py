"""SFT checkpoints and the stage's ``final`` model: verified before use, written whole or not at all.

* Every ``checkpoint-<step>`` gets a manifest once the Trainer has written it (``ManifestCallback``:
  each file's size and CRC-32, each file fsync'd; ``recallm.io.write_manifest``).
* ``check_checkpoint`` verifies one: complete (``trainer_state.json`` — the Trainer writes it last —
  weights, optimizer and scheduler state), intact (its manifest: a checkpoint without one cannot
  be verified and is not resumed from — it is damaged like any other) and finite (the weights read
  tensor by tensor, ``recallm.modeling.safetensors_problem``: a diverged run's NaN checkpoint is not
  resumed from). A model directory without a manifest (a base, an older ``final``) is read whole
  instead: torch files through their zip CRC-32s, safetensors tensor by tensor, JSON parsed.
* ``find_checkpoint`` picks the newest checkpoint that verifies; newer damaged ones are moved aside
  to ``corrupt-checkpoint-<step>`` (kept, out of the Trainer's way) with a warning. With none
  intact it is a ``RecallmError`` — nothing is moved then.
* ``save_final`` refuses weights that are not finite (one line naming the tensor: the run diverged;
  nothing is written), else writes ``final`` into ``.final.tmp`` (model, tokenizer, ``recallm_sft.json``,
  manifest), then renames it into place after fsync: a kill leaves the previous ``final`` or none,
  never a partial one. A rerun after a kill during that save resumes from the last checkpoint,
  which holds the trained model already: ``final_from_checkpoint`` writes ``final`` from its
  files, without training (``Trainer.train`` would take one step past ``max_steps`` there when the
  last step falls inside an epoch). ``model_dir_problem`` verifies a model directory before a stage
  starts from it.
"""

from __future__ import annotations

import json
import logging
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from recallm.errors import RecallmError
from recallm.io import (
    MANIFEST_FILE,
    atomic_dir,
    move_aside,
    replace,
    verify_manifest,
    write_json_atomic,
    write_manifest,
)

__all__ = [
    "CollatorStateCallback",
    "ManifestCallback",
    "restore_collator_state",
    "check_checkpoint",
    "find_checkpoint",
    "model_dir_problem",
    "save_final",
    "final_from_checkpoint",
    "agreed",
]

log = logging.getLogger(__name__)
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "adapter_model.safetensors")


# ---------------------------------------------------------------------------------- verification
def _check_torch_file(path: Path) -> str | None:
    """torch.save's zip format: every member against its CRC-32; an older pickle format: loaded."""
    with path.open("rb") as f:
        is_zip = f.read(4) == b"PK\x03\x04"
    if is_zip:
        try:
            with zipfile.ZipFile(path) as z:
                bad = z.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            return f"unreadable ({exc})"
        return None if bad is None else f"member {bad} fails its CRC-32 check"
    import torch

    try:
        torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001  (pickle and torch raise many types)
        return f"unreadable ({type(exc).__name__})"
    return None


def _files_problem(directory: Path, *, need_manifest: bool = False) -> str | None:
    """The first damaged file of ``directory`` (module doc), or None. Weights are read whole and
    checked finite whether or not there is a manifest (a diverged run saves NaN weights intact)."""
    from recallm.modeling import safetensors_problem

    try:
        verified = verify_manifest(directory)
    except RecallmError as exc:
        return str(exc)
    if not verified and need_manifest:
        return f"unverifiable: its {MANIFEST_FILE} (the checksums written after every save) is missing"
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        name = str(path.relative_to(directory))
        if path.name.endswith(".safetensors"):
            problem = safetensors_problem(path)
        elif verified:
            continue
        elif path.suffix in (".pt", ".pth", ".bin"):
            problem = _check_torch_file(path)
        elif path.suffix == ".json":
            try:
                json.loads(path.read_text(encoding="utf-8"))
                problem = None
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                problem = f"unreadable ({exc})"
        else:
            continue
        if problem:
            return f"{name} {problem}"
    return None


def _checkpoint_problem(path: Path) -> str | None:
    try:
        json.loads((path / "trainer_state.json").read_text())
    except (OSError, ValueError) as exc:
        reason = "missing" if isinstance(exc, FileNotFoundError) else "unreadable"
        return f"partial or corrupt: trainer_state.json {reason} ({exc})"
    if not any((path / w).is_file() for w in _WEIGHTS):
        return "partial: no model weights"
    deepspeed_dirs = [d for d in path.glob("global_step*") if d.is_dir()]
    if not (path / "optimizer.pt").is_file() and not deepspeed_dirs:
        return "partial: no optimizer state (optimizer.pt or global_step*/)"
    if not deepspeed_dirs and not (path / "scheduler.pt").is_file():
        return "partial: no scheduler.pt"
    problem = _files_problem(path, need_manifest=True)
    return None if problem is None else f"corrupt: {problem}"


def check_checkpoint(path: str | Path) -> Path:
    """Raise ``RecallmError`` unless ``path`` is a complete, intact Trainer checkpoint."""
    path = Path(path)
    if not path.is_dir():
        raise RecallmError(f"checkpoint {path} does not exist")
    problem = _checkpoint_problem(path)
    if problem:
        raise RecallmError(f"checkpoint {path} is {problem}")
    return path


def find_checkpoint(stage_dir: str | Path) -> Path | None:
    """The newest intact ``checkpoint-<step>`` of a stage directory, or None if there is none; newer
    damaged ones are moved aside with a warning (module doc)."""
    stage_dir = Path(stage_dir)
    candidates = []
    for d in stage_dir.glob("checkpoint-*"):
        try:
            candidates.append((int(d.name.split("-")[-1]), d))
        except ValueError:
            continue
    if not candidates:
        return None
    damaged: list[tuple[Path, str]] = []
    for _, path in sorted(candidates, reverse=True):
        problem = _checkpoint_problem(path)
        if problem is None:
            for bad, why in damaged:
                moved = move_aside(bad)
                log.warning(
                    "checkpoint %s is %s: moved it to %s; resuming from %s, the newest complete checkpoint",
                    bad.name, why, moved.name, path.name,
                )  # fmt: skip
            return path
        damaged.append((path, problem))
    listed = "; ".join(f"{p.name} is {why}" for p, why in damaged)
    raise RecallmError(
        f"no complete checkpoint in {stage_dir}: {listed}; move them away or set resume=never to start over"
    )


def model_dir_problem(path: str | Path) -> str | None:
    """What is wrong with a saved model directory (config, weights, every file intact), or None."""
    path = Path(path)
    if not (path / "config.json").is_file():
        return "no config.json"
    if not any((path / w).is_file() for w in _WEIGHTS):
        return "no model weights"
    return _files_problem(path)


# ------------------------------------------------------------------------------------- writing
COLLATOR_STATE = "recallm_collator.json"


class CollatorStateCallback(TrainerCallback):
    """With each checkpoint (before its manifest, so that the manifest covers it): the collator's batch counter
    (``SFTCollator._calls``, which seeds the PoSE position skips of the next batch), so that a resumed run draws
    the skips an uninterrupted one draws. Without it the counter restarted at 0 on resume."""

    def __init__(self, collator) -> None:
        self.collator = collator

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            write_json_atomic(checkpoint / COLLATOR_STATE, {"calls": int(self.collator._calls)})
        return control


def restore_collator_state(collator, checkpoint: Path) -> None:
    """The batch counter saved with ``checkpoint`` (:class:`CollatorStateCallback`) into ``collator``; a
    checkpoint written before the counter was saved leaves it at 0 (its PoSE skips then differ from the
    uninterrupted run's, as they did), said in the log."""
    path = Path(checkpoint) / COLLATOR_STATE
    if not path.is_file():
        log.warning("%s has no %s: the resumed run's PoSE position skips restart their sequence", checkpoint, COLLATOR_STATE)
        return
    try:
        calls = json.loads(path.read_text())["calls"]
        if not isinstance(calls, int) or isinstance(calls, bool) or calls < 0:
            raise ValueError(calls)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise RecallmError(f"{path} is not a collator state ({{\"calls\": <count>}}): {exc!r}"[:300]) from None
    collator._calls = calls


class ManifestCallback(TrainerCallback):
    """After each checkpoint save: wait for every process, then the saving process(es) record the
    checkpoint's manifest (``recallm.io.write_manifest``)."""

    def on_save(self, args, state, control, **kwargs):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        if args.should_save:
            write_manifest(Path(args.output_dir) / f"checkpoint-{state.global_step}")
        return control


def save_final(trainer, tokenizer, final: Path, info: dict[str, Any], *, lora: bool = False) -> Path:
    """Save the trained model as ``final`` atomically (module doc); every process calls it (the
    model save may be collective), the main process writes. ``lora``: the model is a PEFT model, saved
    merged with its adapter beside it (``recallm.sft.lora.save_merged``)."""
    from recallm.modeling import check_finite

    steps = trainer.state.global_step
    check_finite(trainer.model, f"the model after {steps} steps (training diverged; final is not written)")
    tmp = final.with_name(f".{final.name}.tmp")
    main = trainer.is_world_process_zero()
    if main and tmp.exists():
        shutil.rmtree(tmp)  # left by a kill during an earlier save
    if lora:
        if main:
            from recallm.sft.lora import save_merged

            save_merged(trainer.accelerator.unwrap_model(trainer.model), tokenizer, tmp)
    else:
        trainer.save_model(str(tmp))
    if main:
        tokenizer.save_pretrained(tmp)
        (tmp / "recallm_sft.json").write_text(json.dumps(info, indent=2))
        write_manifest(tmp)
        replace(tmp, final)
    return final


_MODEL_FILES = ("config.json", "generation_config.json", "model*.safetensors", "model.safetensors.index.json")


def final_from_checkpoint(checkpoint: Path, tokenizer, final: Path, info: dict[str, Any], *, main: bool) -> Path | None:
    """``final`` from the model files of ``checkpoint`` (module doc); None if it has no full weights
    (e.g. ZeRO-3 shards only). Only the main process writes."""
    files = sorted({p for pattern in _MODEL_FILES for p in checkpoint.glob(pattern)})
    if not any(p.name.endswith(".safetensors") for p in files):
        return None
    if main:
        shutil.rmtree(final.with_name(f".{final.name}.tmp"), ignore_errors=True)  # save_final's, left by a kill
        with atomic_dir(final) as tmp:
            for path in files:
                shutil.copy2(path, tmp / path.name)
            tokenizer.save_pretrained(tmp)
            (tmp / "recallm_sft.json").write_text(json.dumps(info, indent=2))
            write_manifest(tmp)
    return final


def agreed(fn: Callable[[], Any]) -> Any:
    """``fn()`` on the main process, its result (or its ``RecallmError``) shared with every process;
    just ``fn()`` without a process group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return fn()
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", fn())
        except RecallmError as exc:
            box[0] = ("error", str(exc))
    dist.broadcast_object_list(box, src=0)
    status, value = box[0]
    if status == "error":
        raise RecallmError(value)
    return value

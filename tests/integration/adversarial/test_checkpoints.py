"""Killed and damaged SFT runs (issue 18 item 9): every checkpoint file is verified when one is
chosen to resume from — a damaged newest checkpoint is moved aside with a warning and the previous
complete one is used; ``final`` is written whole or not at all (a temporary directory renamed into
place, after fsync); a stage started from a damaged model directory is a one-line error."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from recallm.errors import RecallmError
from recallm.paths import config_dir
from tests.fsync_spy import RenameSpy

MIX = {
    "seed": 0,
    "tolerance": 0.05,
    "train": {
        "lengths": [192, 256],
        "entries": [
            {
                "task": "kv_retrieval",
                "count": 8,
                "params": {"key_type": "toy", "value_type": "toy", "formats": ["lines"]},
            }
        ],
    },
    "sft": {"count": 16, "val_fraction": 0.25},
}


def _cfg(out: Path, data: Path, model: Path, *overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(
            "sft",
            overrides=[
                f"train_file={data}/sft/train.jsonl",
                "val_file=null",  # no evaluation: not what is tested here
                f"out_dir={out}",
                f"model.path={model}",
                "stage=full",
                f"init_from={model}",
                "sft.global_batch_size=4",
                "sft.per_device_batch_size=2",
                "sft.save_steps=2",
                "sft.save_total_limit=null",
                "sft.eval.steps=1000",
                "sft.eval.recall_prompts=0",
                "max_steps=4",
                *overrides,
            ],
        )
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_dir):
    """One stage=full run of 4 steps (checkpoint-2, checkpoint-4, final), with the rename spy on."""
    from data_gen.generate import run_schedule, schedule_from_config
    from recallm.sft.train import run_sft

    root = tmp_path_factory.mktemp("ckpt")
    run_schedule(schedule_from_config(MIX), root / "data", tiny_dir, workers=1, progress=False)
    mp = pytest.MonkeyPatch()
    spy = RenameSpy().install(mp)
    try:
        final = run_sft(_cfg(root / "run", root / "data", tiny_dir))
    finally:
        mp.undo()
    return {"root": root, "stage": final.parent, "final": final, "spy": spy, "data": root / "data"}


def _stage_copy(trained, tmp_path) -> Path:
    return Path(shutil.copytree(trained["stage"], tmp_path / "run" / "full"))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _overwrite_4k(path: Path, byte: bytes | None = None) -> None:
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.seek(size // 2)
        f.write(byte * 4096 if byte else os.urandom(4096))


DAMAGE = {
    "optimizer.pt truncated": ("optimizer.pt", _truncate),
    "scheduler.pt truncated": ("scheduler.pt", _truncate),
    "rng_state.pth truncated": ("rng_state.pth", _truncate),
    "model.safetensors 4 KB of garbage": ("model.safetensors", _overwrite_4k),
    "optimizer.pt 4 KB of zeros": ("optimizer.pt", lambda p: _overwrite_4k(p, b"\x00")),
    "trainer_state.json missing": ("trainer_state.json", lambda p: p.unlink()),
    # issue 31: a checkpoint that cannot be verified is not resumed from without a word
    "model.safetensors altered, manifest deleted": ("recallm_files.json", lambda p: _alter_unverified(p)),
    "model.safetensors NaN (a diverged save)": ("model.safetensors", lambda p: _nan_tensor(p)),
}


def _alter_unverified(manifest: Path) -> None:
    """Finite, readable weights that are not the ones saved, and no manifest to say so."""
    from safetensors.torch import load_file, save_file

    path = manifest.parent / "model.safetensors"
    tensors = {n: t * 1.01 if t.is_floating_point() else t for n, t in load_file(str(path)).items()}
    save_file(tensors, str(path), metadata={"format": "pt"})
    manifest.unlink()


def _nan_tensor(path: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    name = next(n for n, t in sorted(tensors.items()) if t.is_floating_point())
    tensors[name] = tensors[name].clone().fill_(float("nan"))
    save_file(tensors, str(path), metadata={"format": "pt"})
    from recallm.io import write_manifest

    write_manifest(path.parent)  # saved so, checksums and all: only the values are wrong


@pytest.mark.parametrize("case", list(DAMAGE))
def test_damaged_newest_checkpoint_falls_back_with_a_warning(trained, tmp_path, caplog, case):
    from recallm.sft.train import find_checkpoint

    stage = _stage_copy(trained, tmp_path)
    name, damage = DAMAGE[case]
    damage(stage / "checkpoint-4" / name)
    with caplog.at_level(logging.WARNING, logger="recallm.sft"):
        chosen = find_checkpoint(stage)
    assert chosen == stage / "checkpoint-2"
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert "checkpoint-4" in warning and name in warning and "checkpoint-2" in warning, warning
    assert not (stage / "checkpoint-4").exists() and (stage / "corrupt-checkpoint-4").is_dir()  # kept, aside


def test_no_complete_checkpoint_is_one_error(trained, tmp_path):
    from recallm.sft.train import check_checkpoint, find_checkpoint

    stage = _stage_copy(trained, tmp_path)
    _truncate(stage / "checkpoint-4" / "optimizer.pt")
    _overwrite_4k(stage / "checkpoint-2" / "model.safetensors")
    with pytest.raises(RecallmError, match=r"no complete checkpoint in .*: checkpoint-4 .*optimizer\.pt.*resume=never"):
        find_checkpoint(stage)
    assert (stage / "checkpoint-4").is_dir() and (stage / "checkpoint-2").is_dir()  # nothing moved
    with pytest.raises(RecallmError, match=r"checkpoint-2 is corrupt: model\.safetensors"):
        check_checkpoint(stage / "checkpoint-2")  # resume=<dir> names it: no fallback


def test_checkpoints_and_final_are_fsynced_and_carry_a_manifest(trained):
    from recallm.io import MANIFEST_FILE

    assert trained["spy"].problems() == []
    renamed = trained["spy"].renamed()
    assert trained["final"] in renamed
    assert trained["stage"] / "checkpoint-4" / MANIFEST_FILE in renamed
    manifest = json.loads((trained["final"] / MANIFEST_FILE).read_text())
    assert {"model.safetensors", "tokenizer.json", "recallm_sft.json"} <= set(manifest["files"])
    assert not list(trained["stage"].glob(".final*"))


def test_resume_past_damage_and_a_kill_during_the_final_save(trained, tmp_path, monkeypatch, caplog, tiny_dir):
    """Resume=auto with a truncated optimizer.pt in the newest checkpoint: the run goes on from the
    one before; a kill while ``final`` is being written leaves no ``final`` (not a partial one);
    the rerun writes it whole."""
    from recallm.io import verify_manifest
    from recallm.sft.train import RecallTrainer, check_checkpoint, run_sft

    out = tmp_path / "run"
    stage = _stage_copy(trained, tmp_path)
    shutil.rmtree(stage / "final")
    _truncate(stage / "checkpoint-4" / "optimizer.pt")

    class Killed(Exception):
        pass

    real_save = RecallTrainer.save_model

    def save_then_die(self, output_dir=None, _internal_call=False):
        real_save(self, output_dir, _internal_call)
        if not _internal_call:  # the final save (checkpoints are internal calls)
            raise Killed

    monkeypatch.setattr(RecallTrainer, "save_model", save_then_die)
    cfg = _cfg(out, trained["data"], tiny_dir)
    with caplog.at_level(logging.WARNING, logger="recallm.sft"), pytest.raises(Killed):
        run_sft(cfg)
    assert "resuming from" in caplog.text and "checkpoint-2" in caplog.text
    assert not (stage / "final").exists()
    check_checkpoint(stage / "checkpoint-4")  # trained again from checkpoint-2, saved whole
    monkeypatch.setattr(RecallTrainer, "save_model", real_save)
    final = run_sft(cfg)
    assert final == stage / "final" and verify_manifest(final)
    assert json.loads((final / "recallm_sft.json").read_text())["steps"] == 4
    assert not list(stage.glob(".final*"))


def test_stage_full_from_a_partial_embed_final(trained, tmp_path, tiny_dir):
    """A ``final`` written in place by an older version and cut by a kill: one line naming it."""
    from recallm.sft.train import run_sft

    out = tmp_path / "run"
    partial = shutil.copytree(trained["final"], out / "embed" / "final")
    (partial / "model.safetensors").write_bytes((partial / "model.safetensors").read_bytes()[:5000])
    (partial / "recallm_files.json").unlink(missing_ok=True)  # as written by a version without manifests
    cfg = _cfg(out, trained["data"], tiny_dir, "init_from=null")
    with pytest.raises(RecallmError, match=r"stage=full starts from .*embed/final, which is incomplete or damaged"):
        run_sft(cfg)
    assert not (out / "full").exists()

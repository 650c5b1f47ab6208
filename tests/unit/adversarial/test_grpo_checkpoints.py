"""verl's GRPO checkpoints (``recallm.grpo.checkpoints``): checksummed by the wrapped save, verified
before a resume and an export; a damaged newest step is moved aside and the tracker names the newest
intact one; nothing intact left is one line and moves nothing. Fake step directories laid out as
verl 0.9.1 writes them (``actor/model_world_size_*``, ``optim_world_size_*``, ``data.pt``, tracker)."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from recallm.errors import RecallmError
from recallm.grpo import checkpoints, retention
from recallm.grpo.checkpoints import TRACKER, check_step, prepare_resume
from recallm.io import MANIFEST_FILE


def _write_step(root: Path, step: int) -> Path:
    """What verl's _save_checkpoint writes for one step (one rank), then the tracker."""
    actor = root / f"global_step_{step}" / "actor"
    (actor / "huggingface").mkdir(parents=True, exist_ok=True)
    (actor / "model_world_size_1_rank_0.pt").write_bytes(bytes([step]) * 4096)
    (actor / "optim_world_size_1_rank_0.pt").write_bytes(b"o" * 2048)
    (actor / "extra_state_world_size_1_rank_0.pt").write_bytes(b"e" * 64)
    (actor / "huggingface" / "config.json").write_text("{}")
    (root / f"global_step_{step}" / "data.pt").write_bytes(b"d" * 32)
    (root / TRACKER).write_text(str(step))
    return root / f"global_step_{step}"


class _Trainer:
    """The part of verl's RayPPOTrainer the wrap touches."""

    def __init__(self, root: Path, async_save: bool = False) -> None:
        checkpoint = {"async_save": async_save}
        actor = types.SimpleNamespace(checkpoint=checkpoint)
        self.config = types.SimpleNamespace(
            trainer=types.SimpleNamespace(default_local_dir=str(root)),
            actor_rollout_ref=types.SimpleNamespace(actor=actor),
        )
        self.global_steps = 0
        self.killed = False

    def _save_checkpoint(self):
        root = Path(self.config.trainer.default_local_dir)
        if self.killed:  # killed inside verl's save, one shard rewritten
            (root / f"global_step_{self.global_steps}" / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"x")
            raise KeyboardInterrupt
        _write_step(root, self.global_steps)


@pytest.fixture
def trainer_cls(monkeypatch):
    cls = type("RayPPOTrainer", (_Trainer,), {})
    module = types.SimpleNamespace(RayPPOTrainer=cls)
    checkpoints._wrap_trainer(module)
    checkpoints._wrap_trainer(module)  # once only
    monkeypatch.delenv(retention.KEEP_ENV, raising=False)
    return cls


def _saved(trainer_cls, root: Path, *steps: int) -> None:
    trainer = trainer_cls(root)
    for step in steps:
        trainer.global_steps = step
        trainer._save_checkpoint()


def test_every_save_is_checksummed_and_verifies(trainer_cls, tmp_path):
    _saved(trainer_cls, tmp_path, 1, 2)
    for step in (1, 2):
        assert (tmp_path / f"global_step_{step}" / MANIFEST_FILE).is_file()
        assert check_step(tmp_path / f"global_step_{step}") is True
    resume = prepare_resume(tmp_path)
    assert (resume.step, resume.verified, resume.moved) == (2, True, ())
    assert "global_step_2 (checksums verified)" in resume.describe()


def test_a_damaged_newest_step_is_moved_aside_and_the_tracker_names_the_intact_one(trainer_cls, tmp_path):
    _saved(trainer_cls, tmp_path, 1, 2, 3)
    shard = tmp_path / "global_step_3" / "actor" / "model_world_size_1_rank_0.pt"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF  # one flipped byte, same size
    shard.write_bytes(bytes(data))
    (tmp_path / "global_step_2" / "data.pt").write_bytes(b"d" * 8)  # truncated
    resume = prepare_resume(tmp_path)
    assert resume.step == 1 and (tmp_path / TRACKER).read_text() == "1"
    assert len(resume.moved) == 2
    assert (
        "global_step_3 is damaged: actor/model_world_size_1_rank_0.pt changed since it was written" in resume.moved[0]
    )
    assert "global_step_2 is damaged: data.pt has 8 bytes, 32 were written" in resume.moved[1]
    assert (tmp_path / "corrupt-global_step_3").is_dir() and (tmp_path / "corrupt-global_step_2").is_dir()
    assert sorted(retention.saved_steps(tmp_path)) == [1]
    # the moved steps are kept (nothing already written is lost), and a second launch agrees
    assert prepare_resume(tmp_path).moved == ()


def test_a_save_cut_short_has_no_manifest_and_is_not_resumed_from(trainer_cls, tmp_path):
    _saved(trainer_cls, tmp_path, 2)
    _write_step(tmp_path, 4)  # verl wrote it and its tracker; the process was killed before the manifest
    resume = prepare_resume(tmp_path)
    assert resume.step == 2 and "global_step_4 is incomplete: no recallm_files.json" in resume.moved[0]
    assert (tmp_path / TRACKER).read_text() == "2"


def test_a_resave_drops_the_old_manifest_first(trainer_cls, tmp_path):
    """A save into an existing step (after a resume from an earlier one) killed midway: the old
    manifest must not vouch for the half-rewritten files."""
    _saved(trainer_cls, tmp_path, 1, 2)
    trainer = trainer_cls(tmp_path)
    trainer.global_steps, trainer.killed = 2, True
    with pytest.raises(KeyboardInterrupt):
        trainer._save_checkpoint()
    assert not (tmp_path / "global_step_2" / MANIFEST_FILE).exists()
    assert prepare_resume(tmp_path).step == 1


def test_nothing_intact_is_one_line_and_moves_nothing(trainer_cls, tmp_path):
    _saved(trainer_cls, tmp_path, 1)
    (tmp_path / "global_step_1" / "actor" / "optim_world_size_1_rank_0.pt").unlink()
    with pytest.raises(RecallmError) as err:
        prepare_resume(tmp_path)
    message = str(err.value)
    assert "\n" not in message and "no intact checkpoint to resume from" in message
    assert "global_step_1 is damaged: actor/optim_world_size_1_rank_0.pt is missing" in message
    assert "trainer.resume_mode=disable" in message
    assert (tmp_path / "global_step_1").is_dir() and (tmp_path / TRACKER).read_text() == "1"


def test_a_tracker_naming_a_removed_step_is_not_a_silent_fresh_start(trainer_cls, tmp_path):
    """verl 0.9.1 trains from scratch, without a word, when the tracker names a missing directory."""
    _saved(trainer_cls, tmp_path, 1, 2)
    import shutil

    shutil.rmtree(tmp_path / "global_step_2")
    resume = prepare_resume(tmp_path)
    assert (
        resume.step == 1 and "global_step_2 (named by latest_checkpointed_iteration.txt) is missing" in resume.moved[0]
    )


def test_an_unreadable_tracker_counts_as_naming_the_newest_step(trainer_cls, tmp_path):
    _saved(trainer_cls, tmp_path, 1, 2)
    (tmp_path / TRACKER).write_text("")  # killed while verl rewrote it
    assert prepare_resume(tmp_path).step == 2 and (tmp_path / TRACKER).read_text() == "2"


def test_steps_saved_before_checksums_are_resumed_unverified(tmp_path):
    _write_step(tmp_path, 1)
    _write_step(tmp_path, 2)
    resume = prepare_resume(tmp_path)
    assert (resume.step, resume.verified) == (2, False) and "unverified" in resume.describe()
    assert prepare_resume(tmp_path / "none").step is None  # nothing saved: from scratch


def test_resume_path_is_verified_and_a_damaged_one_refused(trainer_cls, tmp_path):
    _saved(trainer_cls, tmp_path, 1, 2)
    assert prepare_resume(tmp_path, "resume_path", str(tmp_path / "global_step_1")).step == 1
    (tmp_path / "global_step_1" / "data.pt").write_bytes(b"x" * 32)
    with pytest.raises(RecallmError, match=r"global_step_1 is damaged: data.pt changed since it was written"):
        prepare_resume(tmp_path, "resume_path", str(tmp_path / "global_step_1"))
    with pytest.raises(RecallmError, match="is not a global_step_N directory"):
        prepare_resume(tmp_path, "resume_path", str(tmp_path))
    assert prepare_resume(tmp_path, "disable").step is None


def test_retention_keeps_the_eval_steps_weights_verifiable_and_never_resumes_from_them(
    trainer_cls, tmp_path, monkeypatch
):
    monkeypatch.setenv(retention.KEEP_ENV, "1")
    monkeypatch.setenv(retention.EVAL_STEP_ENV, "1")
    _saved(trainer_cls, tmp_path, 1, 2, 3)
    assert sorted(retention.saved_steps(tmp_path)) == [1, 3]
    assert not any((tmp_path / "global_step_1" / "actor").glob("optim_*"))
    assert check_step(tmp_path / "global_step_1")  # the weights left verify: export can use them
    (tmp_path / "global_step_3" / "data.pt").write_bytes(b"")
    with pytest.raises(RecallmError, match="no step with|global_step_3 is damaged"):
        prepare_resume(tmp_path)  # step 1 holds no optimizer state: not a resume point


def test_async_save_writes_no_manifest(trainer_cls, tmp_path, capsys):
    trainer = trainer_cls(tmp_path, async_save=True)
    trainer.global_steps = 1
    trainer._save_checkpoint()
    assert not (tmp_path / "global_step_1" / MANIFEST_FILE).exists()
    assert "without checksums" in capsys.readouterr().out


# ---------------------------------------------------------------------- issue 38: what a manifest vouches for
@pytest.mark.parametrize("kept", [[], ["data.pt"]], ids=["empty", "partial"])
def test_an_empty_or_partial_manifest_vouches_for_no_flipped_step(trainer_cls, tmp_path, kept):
    """A manifest rewritten with fewer files (an empty list said "checksums verified") counts as none: the step
    is incomplete, moved aside, and the newest step whose manifest lists all of it is resumed."""
    import json

    _saved(trainer_cls, tmp_path, 1, 2)
    manifest = tmp_path / "global_step_2" / MANIFEST_FILE
    files = json.loads(manifest.read_text())["files"]
    manifest.write_text(json.dumps({"version": 1, "files": {k: v for k, v in files.items() if k in kept}}))
    shard = tmp_path / "global_step_2" / "actor" / "model_world_size_1_rank_0.pt"
    shard.write_bytes(b"\xff" + shard.read_bytes()[1:])  # a flipped byte the manifest no longer lists
    resume = prepare_resume(tmp_path)
    assert (resume.step, resume.verified) == (1, True)
    assert "global_step_2 is incomplete: no recallm_files.json listing every file" in resume.moved[0]
    with pytest.raises(RecallmError, match="listing every file"):
        check_step(tmp_path / "corrupt-global_step_2")  # (moved aside; a manifest of a partial list is none)


def test_a_step_that_is_a_link_to_another_step_is_refused(trainer_cls, tmp_path):
    _saved(trainer_cls, tmp_path, 1)
    (tmp_path / "global_step_5").symlink_to(tmp_path / "global_step_1")
    (tmp_path / TRACKER).write_text("5")
    with pytest.raises(RecallmError, match="global_step_5 is not a directory of its run: it resolves to"):
        check_step(tmp_path / "global_step_5")
    resume = prepare_resume(tmp_path)
    assert resume.step == 1 and "global_step_5 is not a directory of its run" in resume.moved[0]
    assert (tmp_path / "global_step_1" / "actor").is_dir()  # the link moved aside, its target untouched
    (tmp_path / "global_step_7").symlink_to(tmp_path / "global_step_1")
    with pytest.raises(RecallmError, match="global_step_7 is not a directory of its run"):
        prepare_resume(tmp_path, "resume_path", str(tmp_path / "global_step_7"))


def test_a_tracker_that_is_a_directory_is_one_line(trainer_cls, tmp_path):
    _saved(trainer_cls, tmp_path, 1)
    (tmp_path / TRACKER).unlink()
    (tmp_path / TRACKER).mkdir()
    with pytest.raises(RecallmError, match="latest_checkpointed_iteration.txt is not a file"):
        prepare_resume(tmp_path)
    assert (tmp_path / TRACKER).is_dir()


@pytest.mark.parametrize(
    "manifest", ['{"version": 1, "files": {"data.pt": {"size": 1e999, "crc32": "0"}}}', "[" * 100000], ids=["1e999", "deep"]
)
def test_a_damaged_step_manifest_is_a_damaged_step(trainer_cls, tmp_path, manifest):
    _saved(trainer_cls, tmp_path, 1, 2)
    (tmp_path / "global_step_2" / MANIFEST_FILE).write_text(manifest)
    resume = prepare_resume(tmp_path)
    assert resume.step == 1 and "recallm_files.json unreadable" in resume.moved[0]


def test_resume_mode_is_one_of_verls(tmp_path):
    with pytest.raises(RecallmError, match="trainer.resume_mode=bogus is not one of auto, disable, resume_path"):
        prepare_resume(tmp_path, "bogus")


def test_one_launch_per_run_directory(tmp_path):
    """recallm-grpo holds trainer.default_local_dir's lock from the resume check to the end; a second launch's
    checks say the directory is in use (one line naming the holder), before Ray starts."""
    from omegaconf import OmegaConf

    from recallm.grpo.checkpoints import check_run_dir, hold_run_dir

    cfg = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path / "run"), "resume_mode": "auto"}})
    assert list(check_run_dir(cfg)) == []
    with hold_run_dir(cfg):
        done = {}

        def second():  # another thread: as another process, another writer (the lock is per writer)
            done["checks"] = [str(p) for p in _problems(lambda: check_run_dir(cfg))]
            try:
                with hold_run_dir(cfg):
                    done["ran"] = True
            except RecallmError as exc:
                done["refused"] = str(exc)

        import threading

        thread = threading.Thread(target=second)
        thread.start()
        thread.join()
        assert "ran" not in done and "in use by another writer (recallm-grpo, pid" in done["refused"]
        assert len(done["checks"]) == 1 and "run is in use by another writer" in done["checks"][0]
    assert not (tmp_path / "run").exists()  # nothing left: the lock file and the directory it made are gone
    cfg.trainer.resume_mode = "bogus"
    assert [p for p in check_run_dir(cfg)] == [
        "trainer.resume_mode=bogus is not one of auto, disable, resume_path (verl would resume as auto): auto resumes "
        "the newest step, disable starts afresh, resume_path takes trainer.resume_from_path"
    ]


def _problems(check):
    from recallm.errors import collect

    return collect(check)

"""Two writers of one output (issue 38): nothing one run wrote is removed or replaced by another.

* ``recallm-export`` twice to one new ``--out``, the second started while the first runs: the first writes its
  model (rc 0, every file verified), the second is refused in one line (the first's lock on ``--out``) and
  removes nothing (it used to delete the whole output directory in its cleanup); each export writes a
  directory of its own and renames it at the end without replacing (``recallm.io.atomic_dir``).
* ``recallm-grpo`` on a ``trainer.default_local_dir`` another launch holds: refused before Ray starts, with one
  line naming the holder (two launches trained into one directory to rc 0).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch


def fake_checkpoint(model_dir: Path, root: Path) -> Path:
    """A GRPO run directory as verl 0.9.1 saves one step of ``model_dir`` on one rank (plain tensors: verl's merger
    reads them as an FSDP world of 1), without manifests."""
    from safetensors.torch import load_file

    actor = root / "global_step_1" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, actor / "huggingface" / name)
    torch.save(load_file(str(model_dir / "model.safetensors")), actor / "model_world_size_1_rank_0.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"world_size": 1}))
    (root / "latest_checkpointed_iteration.txt").write_text("1")
    return root


def _export(checkpoint: Path, out: Path, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "recallm.cli.export", "--checkpoint", str(checkpoint), "--out", str(out)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.slow
def test_two_exports_to_one_new_out_never_remove_each_others_files(tiny_dir, tmp_path):
    from recallm.io import verify_manifest

    checkpoint = fake_checkpoint(tiny_dir, tmp_path / "run")
    out = tmp_path / "exported"
    first = _export(checkpoint, out, tmp_path)
    lock = tmp_path / ".exported.recallm.lock"
    deadline = time.monotonic() + 120
    while not lock.exists():  # the first holds --out (its lock file beside it) from before it reads anything
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.1)
    second = _export(checkpoint, out, tmp_path)
    _, err2 = second.communicate(timeout=300)
    out1, err1 = first.communicate(timeout=300)
    assert second.returncode == 2, err2[-2000:]
    lines = [line for line in err2.splitlines() if line.startswith("error:")]
    # refused while the first runs (its lock), or once it has finished (its model is there): never a cleanup
    assert lines and ("is in use by another writer (recallm-export, pid" in lines[-1] or "is not empty" in lines[-1])
    assert first.returncode == 0, err1[-3000:]
    assert f"wrote {out}" in out1
    assert "has no checksums" in err1 and "read unverified" in err1  # (a checkpoint without manifests, said so)
    assert verify_manifest(out, complete=True)  # the first's model, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "run"]  # no private directory, no lock left
    # afterwards: the directory is taken, and a third export refuses it at once
    third = _export(checkpoint, out, tmp_path)
    _, err3 = third.communicate(timeout=300)
    assert third.returncode == 2 and "is not empty: an export writes a new directory" in err3
    assert verify_manifest(out, complete=True)


def _holding(code: str) -> subprocess.Popen:
    """Another process running ``code`` (which prints ``held`` once it holds its lock), until killed."""
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_an_export_to_an_out_another_export_holds_is_refused_at_once(tiny_dir, tmp_path, capsys):
    from recallm.cli.export import main

    checkpoint = fake_checkpoint(tiny_dir, tmp_path / "run")
    out = tmp_path / "exported"
    holder = _holding(
        "import time\nfrom recallm.io import lock_output\n"
        f"with lock_output({str(out)!r}, 'recallm-export'):\n    print('held', flush=True)\n    time.sleep(300)\n"
    )
    try:
        with pytest.raises(SystemExit) as exc:
            main(["--checkpoint", str(checkpoint), "--out", str(out)])
        err = capsys.readouterr().err.strip().splitlines()
        assert exc.value.code == 2
        assert f"{out} is in use by another writer (recallm-export, pid {holder.pid}" in err[-1], err
        assert not out.exists()
    finally:
        holder.kill()
        holder.wait()


def test_an_export_that_fails_leaves_nothing_and_keeps_what_is_there(tiny_dir, tmp_path, capsys):
    """A damaged step (a shard that does not read) fails in one line; the output directory, never created, is not
    there, and the private directory it wrote into is gone."""
    from recallm.cli.export import main

    checkpoint = fake_checkpoint(tiny_dir, tmp_path / "run")
    (checkpoint / "global_step_1" / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(SystemExit) as exc:
        main(["--checkpoint", str(checkpoint), "--out", str(tmp_path / "exported")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and err[-1].startswith("error: cannot read the checkpoint shards in"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_second_grpo_launch_on_a_held_run_directory_is_refused(tiny_dir, tmp_path, monkeypatch, capsys):
    """Another process holds trainer.default_local_dir (a launch training there): this launch's checks refuse it in
    one line naming the holder, before Ray starts; the holder's directory is untouched."""
    run_dir = tmp_path / "grpo-run"
    holder = _holding(
        "import time\nfrom recallm.io import lock_dir\n"
        f"with lock_dir({str(run_dir)!r}, 'recallm-grpo'):\n    print('held', flush=True)\n    time.sleep(300)\n"
    )
    try:
        import recallm.grpo.app as app
        from recallm.cli.grpo import main

        monkeypatch.setattr(app, "launch", lambda cfg, env: pytest.fail("a second launch reached verl"))
        with pytest.raises(SystemExit) as exc:
            main(["grpo=tiny_cpu", f"actor_rollout_ref.model.path={tiny_dir}", f"trainer.default_local_dir={run_dir}"])
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert exc.value.code == 2
        assert any(f"{run_dir} is in use by another writer (recallm-grpo, pid {holder.pid}" in line for line in err), err
        assert sorted(p.name for p in run_dir.iterdir()) == [".recallm.lock"]
    finally:
        holder.kill()
        holder.wait()

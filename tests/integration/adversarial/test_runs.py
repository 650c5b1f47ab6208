"""Runs that collide or die mid-write (issue 18 items 8 and 9): a second ``recallm-data`` writer of
one ``out_dir`` is refused in one line, and every file the project renames into place (data shards,
manifest, summaries, eval and RLM summaries, the pipeline state, scored output) was fsync'd before
the rename, its directory after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from recallm.errors import RecallmError
from tests.fsync_spy import RenameSpy

MIX = {
    "seed": 0,
    "tolerance": 0.05,
    "train": {
        "lengths": [192, 224],
        "entries": [{"task": "kv_retrieval", "count": 6, "params": {"key_type": "toy", "value_type": "toy"}}],
    },
    "val": {"lengths": [256], "per_cell": 2},
    "sft": {"count": 4, "val_fraction": 0.25},
}


def _files(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_second_data_writer_is_refused(tmp_path, tiny_dir):
    """The issue's case: another run writes into the same out_dir (here: holds its lock); a second
    ``recallm-data`` with another plan exits 2 in one line and touches nothing there."""
    from data_gen.generate import run_schedule, schedule_from_config
    from recallm.io import lock_dir

    out = tmp_path / "data"
    run_schedule(schedule_from_config(MIX), out, tiny_dir, workers=1, progress=False)
    before = _files(out)
    with lock_dir(out, "recallm-data (test)"):
        proc = subprocess.run(
            [sys.executable, "-m", "recallm.cli.data", "data=tiny", f"out_dir={out}", f"tokenizer={tiny_dir}"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            timeout=300,
        )
        # in this process, another thread is another writer too
        errors = []
        worker = threading.Thread(target=lambda: _try(errors, run_schedule, schedule_from_config(MIX), out, tiny_dir))
        worker.start()
        worker.join()
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert (
        "is in use by another writer" in lines[0] and "recallm-data (test)" in lines[0] and str(os.getpid()) in lines[0]
    )
    assert len(errors) == 1 and isinstance(errors[0], RecallmError) and "in use" in str(errors[0])
    assert _files(out) == before
    # released: the next run goes ahead (and reuses every shard)
    run_schedule(schedule_from_config(MIX), out, tiny_dir, workers=1, progress=False)
    assert _files(out) == before


def _try(errors, fn, *args):
    try:
        fn(*args, workers=1, progress=False)
    except Exception as exc:  # noqa: BLE001  (the test inspects it)
        errors.append(exc)


def test_lock_is_reentrant_in_one_thread_and_released_on_error(tmp_path):
    from recallm.io import lock_dir

    with lock_dir(tmp_path, "outer"), lock_dir(tmp_path, "inner"):
        pass
    with pytest.raises(KeyError), lock_dir(tmp_path, "failing"):
        raise KeyError("x")
    with lock_dir(tmp_path, "again"):  # free again
        pass


def test_data_outputs_are_fsynced_before_rename(tmp_path, tiny_dir, monkeypatch):
    from data_gen.generate import run_schedule, schedule_from_config

    spy = RenameSpy().install(monkeypatch)
    out = tmp_path / "data"
    run_schedule(schedule_from_config(MIX), out, tiny_dir, workers=1, progress=False)
    renamed = {str(p.relative_to(out)) for p in spy.renamed()}
    assert {"shards/manifest.json", "summary.json", "summary.md", "train.parquet", "sft/train.jsonl"} <= renamed
    assert any(name.startswith("shards/train-") for name in renamed)
    assert spy.problems() == []
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]


def test_summaries_and_state_are_fsynced_before_rename(tmp_path, monkeypatch):
    """The eval run file, the RLM summary, the pipeline state and recallm-score's output."""
    from recallm.cli.score import score_file
    from recallm.pipeline import _save_state
    from recallm.rlm.evaluate import run_tasks

    spy = RenameSpy().install(monkeypatch)
    run_tasks(None, [], tmp_path / "rlm", fingerprint={"x": 1}, progress=False)  # nothing to run: summary only
    _save_state(tmp_path, {"jobs": {}})
    src = tmp_path / "in.jsonl"
    src.write_text(
        json.dumps({"response": "</think>\nAnswer: 1", "ground_truth": {"category": "short_math", "answers": ["1"]}})
        + "\n"
    )
    score_file(src, tmp_path / "scored.jsonl", None)
    renamed = {str(p.relative_to(tmp_path)) for p in spy.renamed()}
    assert {"rlm/run.json", "rlm/summary.json", "pipeline.json", "scored.jsonl"} <= renamed, renamed
    assert spy.problems() == []


def test_atomic_write_keeps_the_old_file_when_the_writer_fails(tmp_path):
    from recallm.io import atomic_path, write_json_atomic

    target = tmp_path / "summary.json"
    write_json_atomic(target, {"v": 1})
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text('{"v": 2, "trunc')
        raise RuntimeError("killed mid-write")
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]

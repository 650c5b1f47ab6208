"""Data shards and outputs carry checksums (issue 31): one flipped byte in a shard no longer changes
rows of ``train.parquet`` silently — the shard is found damaged and generated again, as a truncated
one is; the outputs are verified where they are read."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from recallm.errors import RecallmError

MIX = {
    "seed": 3,
    "train": {
        "lengths": [192, 256],
        "entries": [{"task": "kv_retrieval", "count": 6, "params": {"key_type": "toy", "value_type": "toy"}}],
    },
    "sft": {"count": 2, "val_fraction": 0.0},
}


@pytest.fixture(scope="module")
def generated(tmp_path_factory, tiny_dir) -> Path:
    from data_gen.generate import run_schedule, schedule_from_config

    out = tmp_path_factory.mktemp("data") / "out"
    run_schedule(schedule_from_config(MIX), out, tiny_dir, workers=1, progress=False)
    return out


def _flip(path: Path, at: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if at is None else at
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


def _rerun(out: Path, tiny_dir: Path) -> dict:
    from data_gen.generate import run_schedule, schedule_from_config

    return run_schedule(schedule_from_config(MIX), out, tiny_dir, workers=1, progress=False)


@pytest.mark.parametrize("damage", ["flipped byte", "truncated"])
def test_damaged_shard_is_regenerated(generated, tmp_path, tiny_dir, caplog, damage):
    out = Path(shutil.copytree(generated, tmp_path / "out"))
    shard = sorted((out / "shards").glob("train-*.parquet"))[0]
    original = shard.read_bytes()
    train = (out / "train.parquet").read_bytes()
    if damage == "truncated":
        shard.write_bytes(original[: len(original) // 2])
    else:
        _flip(shard)
    with caplog.at_level(logging.WARNING, logger="data_gen"):
        _rerun(out, tiny_dir)
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert shard.name in warning and "generating it again" in warning, warning
    assert shard.read_bytes() == original  # the same rows again (deterministic)
    assert (out / "train.parquet").read_bytes() == train


def test_damaged_output_is_refused_where_it_is_read(generated, tmp_path):
    from data_gen.io import read_records
    from recallm.io import read_jsonl

    out = Path(shutil.copytree(generated, tmp_path / "out"))
    _flip(out / "train.parquet")
    with pytest.raises(RecallmError, match=r"train\.parquet changed since it was written"):
        read_records(out / "train.parquet")
    sft = out / "sft" / "train.jsonl"
    sft.write_bytes(sft.read_bytes()[:-10])
    with pytest.raises(RecallmError, match=r"train\.jsonl has \d+ bytes, \d+ were written"):
        read_jsonl(sft)


def test_shard_without_checksum_is_not_reused(generated, tmp_path, tiny_dir, caplog):
    """A shard the manifest does not list (written by another run, or by hand) is generated again."""
    out = Path(shutil.copytree(generated, tmp_path / "out"))
    (out / "shards" / "recallm_files.json").unlink()
    with caplog.at_level(logging.WARNING, logger="data_gen"):
        _rerun(out, tiny_dir)
    assert "no recorded checksum" in caplog.text


def test_workers_are_capped_by_shards_and_cpus(generated, tmp_path, tiny_dir, monkeypatch, caplog):
    """``workers=100000`` starts no more processes than there are shards to write and CPUs."""
    import data_gen.generate as generate

    started = []
    real = generate.ProcessPoolExecutor

    def pool(workers, *args, **kwargs):
        started.append(workers)
        return real(workers, *args, **kwargs)

    monkeypatch.setattr(generate, "ProcessPoolExecutor", pool)
    monkeypatch.setattr(generate.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    out = Path(shutil.copytree(generated, tmp_path / "out"))
    shards = sorted((out / "shards").glob("*.parquet"))
    for shard in shards[:2]:
        shard.unlink()
    with caplog.at_level(logging.WARNING, logger="data_gen"):
        generate.run_schedule(generate.schedule_from_config(MIX), out, tiny_dir, workers=100000, progress=False)
    assert started == [2] and "workers=100000: using 2" in caplog.text
    assert generate.worker_count(100000, 1) == 1 and generate.worker_count(1, 50) == 1

"""Data lost (issue 31): two ``recallm-score`` runs with one ``output=`` (the first said it wrote a
file holding the second's scores), ``input=X output=X`` (the rollouts overwritten), two
``recallm-eval`` runs into one directory (both ran everything), a deleted ``run.json`` (old results
reused unchecked), ``recallm-pipeline`` without a run-directory lock. Each is refused in one line,
and what is on disk stays."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from pathlib import Path

import pytest

from recallm.errors import RecallmError
from recallm.io import lock_dir, lock_output

PROMPT = "Documents:\n[1] Paris is in France.\n[2] Lyon is in France.\nQuestion: ?\n"
GT = {"category": "single_hop_qa", "answers": ["Paris"], "gold": [{"text": "Paris is in France.", "start": 15, "end": 34}]}


def _rollouts(path: Path, n: int = 3) -> Path:
    rows = [{"response": f"<think>x</think>\nAnswer: {a}", "ground_truth": GT, "prompt_text": PROMPT} for a in ["Paris", "Lyon", "Rome"][:n]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _main(monkeypatch, capsys, module: str, args: list[str]):
    import importlib

    mod = importlib.import_module(module)
    monkeypatch.setattr(sys, "argv", [module, *args])
    with pytest.raises(SystemExit) as exc:
        mod.main()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return exc.value.code, err


@contextlib.contextmanager
def _held_elsewhere(lock, path, what):
    """``lock(path, what)`` held by another thread (as another run would) for the block."""
    held, done = threading.Event(), threading.Event()

    def hold():
        with lock(path, what):
            held.set()
            done.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(30)
    try:
        yield
    finally:
        done.set()
        thread.join()


def test_score_output_that_is_the_input_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    src = _rollouts(tmp_path / "r.jsonl")
    before = src.read_bytes()
    code, err = _main(monkeypatch, capsys, "recallm.cli.score", ["input=r.jsonl", "output=./r.jsonl"])
    assert code == 2 and len(err) == 1 and "is the input file" in err[0], err
    assert src.read_bytes() == before


def test_second_score_run_with_the_same_output_is_refused(tmp_path, monkeypatch, capsys):
    """While one run holds ``out.jsonl``, a second is refused before it writes (and in the middle,
    were it past the check): the file the first reports is its own."""
    from recallm.cli.score import score_file

    monkeypatch.chdir(tmp_path)
    _rollouts(tmp_path / "a.jsonl")
    _rollouts(tmp_path / "b.jsonl", n=2)
    out = tmp_path / "out.jsonl"
    with _held_elsewhere(lock_output, out, "recallm-score (the first run)"):
        code, err = _main(monkeypatch, capsys, "recallm.cli.score", ["input=b.jsonl", "output=out.jsonl"])
        assert code == 2 and len(err) == 1 and "in use by another writer (recallm-score (the first run)" in err[0], err
        with pytest.raises(RecallmError, match="in use by another writer"):
            score_file(tmp_path / "b.jsonl", out, None)
    assert not out.exists()
    score_file(tmp_path / "a.jsonl", out, None)
    assert len(out.read_text().splitlines()) == 3
    leftovers = [p.name for p in tmp_path.iterdir() if ".tmp" in p.name]
    assert not leftovers, leftovers


def test_score_output_carries_its_checksum(tmp_path):
    from recallm.cli.score import score_file
    from recallm.io import read_jsonl

    out = tmp_path / "out.jsonl"
    score_file(_rollouts(tmp_path / "a.jsonl"), out, None)
    assert len(read_jsonl(out)) == 3
    out.write_text(out.read_text().replace('"line": 1', '"line": 7'))
    with pytest.raises(RecallmError, match=r"out\.jsonl changed since it was written"):
        read_jsonl(out)


def test_lock_file_that_is_a_directory_is_one_line(tmp_path):
    (tmp_path / "run" / ".recallm.lock").mkdir(parents=True)
    with pytest.raises(RecallmError, match=r"\.recallm\.lock is a directory, not a lock file"):
        with lock_dir(tmp_path / "run", "test"):
            pass

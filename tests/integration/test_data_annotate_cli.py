"""recallm-annotate's command line (a subprocess) against the stub teacher and annotator:
end to end, and a bad config as one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests import annotate_fixtures
from tests.annotate_fixtures import KEY_ENV, SECRET, check_examples, read_jsonl

# the shared fixtures (tests/annotate_fixtures.py), named here for pytest
parquet, rows, stub_factory, tokenizer = (
    annotate_fixtures.parquet,
    annotate_fixtures.rows,
    annotate_fixtures.stub_factory,
    annotate_fixtures.tokenizer,
)


def _cli(*args, cwd, env_extra=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "recallm.cli.annotate", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


def test_cli_end_to_end(parquet, tiny_dir, tmp_path, stub_factory, rows, tokenizer):
    plan = {i: ("ok", "exact") for i in range(6)} | {3: ("ok", "hopeless"), 6: ("wrong", "exact"), 7: ("ok", "fuzzy")}
    stub = stub_factory(rows, plan, fail_first=2)
    out = tmp_path / "out"
    proc = _cli(
        f"input={parquet}",
        f"tokenizer={tiny_dir}",
        f"output_dir={out}",
        f"teacher.base_url={stub.url}",
        "teacher.model=teacher-m",
        "annotator.model=annotator-m",
        f"teacher.api_key_env={KEY_ENV}",
        "teacher.backoff=0.01",
        "annotator.backoff=0.01",
        "val_fraction=0.2",
        "progress=false",
        cwd=tmp_path,
        env_extra={KEY_ENV: SECRET},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "kept 6, dropped 2" in proc.stdout and "unaligned_span" in proc.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["kept"] == 6 and report["dropped_by_reason"]["wrong_answer"] == 1
    assert report["splits"] == {"train": 5, "val": 1}
    assert report["settings"]["annotator"] == f"annotator-m @ {stub.url}"  # interpolated from teacher.base_url
    check_examples(read_jsonl(out / "train.jsonl") + read_jsonl(out / "val.jsonl"), tokenizer, rows)
    assert all(r["auth"] == f"Bearer {SECRET}" for r in stub.calls)
    everything = (
        proc.stdout
        + proc.stderr
        + "".join(p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".parquet")
    )
    assert SECRET not in everything


@pytest.mark.parametrize(
    "args, pattern",
    [
        (["output_dir={tmp}/o", "checks.min_similarity=1.5"], r"^error: checks.min_similarity must be in \[0.0, 1.0\]"),
        ([], r"^error: missing required config value\(s\): output_dir$"),
    ],
)
def test_cli_bad_config_is_one_line(parquet, tiny_dir, tmp_path, args, pattern):
    args = [a.format(tmp=tmp_path) for a in args]
    proc = _cli(f"input={parquet}", f"tokenizer={tiny_dir}", "teacher.model=t", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and re.search(pattern, lines[0]), proc.stderr
    assert "Traceback" not in proc.stderr

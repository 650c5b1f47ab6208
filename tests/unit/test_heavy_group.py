"""``@pytest.mark.heavy`` under ``make test``'s ``-n 2 --dist loadgroup``: every heavy test on one worker,
the light ones spread over both (tests/heavy_group.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SUITE = """
import os, time
import pytest

def _record(name):
    with open(os.path.join(os.environ["RAN_DIR"], name), "w") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"])

@pytest.mark.heavy
@pytest.mark.parametrize("i", range(4))
def test_heavy(i):
    _record(f"heavy{i}")
    time.sleep(0.3)

@pytest.mark.parametrize("i", range(12))
def test_light(i):
    _record(f"light{i}")
    time.sleep(0.1)
"""


def test_heavy_tests_share_one_worker_and_the_light_ones_both(tmp_path):
    (tmp_path / "conftest.py").write_text("from tests.heavy_group import pytest_collection_modifyitems  # noqa: F401\n")
    (tmp_path / "test_suite.py").write_text(SUITE)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    heavy: one worker\n")
    (tmp_path / "ran").mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAN_DIR": str(tmp_path / "ran")}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-p",
            "no:cacheprovider",
            "test_suite.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    ran = {p.name: p.read_text() for p in (tmp_path / "ran").iterdir()}
    assert len(ran) == 16
    heavy = {ran[f"heavy{i}"] for i in range(4)}
    assert len(heavy) == 1  # one worker ran all of them
    assert {ran[f"light{i}"] for i in range(12)} == {"gw0", "gw1"}  # the rest on both

"""The cluster tier (``make test-cluster``): the sbatch scripts under a real one-machine SLURM
(``scripts/local_slurm.sh``: Debian's slurm-wlm and munge) and GRPO on a Ray cluster of two nodes on
one machine. Everything here skips with the reason where it cannot run (not root, no apt-get, a port
taken), every wait has a timeout, and every daemon, job and Ray node a test starts is stopped."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCAL_SLURM = ROOT / "scripts" / "local_slurm.sh"
SKIP = 77  # local_slurm.sh: cannot run here


@dataclass
class Job:
    id: str
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.is_file() else ""


class LocalSlurm:
    """A running ``local_slurm.sh`` cluster: submit the checkout's sbatch scripts, wait for their end,
    read their final states (``jobcomp.log``: sacct needs slurmdbd, which it does not set up)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.conf = directory / "slurm.conf"

    def env(self, **extra: str) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RECALLM_", "RAY_"))}
        return {
            **keep,
            "SLURM_CONF": str(self.conf),
            "RECALLM_REPO": str(ROOT),
            "RECALLM_VENV": sys.prefix,
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
            **extra,
        }

    def run(self, *cmd: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(cmd, env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode:
            raise AssertionError(f"{shlex.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def submit(self, script: str, *args: str, options: tuple[str, ...] = (), logs: Path, env: dict | None = None) -> Job:
        """``sbatch <options> slurm/<script> <args>`` from the checkout's root, as a user submits it; the
        job's output goes to ``logs/<job name>-<id>.out`` (``--output`` overrides the script's)."""
        logs.mkdir(parents=True, exist_ok=True)
        cmd = ["sbatch", "--parsable", f"--output={logs}/%x-%j.out", *options, f"slurm/{script}", *args]
        proc = subprocess.run(cmd, cwd=ROOT, env=self.env(**(env or {})), capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, f"sbatch failed: {proc.stderr}"
        job = proc.stdout.strip().split(";")[0]
        name = re.search(r"--job-name=(\S+)", (ROOT / "slurm" / script).read_text()).group(1)
        return Job(job, logs / f"{name}-{job}.out")

    def show(self, job: Job) -> dict[str, str]:
        out = self.run("scontrol", "show", "job", "-o", job.id, check=False).stdout
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    def completions(self, job: Job) -> list[str]:
        """The final state of every run of ``job`` (one line per run in jobcomp.log: REQUEUED, COMPLETED, ...)."""
        log = self.dir / "jobcomp.log"
        lines = log.read_text().splitlines() if log.is_file() else []
        return [re.search(r"JobState=(\S+)", line).group(1) for line in lines if f"JobId={job.id} " in line]

    def wait_state(self, job: Job, states: tuple[str, ...], timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            state = self.show(job).get("JobState", "?")
            if state in states:
                return state
            if time.monotonic() > deadline:
                self.run("scancel", job.id, check=False)
                pytest.fail(f"job {job.id} still {state} after {timeout:g} s:\n{job.text()[-6000:]}")
            time.sleep(1)

    def wait(self, job: Job, timeout: float) -> str:
        """Wait for the job's end (cancelled after ``timeout``, then the test fails); its final state."""
        return self.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"), timeout)

    def wait_log(self, job: Job, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, job.text())
            if m:
                return m
            if self.show(job).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED"):
                break
            time.sleep(0.5)
        self.run("scancel", job.id, check=False)
        pytest.fail(f"job {job.id}: no {pattern!r} in its log within {timeout:g} s:\n{job.text()[-6000:]}")


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A real SLURM on this machine for the session (``scripts/local_slurm.sh start``), stopped at the end."""
    directory = tmp_path_factory.mktemp("slurm")
    try:
        proc = subprocess.run(["bash", str(LOCAL_SLURM), "start", str(directory)], capture_output=True, text=True,
                              timeout=900)
    except subprocess.TimeoutExpired:
        subprocess.run(["bash", str(LOCAL_SLURM), "stop", str(directory)], capture_output=True, timeout=120)
        pytest.fail("scripts/local_slurm.sh start did not finish in 900 s")
    if proc.returncode == SKIP:
        reasons = [line.removeprefix("skip: ") for line in proc.stderr.splitlines() if line.startswith("skip: ")]
        pytest.skip(reasons[-1] if reasons else proc.stderr.strip())
    if proc.returncode:
        pytest.fail(f"scripts/local_slurm.sh start failed: {proc.stderr.strip()}")
    try:
        yield LocalSlurm(directory)
    finally:
        subprocess.run(["bash", str(LOCAL_SLURM), "stop", str(directory)], capture_output=True, timeout=120)

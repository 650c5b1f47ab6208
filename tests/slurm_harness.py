"""A fake SLURM/Ray world for running ``slurm/*.sbatch`` without a cluster.

:class:`FakeCluster` lays out, under a temporary directory:

* ``repo/``: a copy of the checkout's ``slurm/`` as a fresh clone has it (``slurm/logs/`` holds only
  its ``.gitignore``; the scripts ``cd`` to ``repo/``);
* ``bin/`` (first on ``PATH``): ``srun`` (runs its command "on" ``--nodelist``'s node, i.e. with
  ``FAKE_NODE`` set), ``scontrol`` (``show hostnames``, ``show job -o``, ``requeue``),
  ``hostname`` (``-I``: the node's addresses, a loopback one first), ``ip`` and ``curl`` (succeeds
  when ``FAKE_JUDGE_UP=1`` and the ``vllm`` stub has started);
* ``venv/bin/``: ``ray``, ``python`` (``-m recallm.grpo.cluster``: returns once ``--nodes`` Ray
  nodes have started), ``vllm`` (a judge server: up until killed, or exits at once
  with ``FAKE_JUDGE_EXIT=1``), ``recallm-grpo``, ``recallm-eval``, ``torchrun``, ``recallm-plan`` (exits
  ``FAKE_PLAN_RC``, default 0).

Every stub appends one JSON line to ``calls.jsonl``: its name, the node it ran on, its arguments,
its pid and the environment variables in :data:`WATCHED_ENV`. ``ray start --block`` stays up
until killed (the scripts must clean it up); the driver (``recallm-grpo``/``torchrun``) can be told
to wait (``FAKE_DRIVER_SLEEP``) so that a test can signal the job while it trains. Nothing here
talks to a network: the addresses are strings from the documentation ranges.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WATCHED_ENV = (
    "RAY_ADDRESS",
    "MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP",
    "WANDB_MODE",
    "WANDB_DIR",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "SLURM_JOB_ID",
    "CUDA_VISIBLE_DEVICES",
)

_STUB = textwrap.dedent(
    r"""
    import json, os, sys, time
    name = os.environ["FAKE_STUB_NAME"]
    args = sys.argv[1:]
    watched = {WATCHED}
    entry = {"name": name, "node": os.environ.get("FAKE_NODE", "HEAD"), "args": args, "pid": os.getpid(),
             "env": {k: os.environ[k] for k in watched if k in os.environ}}
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(json.dumps(entry) + "\n")
    nodes = os.environ.get("FAKE_NODES", "node-0").split(",")
    if name == "srun":
        i = 0
        while args[i].startswith("-"):  # srun's own options (--key=value forms), then the command
            if args[i].startswith("--nodelist="):
                os.environ["FAKE_NODE"] = args[i].split("=", 1)[1]
            i += 1
        os.execvp(args[i], args[i:])
    elif name == "scontrol":
        if args[:2] == ["show", "hostnames"]:
            print("\n".join(nodes))
        elif args[:2] == ["show", "job"]:
            print(f"JobId={args[-1]} JobName=x EndTime={os.environ.get('FAKE_END_TIME', 'Unknown')} Partition=gpu")
    elif name == "hostname":
        if args == ["-I"]:
            ips = json.loads(os.environ.get("FAKE_IPS", "{}"))
            print("127.0.1.1 " + ips.get(os.environ.get("FAKE_NODE", nodes[0]), "192.0.2.1") + " fe80::1")
        else:
            print(os.environ.get("FAKE_NODE", nodes[0]))
    elif name == "ip":
        dev = args[args.index("dev") + 1]
        print(f"3: {dev}    inet {os.environ.get('FAKE_IFACE_IP', '198.51.100.7')}/24 brd 198.51.100.255 scope global {dev}")
    elif name == "ray":
        if "--block" in args:
            time.sleep(120)  # a Ray node: up until the job stops it
    elif name == "curl":  # the judge answers once its server has started (has written its line), as a real one
        with open(os.environ["FAKE_LOG"]) as f:
            started = any(json.loads(line)["name"] == "vllm" for line in f if line.strip())
        sys.exit(0 if os.environ.get("FAKE_JUDGE_UP") == "1" and started else 7)
    elif name == "vllm":
        if os.environ.get("FAKE_JUDGE_EXIT") != "1":
            time.sleep(120)  # a server: up until the job stops it
        sys.exit(1)
    elif name == "python":  # recallm.grpo.cluster: up once --nodes Ray nodes have started (as Ray sees them)
        rc = int(os.environ.get("FAKE_CLUSTER_RC", "0"))
        if rc == 0 and "--nodes" in args:
            want, deadline = int(args[args.index("--nodes") + 1]), time.monotonic() + 30
            while time.monotonic() < deadline:
                with open(os.environ["FAKE_LOG"]) as f:
                    calls = [json.loads(line) for line in f if line.strip()]
                if sum(c["name"] == "ray" and "--block" in c["args"] for c in calls) >= want:
                    break
                time.sleep(0.05)
            else:
                rc = 3
        sys.exit(rc)
    elif name in ("recallm-grpo", "recallm-eval", "torchrun"):
        wait = float(os.environ.get("FAKE_DRIVER_SLEEP", "0"))
        if wait:
            with open(os.environ["FAKE_LOG"] + ".started", "w") as f:
                f.write(str(os.getpid()))
            time.sleep(wait)
        sys.exit(int(os.environ.get("FAKE_DRIVER_RC", "0")))
    elif name == "recallm-plan":
        sys.exit(int(os.environ.get("FAKE_PLAN_RC", "0")))
    """
).replace("{WATCHED}", repr(WATCHED_ENV))

_SYSTEM_STUBS = ("srun", "scontrol", "hostname", "ip", "curl")
_VENV_STUBS = ("ray", "python", "vllm", "recallm-grpo", "recallm-eval", "torchrun", "recallm-plan")


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    calls: list[dict] = field(default_factory=list)

    def named(self, name: str) -> list[dict]:
        return [c for c in self.calls if c["name"] == name]


class FakeCluster:
    """Run sbatch scripts against stubs (see module doc). ``nodes``: the job's node names;
    ``ips``: node -> its non-loopback address (``hostname -I``)."""

    def __init__(self, tmp: Path, nodes: list[str], ips: dict[str, str] | None = None) -> None:
        self.tmp = Path(tmp)
        self.repo = self.tmp / "repo"
        # what a fresh checkout has: none of the logs a real job left in slurm/logs/
        shutil.copytree(
            ROOT / "slurm",
            self.repo / "slurm",
            ignore=lambda d, names: [n for n in names if Path(d).name == "logs" and n != ".gitignore"],
        )
        self.bin = self.tmp / "bin"
        self.venv = self.tmp / "venv"
        (self.venv / "bin").mkdir(parents=True)
        self.bin.mkdir()
        stub = self.tmp / "stub.py"
        stub.write_text(_STUB)
        for names, where in ((_SYSTEM_STUBS, self.bin), (_VENV_STUBS, self.venv / "bin")):
            for name in names:
                path = where / name
                path.write_text(f'#!/bin/sh\nFAKE_STUB_NAME={name} exec {sys.executable} {stub} "$@"\n')
                path.chmod(0o755)
        self.log = self.tmp / "calls.jsonl"
        self.nodes = nodes
        self.ips = ips or {}

    def env(self, **extra: str) -> dict[str, str]:
        keep = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "RECALLM_", "WANDB_", "NCCL_")) and k != "CUDA_VISIBLE_DEVICES"
        }
        env = {
            **keep,
            "PATH": f"{self.bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "RECALLM_REPO": str(self.repo),
            "RECALLM_VENV": str(self.venv),
            "FAKE_LOG": str(self.log),
            "FAKE_NODES": ",".join(self.nodes),
            "FAKE_IPS": json.dumps(self.ips),
            "SLURM_JOB_NODELIST": f"fake[{len(self.nodes)}]",
            "SLURM_NNODES": str(len(self.nodes)),
            "RECALLM_EPHEMERAL_RANGE": "32768 60999",  # Linux's default, whatever this machine's is
        }
        env.pop("FAKE_NODE", None)
        env.update(extra)
        return env

    def calls(self) -> list[dict]:
        if not self.log.is_file():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def run(self, script: str, *args: str, timeout: float = 60, **env: str) -> Run:
        """Run ``slurm/<script>`` to completion."""
        proc = subprocess.run(
            ["bash", str(self.repo / "slurm" / script), *args],
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=True,
        )
        return Run(proc.returncode, proc.stdout, proc.stderr, self.calls())

    def run_and_signal(
        self, script: str, *args: str, sig: int = signal.SIGUSR1, timeout: float = 60, **env: str
    ) -> Run:
        """Start ``slurm/<script>``, wait until its driver runs, send ``sig`` to the batch shell
        (as SLURM's ``--signal=B:...`` does), and wait for the script to end."""
        started = Path(str(self.log) + ".started")
        proc = subprocess.Popen(
            ["bash", str(self.repo / "slurm" / script), *args],
            env=self.env(FAKE_DRIVER_SLEEP="60", **env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + timeout
            while not started.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    out, err = proc.communicate()
                    raise AssertionError(f"the driver never started (rc={proc.returncode}): {out}\n{err}")
                time.sleep(0.05)
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        return Run(proc.returncode, out, err, self.calls())


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False

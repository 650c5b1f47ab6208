"""How model code is isolated (``Isolation``), and what the host builds for each kind: the
filesystem the REPL sees, bubblewrap's arguments, the scrubbed environment.

The kinds (``bwrap``, ``namespaces``, ``none``) are described in ``recallm.rlm.sandbox``; which one
works here is probed by starting a REPL (``repl.probe_isolation``).
"""

from __future__ import annotations

import logging
import os
import site
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recallm.rlm.sandbox import confine, proctree
from recallm.rlm.sandbox.limits import SandboxLimits

__all__ = ["Isolation", "ISOLATION_MODES", "DEFAULT_ISOLATION"]

log = logging.getLogger(__name__)

ISOLATION_MODES = ("bwrap", "auto", "namespaces", "none")
DEFAULT_ISOLATION = "bwrap"
HERE = Path(__file__).resolve().parent
WORKER = HERE / "worker.py"
SIBLINGS = ("worker.py", "protocol.py", "confine.py")  # what the worker imports, bound inside bubblewrap
INSIDE_DIR = "/opt/recallm-rlm"
INSIDE_HOME = confine.INSIDE_HOME
SHM_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Isolation:
    """How model code is isolated: ``kind`` is ``bwrap``, ``namespaces`` or ``none``;
    ``detail`` is bubblewrap's path, or why the stronger kinds are unavailable."""

    kind: str
    detail: str
    tree: str = ""
    """how the whole tree is capped (cgroup, or why not)"""

    @property
    def bubblewrap(self) -> bool:
        return self.kind == "bwrap"

    @property
    def isolated(self) -> bool:
        """Namespaces (no network, a minimal filesystem, own PIDs) around model code."""
        return self.kind in ("bwrap", "namespaces")

    def describe(self) -> str:
        root = os.geteuid() == 0
        who = (
            "runs as its own unprivileged uid without capabilities (no_new_privs)"
            if root
            else f"runs as the host's user (uid {os.getuid()}) without capabilities"
        )
        tree = self.tree or proctree.detect_cgroups().describe()
        caps = f"whole-tree caps: processes by RLIMIT_NPROC, {tree}" + (
            "" if tree.startswith("cgroup") and "memory" in tree else ", memory sampled by the host"
        )
        spaces = "no network, own PID/mount/IPC/UTS namespaces, a minimal read-only filesystem"
        if self.kind == "bwrap":
            return f"bubblewrap ({self.detail}): {spaces}; {who}; {caps}"
        if self.kind == "namespaces":
            return f"WITHOUT bubblewrap ({self.detail}): recallm's own Linux namespaces: {spaces}; {who}; {caps}"
        extra = (
            ""
            if root
            else (
                "; the host process is made non-dumpable, but the host user's other processes are open to it "
                "(signals, ptrace, /proc)"
            )
        )
        return (
            f"UNISOLATED ({self.detail}): model code shares the host's network and can read every file "
            f"readable by {'any user' if root else 'the host user'}; {who}{extra}; {caps}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "bubblewrap": self.bubblewrap,
            "isolated": self.isolated,
            "describe": self.describe(),
        }


def python() -> str:
    return os.path.realpath(sys.executable)


def site_dirs() -> list[str]:
    dirs = []
    for path in [*site.getsitepackages(), site.getusersitepackages()]:
        if path and os.path.isdir(path) and path not in dirs:
            dirs.append(path)
    return dirs


def python_paths() -> list[str]:
    """What the interpreter needs read-only inside the namespaces: its installation prefix(es)."""
    paths = []
    for prefix in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.path.dirname(python()))):
        prefix = os.path.realpath(prefix)
        if prefix and prefix != "/" and os.path.isdir(prefix) and prefix not in paths:
            paths.append(prefix)
    return paths


def visible(ro_paths: Sequence[str]) -> list[tuple[str, str, str]]:
    """The sandbox's filesystem, as ``(kind, source, destination)``: ``ro`` binds and
    ``symlink``s, the same for bubblewrap and for recallm's own namespaces."""
    entries: list[tuple[str, str, str]] = [("ro", "/usr", "/usr")]
    covered = ["/usr"]
    tops = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
    etc = tuple(f"/etc/{n}" for n in ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives"))
    for path in tops + etc:
        if os.path.islink(path):
            entries.append(("symlink", os.readlink(path), path))
        elif os.path.exists(path):
            entries.append(("ro", path, path))
            covered.append(path)
    for path in sorted({os.path.realpath(p) for p in ro_paths}, key=len):
        if not any(path == c or path.startswith(c + "/") for c in covered):
            entries.append(("ro", path, path))
            covered.append(path)
    return entries


def bwrap_args(
    bwrap: str, entries: Sequence[tuple[str, str, str]], limits: SandboxLimits, root_host: bool
) -> list[str]:
    args = [bwrap, "--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-pid", "--unshare-net"]
    args += ["--unshare-uts", "--unshare-cgroup-try", "--hostname", "rlm"]
    if not root_host:
        args += ["--unshare-user", "--disable-userns"]
    args += ["--cap-drop", "ALL"]
    if root_host:  # kept only until worker.py drops to the sandbox's uid (confine.py)
        for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_CHOWN"):
            args += ["--cap-add", cap]
    made = {"/"}

    def parents(dest: str) -> None:  # 0755, whatever the host's directory allows (e.g. /root, /home)
        missing = []
        parent = os.path.dirname(dest)
        while parent not in made:
            missing.append(parent)
            made.add(parent)
            parent = os.path.dirname(parent)
        for path in reversed(missing):
            args.extend(["--perms", "0755", "--dir", path])
        made.add(dest)

    files = [("ro", str(HERE / name), f"{INSIDE_DIR}/{name}") for name in SIBLINGS]
    for kind, source, dest in [*entries, *files]:
        parents(dest)
        args += ["--symlink", source, dest] if kind == "symlink" else ["--ro-bind", source, dest]
    args += ["--proc", "/proc", "--dev", "/dev"]
    for dest, perms, size in (("/tmp", "1777", limits.tmp_mb << 20), ("/dev/shm", "1777", SHM_BYTES),
                              (INSIDE_HOME, "0700", limits.home_mb << 20)):  # fmt: skip
        parents(dest)
        args += ["--perms", perms, "--size", str(size), "--tmpfs", dest]
    args += ["--remount-ro", "/", "--chdir", INSIDE_HOME]
    return args


def none_obstacle() -> str | None:
    """Why ``none`` cannot run here: a root host must run model code as an unprivileged uid,
    which must be able to read the interpreter, its site-packages and worker.py."""
    if os.geteuid() != 0:
        return None
    for path in [*python_paths(), *site_dirs(), str(HERE)]:
        obstacle = confine.world_reachable(path)
        if obstacle is not None:
            return f"the host is root and {obstacle}, so an unprivileged REPL could not run the interpreter"
    return None


def clean_env(home: str, tmp: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": tmp,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


_host_guarded = False


def guard_host() -> None:
    """Under ``none`` with a non-root host, model code runs as the host's user: make the host
    process non-dumpable, so that its memory and environment cannot be read through /proc."""
    global _host_guarded
    if not _host_guarded and os.geteuid() != 0:
        confine.set_dumpable(False)
        _host_guarded = True
        log.warning("RLM sandbox without isolation: this process is now non-dumpable (no core dumps, no ptrace)")

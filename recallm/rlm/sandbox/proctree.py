"""The host's handle on an RLM REPL's whole process tree: find it, cap it, kill all of it.

A REPL is more than one process: model code may fork, start subprocesses, ``setsid`` and
double-fork daemons. The host finds every process of a REPL three ways, whichever apply:

* **by uid**: when the host is root each REPL runs as its own unprivileged uid
  (``confine.UID_BASE`` + the pid of its first process), so every process with that uid is the
  REPL's, wherever it went;
* **by ancestry**: the descendants of the REPL's first process (with a PID namespace all of the
  REPL's processes stay below it; without one it is a child subreaper, so orphans come back);
* **by cgroup**: where the host may create cgroups (v2, or v1 ``memory`` / ``pids``
  controllers), each REPL gets one, which also caps the memory and the number of processes of
  the whole tree and counts out-of-memory kills.

``kill_tree`` kills by all three. ``Cgroups.detect()`` says once per process whether cgroups can
be used here, and why not.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "Cgroups",
    "CgroupSupport",
    "detect_cgroups",
    "scan",
    "tree_pids",
    "tree_rss",
    "kill_tree",
    "kill_uid",
    "dir_size",
]

log = logging.getLogger(__name__)

_PREFIX = "recallm-rlm-"
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_names = itertools.count(1)


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    uids: tuple[int, ...]
    zombie: bool


def scan() -> list[Proc]:
    """Every process on the machine (pid, parent, real/effective/saved/fs uids, zombie)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{entry}/status", "rb") as f:
                status = f.read()
        except OSError:  # it exited meanwhile
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        uids: tuple[int, ...] = ()
        for line in status.splitlines():
            if line.startswith(b"Uid:"):
                uids = tuple(int(x) for x in line.split()[1:])
                break
        found.append(Proc(int(entry), int(fields[1]), uids, fields[0] in (b"Z", b"X")))
    return found


def tree_pids(root_pid: int | None, uid: int | None, procs: list[Proc] | None = None) -> list[int]:
    """Live processes below ``root_pid`` (not itself) and every live process of ``uid``."""
    procs = scan() if procs is None else procs
    children: dict[int, list[int]] = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p.pid)
    alive = {p.pid for p in procs if not p.zombie}
    found: set[int] = set()
    if root_pid is not None:
        stack = list(children.get(root_pid, ()))
        while stack:
            pid = stack.pop()
            if pid not in found:
                found.add(pid)
                stack.extend(children.get(pid, ()))
    if uid is not None:
        found.update(p.pid for p in procs if uid in p.uids)
    return sorted(found & alive)


def tree_rss(pids: Iterable[int]) -> int:
    """Resident bytes of ``pids`` together (shared pages count once per process: an upper bound)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            pass
    return total


def dir_size(path: str, limit: int) -> int:
    """Bytes of the files under ``path`` (stops counting past ``limit``)."""
    total = 0
    stack = [path]
    while stack and total <= limit:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        else:
                            total += entry.stat(follow_symlinks=False).st_blocks * 512
                    except OSError:
                        pass
        except OSError:
            pass
    return total


def _kill_all(pids: Iterable[int]) -> int:
    n = 0
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            n += 1
        except (ProcessLookupError, PermissionError):
            pass
    return n


_KILL_AS = "import os, sys; u = int(sys.argv[1]); os.setgroups([]); os.setresgid(u, u, u); os.setresuid(u, u, u); os.kill(-1, 9)"


def kill_uid(uid: int) -> None:
    """Kill every process of ``uid`` at once: ``kill(-1, SIGKILL)`` made by a helper running as
    that uid, which the kernel does atomically (no process can fork away meanwhile). Root only."""
    import subprocess
    import sys

    try:
        subprocess.run([sys.executable, "-I", "-S", "-c", _KILL_AS, str(uid)], timeout=30, capture_output=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("could not kill the processes of uid %d at once (%s)", uid, exc)


def kill_tree(
    root_pid: int | None, uid: int | None, cgroups: Cgroups | None, *, at_once: bool = False, timeout: float = 10.0
) -> list[int]:
    """SIGKILL the REPL's processes found by ancestry of ``root_pid`` (which must not be reaped
    yet: its pid is then still its own), by ``uid`` and in ``cgroups``, again and again until
    none is left or ``timeout`` passes; ``root_pid`` itself is killed too but not reaped.
    ``at_once``: first kill every process of ``uid`` atomically (``kill_uid``; for trees without
    a PID namespace, where a process that keeps forking could outrun one kill at a time).
    Returns the pids still alive at the end (empty when all went)."""
    deadline = time.monotonic() + timeout
    if root_pid is not None:  # first the tree below the first process, while it still holds it together
        for _ in range(1000):
            below = tree_pids(root_pid, None)
            if not below or not _kill_all(below):
                break
        _kill_all([root_pid])
    if at_once and uid is not None and tree_pids(None, uid):
        kill_uid(uid)
    left: list[int] = []
    delay = 0.001
    while True:
        left = tree_pids(None, uid) if uid is not None else []
        if cgroups is not None:
            left = sorted(set(left) | set(cgroups.pids()))
        if not left:
            return []
        if cgroups is not None:
            cgroups.kill()
        _kill_all(left)
        if time.monotonic() > deadline:
            log.warning("RLM sandbox processes %s survived SIGKILL for %.0fs", left, timeout)
            return left
        time.sleep(delay)
        delay = min(0.05, delay * 2)


# --- cgroups --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CgroupSupport:
    """Where a REPL's cgroups go: ``parents`` maps ``memory`` / ``pids`` to (version, the host
    process's own cgroup directory of that controller); empty with ``reason`` when unusable."""

    parents: tuple[tuple[str, int, str], ...]
    reason: str = ""

    @property
    def usable(self) -> bool:
        return bool(self.parents)

    def describe(self) -> str:
        if not self.usable:
            return f"no cgroup ({self.reason})"
        versions = sorted({f"v{v}" for _, v, _ in self.parents})
        return f"cgroup {'+'.join(versions)} ({', '.join(c for c, _, _ in self.parents)})"


def _mountinfo() -> list[tuple[str, str, list[str]]]:
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) >= 5 and len(rest) >= 3:
                mounts.append((fields[4], rest[0], rest[2].split(",")))
    return mounts


def _own_cgroups() -> dict[str, str]:
    """``{controller or "": path}`` from /proc/self/cgroup ("" is the v2 hierarchy)."""
    own = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                own[name] = path
    return own


def _writable_parent(path: str) -> str | None:
    probe = os.path.join(path, f"{_PREFIX}probe-{os.getpid()}-{next(_names)}")
    try:
        os.mkdir(probe)
    except OSError as exc:
        return f"cannot create a cgroup under {path} ({exc.strerror})"
    try:
        os.rmdir(probe)
    except OSError:
        pass
    return None


@functools.cache
def detect_cgroups() -> CgroupSupport:
    """Whether this process may create child cgroups with the ``memory`` and ``pids``
    controllers (probed once: a child cgroup is made and removed)."""
    try:
        mounts, own = _mountinfo(), _own_cgroups()
    except OSError as exc:
        return CgroupSupport((), f"cannot read /proc/self/cgroup ({exc.strerror})")
    parents: list[tuple[str, int, str]] = []
    reasons = []
    v2 = next((m for m, t, _ in mounts if t == "cgroup2"), None)
    if v2 is not None and "" in own:
        base = os.path.normpath(v2 + own[""])
        try:
            with open(os.path.join(base, "cgroup.subtree_control")) as f:
                enabled = f.read().split()
        except OSError:
            enabled = []
        if {"memory", "pids"} <= set(enabled):
            why = _writable_parent(base)
            if why is None:
                _clean_stale(base)
                return CgroupSupport((("memory", 2, base), ("pids", 2, base)))
            reasons.append(why)
        else:
            reasons.append(f"the cgroup v2 {base} does not delegate memory and pids to children")
    for controller in ("memory", "pids"):
        mount = next((m for m, t, opts in mounts if t == "cgroup" and controller in opts), None)
        if mount is None or controller not in own:
            reasons.append(f"no cgroup v1 {controller} controller")
            continue
        base = os.path.normpath(mount + own[controller])
        why = _writable_parent(base)
        if why is not None:
            reasons.append(why)
            continue
        _clean_stale(base)
        parents.append((controller, 1, base))
    if not parents:
        return CgroupSupport((), "; ".join(reasons))
    return CgroupSupport(tuple(parents), "; ".join(reasons))


def _clean_stale(base: str) -> None:
    """Remove empty cgroups left by recallm processes that are gone (a host killed hard)."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        if not name.startswith(_PREFIX):
            continue
        owner = name[len(_PREFIX) :].split("-")[0]
        if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            try:
                os.rmdir(os.path.join(base, name))
            except OSError:
                pass


class Cgroups:
    """The cgroup(s) of one REPL: memory and process caps on the whole tree (module doc)."""

    def __init__(self, support: CgroupSupport, *, memory_bytes: int, max_pids: int) -> None:
        self.dirs: dict[str, tuple[int, str]] = {}
        name = f"{_PREFIX}{os.getpid()}-{next(_names)}"
        try:
            for controller, version, base in support.parents:
                path = os.path.join(base, name)
                if path not in {p for _, p in self.dirs.values()}:
                    os.mkdir(path)
                self.dirs[controller] = (version, path)
            self._limit("memory", memory_bytes, max_pids)
            self._limit("pids", memory_bytes, max_pids)
        except OSError:
            self.remove()
            raise

    def _write(self, path: str, text: str) -> None:
        with open(path, "w") as f:
            f.write(text)

    def _limit(self, controller: str, memory_bytes: int, max_pids: int) -> None:
        if controller not in self.dirs:
            return
        version, path = self.dirs[controller]
        if controller == "pids":
            self._write(os.path.join(path, "pids.max"), str(max_pids))
        elif version == 2:
            self._write(os.path.join(path, "memory.max"), str(memory_bytes))
            if os.path.exists(os.path.join(path, "memory.swap.max")):
                self._write(os.path.join(path, "memory.swap.max"), "0")
        else:
            self._write(os.path.join(path, "memory.limit_in_bytes"), str(memory_bytes))
            if os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
                self._write(os.path.join(path, "memory.memsw.limit_in_bytes"), str(memory_bytes))

    @property
    def caps_memory(self) -> bool:
        return "memory" in self.dirs

    @property
    def caps_pids(self) -> bool:
        return "pids" in self.dirs

    @property
    def join(self) -> list[str]:
        """The directories a process writes its pid into to join (each once)."""
        return sorted({path for _, path in self.dirs.values()})

    def pids(self) -> list[int]:
        found: set[int] = set()
        for path in self.join:
            try:
                with open(os.path.join(path, "cgroup.procs")) as f:
                    found.update(int(x) for x in f.read().split())
            except (OSError, ValueError):
                pass
        return sorted(found)

    def oom_kills(self) -> int:
        """How many processes the kernel killed for going over the memory cap so far."""
        if "memory" not in self.dirs:
            return 0
        version, path = self.dirs["memory"]
        name = "memory.events" if version == 2 else "memory.oom_control"
        try:
            with open(os.path.join(path, name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def kill(self) -> None:
        for version, path in self.dirs.values():
            if version == 2 and os.path.exists(os.path.join(path, "cgroup.kill")):
                try:
                    self._write(os.path.join(path, "cgroup.kill"), "1")
                except OSError:
                    pass
        _kill_all(self.pids())

    def remove(self) -> None:
        for path in self.join:
            for attempt in range(50):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if attempt == 49:
                        log.warning("could not remove the RLM sandbox cgroup %s", path)
                    time.sleep(0.02)
        self.dirs = {}

"""Confinement of an RLM REPL's process tree, on the sandbox side (standard library only).

This module runs in the processes the host starts for a REPL, before any model-written code
exists (``worker.py`` imports it as a sibling module, also inside bubblewrap), and lends its
few Linux calls (``prctl``) to the host. ``enter(config)`` is the first thing ``worker.py``
does; it returns only in the process that will run the REPL (the *worker*), already confined.
The first process (the *outer*, started by the host in a new session) first joins the
sandbox's cgroups, so that every process it ever starts is counted and capped there, then:

* ``bwrap``: replaces itself with bubblewrap, which starts ``worker.py`` again inside (stage
  ``inside``) in new PID/mount/network/IPC/UTS namespaces and a minimal read-only filesystem;
* ``namespaces`` (recallm's own, where bubblewrap is missing): creates the same namespaces
  itself (plus a user namespace when the host is not root), forks the namespace's PID 1 - a
  reaper that builds the same minimal filesystem (read-only bind mounts of ``/usr``, the Python
  installation and its site-packages, a fresh ``/proc``, a few device nodes, size-capped tmpfs
  for ``/tmp``, ``/dev/shm`` and the private directory ``/home/rlm``), pivots into it and forks
  the worker. The outer dies with the host, PID 1 with the outer (``PR_SET_PDEATHSIG``) and
  with the worker; the kernel then kills every process left in the namespace;
* ``none``: becomes a child subreaper (orphaned descendants come back to it), forks the worker,
  and kills whatever descendants remain when the worker exits or the host dies.

A host that dies without closing its sandboxes (``SIGKILL``, a killed test run) takes every
REPL process with it in every mode (bubblewrap: ``--die-with-parent``), also while a cell runs
or waits on a sub-call.

The worker then drops to the sandbox's own unprivileged uid when the host is root (a fresh uid
per REPL: ``RLIMIT_NPROC`` counts exactly its processes and threads, and the host can find and
kill all of them by uid), or clears its capabilities when it is root only inside a user
namespace; sets ``no_new_privs`` (no setuid binary or file capability can raise it again) and
makes itself non-dumpable.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import select
import signal
import stat
import time

__all__ = ["enter", "set_dumpable", "end_other_processes", "UID_BASE", "INSIDE_HOME"]

#: the sandbox's uid is UID_BASE + the outer process's pid (unique among live sandboxes)
UID_BASE = 1_900_000_000
INSIDE_HOME = "/home/rlm"

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_MOVE, MS_REC = 1024, 2048, 4096, 8192, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 36, 38
_CAP_VERSION_3 = 0x20080522
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "ppc64": 203, "s390x": 217}
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _check(result: int, what: str) -> int:
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _b(path: str | None) -> bytes | None:
    return None if path is None else os.fsencode(path)


def _prctl(option: int, arg: int = 0) -> None:
    _check(_libc.prctl(option, arg, 0, 0, 0), f"prctl({option})")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    result = _libc.mount(_b(source), _b(target), _b(fstype), flags, None if data is None else data.encode())
    _check(result, f"mount {source} on {target}")


def set_dumpable(dumpable: bool) -> None:
    """``PR_SET_DUMPABLE``: a non-dumpable process cannot be ptraced, nor its ``/proc`` files
    (``environ``, ``mem``) read, by other processes of the same user."""
    _prctl(PR_SET_DUMPABLE, 1 if dumpable else 0)


# --- the outer process ----------------------------------------------------------------------


def enter(config: dict) -> None:
    """Confine this process tree as ``config["confine"]`` says (see module doc); returns in the
    worker. Any failure is an exception: the worker never runs unconfined by accident."""
    spec = config["confine"]
    if spec["stage"] == "outer":
        for path in spec.get("cgroups") or ():
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        if spec.get("private_uid"):
            spec["uid"] = spec["gid"] = UID_BASE + os.getpid()
        mode = spec["mode"]
        if mode in ("namespaces", "none"):  # bubblewrap has --die-with-parent
            _die_with_host(spec, signal.SIGKILL if mode == "namespaces" else signal.SIGTERM)
        if mode == "bwrap":
            inner = dict(config, confine=dict(spec, stage="inside"))
            argv = [*spec["bwrap"], spec["python"], "-I", "-S", "-B", spec["inside_worker"], json.dumps(inner)]
            os.execv(argv[0], argv)
        elif mode == "namespaces":
            _enter_namespaces(spec)
        elif mode == "none":
            _enter_supervised(spec)
        else:
            raise ValueError(f"unknown confinement mode {mode!r}")
    _become_unprivileged(spec)


def _close_fds(fds) -> None:
    for fd in fds:
        try:
            os.close(int(fd))
        except OSError:
            pass


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _wait_for(pid: int) -> int:
    """Reap children (orphans included) until ``pid`` exits; its exit code."""
    while True:
        try:
            child, status = os.wait()
        except ChildProcessError:
            return 1
        if child == pid:
            return _exit_code(status)


def _children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == pid and fields[0] != b"Z":
            found.append(int(entry))
    return found


def _process_table() -> dict[int, tuple[int, bytes]]:
    """``pid -> (ppid, state)`` of every process this one can see in ``/proc``."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            table[int(entry)] = (int(fields[1]), fields[0])
    return table


def _live_descendants(root: int) -> list[int]:
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = [], list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, ()))
        if table[pid][1] not in (b"Z", b"X"):
            found.append(pid)
    return found


def end_other_processes(parent: int, seconds: float = 5.0) -> int:
    """Kill every live process below ``parent`` (the REPL's PID 1, or the supervisor under
    ``none``: orphans come back to it) except this one, round after round until none is left
    (a process forked meanwhile is found in the next round), then reap this process's own
    children and wait (at most ``seconds``) for ``parent`` to reap the rest, so that their slots
    under ``max_processes`` are free again. Returns how many were killed. Does nothing when
    ``parent`` is no longer this process's parent (the REPL is being torn down)."""
    if os.getppid() != parent:
        return 0
    me = os.getpid()
    killed: set[int] = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = [pid for pid in _live_descendants(parent) if pid != me]
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except OSError:
                pass
        _reap_children()
    while time.monotonic() < deadline:  # the zombies of orphans: reaped by ``parent``
        _reap_children()
        table = _process_table()
        if not any(pid in table for pid in killed):
            break
        time.sleep(0.01)
    return len(killed)


def _reap_children() -> None:
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


class _HostGone(Exception):
    pass


def _host_gone(signum, frame) -> None:
    raise _HostGone()


def _die_with_host(spec: dict, signum: int) -> None:
    """Get ``signum`` when the host dies (``PR_SET_PDEATHSIG``); exit now if it already has."""
    _prctl(PR_SET_PDEATHSIG, signum)
    host = spec.get("host_pid")
    if host is not None and os.getppid() != host:  # the host died before the line above
        os._exit(1)


def _enter_supervised(spec: dict) -> None:
    """``none``: the worker under a subreaper that kills its leftover descendants (module doc)."""
    signal.signal(signal.SIGTERM, _host_gone)  # the host died (_die_with_host) or asks to stop
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    home = spec["home"]
    if spec.get("uid") is not None:
        for path in (home, os.path.join(home, "tmp")):
            os.chown(path, spec["uid"], spec["gid"])
    worker = os.fork()
    if worker == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(home)
        return
    _close_fds(spec["fds"])
    try:
        code = _wait_for(worker)
    except _HostGone:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        code = 1
    for _ in range(1000):  # each round kills every live descendant; their children come back to us
        children = _children_of(os.getpid())
        if not children:
            break
        for child in children:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
    os._exit(code)


def _enter_namespaces(spec: dict) -> None:
    """``namespaces``: outer -> PID 1 of new namespaces (reaper) -> worker (module doc)."""
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    userns = os.geteuid() != 0
    uid, gid = os.getuid(), os.getgid()
    if userns:
        flags |= CLONE_NEWUSER
    lifeline_r, lifeline_w = os.pipe()
    _check(_libc.unshare(flags), "unshare")
    if userns:  # the host's uid inside too (with every capability in the namespace until the worker drops them)
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    init = os.fork()
    if init:
        os.close(lifeline_r)
        _close_fds(spec["fds"])
        os._exit(_wait_for(init))  # holds lifeline_w open until it dies
    # PID 1 of the new PID namespace
    os.close(lifeline_w)
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if select.select([lifeline_r], [], [], 0)[0]:  # the outer died before the line above
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    _build_root(spec["root"], userns, spec.get("uid"), spec.get("gid"))
    name = b"rlm"
    _check(_libc.sethostname(name, len(name)), "sethostname")
    worker = os.fork()
    if worker == 0:
        os.close(lifeline_r)
        os.chdir(INSIDE_HOME)
        return
    _close_fds(spec["fds"])
    os._exit(_wait_for(worker))


# --- the filesystem of the namespaces mode ----------------------------------------------------


def _mkdirs(path: str) -> None:
    """Create ``path`` and its missing parents, each 0755 whatever the umask."""
    parts = path.strip("/").split("/")
    current = ""
    for part in parts:
        current += "/" + part
        if not os.path.lexists(current):
            os.mkdir(current)
            os.chmod(current, 0o755)


def _locked_flags(path: str) -> int:
    """The flags of the mount under ``path`` that a read-only remount must keep (in a user
    namespace the kernel refuses to clear them)."""
    have = os.statvfs(path).f_flag
    flags = 0
    for st_flag, ms_flag in (
        (os.ST_NOEXEC, MS_NOEXEC),
        (os.ST_NOATIME, MS_NOATIME),
        (os.ST_NODIRATIME, MS_NODIRATIME),
        (os.ST_RELATIME, MS_RELATIME),
        (os.ST_NODEV, MS_NODEV),
        (os.ST_NOSUID, MS_NOSUID),
    ):
        if have & st_flag:
            flags |= ms_flag
    return flags


def _bind(source: str, target: str, *, read_only: bool, extra: int = 0) -> None:
    if os.path.isdir(source):
        _mkdirs(target)
    else:
        _mkdirs(os.path.dirname(target))
        if not os.path.lexists(target):
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    _mount(source, target, None, MS_BIND | MS_REC)
    flags = MS_BIND | MS_REMOUNT | MS_NOSUID | extra | _locked_flags(source)
    _mount(None, target, None, flags | (MS_RDONLY | MS_NODEV if read_only else 0))


def _tmpfs(target: str, size: int, mode: str, flags: int = MS_NOSUID | MS_NODEV, owner: str = "") -> None:
    _mkdirs(target)
    _mount("tmpfs", target, "tmpfs", flags, f"size={int(size)},mode={mode}{owner}")


def _build_root(root: dict, userns: bool, uid: int | None, gid: int | None) -> None:
    """Build the sandbox's filesystem at ``root["dir"]`` (a private mount namespace) and pivot
    into it; the host's filesystem is gone from this namespace afterwards."""
    new = root["dir"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=0755")
    for kind, source, dest in root["entries"]:
        target = new + dest
        if kind == "symlink":
            _mkdirs(os.path.dirname(target))
            os.symlink(source, target)
        else:
            _bind(source, target, read_only=True)
    _mkdirs(new + "/proc")
    _mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _tmpfs(new + "/dev", 1 << 16, "0755", MS_NOSUID | MS_NOEXEC)
    for device in _DEVICES:
        if os.path.exists(f"/dev/{device}"):
            _bind(f"/dev/{device}", f"{new}/dev/{device}", read_only=False, extra=MS_NOEXEC)
    for name, link in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                       ("stderr", "/proc/self/fd/2")):  # fmt: skip
        os.symlink(link, f"{new}/dev/{name}")
    _tmpfs(new + "/dev/shm", root["shm_bytes"], "1777")
    _tmpfs(new + "/tmp", root["tmp_bytes"], "1777")
    owner = "" if userns or uid is None else f",uid={uid},gid={gid}"
    _tmpfs(new + INSIDE_HOME, root["home_bytes"], "0700", owner=owner)
    _mount(None, new, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=16m,mode=0755")
    os.chdir(new)
    number = _PIVOT_ROOT.get(platform.machine())
    if number is not None:
        _check(_libc.syscall(number, b".", b"."), "pivot_root")
        _check(_libc.umount2(b".", MNT_DETACH), "umount the host's root")
    else:  # what switch_root does: the old root stays below, unreachable by path
        _mount(new, "/", None, MS_MOVE)
        os.chroot(".")
    os.chdir("/")


# --- the worker ----------------------------------------------------------------------------


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 40


def _clear_capabilities() -> None:
    for cap in range(_last_cap() + 1):  # the bounding set (needs CAP_SETPCAP; otherwise no_new_privs covers it)
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == -1 and ctypes.get_errno() not in (1, 22):  # EPERM, EINVAL
            _check(-1, "PR_CAPBSET_DROP")
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")


def _really_root() -> bool:
    """Whether this process is root of the host (not only inside a user namespace)."""
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/self/uid_map") as f:
            return any(line.split()[:2] == ["0", "0"] for line in f)
    except OSError:
        return True


def _become_unprivileged(spec: dict) -> None:
    uid, gid = spec.get("uid"), spec.get("gid")
    if spec.get("chown_home") and uid is not None:
        os.chown(INSIDE_HOME, uid, gid)
    if uid is not None and os.getuid() != uid:
        for cap in range(_last_cap() + 1):  # while CAP_SETPCAP is still there
            _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)  # clears the permitted and effective capabilities
        if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
            raise OSError(f"could not drop to uid {uid}")
    _clear_capabilities()
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    set_dumpable(False)
    nproc = spec.get("nproc")
    if nproc:
        import resource

        resource.setrlimit(resource.RLIMIT_NPROC, (int(nproc), int(nproc)))
    if _really_root():
        raise OSError("refusing to run model code as the host's root")


def world_reachable(path: str) -> str | None:
    """None when any user can reach ``path`` (every directory on the way searchable by others,
    the path itself readable); else the first obstacle, in words."""
    current = "/"
    for part in os.path.realpath(path).strip("/").split("/"):
        if not part:
            continue
        mode = os.stat(current).st_mode
        if not mode & stat.S_IXOTH:
            return f"{current} is not searchable by other users"
        current = os.path.join(current, part)
    if not os.stat(current).st_mode & stat.S_IROTH:
        return f"{current} is not readable by other users"
    return None

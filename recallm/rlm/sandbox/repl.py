"""The host side of an RLM's REPL: model-written code never runs in the host interpreter.

Each RLM instance gets one ``Sandbox``: a separate Python process (``recallm/rlm/worker.py``)
holding a persistent namespace, talking to the host over two pipes (``recallm/rlm/protocol.py``).
Model code is hostile until proven otherwise. What protects the host:

* **isolation** (``isolation``), see ``ISOLATION_MODES``:

  - ``bwrap`` (the default): bubblewrap, required. New PID, mount, network, IPC and UTS
    namespaces (no network at all: ``127.0.0.1`` is unreachable), a read-only view of only
    ``/usr``, the Python installation and (optionally) its site-packages; no ``/proc`` of other
    processes, no ``/etc/shadow``, no ``/root``, ``/home`` or project directory.
  - ``namespaces``: the same namespaces and filesystem built by recallm itself
    (``confine.py``), for hosts without bubblewrap where the host is root or unprivileged user
    namespaces work.
  - ``none``: no namespaces: model code shares the host's network and sees every file its
    user may read; only the safeguards below apply. Refused when the host is root and the
    Python installation is not readable by an unprivileged user (the REPL would need root).
  - ``auto``: the first of ``bwrap``, ``namespaces``, ``none`` that works here, with a
    warning, and the result in every trajectory and evaluation report when it is not bwrap.

* **an unprivileged user**: when the host is root, each REPL runs as its own uid
  (``confine.UID_BASE`` + the pid of its first process) with no capabilities and
  ``no_new_privs``; it can neither signal, ptrace nor read the memory or environment of the
  host's processes, nor read root's files. (A non-root host's REPL runs as the host's user with
  no capabilities; under ``none`` the host then makes itself non-dumpable, so that model code
  cannot read its memory or environment.)
* **the whole process tree** is one unit (``proctree.py``): killed together, always - at
  ``close()``, on a timeout, a restart or a protocol violation - by PID namespace, uid, cgroup
  and ancestry; no child, ``setsid`` grandchild or daemon outlives its sandbox.
* **caps on the whole tree**: ``max_processes`` (processes and threads together:
  ``RLIMIT_NPROC`` on the REPL's own uid, and the cgroup's ``pids.max``), ``memory_mb`` (each
  process's address space, and the resident memory of all of them together: a cgroup where
  the host may create one, else the host samples it every 0.25 s and restarts the REPL when it
  is over), ``home_mb`` (the private directory ``/home/rlm``, a tmpfs; sampled under ``none``),
  ``tmp_mb`` (``/tmp``), ``max_file_mb`` (any single file), CPU time and wall clock per cell, and
  the output a cell returns;
* **a scrubbed environment** (no API keys or other host secrets) and ``python -I -S -B``;
* **a bounded host side**: every message from the REPL is checked; a ``done`` is accepted only
  for the cell in flight (cell ids are random), a reply only for the request in flight, and
  anything else - a forged or late reply, an unknown message, a line longer than
  ``max_message_mb`` - ends the REPL (it is restarted, the cell reports why). Sub-calls run on
  at most ``max_processes`` host threads at once; more in flight, duplicates and kinds the REPL
  was not given are answered with an error at once. Writes to a REPL that stops reading give up
  after ``_SEND_TIMEOUT_S``.

Sub-calls that model code makes arrive as ``call`` messages; ``on_call(kind, args)`` (the RLM's
sub-call router) answers each on a bounded pool of threads, so that concurrent calls from
threads in a cell, and batched calls, are served at once. Each call gets a ``CancelToken``
(``recallm.cancel.current()`` inside ``on_call``), cancelled when the cell that made it ends
(or is killed) while it is still in flight.

A cell's wall clock counts only its own time: while one of its sub-calls is in flight, the
worker's timer is paused and the host's kill deadline moves by as much. ``execute(max_s=...)``
bounds the whole cell, waits included (the task's remaining wall time): past it, the cell's
sub-calls are cancelled and the cell gets ``kill_grace_s`` to end before it is killed.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import secrets
import select
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recallm import cancel as _cancel
from recallm.config import dataclass_values
from recallm.errors import RecallmError
from recallm.rlm.budget import BudgetExhausted
from recallm.rlm.sandbox import confine, proctree
from recallm.rlm.sandbox.protocol import LineReader, ProtocolError, encode

__all__ = [
    "SandboxLimits",
    "Isolation",
    "detect_isolation",
    "probe_isolation",
    "resolve_isolation",
    "Sandbox",
    "CellResult",
    "ISOLATION_MODES",
    "DEFAULT_ISOLATION",
]

log = logging.getLogger(__name__)

ISOLATION_MODES = ("bwrap", "auto", "namespaces", "none")
DEFAULT_ISOLATION = "bwrap"
_HERE = Path(__file__).resolve().parent
_WORKER = _HERE / "worker.py"
_SIBLINGS = ("worker.py", "protocol.py", "confine.py")  # what the worker imports, bound inside bubblewrap
_INSIDE_DIR = "/opt/recallm-rlm"
_INSIDE_HOME = confine.INSIDE_HOME
_SHM_BYTES = 16 * 1024 * 1024
_HELPER_MB = 16  # memory the sandbox's own helper processes (bubblewrap, PID 1) add to a cgroup, on top of memory_mb
_SAMPLED_HELPERS_MB = 32  # resident memory of the helper Python processes (counted when no private uid)
_TICK_S = 0.25  # how often the host checks a running cell (samples, a stalled channel)
_SEND_TIMEOUT_S = 10.0
_warned: set[str] = set()


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one REPL (all its processes together) and of each cell it runs."""

    cpu_s: float = 60.0
    """CPU seconds per cell"""
    wall_s: float = 120.0
    """wall-clock seconds per cell (also cut to the task's remaining wall time)"""
    memory_mb: int = 2048
    """address space of each REPL process (RLIMIT_AS) and resident memory of all of them together, in MiB"""
    max_processes: int = 64
    """processes and threads of the REPL together (and sub-calls the host serves for it at once)"""
    max_output_chars: int = 100_000
    """characters of a cell's output that leave the sandbox (the rest is counted, not sent)"""
    max_file_mb: int = 256
    """largest file a cell may write (RLIMIT_FSIZE), in MiB"""
    home_mb: int = 256
    """size of the private directory /home/rlm (a tmpfs, counted in memory_mb), in MiB"""
    tmp_mb: int = 256
    """size of /tmp inside the namespaces (a tmpfs, counted in memory_mb), in MiB"""
    max_message_mb: int = 64
    """longest message the host accepts from the REPL (a sub-call's arguments), in MiB"""
    kill_grace_s: float = 2.0
    """after the wall-clock limit, seconds the worker gets to stop the cell before it is killed"""
    startup_timeout_s: float = 30.0
    """seconds a fresh REPL may take to load its context"""

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any] | None, where: str = "sandbox") -> SandboxLimits:
        limits = cls(**dataclass_values(cls, cfg, where))
        for name in limits.__dataclass_fields__:
            if getattr(limits, name) <= 0:
                raise RecallmError(f"{where}.{name} must be > 0, got {getattr(limits, name)}")
        if limits.memory_mb < 64:
            raise RecallmError(f"{where}.memory_mb must be >= 64 (Python itself needs some), got {limits.memory_mb}")
        if limits.max_processes < 4:
            raise RecallmError(
                f"{where}.max_processes must be >= 4 (the REPL itself uses 2 threads), got {limits.max_processes}"
            )
        return limits


# --- isolation ------------------------------------------------------------------------------


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


def _python() -> str:
    return os.path.realpath(sys.executable)


def _site_dirs() -> list[str]:
    dirs = []
    for path in [*site.getsitepackages(), site.getusersitepackages()]:
        if path and os.path.isdir(path) and path not in dirs:
            dirs.append(path)
    return dirs


def _python_paths() -> list[str]:
    """What the interpreter needs read-only inside the namespaces: its installation prefix(es)."""
    paths = []
    for prefix in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.path.dirname(_python()))):
        prefix = os.path.realpath(prefix)
        if prefix and prefix != "/" and os.path.isdir(prefix) and prefix not in paths:
            paths.append(prefix)
    return paths


def _visible(ro_paths: Sequence[str]) -> list[tuple[str, str, str]]:
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


def _bwrap_args(
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

    files = [("ro", str(_HERE / name), f"{_INSIDE_DIR}/{name}") for name in _SIBLINGS]
    for kind, source, dest in [*entries, *files]:
        parents(dest)
        args += ["--symlink", source, dest] if kind == "symlink" else ["--ro-bind", source, dest]
    args += ["--proc", "/proc", "--dev", "/dev"]
    for dest, perms, size in (("/tmp", "1777", limits.tmp_mb << 20), ("/dev/shm", "1777", _SHM_BYTES),
                              (_INSIDE_HOME, "0700", limits.home_mb << 20)):  # fmt: skip
        parents(dest)
        args += ["--perms", perms, "--size", str(size), "--tmpfs", dest]
    args += ["--remount-ro", "/", "--chdir", _INSIDE_HOME]
    return args


def _none_obstacle() -> str | None:
    """Why ``none`` cannot run here: a root host must run model code as an unprivileged uid,
    which must be able to read the interpreter, its site-packages and worker.py."""
    if os.geteuid() != 0:
        return None
    for path in [*_python_paths(), *_site_dirs(), str(_HERE)]:
        obstacle = confine.world_reachable(path)
        if obstacle is not None:
            return f"the host is root and {obstacle}, so an unprivileged REPL could not run the interpreter"
    return None


_PROBE_LIMITS = SandboxLimits(cpu_s=20, wall_s=20, memory_mb=256, startup_timeout_s=60, home_mb=1, tmp_mb=1)


@functools.cache
def probe_isolation(kind: str) -> Isolation | str:
    """``kind`` if a REPL starts and runs a cell with it here, else why not (probed once)."""
    if kind == "bwrap":
        detail = shutil.which("bwrap")
        if detail is None:
            return "bubblewrap (bwrap) is not installed; `apt-get install bubblewrap` adds it"
    elif kind == "none":
        obstacle = _none_obstacle()
        if obstacle is not None:
            return obstacle
        detail = "isolation=none"
    else:
        detail = "namespaces"
    candidate = Isolation(kind, detail)
    try:
        with Sandbox("", limits=_PROBE_LIMITS, isolation=candidate) as sb:
            result = sb.execute("import json, socket\nprint('ok')")
    except (RecallmError, OSError) as exc:
        return f"{kind} cannot start a sandbox here ({exc})"
    if result.stdout != "ok\n":
        return f"{kind} cannot start a sandbox here ({(result.error or result.stdout).strip().splitlines()[-1:]})"
    return candidate


@functools.cache
def detect_isolation() -> Isolation:
    """The strongest isolation that works here (what ``isolation=auto`` picks), probed once;
    ``kind`` ``none`` with the reasons when nothing works (then even ``none`` is refused)."""
    reasons: list[str] = []
    for kind in ("bwrap", "namespaces", "none"):
        found = probe_isolation(kind)
        if isinstance(found, Isolation):
            return Isolation(found.kind, "; ".join(reasons)) if reasons else found
        reasons.append(found)
    return Isolation("unavailable", "; ".join(reasons))


def resolve_isolation(mode: str) -> Isolation:
    """The isolation for ``mode`` (see ``ISOLATION_MODES``). ``bwrap``, ``namespaces`` and
    ``none`` are required as asked (a ``RecallmError`` saying why they do not work here);
    ``auto`` takes the strongest that works and warns, once, when it is not bubblewrap."""
    if mode not in ISOLATION_MODES:
        raise RecallmError(f"sandbox isolation must be one of {', '.join(ISOLATION_MODES)}, got {mode!r}")
    if mode == "auto":
        found = detect_isolation()
        if found.kind == "unavailable":
            raise RecallmError(f"no way to run model code safely here: {found.detail}")
    else:
        probed = probe_isolation(mode)
        if isinstance(probed, str):
            hint = {
                "bwrap": "; install it, or opt out with rlm.isolation=auto (recallm's own namespaces, else none)",
                "namespaces": "; use rlm.isolation=bwrap or auto",
                "none": "; use rlm.isolation=bwrap, namespaces or auto",
            }[mode]
            raise RecallmError(f"sandbox isolation={mode}, but {probed}{hint}")
        found = probed
        if mode == "none":
            found = Isolation("none", "isolation=none was asked for")
    if not found.bubblewrap and found.kind not in _warned:
        _warned.add(found.kind)
        log.warning("RLM sandbox %s", found.describe())
    return found


def _clean_env(home: str, tmp: str) -> dict[str, str]:
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


def _guard_host() -> None:
    """Under ``none`` with a non-root host, model code runs as the host's user: make the host
    process non-dumpable, so that its memory and environment cannot be read through /proc."""
    global _host_guarded
    if not _host_guarded and os.geteuid() != 0:
        confine.set_dumpable(False)
        _host_guarded = True
        log.warning("RLM sandbox without isolation: this process is now non-dumpable (no core dumps, no ptrace)")


# --- results --------------------------------------------------------------------------------


@dataclass
class CellResult:
    """What one cell did."""

    stdout: str
    stdout_chars: int
    error: str | None
    error_type: str | None
    final: str | None
    timed_out: bool
    elapsed: float
    restarted: bool = False

    @property
    def truncated(self) -> bool:
        return self.stdout_chars > len(self.stdout)

    def as_dict(self) -> dict[str, Any]:
        return {
            "stdout": self.stdout,
            "stdout_chars": self.stdout_chars,
            "error": self.error,
            "error_type": self.error_type,
            "final": self.final,
            "timed_out": self.timed_out,
            "elapsed": round(self.elapsed, 4),
            "restarted": self.restarted,
        }


_OPTIONAL_STR = (str, type(None))
_DONE_FIELDS = {
    "stdout": (str,),
    "stdout_chars": (int,),
    "error": _OPTIONAL_STR,
    "error_type": _OPTIONAL_STR,
    "final": _OPTIONAL_STR,
    "timed_out": (bool,),
    "elapsed": (int, float),
}
_VALUE_FIELDS = {"ok": (bool,), "value": _OPTIONAL_STR, "error": _OPTIONAL_STR}


def _malformed(message: Mapping[str, Any], fields: Mapping[str, tuple[type, ...]]) -> str | None:
    for name, types in fields.items():
        value = message.get(name)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return f"a {message.get('op')!r} message with {name}={str(value)[:40]!r}"
    return None


class _Stalled(Exception):
    """The REPL did not take a message within ``_SEND_TIMEOUT_S``."""


#: ``on_call(kind, args) -> value``; raise ``BudgetExhausted`` or any exception to fail the call
CallHandler = Callable[[str, Mapping[str, Any]], Any]


class Sandbox:
    """One REPL (see module doc). ``execute`` runs a cell, ``get`` reads a variable; a REPL
    that dies, is killed or breaks the protocol is started again on the next use (the context
    is reloaded, other variables and files are lost, and the cell's result says so). Use as a
    context manager or call ``close``, which kills every process of the REPL.

    Raises ``RecallmError`` when the REPL cannot start (the reason and its stderr in one line).
    """

    def __init__(
        self,
        context: Any,
        *,
        query: str | None = None,
        limits: SandboxLimits | None = None,
        isolation: str | Isolation = DEFAULT_ISOLATION,
        functions: Sequence[str] = (),
        disabled_reason: str = "",
        on_call: CallHandler | None = None,
        site_packages: bool = True,
        workdir_base: str | None = None,
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.isolation = isolation if isinstance(isolation, Isolation) else resolve_isolation(isolation)
        if self.isolation.kind not in ("bwrap", "namespaces", "none"):
            raise RecallmError(f"no sandbox isolation available: {self.isolation.detail}")
        self.functions = tuple(functions)
        self.disabled_reason = disabled_reason
        self.on_call = on_call
        self.site_packages = bool(site_packages)
        self._root_host = os.geteuid() == 0
        self._base = tempfile.mkdtemp(prefix="recallm-rlm-", dir=workdir_base)
        # under ``none`` the REPL's own uid must pass through to its directory (mode 0700, its own)
        os.chmod(self._base, 0o711 if self.isolation.kind == "none" else 0o700)
        self._home = os.path.join(self._base, "home")  # the private directory under ``none``
        self._context_file = os.path.join(self._base, "context.json")
        try:
            payload = json.dumps({"context": context, "query": query}, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            shutil.rmtree(self._base, ignore_errors=True)
            raise RecallmError(f"the RLM context must be a str or JSON data (lists, dicts, numbers): {exc}") from None
        Path(self._context_file).write_text(payload, encoding="utf-8")  # read through a file descriptor
        os.chmod(self._context_file, 0o600)
        self._proc: subprocess.Popen | None = None
        self._reader: LineReader | None = None
        self._to_worker: int | None = None
        self._uid: int | None = None
        self._write_lock = threading.Lock()
        self._calls_lock = threading.Lock()
        # (REPL start, call id) of the sub-calls being served -> the token that cancels each
        self._calls: dict[tuple[int, Any], _cancel.CancelToken] = {}
        self._waiting_since: float | None = None  # when the count of calls being served went from 0 to 1
        self._waited = 0.0  # seconds with sub-calls being served, summed
        self._pool: ThreadPoolExecutor | None = None
        self._broken: str | None = None
        self._cgroups: proctree.Cgroups | None = None
        self._memory_cap = (self.limits.memory_mb + _HELPER_MB) << 20
        self._last_sample = 0.0
        self._closed = False
        self.starts = 0
        self.cells = 0
        if self.isolation.kind == "none":
            _guard_host()

    # --- process lifecycle -------------------------------------------------------------------

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _exit_status(self) -> int | None:
        """The first process's exit code (negative: killed by that signal) once it has exited,
        without reaping it (its pid, and so the REPL's uid, stay reserved); None while it runs."""
        proc = self._proc
        if proc is None:
            return None
        if proc.returncode is not None:
            return proc.returncode
        try:
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return proc.poll() if proc.returncode is None else proc.returncode
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._exit_status() is None

    def _ensure_cgroups(self) -> None:
        if self._cgroups is not None:
            return
        support = proctree.detect_cgroups()
        if not support.usable:
            return
        try:
            self._cgroups = proctree.Cgroups(
                support, memory_bytes=self._memory_cap, max_pids=self.limits.max_processes + 8
            )
        except OSError as exc:
            log.warning("RLM sandbox: no cgroup for this REPL (%s); its memory is sampled instead", exc)

    def _command(self, h2w_r: int, w2h_w: int, context_fd: int) -> tuple[list[str], dict[str, str]]:
        kind = self.isolation.kind
        sys_path = _site_dirs() if self.site_packages else []
        spec: dict[str, Any] = {
            "stage": "outer",
            "mode": kind,
            "cgroups": self._cgroups.join if self._cgroups is not None else [],
            "private_uid": self._root_host,
            "host_pid": os.getpid(),  # the REPL dies with the host (confine._die_with_host)
            "nproc": self.limits.max_processes,
            "fds": [h2w_r, w2h_w, context_fd],
        }
        entries = _visible(_python_paths() + sys_path) if kind != "none" else []
        if kind == "bwrap":
            spec["bwrap"] = _bwrap_args(self.isolation.detail, entries, self.limits, self._root_host)
            spec["python"] = _python()
            spec["inside_worker"] = f"{_INSIDE_DIR}/worker.py"
            spec["chown_home"] = self._root_host
        elif kind == "namespaces":
            root = os.path.join(self._base, "root")
            os.makedirs(root, exist_ok=True)
            spec["root"] = {
                "dir": root,
                "entries": entries,
                "tmp_bytes": self.limits.tmp_mb << 20,
                "home_bytes": self.limits.home_mb << 20,
                "shm_bytes": _SHM_BYTES,
            }
        else:
            shutil.rmtree(self._home, ignore_errors=True)
            os.makedirs(os.path.join(self._home, "tmp"), mode=0o700)
            spec["home"] = self._home
        config = {
            "fd_in": h2w_r,
            "fd_out": w2h_w,
            "context_fd": context_fd,
            "max_output_chars": self.limits.max_output_chars,
            "memory_bytes": self.limits.memory_mb << 20,
            "max_file_bytes": self.limits.max_file_mb << 20,
            "functions": list(self.functions),
            "disabled_reason": self.disabled_reason,
            "sys_path": sys_path,
            "confine": spec,
        }
        if kind == "none":
            env = _clean_env(self._home, os.path.join(self._home, "tmp"))
        else:
            env = _clean_env(_INSIDE_HOME, "/tmp")
        return [_python(), "-I", "-S", "-B", str(_WORKER), json.dumps(config)], env

    def start(self) -> None:
        if self._closed:
            raise RecallmError("this sandbox is closed")
        if self.alive:
            return
        self._kill()
        self._ensure_cgroups()
        self._broken = None
        h2w_r, h2w_w = os.pipe()
        w2h_r, w2h_w = os.pipe()
        context_fd = os.open(self._context_file, os.O_RDONLY)
        stderr_path = os.path.join(self._base, "stderr.log")
        try:
            command, env = self._command(h2w_r, w2h_w, context_fd)
            with open(os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as stderr:
                self._proc = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    env=env,
                    cwd=self._base,
                    pass_fds=(h2w_r, w2h_w, context_fd),
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as exc:
            for fd in (h2w_r, h2w_w, w2h_r, w2h_w, context_fd):
                os.close(fd)
            raise RecallmError(f"cannot start the RLM sandbox ({exc})") from None
        for fd in (h2w_r, w2h_w, context_fd):
            os.close(fd)
        os.set_blocking(h2w_w, False)
        self._to_worker = h2w_w
        self._reader = LineReader(w2h_r, max_line_bytes=self.limits.max_message_mb << 20)
        self._uid = confine.UID_BASE + self._proc.pid if self._root_host else None
        self.starts += 1
        try:
            message = self._reader.read(timeout=self.limits.startup_timeout_s)
        except (EOFError, ProtocolError):
            message = None
        if message is None or message.get("op") != "ready":
            self._kill()
            tail = Path(stderr_path).read_text(errors="replace").strip().splitlines()
            why = tail[-1] if tail else f"no answer within {self.limits.startup_timeout_s:g}s"
            raise RecallmError(f"the RLM sandbox did not start ({self.isolation.kind}): {why}")

    def _kill(self) -> None:
        """Kill every process of the REPL (whether or not its first process already exited)."""
        proc = self._proc
        if proc is not None:
            root_pid = proc.pid if proc.returncode is None else None
            proctree.kill_tree(root_pid, self._uid, self._cgroups, at_once=self.isolation.kind == "none")
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not fail
                log.warning("sandbox process %d did not exit after SIGKILL", proc.pid)
            self._proc = None
        self._teardown()

    def _teardown(self) -> None:
        for fd in (self._to_worker, self._reader.fd if self._reader is not None else None):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._to_worker = None
        self._reader = None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.alive:
            try:
                self._send({"op": "shutdown"}, timeout=1.0)
                for _ in range(50):
                    if self._exit_status() is not None:
                        break
                    time.sleep(0.01)
            except (OSError, _Stalled):
                pass
        self._kill()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._cgroups is not None:
            self._cgroups.remove()
        if self.isolation.kind == "none" and self._uid is not None:
            _remove_files_of(self._uid)
        shutil.rmtree(self._base, ignore_errors=True)

    # --- messages ----------------------------------------------------------------------------

    def _send(self, message: dict[str, Any], timeout: float | None = None) -> None:
        """Write one message; ``_Stalled`` when the REPL does not take it within ``timeout``
        (default ``_SEND_TIMEOUT_S``)."""
        timeout = _SEND_TIMEOUT_S if timeout is None else timeout
        data = memoryview(encode(message))
        deadline = time.monotonic() + timeout
        if not self._write_lock.acquire(timeout=timeout):
            raise _Stalled()
        try:
            while data:
                fd = self._to_worker
                if fd is None:
                    raise BrokenPipeError("the sandbox is not running")
                try:
                    data = data[os.write(fd, data) :]
                except BlockingIOError:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise _Stalled() from None
                    select.select([], [fd], [], min(left, _TICK_S))
        finally:
            self._write_lock.release()

    def _reply(self, message: dict[str, Any], generation: int) -> None:
        if generation != self.starts:  # a late answer for a REPL that was restarted meanwhile: nobody waits
            return
        try:
            self._send(message)
        except _Stalled:
            self._broken = f"the REPL did not read what the host sent for {_SEND_TIMEOUT_S:g}s"
        except OSError:  # the REPL was killed meanwhile; nobody waits for this answer
            pass

    def _waiting_changed(self, before: int) -> None:
        """Under ``_calls_lock``, after a call was added or removed (``before``: how many were
        served): keeps the time with sub-calls being served."""
        after, now = len(self._calls), time.monotonic()
        if before == 0 and after > 0:
            self._waiting_since = now
        elif before > 0 and after == 0 and self._waiting_since is not None:
            self._waited += now - self._waiting_since
            self._waiting_since = None

    def _waited_s(self) -> float:
        """Seconds so far with at least one sub-call being served (the REPL's timer paused)."""
        with self._calls_lock:
            ongoing = time.monotonic() - self._waiting_since if self._waiting_since is not None else 0.0
            return self._waited + ongoing

    def _cancel_calls(self, reason: str) -> None:
        with self._calls_lock:
            tokens = list(self._calls.values())
        for token in tokens:
            token.cancel(reason)

    def _answer_call(
        self, generation: int, call_id: Any, kind: str, args: Mapping[str, Any], token: _cancel.CancelToken
    ) -> None:
        reply: dict[str, Any] = {"op": "result", "id": call_id, "ok": False}
        try:
            if self.on_call is None:
                raise RuntimeError("sub-calls are not available")
            with _cancel.scope(token):
                reply["value"] = self.on_call(kind, args)
            reply["ok"] = True
        except BudgetExhausted as exc:
            reply.update(error=str(exc), budget=True)
        except Exception as exc:  # any failure goes back to model code as its exception
            reply["error"] = f"{type(exc).__name__}: {exc}" if not isinstance(exc, RecallmError) else str(exc)
        finally:
            with self._calls_lock:
                before = len(self._calls)
                self._calls.pop((generation, call_id), None)
                self._waiting_changed(before)
        self._reply(reply, generation)

    def _dispatch(self, message: Mapping[str, Any]) -> str | None:
        """Serve a ``call`` on the bounded pool; a reason when the message is malformed."""
        call_id, kind, args = message.get("id"), message.get("kind"), message.get("args")
        if not isinstance(call_id, int) or isinstance(call_id, bool) or not isinstance(kind, str):
            return f"a 'call' message with id={str(call_id)[:20]!r}, kind={str(kind)[:20]!r}"
        if not isinstance(args, dict):
            return f"a 'call' message whose args are a {type(args).__name__}"
        refuse = None
        limit = self.limits.max_processes
        key = (self.starts, call_id)
        with self._calls_lock:
            if kind not in self.functions:
                refuse = f"RuntimeError: {kind[:40]} is not available in this REPL"
            elif key in self._calls:
                refuse = f"RuntimeError: sub-call id {call_id} is already in flight"
            elif len(self._calls) >= limit:  # (calls of a restarted REPL still hold their threads)
                refuse = f"RuntimeError: more than {limit} sub-calls at once (sandbox.max_processes)"
            else:
                token = _cancel.CancelToken()
                before = len(self._calls)
                self._calls[key] = token
                self._waiting_changed(before)
        if refuse is not None:
            self._reply({"op": "result", "id": call_id, "ok": False, "error": refuse}, self.starts)
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=limit, thread_name_prefix="rlm-subcall")
        self._pool.submit(self._answer_call, self.starts, call_id, kind, args, token)
        return None

    def _over_limits(self, *, now: bool = False) -> tuple[str, str] | None:
        """Samples what the kernel does not cap here (no cgroup; the private directory under
        ``none``), at most every ``_TICK_S`` unless ``now``: ``(error_type, message)`` when
        the REPL is over a limit."""
        memory = self._cgroups is None or not self._cgroups.caps_memory
        home = self.isolation.kind == "none"
        if not (memory or home) or self._proc is None:
            return None
        if not now and time.monotonic() - self._last_sample < _TICK_S:
            return None
        self._last_sample = time.monotonic()
        if memory:  # the REPL's own uid (not the helpers), else everything below the first process
            pids = proctree.tree_pids(None if self._uid else self._proc.pid, self._uid)
            used = proctree.tree_rss(pids if self._uid else [self._proc.pid, *pids])
            used -= 0 if self._uid else _SAMPLED_HELPERS_MB << 20
            if used > self._memory_cap:
                return "MemoryError", (
                    f"MemoryError: the REPL's processes together used {used >> 20} MiB, more than "
                    f"memory_mb={self.limits.memory_mb} allows; they were killed"
                )
        if home:
            cap = self.limits.home_mb << 20
            if proctree.dir_size(self._home, cap) > cap:
                return "OSError", f"OSError: the private directory holds more than home_mb={self.limits.home_mb} MiB"
        return None

    def _await(self, op: str, request_id: str, deadline: Callable[[], float]) -> tuple[str, Any]:
        """Read messages, serving sub-calls, until the reply ``op`` to ``request_id``:
        ``("reply", message)``, ``("timeout", None)`` (past ``deadline()``, asked again at every
        tick), ``("died", None)``, or ``("violation" | "limit", (error_type, why))`` - then the REPL
        has been killed."""
        while True:
            if self._broken is not None:
                self._kill()
                return "violation", ("SandboxError", self._broken)
            left = deadline() - time.monotonic()
            if left <= 0:
                return "timeout", None
            try:
                message = self._reader.read(timeout=min(left, _TICK_S))
            except EOFError:
                return "died", None
            except ProtocolError as exc:
                self._kill()
                return "violation", ("SandboxError", f"the REPL broke the protocol ({exc})")
            over = self._over_limits()
            if over is not None:
                self._kill()
                return "limit", over
            if message is None:
                continue
            got = message.get("op")
            why = None
            if got == "call":
                why = self._dispatch(message)
            elif got == op and message.get("id") == request_id:
                why = _malformed(message, _DONE_FIELDS if op == "done" else _VALUE_FIELDS)
                if why is None:
                    return "reply", message
            else:
                expected = f"the {op!r} of the request in flight"
                why = f"a {str(got)[:20]!r} message with id {str(message.get('id'))[:20]!r} instead of {expected}"
            if why is not None:
                self._kill()
                return "violation", ("SandboxError", f"the REPL broke the protocol ({why})")

    def _died(self, oom_before: int) -> str:
        code = None
        for _ in range(200):  # up to 2 s for the first process to finish dying
            code = self._exit_status()
            if code is not None:
                break
            time.sleep(0.01)
        if code is None:
            how = "closed its end of the channel"
        elif code < 0 or code > 128:
            number = -code if code < 0 else code - 128
            try:
                how = f"was killed by {signal.Signals(number).name}"
            except ValueError:
                how = f"was killed by signal {number}"
        else:
            how = f"exited with code {code}"
        if self._cgroups is not None and self._cgroups.oom_kills() > oom_before:
            how += f" (its processes together went over memory_mb={self.limits.memory_mb})"
        self._kill()
        return how

    def _lost(self, what: str) -> str:
        return f"{what}; the REPL was restarted: variables from earlier cells are lost (context is reloaded)"

    # --- the API -----------------------------------------------------------------------------

    def execute(
        self, code: str, *, wall_s: float | None = None, cpu_s: float | None = None, max_s: float | None = None
    ) -> CellResult:
        """Run one cell (see class doc). ``wall_s`` / ``cpu_s`` cut the cell's limits further;
        ``max_s`` bounds the cell with its sub-call waits (see module doc)."""
        self.start()
        wall = self.limits.wall_s if wall_s is None else max(0.05, min(self.limits.wall_s, wall_s))
        cpu = self.limits.cpu_s if cpu_s is None else max(0.05, min(self.limits.cpu_s, cpu_s))
        cell_id = secrets.token_hex(8)  # unguessable: no earlier cell can forge this one's reply
        self.cells += 1
        start = time.monotonic()
        oom_before = self._cgroups.oom_kills() if self._cgroups is not None else 0
        waited_before = self._waited_s()
        grace = self.limits.kill_grace_s
        hard = None if max_s is None else start + max(0.05, max_s)
        cut: float | None = None  # once ``hard`` has passed: the cell's last moment

        def deadline() -> float:
            """The cell's own wall clock (its sub-call waits excluded), cut by ``max_s``."""
            nonlocal cut
            now = time.monotonic()
            if hard is not None and cut is None and now >= hard:
                self._cancel_calls("the task's wall-clock budget is spent")
                cut = now + grace
            own = start + wall + grace + (self._waited_s() - waited_before)
            return own if cut is None else min(own, cut)

        try:
            self._send({"op": "exec", "id": cell_id, "code": code, "cpu_s": cpu, "wall_s": wall})
        except (OSError, _Stalled):
            how = self._died(oom_before)
            return self._failed(self._lost(f"the REPL process {how} before the cell ran"), start)
        try:
            status, payload = self._await("done", cell_id, deadline)
        finally:
            self._cancel_calls("the cell that made this sub-call has ended")
        if (
            status == "reply" and self.isolation.kind == "none"
        ):  # what the kernel does not cap is checked after every cell
            over = self._over_limits(now=True)
            if over is not None:
                self._kill()
                status, payload = "limit", over
        if status == "reply":
            cap = self.limits.max_output_chars
            return CellResult(
                stdout=payload["stdout"][:cap],
                stdout_chars=max(0, payload["stdout_chars"]),
                error=None if payload["error"] is None else payload["error"][:cap],
                error_type=None if payload["error_type"] is None else payload["error_type"][:100],
                final=payload["final"],
                timed_out=payload["timed_out"],
                elapsed=float(payload["elapsed"]),
            )
        if status == "timeout":
            self._kill()
            what = (
                f"the cell outlived the task's wall-clock budget ({max_s:g}s) and was killed"
                if cut is not None
                else f"the cell ignored its wall-clock limit of {wall:g}s and was killed"
            )
            return self._failed(self._lost(f"TimeoutError: {what}"), start, timed_out=True)
        if status == "died":
            how = self._died(oom_before)
            kind = "MemoryError" if "memory_mb" in how else "SandboxError"
            return self._failed(self._lost(f"the REPL process {how} while running the cell"), start, kind)
        error_type, why = payload
        return self._failed(self._lost(why), start, error_type)

    def _failed(
        self, error: str, start: float, error_type: str = "SandboxError", *, timed_out: bool = False
    ) -> CellResult:
        return CellResult(
            stdout="",
            stdout_chars=0,
            error=error,
            error_type="TimeoutError" if timed_out else error_type,
            final=None,
            timed_out=timed_out,
            elapsed=time.monotonic() - start,
            restarted=True,
        )

    def get(self, name: str, timeout: float = 30.0) -> tuple[bool, str]:
        """``(True, str(value))`` of a REPL variable, or ``(False, why)``."""
        self.start()
        request_id = secrets.token_hex(8)
        oom_before = self._cgroups.oom_kills() if self._cgroups is not None else 0
        try:
            self._send({"op": "get", "id": request_id, "name": name})
        except (OSError, _Stalled):
            return False, self._lost(f"the REPL process {self._died(oom_before)}")
        end = time.monotonic() + timeout
        status, payload = self._await("value", request_id, lambda: end)
        if status == "reply":
            if payload["ok"]:
                return True, str(payload["value"])[: self.limits.max_message_mb << 20]
            return False, str(payload["error"])[: self.limits.max_output_chars]
        if status == "timeout":
            self._kill()
            return False, self._lost(f"reading {name!r} took longer than {timeout:g}s")
        if status == "died":
            return False, self._lost(f"the REPL process {self._died(oom_before)}")
        return False, self._lost(payload[1])


def _remove_files_of(uid: int) -> None:
    """Under ``none``, the REPL's uid could write only to world-writable directories: remove
    what it left there."""
    for top in ("/tmp", "/var/tmp", "/dev/shm"):
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                pass

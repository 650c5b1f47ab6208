"""The host side of an RLM's REPL: model-written code never runs in the host interpreter.

Each RLM instance gets one ``Sandbox``: a separate Python process (``recallm/rlm/worker.py``)
holding a persistent namespace, talking to the host over two pipes (``recallm/rlm/protocol.py``).
What protects the host:

* **a separate process** in its own session (process group), started with ``python -I -S -B``
  (no ``PYTHON*`` variables, no user site, no ``.pth`` hooks);
* **a scrubbed environment**: only ``PATH``, ``HOME``, ``TMPDIR``, ``LANG`` and thread-count
  variables - no host secrets (API keys, tokens) reach model code;
* **a private working directory** (a fresh temporary directory, mode 700, deleted on close);
* **limits per cell**: CPU time, wall clock (the worker interrupts the cell; if it does not stop
  within ``kill_grace_s`` the host kills the process group and starts a fresh REPL), address
  space (memory), size of written files, and a cap on the output a cell returns;
* **bubblewrap** (``bwrap``), when it is installed and works here: no network (``--unshare-all``
  gives an empty network namespace), its own PID/IPC/UTS namespaces, no capabilities, and a
  read-only view of only ``/usr``, the Python installation and (optionally) its site-packages,
  plus a size-capped ``/tmp`` and the private directory as ``/home/rlm``; the rest of the host
  filesystem (``/root``, ``/home``, ``/work``, ``/etc`` ...) does not exist inside.

``detect_isolation`` probes bubblewrap once per process. ``isolation="auto"`` uses it when it
works and otherwise says so in a warning (and in every trajectory): without it, code runs with
the host's network and a read view of the host filesystem (as the host user), and a root user
could read other processes' environments through ``/proc``. ``isolation="bwrap"`` refuses to
run without it.

Sub-calls that model code makes arrive as ``call`` messages; ``on_call(kind, args)`` (the RLM's
sub-call router) answers each on its own thread, so that concurrent calls from threads in a
cell, and batched calls, are served at once. Each call gets a ``CancelToken``
(``recallm.rlm.cancel.current()`` inside ``on_call``), cancelled when the cell that made it ends
(or is killed) while it is still in flight.

A cell's wall clock counts only its own time: while one of its sub-calls is in flight, the
worker's timer is paused and the host's kill deadline moves by as much. ``execute(max_s=...)``
bounds the whole cell, waits included (the task's remaining wall time): past it, the cell's
sub-calls are cancelled and the cell gets ``kill_grace_s`` to end before it is killed.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recallm.clients import dataclass_values
from recallm.errors import RecallmError
from recallm.rlm import cancel as _cancel
from recallm.rlm.budget import BudgetExhausted
from recallm.rlm.protocol import LineReader, ProtocolError, write_message

__all__ = ["SandboxLimits", "Isolation", "detect_isolation", "Sandbox", "CellResult", "ISOLATION_MODES"]

log = logging.getLogger(__name__)

ISOLATION_MODES = ("auto", "bwrap", "none")
_HERE = Path(__file__).resolve().parent
_WORKER, _PROTOCOL = _HERE / "worker.py", _HERE / "protocol.py"
_INSIDE_DIR = "/opt/recallm-rlm"  # where worker.py and protocol.py are bound inside bubblewrap
_INSIDE_HOME = "/home/rlm"
_warned_once = False


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one REPL process and of each cell it runs."""

    cpu_s: float = 60.0
    """CPU seconds per cell"""
    wall_s: float = 120.0
    """wall-clock seconds per cell (also cut to the task's remaining wall time)"""
    memory_mb: int = 2048
    """address space of the REPL process (RLIMIT_AS), in MiB"""
    max_output_chars: int = 100_000
    """characters of a cell's output that leave the sandbox (the rest is counted, not sent)"""
    max_file_mb: int = 256
    """largest file a cell may write (RLIMIT_FSIZE), in MiB"""
    tmp_mb: int = 256
    """size of /tmp inside bubblewrap, in MiB"""
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
        return limits


@dataclass(frozen=True)
class Isolation:
    """How model code is isolated: ``kind`` is ``bwrap`` or ``none``; ``detail`` says why."""

    kind: str
    detail: str

    @property
    def available(self) -> bool:
        return self.kind == "bwrap"

    def describe(self) -> str:
        if self.available:
            return f"bubblewrap ({self.detail}): no network, read-only minimal filesystem, own PID namespace"
        return (
            f"NONE ({self.detail}): model code has the host's network and can read the host filesystem; "
            "only resource limits, a scrubbed environment and a private working directory apply"
        )


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


def _python() -> str:
    return os.path.realpath(sys.executable)


def _site_dirs() -> list[str]:
    dirs = []
    for path in [*site.getsitepackages(), site.getusersitepackages()]:
        if path and os.path.isdir(path) and path not in dirs:
            dirs.append(path)
    return dirs


def _bwrap_args(
    bwrap: str,
    *,
    home: str,
    context_file: str,
    ro_paths: Sequence[str],
    tmp_bytes: int,
) -> list[str]:
    args = [bwrap, "--die-with-parent", "--new-session", "--unshare-all", "--cap-drop", "ALL"]
    args += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for name in ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives"):
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    seen = {"/usr"}
    for path in ro_paths:
        if path not in seen and not path.startswith("/usr/"):
            seen.add(path)
            args += ["--ro-bind", path, path]
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--size", str(tmp_bytes), "--tmpfs", "/tmp"]
    args += ["--size", str(16 * 1024 * 1024), "--tmpfs", "/dev/shm"]
    args += ["--bind", home, _INSIDE_HOME]
    args += ["--ro-bind", str(_WORKER), f"{_INSIDE_DIR}/worker.py"]
    args += ["--ro-bind", str(_PROTOCOL), f"{_INSIDE_DIR}/protocol.py"]
    args += ["--ro-bind", context_file, f"{_INSIDE_DIR}/context.json"]
    args += ["--remount-ro", "/", "--chdir", _INSIDE_HOME]
    return args


def _python_paths() -> list[str]:
    """What the interpreter needs read-only inside bubblewrap: its installation prefix(es)."""
    paths = []
    for prefix in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.path.dirname(_python()))):
        prefix = os.path.realpath(prefix)
        if prefix and prefix != "/" and os.path.isdir(prefix) and prefix not in paths:
            paths.append(prefix)
    return paths


@functools.cache
def detect_isolation() -> Isolation:
    """Whether bubblewrap is installed and can start the interpreter here (probed once)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return Isolation("none", "bubblewrap (bwrap) is not installed; `apt-get install bubblewrap` adds it")
    with tempfile.TemporaryDirectory(prefix="recallm-rlm-probe-") as tmp:
        context = os.path.join(tmp, "context.json")
        Path(context).write_text("{}")
        home = os.path.join(tmp, "home")
        os.mkdir(home)
        args = _bwrap_args(bwrap, home=home, context_file=context, ro_paths=_python_paths(), tmp_bytes=1 << 20)
        probe = "import socket; socket.socket().close(); print('ok')"
        try:
            done = subprocess.run(
                [*args, _python(), "-I", "-S", "-c", probe],
                env={"PATH": "/usr/bin:/bin"},
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Isolation("none", f"bubblewrap at {bwrap} did not run ({type(exc).__name__}: {exc})")
    if done.returncode != 0 or done.stdout.strip() != "ok":
        reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return Isolation("none", f"bubblewrap at {bwrap} cannot start a sandbox here ({reason})")
    return Isolation("bwrap", bwrap)


def resolve_isolation(mode: str) -> Isolation:
    """The isolation for ``mode`` (``auto`` | ``bwrap`` | ``none``), warning once when ``auto``
    finds none; ``bwrap`` without bubblewrap is a ``RecallmError``."""
    global _warned_once
    if mode not in ISOLATION_MODES:
        raise RecallmError(f"sandbox isolation must be one of {', '.join(ISOLATION_MODES)}, got {mode!r}")
    if mode == "none":
        return Isolation("none", "isolation=none was asked for")
    found = detect_isolation()
    if mode == "bwrap" and not found.available:
        raise RecallmError(f"sandbox isolation=bwrap, but {found.detail}")
    if not found.available and not _warned_once:
        _warned_once = True
        log.warning("RLM sandbox without isolation: %s", found.describe())
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


#: ``on_call(kind, args) -> value``; raise ``BudgetExhausted`` or any exception to fail the call
CallHandler = Callable[[str, Mapping[str, Any]], Any]


class Sandbox:
    """One REPL process (see module doc). ``execute`` runs a cell, ``get`` reads a variable;
    a REPL that dies or is killed is started again on the next use (the context is reloaded,
    other variables are lost, and the cell's result says so). Use as a context manager or call
    ``close``.

    Raises ``RecallmError`` when the REPL cannot start (the reason and its stderr in one line).
    """

    def __init__(
        self,
        context: Any,
        *,
        query: str | None = None,
        limits: SandboxLimits | None = None,
        isolation: str | Isolation = "auto",
        functions: Sequence[str] = (),
        disabled_reason: str = "",
        on_call: CallHandler | None = None,
        site_packages: bool = True,
        workdir_base: str | None = None,
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.isolation = isolation if isinstance(isolation, Isolation) else resolve_isolation(isolation)
        self.functions = tuple(functions)
        self.disabled_reason = disabled_reason
        self.on_call = on_call
        self.site_packages = bool(site_packages)
        self._base = tempfile.mkdtemp(prefix="recallm-rlm-", dir=workdir_base)
        os.chmod(self._base, 0o700)
        self._home = os.path.join(self._base, "home")
        os.mkdir(self._home, 0o700)
        os.mkdir(os.path.join(self._home, "tmp"), 0o700)
        self._context_file = os.path.join(self._base, "context.json")
        try:
            payload = json.dumps({"context": context, "query": query}, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            shutil.rmtree(self._base, ignore_errors=True)
            raise RecallmError(f"the RLM context must be a str or JSON data (lists, dicts, numbers): {exc}") from None
        Path(self._context_file).write_text(payload, encoding="utf-8")
        self._proc: subprocess.Popen | None = None
        self._reader: LineReader | None = None
        self._to_worker: int | None = None
        self._write_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False
        self._calls_lock = threading.Lock()
        self._inflight: dict[Any, _cancel.CancelToken] = {}  # sub-calls being answered
        self._waiting_since: float | None = None  # when the in-flight count went from 0 to 1
        self._waited = 0.0  # seconds with sub-calls in flight, summed
        self.starts = 0
        self.cells = 0

    # --- process lifecycle -------------------------------------------------------------------

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        if self._closed:
            raise RecallmError("this sandbox is closed")
        if self.alive:
            return
        self._teardown()
        h2w_r, h2w_w = os.pipe()
        w2h_r, w2h_w = os.pipe()
        config = {
            "fd_in": h2w_r,
            "fd_out": w2h_w,
            "max_output_chars": self.limits.max_output_chars,
            "memory_bytes": self.limits.memory_mb * 1024 * 1024,
            "max_file_bytes": self.limits.max_file_mb * 1024 * 1024,
            "functions": list(self.functions),
            "disabled_reason": self.disabled_reason,
            "sys_path": _site_dirs() if self.site_packages else [],
        }
        if self.isolation.available:
            config["context_file"] = f"{_INSIDE_DIR}/context.json"
            ro_paths = _python_paths() + (config["sys_path"] if self.site_packages else [])
            command = _bwrap_args(
                self.isolation.detail,
                home=self._home,
                context_file=self._context_file,
                ro_paths=ro_paths,
                tmp_bytes=self.limits.tmp_mb * 1024 * 1024,
            )
            command += [_python(), "-I", "-S", "-B", f"{_INSIDE_DIR}/worker.py", json.dumps(config)]
            env = _clean_env(_INSIDE_HOME, "/tmp")
        else:
            config["context_file"] = self._context_file
            command = [_python(), "-I", "-S", "-B", str(_WORKER), json.dumps(config)]
            env = _clean_env(self._home, os.path.join(self._home, "tmp"))
        stderr_path = os.path.join(self._base, "stderr.log")
        try:
            with open(stderr_path, "wb") as stderr:
                self._proc = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    env=env,
                    cwd=self._home,
                    pass_fds=(h2w_r, w2h_w),
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as exc:
            for fd in (h2w_r, h2w_w, w2h_r, w2h_w):
                os.close(fd)
            raise RecallmError(f"cannot start the RLM sandbox ({command[0]}: {exc})") from None
        os.close(h2w_r)
        os.close(w2h_w)
        self._to_worker = h2w_w
        self._reader = LineReader(w2h_r)
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
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not fail
                log.warning("sandbox process %d did not exit after SIGKILL", proc.pid)
        self._teardown()

    def _teardown(self) -> None:
        if self._to_worker is not None:
            try:
                os.close(self._to_worker)
            except OSError:
                pass
            self._to_worker = None
        if self._reader is not None:
            try:
                os.close(self._reader.fd)
            except OSError:
                pass
            self._reader = None
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.alive:
            try:
                self._send({"op": "shutdown"})
                self._proc.wait(timeout=0.5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()
        self._proc = None
        shutil.rmtree(self._base, ignore_errors=True)

    # --- messages ----------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        with self._write_lock:
            if self._to_worker is None:
                raise BrokenPipeError("the sandbox is not running")
            write_message(self._to_worker, message)

    def _track(self, key: Any, token: _cancel.CancelToken | None) -> None:
        """Register (``token``) or forget (None) an in-flight sub-call; keeps the waiting time."""
        with self._calls_lock:
            before = len(self._inflight)
            if token is not None:
                self._inflight[key] = token
            else:
                self._inflight.pop(key, None)
            after = len(self._inflight)
            now = time.monotonic()
            if before == 0 and after > 0:
                self._waiting_since = now
            elif before > 0 and after == 0 and self._waiting_since is not None:
                self._waited += now - self._waiting_since
                self._waiting_since = None

    def _waited_s(self) -> float:
        with self._calls_lock:
            ongoing = time.monotonic() - self._waiting_since if self._waiting_since is not None else 0.0
            return self._waited + ongoing

    def _cancel_calls(self, reason: str) -> None:
        with self._calls_lock:
            tokens = list(self._inflight.values())
        for token in tokens:
            token.cancel(reason)

    def _answer_call(self, message: Mapping[str, Any]) -> None:
        reply: dict[str, Any] = {"op": "result", "id": message.get("id"), "ok": False}
        key, token = object(), _cancel.CancelToken()
        self._track(key, token)
        try:
            if self.on_call is None:
                raise RuntimeError("sub-calls are not available")
            with _cancel.scope(token):
                reply["value"] = self.on_call(str(message.get("kind")), message.get("args") or {})
            reply["ok"] = True
        except BudgetExhausted as exc:
            reply.update(error=str(exc), budget=True)
        except Exception as exc:  # any failure goes back to model code as its exception
            reply["error"] = f"{type(exc).__name__}: {exc}" if not isinstance(exc, RecallmError) else str(exc)
        try:
            self._send(reply)
        except OSError:  # the REPL was killed meanwhile; nobody waits for this answer
            pass
        finally:
            self._track(key, None)

    def _dispatch(self, message: Mapping[str, Any]) -> None:
        threading.Thread(target=self._answer_call, args=(message,), name="rlm-subcall", daemon=True).start()

    def _died(self) -> str:
        proc = self._proc
        try:
            code = proc.wait(timeout=2) if proc is not None else None
        except subprocess.TimeoutExpired:
            self._kill()
            return "closed its end of the channel"
        if code is not None and code < 0:
            try:
                how = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        else:
            how = f"exited with code {code}"
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
        cell_id = next(self._ids)
        self.cells += 1
        start = time.monotonic()
        waited_before = self._waited_s()
        try:
            self._send({"op": "exec", "id": cell_id, "code": code, "cpu_s": cpu, "wall_s": wall})
        except OSError:
            how = self._died()
            return self._failed(self._lost(f"the REPL process {how} before the cell ran"), start)
        try:
            return self._wait_cell(cell_id, start, wall, waited_before, max_s)
        finally:
            self._cancel_calls("the cell that made this sub-call has ended")

    def _wait_cell(
        self, cell_id: int, start: float, wall: float, waited_before: float, max_s: float | None
    ) -> CellResult:
        grace = self.limits.kill_grace_s
        hard = None if max_s is None else start + max(0.05, max_s)
        cut: float | None = None  # set when `hard` passed: the cell's last moment
        while True:
            now = time.monotonic()
            deadline = start + wall + grace + (self._waited_s() - waited_before)
            if hard is not None and now >= hard and cut is None:
                self._cancel_calls("the task's wall-clock budget is spent")
                cut = now + grace
            if cut is not None:
                deadline = min(deadline, cut)
            left = deadline - now
            if hard is not None and cut is None:
                left = min(left, hard - now)
            if deadline - now <= 0:
                self._kill()
                what = (
                    f"the cell outlived the task's wall-clock budget ({max_s:g}s) and was killed"
                    if cut is not None
                    else f"the cell ignored its wall-clock limit of {wall:g}s and was killed"
                )
                return self._failed(self._lost(f"TimeoutError: {what}"), start, timed_out=True)
            try:
                message = self._reader.read(timeout=left)
            except EOFError:
                how = self._died()
                return self._failed(self._lost(f"the REPL process {how} while running the cell"), start)
            except ProtocolError as exc:
                self._kill()
                return self._failed(self._lost(f"the REPL broke the protocol ({exc})"), start)
            if message is None:
                continue
            op = message.get("op")
            if op == "call":
                self._dispatch(message)
            elif op == "done" and message.get("id") == cell_id:
                return CellResult(
                    stdout=str(message.get("stdout") or ""),
                    stdout_chars=int(message.get("stdout_chars") or 0),
                    error=message.get("error"),
                    error_type=message.get("error_type"),
                    final=message.get("final"),
                    timed_out=bool(message.get("timed_out")),
                    elapsed=float(message.get("elapsed") or 0.0),
                )

    def _failed(self, error: str, start: float, *, timed_out: bool = False) -> CellResult:
        return CellResult(
            stdout="",
            stdout_chars=0,
            error=error,
            error_type="TimeoutError" if timed_out else "SandboxError",
            final=None,
            timed_out=timed_out,
            elapsed=time.monotonic() - start,
            restarted=True,
        )

    def get(self, name: str, timeout: float = 30.0) -> tuple[bool, str]:
        """``(True, str(value))`` of a REPL variable, or ``(False, why)``."""
        self.start()
        request_id = next(self._ids)
        try:
            self._send({"op": "get", "id": request_id, "name": name})
        except OSError:
            return False, self._lost(f"the REPL process {self._died()}")
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._kill()
                return False, self._lost(f"reading {name!r} took longer than {timeout:g}s")
            try:
                message = self._reader.read(timeout=left)
            except (EOFError, ProtocolError):
                return False, self._lost(f"the REPL process {self._died()}")
            if message is None:
                continue
            if message.get("op") == "call":
                self._dispatch(message)
            elif message.get("op") == "value" and message.get("id") == request_id:
                if message.get("ok"):
                    return True, str(message.get("value"))
                return False, str(message.get("error"))

"""The host's handle on one REPL's processes and its channel: start, send, watch, kill, clean up.

``ReplProcess`` starts ``worker.py`` under the sandbox's isolation (``isolation.py``) with its
confinement spec (``confine.py``), holds the two pipes of the protocol (``protocol.py``), samples
what the kernel does not cap here, explains how the REPL died, and kills every process of it
(``proctree.py``) at a restart and at ``close``. It knows nothing of cells or sub-calls
(``repl.Sandbox`` and ``calls.CallServer``).
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from recallm.errors import RecallmError
from recallm.rlm.sandbox import confine, isolation, proctree
from recallm.rlm.sandbox.isolation import Isolation
from recallm.rlm.sandbox.limits import SandboxLimits
from recallm.rlm.sandbox.protocol import LineReader, ProtocolError, encode

__all__ = ["ReplProcess", "Stalled", "TICK_S"]

log = logging.getLogger(__name__)

_HELPER_MB = 16  # memory the sandbox's own helper processes (bubblewrap, PID 1) add to a cgroup, on top of memory_mb
_SAMPLED_HELPERS_MB = 32  # resident memory of the helper Python processes (counted when no private uid)
TICK_S = 0.25  # how often the host checks a running cell (samples, a stalled channel)
_SEND_TIMEOUT_S = 10.0


class Stalled(Exception):
    """The REPL did not take a message within ``_SEND_TIMEOUT_S``."""


class ReplProcess:
    """The processes of one sandbox's REPL, started again after each kill (``starts`` counts
    the starts: the *generation* that a late message belongs to). ``broken`` is set when the
    REPL stopped reading what the host sends; the caller then kills it."""

    def __init__(
        self,
        context: Any,
        query: str | None,
        limits: SandboxLimits,
        isolation_: Isolation,
        *,
        functions: tuple[str, ...],
        disabled_reason: str,
        site_packages: bool,
        workdir_base: str | None,
    ) -> None:
        self.limits = limits
        self.isolation = isolation_
        self.functions = functions
        self.disabled_reason = disabled_reason
        self.site_packages = site_packages
        self.root_host = os.geteuid() == 0
        self.base = tempfile.mkdtemp(prefix="recallm-rlm-", dir=workdir_base)
        # under ``none`` the REPL's own uid must pass through to its directory (mode 0700, its own)
        os.chmod(self.base, 0o711 if self.isolation.kind == "none" else 0o700)
        self.home = os.path.join(self.base, "home")  # the private directory under ``none``
        self._context_file = os.path.join(self.base, "context.json")
        try:
            payload = json.dumps({"context": context, "query": query}, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            shutil.rmtree(self.base, ignore_errors=True)
            raise RecallmError(f"the RLM context must be a str or JSON data (lists, dicts, numbers): {exc}") from None
        Path(self._context_file).write_text(payload, encoding="utf-8")  # read through a file descriptor
        os.chmod(self._context_file, 0o600)
        self.proc: subprocess.Popen | None = None
        self.reader: LineReader | None = None
        self._to_worker: int | None = None
        self.uid: int | None = None
        self._write_lock = threading.Lock()
        self.broken: str | None = None
        self.cgroups: proctree.Cgroups | None = None
        self._memory_cap = (self.limits.memory_mb + _HELPER_MB) << 20
        self._last_sample = 0.0
        self.starts = 0
        if self.isolation.kind == "none":
            isolation.guard_host()

    # --- lifecycle ---------------------------------------------------------------------------

    def exit_status(self) -> int | None:
        """The first process's exit code (negative: killed by that signal) once it has exited,
        without reaping it (its pid, and so the REPL's uid, stay reserved); None while it runs."""
        proc = self.proc
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
        return self.proc is not None and self.exit_status() is None

    def oom_kills(self) -> int:
        return self.cgroups.oom_kills() if self.cgroups is not None else 0

    def _ensure_cgroups(self) -> None:
        if self.cgroups is not None:
            return
        support = proctree.detect_cgroups()
        if not support.usable:
            return
        try:
            self.cgroups = proctree.Cgroups(
                support, memory_bytes=self._memory_cap, max_pids=self.limits.max_processes + 8
            )
        except OSError as exc:
            log.warning("RLM sandbox: no cgroup for this REPL (%s); its memory is sampled instead", exc)

    def _command(self, h2w_r: int, w2h_w: int, context_fd: int) -> tuple[list[str], dict[str, str]]:
        kind = self.isolation.kind
        sys_path = isolation.site_dirs() if self.site_packages else []
        spec: dict[str, Any] = {
            "stage": "outer",
            "mode": kind,
            "cgroups": self.cgroups.join if self.cgroups is not None else [],
            "private_uid": self.root_host,
            "host_pid": os.getpid(),  # the REPL dies with the host (confine._die_with_host)
            "nproc": self.limits.max_processes,
            "fds": [h2w_r, w2h_w, context_fd],
        }
        entries = isolation.visible(isolation.python_paths() + sys_path) if kind != "none" else []
        if kind == "bwrap":
            spec["bwrap"] = isolation.bwrap_args(self.isolation.detail, entries, self.limits, self.root_host)
            spec["python"] = isolation.python()
            spec["inside_worker"] = f"{isolation.INSIDE_DIR}/worker.py"
            spec["chown_home"] = self.root_host
        elif kind == "namespaces":
            root = os.path.join(self.base, "root")
            os.makedirs(root, exist_ok=True)
            spec["root"] = {
                "dir": root,
                "entries": entries,
                "tmp_bytes": self.limits.tmp_mb << 20,
                "home_bytes": self.limits.home_mb << 20,
                "shm_bytes": isolation.SHM_BYTES,
            }
        else:
            shutil.rmtree(self.home, ignore_errors=True)
            os.makedirs(os.path.join(self.home, "tmp"), mode=0o700)
            spec["home"] = self.home
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
            env = isolation.clean_env(self.home, os.path.join(self.home, "tmp"))
        else:
            env = isolation.clean_env(isolation.INSIDE_HOME, "/tmp")
        return [isolation.python(), "-I", "-S", "-B", str(isolation.WORKER), json.dumps(config)], env

    def start(self) -> None:
        """Start the REPL (after killing what is left of an earlier one) and wait for its
        ``ready``; ``RecallmError`` with the reason and its stderr's last line when it does not come."""
        self.kill()
        self._ensure_cgroups()
        self.broken = None
        h2w_r, h2w_w = os.pipe()
        w2h_r, w2h_w = os.pipe()
        context_fd = os.open(self._context_file, os.O_RDONLY)
        stderr_path = os.path.join(self.base, "stderr.log")
        try:
            command, env = self._command(h2w_r, w2h_w, context_fd)
            with open(os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as stderr:
                self.proc = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    env=env,
                    cwd=self.base,
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
        self.reader = LineReader(w2h_r, max_line_bytes=self.limits.max_message_mb << 20)
        self.uid = confine.UID_BASE + self.proc.pid if self.root_host else None
        self.starts += 1
        try:
            message = self.reader.read(timeout=self.limits.startup_timeout_s)
        except (EOFError, ProtocolError):
            message = None
        if message is None or message.get("op") != "ready":
            self.kill()
            tail = Path(stderr_path).read_text(errors="replace").strip().splitlines()
            why = tail[-1] if tail else f"no answer within {self.limits.startup_timeout_s:g}s"
            raise RecallmError(f"the RLM sandbox did not start ({self.isolation.kind}): {why}")

    def kill(self) -> None:
        """Kill every process of the REPL (whether or not its first process already exited)."""
        proc = self.proc
        if proc is not None:
            root_pid = proc.pid if proc.returncode is None else None
            proctree.kill_tree(root_pid, self.uid, self.cgroups, at_once=self.isolation.kind == "none")
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not fail
                log.warning("sandbox process %d did not exit after SIGKILL", proc.pid)
            self.proc = None
        self._teardown()

    def _teardown(self) -> None:
        for fd in (self._to_worker, self.reader.fd if self.reader is not None else None):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._to_worker = None
        self.reader = None

    def close(self) -> None:
        """Ask the REPL to shut down, kill whatever is left, and remove its cgroup and files."""
        if self.alive:
            try:
                self.send({"op": "shutdown"}, timeout=1.0)
                for _ in range(50):
                    if self.exit_status() is not None:
                        break
                    time.sleep(0.01)
            except (OSError, Stalled):
                pass
        self.kill()
        if self.cgroups is not None:
            self.cgroups.remove()
        if self.isolation.kind == "none" and self.uid is not None:
            _remove_files_of(self.uid)
        shutil.rmtree(self.base, ignore_errors=True)

    # --- the channel -------------------------------------------------------------------------

    def send(self, message: dict[str, Any], timeout: float | None = None) -> None:
        """Write one message; ``Stalled`` when the REPL does not take it within ``timeout``
        (default ``_SEND_TIMEOUT_S``)."""
        timeout = _SEND_TIMEOUT_S if timeout is None else timeout
        data = memoryview(encode(message))
        deadline = time.monotonic() + timeout
        if not self._write_lock.acquire(timeout=timeout):
            raise Stalled()
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
                        raise Stalled() from None
                    select.select([], [fd], [], min(left, TICK_S))
        finally:
            self._write_lock.release()

    def reply(self, message: dict[str, Any], generation: int) -> None:
        """Send an answer meant for the REPL start ``generation`` (dropped when it was restarted)."""
        if generation != self.starts:  # a late answer for a REPL that was restarted meanwhile: nobody waits
            return
        try:
            self.send(message)
        except Stalled:
            self.broken = f"the REPL did not read what the host sent for {_SEND_TIMEOUT_S:g}s"
        except OSError:  # the REPL was killed meanwhile; nobody waits for this answer
            pass

    # --- watching ----------------------------------------------------------------------------

    def over_limits(self, *, now: bool = False) -> tuple[str, str] | None:
        """Samples what the kernel does not cap here (no cgroup; the private directory under
        ``none``), at most every ``TICK_S`` unless ``now``: ``(error_type, message)`` when
        the REPL is over a limit."""
        memory = self.cgroups is None or not self.cgroups.caps_memory
        home = self.isolation.kind == "none"
        if not (memory or home) or self.proc is None:
            return None
        if not now and time.monotonic() - self._last_sample < TICK_S:
            return None
        self._last_sample = time.monotonic()
        if memory:  # the REPL's own uid (not the helpers), else everything below the first process
            pids = proctree.tree_pids(None if self.uid else self.proc.pid, self.uid)
            used = proctree.tree_rss(pids if self.uid else [self.proc.pid, *pids])
            used -= 0 if self.uid else _SAMPLED_HELPERS_MB << 20
            if used > self._memory_cap:
                return "MemoryError", (
                    f"MemoryError: the REPL's processes together used {used >> 20} MiB, more than "
                    f"memory_mb={self.limits.memory_mb} allows; they were killed"
                )
        if home:
            cap = self.limits.home_mb << 20
            if proctree.dir_size(self.home, cap) > cap:
                return "OSError", f"OSError: the private directory holds more than home_mb={self.limits.home_mb} MiB"
        return None

    def died(self, oom_before: int) -> str:
        """How the REPL ended (its exit code or signal, and whether the tree went over its
        memory), once it has; its processes are then killed."""
        code = None
        for _ in range(200):  # up to 2 s for the first process to finish dying
            code = self.exit_status()
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
        if self.oom_kills() > oom_before:
            how += f" (its processes together went over memory_mb={self.limits.memory_mb})"
        self.kill()
        return how


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

"""``Sandbox``: one REPL as the RLM loop sees it (run a cell, read a variable), and the probes
that pick an isolation by starting one.

It joins the REPL's processes (``process.ReplProcess``) and the server of its sub-calls
(``calls.CallServer``): while a cell runs, every message from the REPL is checked - a ``done``
is accepted only for the cell in flight (cell ids are random), a reply only for the request in
flight, a ``call`` is served - and anything else ends the REPL (it is started again on the next
use, and the cell's result says so). See ``recallm.rlm.sandbox`` for what protects the host.
"""

from __future__ import annotations

import functools
import logging
import secrets
import shutil
import time
from collections.abc import Callable, Sequence
from typing import Any

from recallm.errors import RecallmError
from recallm.rlm.sandbox.calls import CallHandler, CallServer
from recallm.rlm.sandbox.cell import DONE_FIELDS, VALUE_FIELDS, CellResult, malformed
from recallm.rlm.sandbox.isolation import DEFAULT_ISOLATION, ISOLATION_MODES, Isolation, none_obstacle
from recallm.rlm.sandbox.limits import SandboxLimits
from recallm.rlm.sandbox.process import TICK_S, ReplProcess, Stalled
from recallm.rlm.sandbox.protocol import ProtocolError

__all__ = ["Sandbox", "probe_isolation", "detect_isolation", "resolve_isolation"]

log = logging.getLogger(__name__)

_warned: set[str] = set()


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
        self._process = ReplProcess(
            context,
            query,
            self.limits,
            self.isolation,
            functions=self.functions,
            disabled_reason=disabled_reason,
            site_packages=bool(site_packages),
            workdir_base=workdir_base,
        )
        self._calls = CallServer(self.functions, on_call, self.limits.max_processes, self._process.reply)
        self._closed = False
        self.cells = 0

    # --- process lifecycle -------------------------------------------------------------------

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return self._process.alive

    @property
    def starts(self) -> int:
        """How many times the REPL was started (1 + its restarts)."""
        return self._process.starts

    def start(self) -> None:
        if self._closed:
            raise RecallmError("this sandbox is closed")
        if not self.alive:
            self._process.start()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._process.close()
        self._calls.shutdown()

    # --- one request -------------------------------------------------------------------------

    def _await(self, op: str, request_id: str, deadline: Callable[[], float]) -> tuple[str, Any]:
        """Read messages, serving sub-calls, until the reply ``op`` to ``request_id``:
        ``("reply", message)``, ``("timeout", None)`` (past ``deadline()``, asked again at every
        tick), ``("died", None)``, or ``("violation" | "limit", (error_type, why))`` - then the REPL
        has been killed."""
        process = self._process
        while True:
            if process.broken is not None:
                process.kill()
                return "violation", ("SandboxError", process.broken)
            left = deadline() - time.monotonic()
            if left <= 0:
                return "timeout", None
            try:
                message = process.reader.read(timeout=min(left, TICK_S))
            except EOFError:
                return "died", None
            except ProtocolError as exc:
                process.kill()
                return "violation", ("SandboxError", f"the REPL broke the protocol ({exc})")
            over = process.over_limits()
            if over is not None:
                process.kill()
                return "limit", over
            if message is None:
                continue
            got = message.get("op")
            why = None
            if got == "call":
                why = self._calls.dispatch(message, process.starts)
            elif got == op and message.get("id") == request_id:
                why = malformed(message, DONE_FIELDS if op == "done" else VALUE_FIELDS)
                if why is None:
                    return "reply", message
            else:
                expected = f"the {op!r} of the request in flight"
                why = f"a {str(got)[:20]!r} message with id {str(message.get('id'))[:20]!r} instead of {expected}"
            if why is not None:
                process.kill()
                return "violation", ("SandboxError", f"the REPL broke the protocol ({why})")

    def _lost(self, what: str) -> str:
        return f"{what}; the REPL was restarted: variables from earlier cells are lost (context is reloaded)"

    # --- the API -----------------------------------------------------------------------------

    def execute(
        self, code: str, *, wall_s: float | None = None, cpu_s: float | None = None, max_s: float | None = None
    ) -> CellResult:
        """Run one cell (see class doc). ``wall_s`` / ``cpu_s`` cut the cell's limits further;
        ``max_s`` bounds the cell with its sub-call waits (see ``recallm.rlm.sandbox``)."""
        self.start()
        process = self._process
        wall = self.limits.wall_s if wall_s is None else max(0.05, min(self.limits.wall_s, wall_s))
        cpu = self.limits.cpu_s if cpu_s is None else max(0.05, min(self.limits.cpu_s, cpu_s))
        cell_id = secrets.token_hex(8)  # unguessable: no earlier cell can forge this one's reply
        self.cells += 1
        start = time.monotonic()
        oom_before = process.oom_kills()
        waited_before = self._calls.waited_s()
        grace = self.limits.kill_grace_s
        hard = None if max_s is None else start + max(0.05, max_s)
        cut: float | None = None  # once ``hard`` has passed: the cell's last moment

        def deadline() -> float:
            """The cell's own wall clock (its sub-call waits excluded), cut by ``max_s``."""
            nonlocal cut
            now = time.monotonic()
            if hard is not None and cut is None and now >= hard:
                self._calls.cancel("the task's wall-clock budget is spent")
                cut = now + grace
            own = start + wall + grace + (self._calls.waited_s() - waited_before)
            return own if cut is None else min(own, cut)

        try:
            process.send({"op": "exec", "id": cell_id, "code": code, "cpu_s": cpu, "wall_s": wall})
        except (OSError, Stalled):
            how = process.died(oom_before)
            return self._failed(self._lost(f"the REPL process {how} before the cell ran"), start)
        try:
            status, payload = self._await("done", cell_id, deadline)
        finally:
            self._calls.cancel("the cell that made this sub-call has ended")
        if (
            status == "reply" and self.isolation.kind == "none"
        ):  # what the kernel does not cap is checked after every cell
            over = process.over_limits(now=True)
            if over is not None:
                process.kill()
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
            process.kill()
            what = (
                f"the cell outlived the task's wall-clock budget ({max_s:g}s) and was killed"
                if cut is not None
                else f"the cell ignored its wall-clock limit of {wall:g}s and was killed"
            )
            return self._failed(self._lost(f"TimeoutError: {what}"), start, timed_out=True)
        if status == "died":
            how = process.died(oom_before)
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
        process = self._process
        request_id = secrets.token_hex(8)
        oom_before = process.oom_kills()
        try:
            process.send({"op": "get", "id": request_id, "name": name})
        except (OSError, Stalled):
            return False, self._lost(f"the REPL process {process.died(oom_before)}")
        end = time.monotonic() + timeout
        status, payload = self._await("value", request_id, lambda: end)
        if status == "reply":
            if payload["ok"]:
                return True, str(payload["value"])[: self.limits.max_message_mb << 20]
            return False, str(payload["error"])[: self.limits.max_output_chars]
        if status == "timeout":
            process.kill()
            return False, self._lost(f"reading {name!r} took longer than {timeout:g}s")
        if status == "died":
            return False, self._lost(f"the REPL process {process.died(oom_before)}")
        return False, self._lost(payload[1])


# --- which isolation works here --------------------------------------------------------------

_PROBE_LIMITS = SandboxLimits(cpu_s=20, wall_s=20, memory_mb=256, startup_timeout_s=60, home_mb=1, tmp_mb=1)


@functools.cache
def probe_isolation(kind: str) -> Isolation | str:
    """``kind`` if a REPL starts and runs a cell with it here, else why not (probed once)."""
    if kind == "bwrap":
        detail = shutil.which("bwrap")
        if detail is None:
            return "bubblewrap (bwrap) is not installed; `apt-get install bubblewrap` adds it"
    elif kind == "none":
        obstacle = none_obstacle()
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

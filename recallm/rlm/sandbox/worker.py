"""The sandbox side of an RLM's REPL: a persistent Python namespace in its own process.

Standard library only. The host starts it as a script (``python -I -S -B worker.py CONFIG``,
see ``recallm.rlm.sandbox.process``) with two pipe file descriptors for the protocol of ``protocol.py``
and one to read the context from (``protocol.py`` and ``confine.py`` are bound next to it). It:

0. confines its process tree before anything else (``confine.enter``: cgroups, bubblewrap or
   recallm's own namespaces, an unprivileged uid without capabilities, ``no_new_privs``,
   ``RLIMIT_NPROC``); only the confined worker process returns from there;
1. applies its resource limits before any model-written code exists: the address space
   (``RLIMIT_AS``), the size of any file it writes (``RLIMIT_FSIZE``, ``SIGXFSZ`` ignored so a
   write fails instead of killing it), no core files;
2. loads the prompt into the variable ``context`` (and the query, if any, into ``query``);
3. runs cells in one namespace, one at a time, each under a CPU-time limit (the soft
   ``RLIMIT_CPU`` is moved to "used so far + the cell's allowance"; ``SIGXCPU`` raises in the
   cell) and a wall-clock limit (``SIGALRM``; the timer is paused while a sub-call of the cell
   is in flight - waiting on the host is not the cell's time); the host kills the whole process
   if a cell ignores both (a loop inside C code). A cell that times out takes every other
   process of the REPL with it (``confine.end_other_processes``): what it forked cannot keep
   running, nor hold the process cap, after its ``TimeoutError``;
4. captures what a cell prints - ``sys.stdout``/``sys.stderr`` and anything written to file
   descriptors 1 and 2 (a subprocess) - keeping at most ``max_output_chars`` characters and
   counting the rest;
5. gives model code ``llm_query``, ``llm_query_batched``, ``rlm_query``, ``rlm_query_batched``
   (each a message to the host, which holds the models and the budget), ``FINAL``,
   ``FINAL_VAR`` and ``SHOW_VARS``.

Errors in a cell (syntax errors, exceptions, limits) are reported as text, with the
traceback cut to the cell's own frames; the namespace survives them. Only this process speaks
the protocol: a process that model code forks is a copy of it, so it loses the pipes at the fork
(``os.register_at_fork``), cannot make sub-calls, and exits where its copy of the cell ends.
"""

from __future__ import annotations

import ast
import builtins
import gc
import io
import itertools
import json
import linecache
import math
import os
import resource
import signal
import sys
import threading
import time
import traceback
from queue import Queue

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import confine  # noqa: E402  (sibling files, see module doc)
from protocol import LineReader, write_message  # noqa: E402

_THIS_DIR = os.path.dirname(os.path.abspath(__file__))
_EMERGENCY_BYTES = 4 * 1024 * 1024


class CellTimeout(BaseException):
    """A cell ran past its CPU-time or wall-clock allowance (a BaseException so that a bare
    ``except Exception`` in model code does not swallow it)."""


class SubCallError(Exception):
    """A sub-call failed for good (after the host's retries)."""


class BudgetExhausted(Exception):
    """The task's budget (tokens, sub-calls or wall time) is spent: no more sub-calls."""


class _CappedText(io.TextIOBase):
    """A text stream that keeps the first ``cap`` characters and counts all of them."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.parts: list[str] = []
        self.kept = 0
        self.total = 0

    def writable(self) -> bool:
        return True

    def write(self, text) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self.total += len(text)
        if self.kept < self.cap:
            piece = text[: self.cap - self.kept]
            self.parts.append(piece)
            self.kept += len(piece)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def getvalue(self) -> str:
        return "".join(self.parts)


class Worker:
    def __init__(self, config: dict) -> None:
        self.config = config
        self.fd_in, self.fd_out = int(config["fd_in"]), int(config["fd_out"])
        self.max_output = int(config["max_output_chars"])
        self._write_lock = threading.Lock()
        self._pending: dict[int, dict] = {}
        self._pending_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._jobs: Queue = Queue()
        self._final: str | None = None
        self._reserve: bytearray | None = None
        self._waiting = 0  # sub-calls in flight
        self._paused_left = 0.0  # the cell's wall-clock seconds left when its timer was paused
        self._cell = 0
        self.namespace: dict = {"__name__": "__main__", "__builtins__": builtins}
        # Only this process speaks the protocol. A process that model code forks runs a copy of
        # this one (the cell's frames, this object): it must never send (a "done" of its own would
        # be taken for the cell's), so it loses the pipes at the fork and exits where its copy of
        # the cell ends.
        self._owner = os.getpid()
        self._parent = os.getppid()  # the REPL's PID 1 (the supervisor under ``none``)
        os.register_at_fork(after_in_child=self._forked)

    # --- setup -----------------------------------------------------------------------------

    def apply_limits(self) -> None:
        memory = int(self.config.get("memory_bytes") or 0)
        if memory > 0:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        file_bytes = int(self.config.get("max_file_bytes") or 0)
        if file_bytes > 0:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        signal.signal(signal.SIGXCPU, self._on_cpu_limit)
        signal.signal(signal.SIGALRM, self._on_wall_limit)
        self._reserve = bytearray(_EMERGENCY_BYTES)

    def _on_cpu_limit(self, signum, frame):
        resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        raise CellTimeout(f"the cell used more than its CPU-time limit of {self._cpu_allowance:g}s")

    def _on_wall_limit(self, signum, frame):
        raise CellTimeout(f"the cell ran longer than its wall-clock limit of {self._wall_allowance:g}s")

    def redirect_output(self) -> None:
        """File descriptors 1 and 2 write into one private file, read back after each cell."""
        self._out_fd = os.open(".cell_output", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(self._out_fd, 1)
        os.dup2(self._out_fd, 2)
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)

    def load_context(self) -> None:
        with open(int(self.config["context_fd"]), encoding="utf-8") as f:  # opened by the host, passed down
            payload = json.load(f)
        self.namespace["context"] = payload["context"]
        if payload.get("query") is not None:
            self.namespace["query"] = payload["query"]

    # --- the channel --------------------------------------------------------------------------

    def _forked(self) -> None:
        """In a child forked by model code: close its copies of the protocol's pipes, and keep
        only what it prints from now on (its copy of the cell's output is the parent's)."""
        for fd in (self.fd_in, self.fd_out):
            try:
                os.close(fd)
            except OSError:
                pass
        if isinstance(sys.stdout, _CappedText):
            sys.stdout.parts, sys.stdout.kept, sys.stdout.total = [], 0, 0

    def _leave_child(self, error: str | None, stdout: str, exit_code: int | None) -> None:
        """A forked child's copy of the cell has ended: what it printed and its error go to the
        cell's output (the file behind descriptors 1 and 2), and it exits (with its ``sys.exit``
        code, if any) without touching the protocol."""
        try:
            data = (stdout + (f"[a process forked by the cell ended with] {error}" if error else "")).encode()
            while data:
                data = data[os.write(1, data) :]
        except BaseException:  # exiting is all that is left to do
            pass
        os._exit(exit_code if exit_code is not None else 1 if error else 0)

    def send(self, message: dict) -> None:
        """Write one message; the limit signals are held back meanwhile so that a cell's
        timeout never cuts a message in half. Only the worker's own process may send."""
        if os.getpid() != self._owner:  # (a forked child never gets here: run_cell ends it)
            os._exit(70)
        blocked = {signal.SIGALRM, signal.SIGXCPU}
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
        try:
            with self._write_lock:
                write_message(self.fd_out, message)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def _read_loop(self) -> None:
        reader = LineReader(self.fd_in)
        try:
            while True:
                message = reader.read()
                if message["op"] == "result":
                    with self._pending_lock:
                        slot = self._pending.get(int(message["id"]))
                    if slot is not None:  # a late answer to a call abandoned by a timed-out cell is dropped
                        slot["message"] = message
                        slot["event"].set()
                else:
                    self._jobs.put(message)
        except Exception:  # EOFError (the host is gone) or garbage: stop
            pass
        self._jobs.put({"op": "shutdown"})
        with self._pending_lock:
            for slot in self._pending.values():
                slot["message"] = {"ok": False, "error": "the host closed the connection"}
                slot["event"].set()

    def call(self, kind: str, args: dict):
        """One sub-call through the host; blocks this thread until the host answers."""
        if os.getpid() != self._owner:
            raise SubCallError(f"{kind} works only in the REPL's own process, not in a process forked by the cell")
        call_id = next(self._ids)
        slot = {"event": threading.Event(), "message": None}
        with self._pending_lock:
            self._pending[call_id] = slot
            self._waiting += 1
            if self._waiting == 1:  # pause the cell's wall clock while it waits on the host
                self._paused_left = signal.setitimer(signal.ITIMER_REAL, 0)[0]
        try:
            self.send({"op": "call", "id": call_id, "kind": kind, "args": args})
            slot["event"].wait()
        finally:
            with self._pending_lock:
                self._pending.pop(call_id, None)
                self._waiting -= 1
                if self._waiting == 0 and self._paused_left > 0:
                    signal.setitimer(signal.ITIMER_REAL, self._paused_left)
                    self._paused_left = 0.0
        message = slot["message"]
        if message.get("ok"):
            return message.get("value")
        if message.get("budget"):
            raise BudgetExhausted(message.get("error") or "the task's budget is spent")
        raise SubCallError(message.get("error") or f"{kind} failed")

    # --- what model code sees -----------------------------------------------------------------

    def install_functions(self) -> None:
        call = self.call
        names = set(self.config.get("functions") or ())
        ns = self.namespace

        def _text(value, what: str) -> str:
            if isinstance(value, str):
                return value
            raise TypeError(f"{what} must be a str, got {type(value).__name__}")

        def _context(value):
            if isinstance(value, str):
                return value
            try:
                json.dumps(value)
                return value
            except (TypeError, ValueError):
                return str(value)

        def llm_query(prompt, max_tokens=None):
            """Ask a language model one question; returns its answer as a str."""
            return call("llm_query", {"prompt": _text(prompt, "prompt"), "max_tokens": max_tokens})

        def llm_query_batched(prompts, max_tokens=None):
            """Ask many questions at once (they run concurrently); returns a list of answers in
            order. A prompt whose call failed gets a str starting with '[llm_query error'."""
            prompts = [_text(p, "each prompt") for p in list(prompts)]
            return call("llm_query_batched", {"prompts": prompts, "max_tokens": max_tokens})

        def rlm_query(context, query):
            """Hand a context and a query to a recursive RLM (its own REPL); returns its answer."""
            return call("rlm_query", {"context": _context(context), "query": _text(query, "query")})

        def rlm_query_batched(contexts, queries):
            """Many rlm_query calls at once; ``queries`` is one str for all or a list."""
            contexts = [_context(c) for c in list(contexts)]
            if isinstance(queries, str):
                queries = [queries] * len(contexts)
            queries = [_text(q, "each query") for q in list(queries)]
            if len(queries) != len(contexts):
                raise ValueError(f"{len(contexts)} contexts but {len(queries)} queries")
            return call("rlm_query_batched", {"contexts": contexts, "queries": queries})

        def FINAL(answer):  # noqa: N802 - the name the paper's prompt uses
            """Finish the task with this answer."""
            self._final = str(answer)
            return None

        def FINAL_VAR(name):  # noqa: N802
            """Finish with the value of a REPL variable (its name as a str, or the value itself)."""
            if isinstance(name, str) and name.isidentifier() and name in ns:
                self._final = str(ns[name])
            elif isinstance(name, str) and name.isidentifier():
                # the model may have passed a variable's value instead of its name
                if not any(v is name or (isinstance(v, str) and v == name) for v in ns.values()):
                    raise NameError(f"FINAL_VAR: no variable named {name!r} in the REPL")
                self._final = name
            else:
                self._final = str(name)
            return None

        def SHOW_VARS():  # noqa: N802
            """Print the REPL's variables (name, type, size)."""
            for key, value in sorted(ns.items()):
                if key.startswith("_") or key in installed:
                    continue
                size = f", len {len(value)}" if hasattr(value, "__len__") else ""
                print(f"{key}: {type(value).__name__}{size}")

        functions = {
            "llm_query": llm_query,
            "llm_query_batched": llm_query_batched,
            "rlm_query": rlm_query,
            "rlm_query_batched": rlm_query_batched,
        }
        installed = {name: fn for name, fn in functions.items() if name in names}
        installed.update(FINAL=FINAL, FINAL_VAR=FINAL_VAR, SHOW_VARS=SHOW_VARS)
        installed.update(SubCallError=SubCallError, BudgetExhausted=BudgetExhausted)
        for name in functions:
            if name not in names:
                installed[name] = _disabled(name, self.config.get("disabled_reason") or "")
        self._installed = installed
        ns.update(installed)

    # --- cells --------------------------------------------------------------------------------

    def run_cell(self, message: dict) -> dict:
        self._cell += 1
        filename = f"<cell {self._cell}>"
        code = str(message.get("code", ""))
        self._cpu_allowance = float(message.get("cpu_s") or 0)
        self._wall_allowance = float(message.get("wall_s") or 0)
        self._final = None
        self.namespace.update(self._installed)  # model code may have overwritten them
        capture = _CappedText(self.max_output)
        os.lseek(1, 0, os.SEEK_SET)
        os.ftruncate(1, 0)
        old = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = capture
        error = error_type = None
        timed_out = False
        exit_code = None  # a forked child's sys.exit()
        start = time.monotonic()
        try:
            self._arm()
            try:
                self._execute(code, filename)
            finally:
                self._disarm()
        except BaseException as exc:  # everything a cell can raise, limits included
            if isinstance(exc, MemoryError):
                self._reserve = None
                gc.collect()
            timed_out = isinstance(exc, CellTimeout)
            error_type = "TimeoutError" if timed_out else type(exc).__name__
            error = self._format_error(exc, code, filename)
            if isinstance(exc, SystemExit) and isinstance(exc.code, (int, type(None))):
                exit_code = exc.code or 0
        finally:
            sys.stdout, sys.stderr = old
        if os.getpid() != self._owner:
            self._leave_child(None if exit_code is not None else error, capture.getvalue(), exit_code)
        if timed_out:  # the cell's whole process tree ends with it, whatever it forked or left running
            killed = confine.end_other_processes(self._parent)
            if killed:
                error += (
                    f"\n(the REPL's other processes ended with it: {killed} killed, those of earlier cells "
                    "included; variables are kept)"
                )
        elapsed = time.monotonic() - start
        if self._reserve is None:
            try:
                self._reserve = bytearray(_EMERGENCY_BYTES)
            except MemoryError:
                pass
        stdout = capture.getvalue()
        total = capture.total
        raw = self._read_fd_output(self.max_output - len(stdout))
        if raw[0]:
            stdout += raw[0]
        total += raw[1]
        return {
            "op": "done",
            "id": message.get("id"),
            "stdout": stdout,
            "stdout_chars": total,
            "error": error,
            "error_type": error_type,
            "final": self._final,
            "timed_out": timed_out,
            "elapsed": elapsed,
        }

    def _arm(self) -> None:
        if self._wall_allowance > 0:
            signal.setitimer(signal.ITIMER_REAL, self._wall_allowance)
        if self._cpu_allowance > 0:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            used = usage.ru_utime + usage.ru_stime
            soft = max(1, math.ceil(used + self._cpu_allowance))
            _, hard = resource.getrlimit(resource.RLIMIT_CPU)
            if hard != resource.RLIM_INFINITY:
                soft = min(soft, hard)
            resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))

    def _disarm(self) -> None:
        with self._pending_lock:
            self._paused_left = 0.0  # a call still in flight (a thread of model code) must not re-arm it
        signal.setitimer(signal.ITIMER_REAL, 0)
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))

    def _execute(self, code: str, filename: str) -> None:
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        tree = ast.parse(code, filename=filename, mode="exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):  # echo a last expression, as a REPL does
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, filename, "exec"), self.namespace)
        if last is not None:
            value = eval(compile(last, filename, "eval"), self.namespace)
            if value is not None:
                print(repr(value))

    def _format_error(self, exc: BaseException, code: str, filename: str) -> str:
        if isinstance(exc, CellTimeout):
            return f"TimeoutError: {exc}"
        if isinstance(exc, MemoryError):
            return "MemoryError: the cell ran out of memory (the REPL's memory limit); free large variables with del"
        try:
            if isinstance(exc, SyntaxError):  # where in the cell; the parser's own frames say nothing
                text = "".join(traceback.format_exception_only(type(exc), exc))
            else:
                tb = traceback.TracebackException.from_exception(exc, limit=None)
                tb.stack = traceback.StackSummary.from_list(
                    [f for f in tb.stack if not os.path.abspath(f.filename).startswith(_THIS_DIR)]
                )
                text = "".join(tb.format())
        except Exception:  # formatting must never take the worker down
            text = f"{type(exc).__name__}: {exc}"
        return text[: self.max_output]

    def _read_fd_output(self, room: int) -> tuple[str, int]:
        try:
            size = os.fstat(1).st_size
            if size <= 0:
                return "", 0
            data = os.pread(1, max(0, min(size, room * 4)), 0) if room > 0 else b""
            text = data.decode("utf-8", errors="replace")[: max(0, room)]
            return text, size
        except OSError:
            return "", 0

    def get_value(self, message: dict) -> dict:
        name = str(message.get("name", ""))
        reply = {"op": "value", "id": message.get("id"), "ok": False, "value": None, "error": None}
        if not name.isidentifier() or name not in self.namespace:
            reply["error"] = f"no variable named {name!r} in the REPL"
            return reply
        try:
            reply["value"] = str(self.namespace[name])
            reply["ok"] = True
        except BaseException as exc:  # a __str__ that raises
            reply["error"] = f"str({name}) raised {type(exc).__name__}: {exc}"
        return reply

    def serve(self) -> None:
        threading.Thread(target=self._read_loop, name="rlm-reader", daemon=True).start()
        self.send({"op": "ready", "pid": os.getpid(), "python": sys.version.split()[0]})
        while True:
            message = self._jobs.get()
            op = message.get("op")
            if op == "shutdown":
                break
            if op == "exec":
                reply = self.run_cell(message)
            elif op == "get":
                reply = self.get_value(message)
            else:
                continue
            try:
                self.send(reply)
            except MemoryError:
                self.send({"op": "done", "id": message.get("id"), "stdout": "", "stdout_chars": 0,
                           "error": "MemoryError while reporting the cell", "error_type": "MemoryError",
                           "final": None, "timed_out": False, "elapsed": 0.0})  # fmt: skip


def _disabled(name: str, reason: str):
    def disabled(*args, **kwargs):
        raise RuntimeError(f"{name} is not available in this REPL{': ' + reason if reason else ''}")

    disabled.__name__ = name
    return disabled


def main() -> None:
    config = json.loads(sys.argv[1])
    confine.enter(config)  # returns in the process that runs the REPL, confined (confine.py)
    for path in config.get("sys_path") or ():
        if path not in sys.path:
            sys.path.append(path)
    worker = Worker(config)
    worker.apply_limits()
    worker.redirect_output()
    worker.load_context()
    worker.install_functions()
    worker.serve()
    os._exit(0)  # daemon threads of model code must not keep the process alive


if __name__ == "__main__":
    main()

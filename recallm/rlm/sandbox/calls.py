"""The host's server for a REPL's sub-calls: ``call`` messages answered on a bounded pool of threads.

Model code's ``llm_query`` and friends arrive as ``call`` messages; ``on_call(kind, args)`` (the
RLM's sub-call router) answers each on at most ``limit`` host threads, so that concurrent calls
from threads in a cell, and batched calls, are served at once. More in flight, duplicate ids and
kinds the REPL was not given are answered with an error at once. Each call gets a
``CancelToken`` (``recallm.cancel.current()`` inside ``on_call``), cancelled when the cell that
made it ends. The server also keeps the time during which at least one call was in flight: the
REPL's wall clock is paused meanwhile, and the host's kill deadline moves by as much.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from recallm import cancel as _cancel
from recallm.errors import RecallmError

__all__ = ["BudgetSpent", "CallHandler", "CallServer"]


class BudgetSpent(Exception):
    """Raised by ``on_call`` when the task's budget is spent: model code gets its own
    ``BudgetExhausted`` (the RLM's ``recallm.rlm.budget.BudgetExhausted`` is one of these)."""


#: ``on_call(kind, args) -> value``; raise ``BudgetSpent`` or any exception to fail the call
CallHandler = Callable[[str, Mapping[str, Any]], Any]

#: ``reply(message, generation)``: send an answer to the REPL start ``generation`` (dropped when
#: that REPL was restarted meanwhile)
Reply = Callable[[dict[str, Any], int], None]


class CallServer:
    """Serves the ``call`` messages of one sandbox's REPL (all its restarts: ``generation``)."""

    def __init__(self, functions: tuple[str, ...], on_call: CallHandler | None, limit: int, reply: Reply) -> None:
        self.functions = functions
        self.on_call = on_call
        self.limit = limit
        self._reply = reply
        self._lock = threading.Lock()
        # (REPL start, call id) of the sub-calls being served -> the token that cancels each
        self._calls: dict[tuple[int, Any], _cancel.CancelToken] = {}
        self._waiting_since: float | None = None  # when the count of calls being served went from 0 to 1
        self._waited = 0.0  # seconds with sub-calls being served, summed
        self._pool: ThreadPoolExecutor | None = None

    def _waiting_changed(self, before: int) -> None:
        """Under ``_lock``, after a call was added or removed (``before``: how many were
        served): keeps the time with sub-calls being served."""
        after, now = len(self._calls), time.monotonic()
        if before == 0 and after > 0:
            self._waiting_since = now
        elif before > 0 and after == 0 and self._waiting_since is not None:
            self._waited += now - self._waiting_since
            self._waiting_since = None

    def waited_s(self) -> float:
        """Seconds so far with at least one sub-call being served (the REPL's timer paused)."""
        with self._lock:
            ongoing = time.monotonic() - self._waiting_since if self._waiting_since is not None else 0.0
            return self._waited + ongoing

    def cancel(self, reason: str) -> None:
        """Cancel every call in flight (their answers, if any, are still sent)."""
        with self._lock:
            tokens = list(self._calls.values())
        for token in tokens:
            token.cancel(reason)

    def _answer(
        self, generation: int, call_id: Any, kind: str, args: Mapping[str, Any], token: _cancel.CancelToken
    ) -> None:
        reply: dict[str, Any] = {"op": "result", "id": call_id, "ok": False}
        try:
            if self.on_call is None:
                raise RuntimeError("sub-calls are not available")
            with _cancel.scope(token):
                reply["value"] = self.on_call(kind, args)
            reply["ok"] = True
        except BudgetSpent as exc:
            reply.update(error=str(exc), budget=True)
        except Exception as exc:  # any failure goes back to model code as its exception
            reply["error"] = f"{type(exc).__name__}: {exc}" if not isinstance(exc, RecallmError) else str(exc)
        finally:
            with self._lock:
                before = len(self._calls)
                self._calls.pop((generation, call_id), None)
                self._waiting_changed(before)
        self._reply(reply, generation)

    def dispatch(self, message: Mapping[str, Any], generation: int) -> str | None:
        """Serve a ``call`` of REPL start ``generation`` on the pool; a reason when the message
        is malformed."""
        call_id, kind, args = message.get("id"), message.get("kind"), message.get("args")
        if not isinstance(call_id, int) or isinstance(call_id, bool) or not isinstance(kind, str):
            return f"a 'call' message with id={str(call_id)[:20]!r}, kind={str(kind)[:20]!r}"
        if not isinstance(args, dict):
            return f"a 'call' message whose args are a {type(args).__name__}"
        refuse = None
        limit = self.limit
        key = (generation, call_id)
        with self._lock:
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
            self._reply({"op": "result", "id": call_id, "ok": False, "error": refuse}, generation)
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=limit, thread_name_prefix="rlm-subcall")
        self._pool.submit(self._answer, generation, call_id, kind, args, token)
        return None

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

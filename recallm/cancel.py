"""Cancellation of model calls: a token that whoever gave up on a call sets, and that the call watches.

A ``CancelToken`` is set once, with a reason, by the party that stopped waiting: a sub-call attempt
that timed out, a cell that ended (or was killed) with sub-calls still in flight, a task that is
over. It can be linked to other tokens (``CancelToken(parents)``): it is cancelled as soon as any
of them is, so one task-wide token reaches every call of the task. Whatever waits or works on a
call watches its token:

* waits - ``token.wait(seconds)`` returns early when the token is set; ``add_callback`` wakes a
  condition or an event (it runs at once if the token is already set);
* models - ``ChatModel.complete(..., cancel=token)``: a scripted model stops its sleep, an
  in-process engine drops a request that has not started and stops generating one that has (HF:
  its batch row ends at the next token; a batch whose every request is cancelled stops; vLLM:
  the request is aborted in the engine, ``LLMEngine.abort_request``, before its next step), a
  server client does not send a request that has not left and aborts one in flight (its
  connection is closed, which vLLM and other servers take as an abort).

A cancelled call that already spent tokens raises ``Cancelled`` carrying them
(``prompt_tokens``, ``completion_tokens``), and the pool charges them: an HF row or an aborted
vLLM request charges its prompt and the tokens it generated before it stopped (vLLM: those of
the engine steps seen before the abort); an aborted server request charges its
prompt (counted locally) and no completion tokens - the server does not report how many it
generated before it saw the connection close, so that part is a lower bound.

The sandbox answers each sub-call of model code on its own thread with a fresh token, cancelled
when the cell ends; ``scope(token)`` makes it ``current()`` for the handler on that thread, so the
handler's signature does not change.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator

__all__ = ["Cancelled", "CancelToken", "current", "scope"]


class Cancelled(Exception):
    """The call was cancelled (``reason`` says by whom)."""

    def __init__(self, reason: str, *, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.prompt_tokens = prompt_tokens  # tokens the cancelled call had already spent (charged)
        self.completion_tokens = completion_tokens


class CancelToken:
    """Set once; linked to ``parents`` (cancelled when any of them is). See module doc."""

    def __init__(self, parents: Iterable[CancelToken | None] = ()) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._ids = 0
        self.reason: str | None = None
        self._unlink: list[Callable[[], None]] = []
        for parent in parents:
            if parent is not None:
                self._unlink.append(parent.add_callback(lambda p=parent: self.cancel(p.reason or "cancelled")))

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self, reason: str = "cancelled") -> None:
        with self._lock:
            if self._event.is_set():
                return
            self.reason = reason
            self._event.set()
            callbacks = list(self._callbacks.values())
            self._callbacks.clear()
        for callback in callbacks:
            callback()

    def add_callback(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback()`` when the token is set (now, if it is); returns a function that
        removes it."""
        with self._lock:
            if not self._event.is_set():
                self._ids += 1
                key = self._ids
                self._callbacks[key] = callback

                def remove() -> None:
                    with self._lock:
                        self._callbacks.pop(key, None)

                return remove
        callback()
        return lambda: None

    def wait(self, timeout: float | None = None) -> bool:
        """True when the token is (or becomes) set within ``timeout`` seconds."""
        return self._event.wait(timeout)

    def check(self) -> None:
        """Raise ``Cancelled`` if the token is set."""
        if self._event.is_set():
            raise Cancelled(self.reason or "cancelled")

    def detach(self) -> None:
        """Stop listening to the parents (a finished call; keeps parents' callback lists short)."""
        for unlink in self._unlink:
            unlink()
        self._unlink.clear()


_local = threading.local()


def current() -> CancelToken | None:
    """The token of the call this thread is answering (``scope``), if any."""
    return getattr(_local, "token", None)


@contextlib.contextmanager
def scope(token: CancelToken | None) -> Iterator[CancelToken | None]:
    """Make ``token`` this thread's ``current()`` for the duration."""
    previous = getattr(_local, "token", None)
    _local.token = token
    try:
        yield token
    finally:
        _local.token = previous

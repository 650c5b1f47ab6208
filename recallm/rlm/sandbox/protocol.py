"""The pipe protocol between the host and a sandboxed REPL worker: JSON lines on a pair of pipes.

Standard library only: this module is bound read-only into the sandbox next to ``worker.py``
and imported there as a top-level module, so it must not import ``recallm``.

Each message is one JSON object (UTF-8) on one line. The worker reads on ``fd_in`` and writes
on ``fd_out`` (two pipes set up by the host; the worker's stdout and stderr are not used, so
model-written code that writes to file descriptor 1 cannot corrupt the channel).

Host -> worker:

* ``{"op": "exec", "id": n, "code": str, "cpu_s": float, "wall_s": float}`` - run a cell;
  ``wall_s`` counts the cell's own time only: while one of its ``call``s is in flight the
  worker's timer is paused (and the host moves its kill deadline by as much);
* ``{"op": "get", "id": n, "name": str}`` - the ``str()`` of a REPL variable (``FINAL_VAR``);
* ``{"op": "result", "id": k, "ok": bool, "value": ..., "error": str, "budget": bool}`` - the
  answer to the worker's sub-call ``k`` (``budget``: the task's budget is spent);
* ``{"op": "shutdown"}``.

Worker -> host:

* ``{"op": "ready", "pid": int, "python": str}`` once, after the context is loaded;
* ``{"op": "call", "id": k, "kind": str, "args": {...}}`` - a sub-call made by model code
  (``llm_query``, ``llm_query_batched``, ``rlm_query``, ``rlm_query_batched``); the calling
  thread blocks until the matching ``result``. Several may be in flight (threads in a cell);
* ``{"op": "done", "id": n, "stdout": str, "stdout_chars": int, "error": str | None,
  "error_type": str | None, "final": str | None, "timed_out": bool, "elapsed": float}``;
* ``{"op": "value", "id": n, "ok": bool, "value": str | None, "error": str | None}``.
"""

from __future__ import annotations

import json
import os
import select
import time
from typing import Any

__all__ = ["ProtocolError", "encode", "write_message", "LineReader", "MAX_LINE_BYTES", "SUBCALL_KINDS"]

#: a longer line is a protocol violation (the worker caps what it sends far below this)
MAX_LINE_BYTES = 256 * 1024 * 1024

SUBCALL_KINDS = ("llm_query", "llm_query_batched", "rlm_query", "rlm_query_batched")


class ProtocolError(Exception):
    """The other side sent something that is not a protocol message."""


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


def write_message(fd: int, message: dict[str, Any]) -> None:
    """Write one message completely (``os.write`` may write less than asked)."""
    data = memoryview(encode(message))
    while data:
        written = os.write(fd, data)
        data = data[written:]


class LineReader:
    """Reads JSON-line messages from a file descriptor, with an optional timeout per message."""

    def __init__(self, fd: int, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.fd = fd
        self.max_line_bytes = max_line_bytes
        self._buffer = bytearray()

    def read(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next message; None when ``timeout`` seconds pass first. ``EOFError`` when the
        other side closed the pipe; ``ProtocolError`` for a line that is not a JSON object or
        is longer than ``max_line_bytes``."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                try:
                    message = json.loads(line)
                except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                    raise ProtocolError(f"not a JSON line: {line[:80]!r} ({exc})") from None
                if not isinstance(message, dict) or "op" not in message:
                    raise ProtocolError(f"not a protocol message: {line[:80]!r}")
                return message
            if len(self._buffer) > self.max_line_bytes:
                raise ProtocolError(f"a line longer than {self.max_line_bytes} bytes")
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                ready, _, _ = select.select([self.fd], [], [], left)
                if not ready:
                    return None
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                raise EOFError("the pipe was closed")
            self._buffer.extend(chunk)

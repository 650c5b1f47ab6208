"""The one local OpenAI-compatible HTTP server of the tests: chat and text completions answered by a function.

``OpenAIStub(respond)`` serves ``POST /v1/chat/completions`` and ``POST /v1/completions`` with
``respond(path, body)`` and ``GET /v1/models`` (the ids in ``models``). ``respond`` returns

* the answer text, or a ``(text, finish_reason)`` pair: sent as one choice of the endpoint's
  shape, with ``usage.completion_tokens`` = the number of words of the text;
* a ``dict``: sent as the whole JSON reply (its own choices and usage, or none);
* a ``Raw(status, payload)``: sent as it is, with that HTTP status (a server error).

Every POST is recorded in ``requests`` as ``(path, body)``; every request, GETs included, in
``calls`` as ``{"method", "path", "auth", "body"}`` (``auth``: the Authorization header or None),
before ``respond`` runs. Inside ``respond``, ``stub.post_index()`` is the number of POSTs that had
arrived with the one being answered (1 for the first), and ``stub.connection()`` its socket (to
hold a request and watch the client hang up).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple


class Raw(NamedTuple):
    """A reply sent as it is: an HTTP status and a JSON payload."""

    status: int
    payload: dict[str, Any]


class OpenAIStub:
    def __init__(self, respond: Callable[[str, dict[str, Any]], Any], *, models: Sequence[str] = ("stub",)) -> None:
        self.requests: list[tuple[str, dict]] = []
        self.calls: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self._local = threading.local()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, body: dict, status: int = 200) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _record(self, body: dict | None) -> None:
                with stub.lock:
                    auth = self.headers.get("Authorization")
                    stub.calls.append({"method": self.command, "path": self.path, "auth": auth, "body": body})
                    if body is not None:
                        stub.requests.append((self.path, body))
                        stub._local.index = len(stub.requests)

            def do_GET(self):
                self._record(None)
                self._send({"data": [{"id": m} for m in models]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self._record(body)
                stub._local.connection = self.connection
                try:
                    answer = respond(self.path, body)
                finally:
                    stub._local.connection = None
                if answer is None:  # the client hung up: nothing to send
                    return
                if isinstance(answer, Raw):
                    return self._send(answer.payload, answer.status)
                if isinstance(answer, dict):
                    return self._send(answer)
                text, reason = answer if isinstance(answer, tuple) else (answer, "stop")
                if self.path.endswith("/chat/completions"):
                    choice = {"message": {"role": "assistant", "content": text}, "finish_reason": reason}
                else:
                    choice = {"text": text, "finish_reason": reason}
                self._send({"choices": [choice], "usage": {"completion_tokens": len(text.split())}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def post_index(self) -> int:
        """How many POSTs had arrived with the one ``respond`` is answering (1 for the first)."""
        return self._local.index

    def connection(self) -> socket.socket:
        """The socket of the request ``respond`` is answering (in the thread that answers it)."""
        return self._local.connection

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> OpenAIStub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

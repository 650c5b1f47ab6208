"""A local OpenAI-compatible HTTP server for tests: chat and text completions answered by a function.

``OpenAIStub(respond)`` serves ``POST /v1/chat/completions`` and ``POST /v1/completions`` with
``respond(path, body)`` (the answer text, or a ``(text, finish_reason)`` pair) and ``GET
/v1/models``; every POST is recorded in ``requests`` as ``(path, body)``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class OpenAIStub:
    def __init__(self, respond: Callable[[str, dict[str, Any]], Any]) -> None:
        self.requests: list[tuple[str, dict]] = []
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send({"data": [{"id": "stub"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with stub.lock:
                    stub.requests.append((self.path, body))
                answer = respond(self.path, body)
                text, reason = answer if isinstance(answer, tuple) else (answer, "stop")
                if self.path.endswith("/chat/completions"):
                    choice = {"message": {"role": "assistant", "content": text}, "finish_reason": reason}
                else:
                    choice = {"text": text, "finish_reason": reason}
                self._send({"choices": [choice], "usage": {"completion_tokens": len(text.split())}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

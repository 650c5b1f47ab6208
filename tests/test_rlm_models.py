"""The RLM's models (issue 17, items 4 and 11): in-process engines batch concurrent requests into
one ``generate`` and drop cancelled ones; OpenAI-compatible servers get only the parameters the
user configured and report their own token usage."""

from __future__ import annotations

import json
import threading
import time

import pytest

from recallm.rlm.cancel import Cancelled, CancelToken
from recallm.rlm.models import make_model


def _wait_for(predicate, what: str, limit_s: float = 120.0) -> None:
    """Poll until ``predicate()`` (a readiness wait, not a timing assertion)."""
    end = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.005)


@pytest.fixture
def hf_model(tiny_dir):
    model = make_model(
        {"name": "hf", "model_path": str(tiny_dir), "recall_constrained": False, "batch_size": 8,
         "max_new_tokens": 6, "device": "cpu", "dtype": "float32"},  # fmt: skip
        "sub",
    )
    batches: list[int] = []
    gate, first = threading.Event(), threading.Event()
    generate = model.backend.generate

    def gated(requests, settings):
        batches.append(len(requests))
        if len(batches) == 1:
            first.set()
            gate.wait()
        return generate(requests, settings)

    model.backend.generate = gated
    yield model, batches, gate, first
    gate.set()
    model.close()


def test_concurrent_requests_to_an_in_process_model_are_one_generate_call(hf_model):
    """Before: a lock made every request its own ``generate`` call (8 calls for 8 requests)."""
    model, batches, gate, first = hf_model
    results: dict[int, object] = {}

    def ask(i: int) -> None:
        results[i] = model.complete([{"role": "user", "content": f"question {i}"}], max_new_tokens=4 + i % 2)

    threads = [threading.Thread(target=ask, args=(0,))]
    threads[0].start()
    first.wait()  # the first request is being generated; the next seven queue up meanwhile
    threads += [threading.Thread(target=ask, args=(i,)) for i in range(1, 8)]
    for t in threads[1:]:
        t.start()
    _wait_for(lambda: model.queued() == 7, "seven queued requests")
    gate.set()
    for t in threads:
        t.join()
    assert batches == [1, 7]
    assert sorted(results) == list(range(8))
    for i, reply in results.items():
        assert 1 <= reply.completion_tokens <= 4 + i % 2  # each request keeps its own token budget
        assert reply.prompt_tokens > 0


def test_a_cancelled_queued_request_never_reaches_the_engine(hf_model):
    """Before: an abandoned call still held the lock, and the calls behind it timed out in turn."""
    model, batches, gate, first = hf_model
    token = CancelToken()
    outcome: dict[str, object] = {}

    def ask(key: str, cancel=None) -> None:
        try:
            outcome[key] = model.complete([{"role": "user", "content": key}], max_new_tokens=3, cancel=cancel)
        except Cancelled as exc:
            outcome[key] = exc

    a = threading.Thread(target=ask, args=("a",))
    a.start()
    first.wait()
    b = threading.Thread(target=ask, args=("b", token))
    b.start()
    _wait_for(lambda: model.queued() == 1, "b queued")
    token.cancel("the caller gave up")
    b.join()  # returns at once, while `a` is still being generated
    assert isinstance(outcome["b"], Cancelled) and "a" not in outcome
    gate.set()
    a.join()
    assert batches == [1] and outcome["a"].completion_tokens >= 1


def _server(reply_usage: dict | None):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"data": []}')

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            reply = {"choices": [{"message": {"content": "FINAL(4)"}, "finish_reason": "stop"}]}
            if reply_usage is not None:
                reply["usage"] = reply_usage
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def test_an_openai_server_gets_only_what_the_user_configured_and_reports_usage():
    """Before: every request carried temperature=0.0 and max_tokens (reasoning models reject
    both), and prompt tokens were counted locally even when the server reported them."""
    server, seen = _server({"prompt_tokens": 123, "completion_tokens": 7})
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        bare = make_model({"name": "openai", "served_model": "o", "base_url": url, "api_key_env": None}, "root")
        reply = bare.complete([{"role": "user", "content": "2+2?"}], max_new_tokens=None)
        assert (reply.text, reply.prompt_tokens, reply.completion_tokens) == ("FINAL(4)", 123, 7)
        assert set(seen[-1]) == {"model", "messages"}
        capped = bare.complete([{"role": "user", "content": "2+2?"}], max_new_tokens=50)
        assert seen[-1]["max_tokens"] == 50 and "temperature" not in seen[-1] and capped.prompt_tokens == 123
        configured = make_model(
            {"name": "openai", "served_model": "o", "base_url": url, "api_key_env": None, "temperature": 0.6,
             "max_tokens_key": "max_completion_tokens"},  # fmt: skip
            "sub",
        )
        configured.complete([{"role": "user", "content": "hi"}], max_new_tokens=64)
        assert seen[-1]["temperature"] == 0.6 and seen[-1]["max_completion_tokens"] == 64
        assert "max_tokens" not in seen[-1]
        bare.close()
        configured.close()
    finally:
        server.shutdown()


def test_without_server_usage_tokens_are_counted_locally():
    server, _ = _server(None)
    try:
        model = make_model(
            {"name": "openai", "served_model": "o", "base_url": f"http://127.0.0.1:{server.server_address[1]}/v1",
             "api_key_env": None},  # fmt: skip
            "root",
        )
        reply = model.complete([{"role": "user", "content": "x" * 40}], max_new_tokens=None)
        assert reply.prompt_tokens >= 10 and reply.completion_tokens >= 1
        model.close()
    finally:
        server.shutdown()

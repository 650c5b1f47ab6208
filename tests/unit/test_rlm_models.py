"""The RLM's models (issue 17, items 4 and 11): in-process engines batch concurrent requests into
one ``generate`` and drop cancelled ones; OpenAI-compatible servers get only the parameters the
user configured and report their own token usage."""

from __future__ import annotations

import threading

import pytest

from recallm.cancel import Cancelled, CancelToken
from recallm.rlm.models import make_model
from tests.openai_stub import OpenAIStub
from tests.rlm_helpers import wait_for


@pytest.fixture
def hf_model(tiny_dir):
    model = make_model(
        {
            "name": "hf",
            "model_path": str(tiny_dir),
            "recall_constrained": False,
            "batch_size": 8,
            "max_new_tokens": 6,
            "device": "cpu",
            "dtype": "float32",
        },  # fmt: skip
        "sub",
    )
    batches: list[int] = []
    gate, first = threading.Event(), threading.Event()
    generate = model.backend.generate

    def gated(requests, settings, **kwargs):
        batches.append(len(requests))
        if len(batches) == 1:
            first.set()
            gate.wait()
        return generate(requests, settings, **kwargs)

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
    wait_for(lambda: model.queued() == 7, "seven queued requests")
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
    wait_for(lambda: model.queued() == 1, "b queued")
    token.cancel("the caller gave up")
    b.join()  # returns at once, while `a` is still being generated
    assert isinstance(outcome["b"], Cancelled) and "a" not in outcome
    gate.set()
    a.join()
    assert batches == [1] and outcome["a"].completion_tokens >= 1


def _server(reply_usage: dict | None) -> OpenAIStub:
    """The shared stub answering ``FINAL(4)``, with ``reply_usage`` as its usage (None: none)."""
    reply = {"choices": [{"message": {"content": "FINAL(4)"}, "finish_reason": "stop"}]}
    if reply_usage is not None:
        reply["usage"] = reply_usage
    return OpenAIStub(lambda path, body: reply, models=())


def _last_body(stub: OpenAIStub) -> dict:
    return stub.requests[-1][1]


def test_an_openai_server_gets_only_what_the_user_configured_and_reports_usage():
    """Before: every request carried temperature=0.0 and max_tokens (reasoning models reject
    both), and prompt tokens were counted locally even when the server reported them."""
    stub = _server({"prompt_tokens": 123, "completion_tokens": 7})
    url = stub.url
    try:
        bare = make_model({"name": "openai", "served_model": "o", "base_url": url, "api_key_env": None}, "root")
        reply = bare.complete([{"role": "user", "content": "2+2?"}], max_new_tokens=None)
        assert (reply.text, reply.prompt_tokens, reply.completion_tokens) == ("FINAL(4)", 123, 7)
        assert set(_last_body(stub)) == {"model", "messages"}
        capped = bare.complete([{"role": "user", "content": "2+2?"}], max_new_tokens=50)
        seen = _last_body(stub)
        assert seen["max_tokens"] == 50 and "temperature" not in seen and capped.prompt_tokens == 123
        configured = make_model(
            {
                "name": "openai",
                "served_model": "o",
                "base_url": url,
                "api_key_env": None,
                "temperature": 0.6,
                "max_tokens_key": "max_completion_tokens",
            },  # fmt: skip
            "sub",
        )
        configured.complete([{"role": "user", "content": "hi"}], max_new_tokens=64)
        assert _last_body(stub)["temperature"] == 0.6 and _last_body(stub)["max_completion_tokens"] == 64
        assert "max_tokens" not in _last_body(stub)
        bare.close()
        configured.close()
    finally:
        stub.close()


def test_without_server_usage_tokens_are_counted_locally():
    stub = _server(None)
    try:
        model = make_model(
            {
                "name": "openai",
                "served_model": "o",
                "base_url": stub.url,
                "api_key_env": None,
            },  # fmt: skip
            "root",
        )
        reply = model.complete([{"role": "user", "content": "x" * 40}], max_new_tokens=None)
        assert reply.prompt_tokens >= 10 and reply.completion_tokens >= 1
        model.close()
    finally:
        stub.close()


# --- a call already running really stops (issue 17, item 3) ---------------------------------------


@pytest.fixture
def endless_hf(tiny_dir):
    """The tiny model with no end-of-sequence token (every row runs to its limit unless stopped),
    its forward calls counted; ``on_forward(n)`` runs after the n-th."""
    model = make_model(
        {
            "name": "hf",
            "model_path": str(tiny_dir),
            "recall_constrained": False,
            "batch_size": 8,
            "max_new_tokens": 64,
            "device": "cpu",
            "dtype": "float32",
        },  # fmt: skip
        "sub",
    )
    backend = model.backend
    backend.eos_ids = []
    state = {"forwards": 0, "on_forward": lambda n: None}
    forward = backend.model.forward

    def counted(*args, **kwargs):
        out = forward(*args, **kwargs)
        state["forwards"] += 1
        state["on_forward"](state["forwards"])
        return out

    backend.model.forward = counted
    yield model, state
    model.close()


def test_a_cancelled_hf_request_stops_generating_and_is_charged_what_it_spent(endless_hf):
    """Before: a running request ran all its 64 tokens after its caller gave up."""
    from recallm.rlm.budget import Budget, BudgetLimits
    from recallm.rlm.subcalls import CallPool

    model, state = endless_hf
    messages = [{"role": "user", "content": "count to a hundred"}]
    full = model.complete(messages, max_new_tokens=64)
    assert full.completion_tokens == 64 and state["forwards"] == 64  # the baseline: no early end
    state["forwards"] = 0
    token = CancelToken()
    state["on_forward"] = lambda n: token.cancel("the cell ended") if n == 5 else None
    budget = Budget(BudgetLimits())
    pool = CallPool(2, budget)
    with pytest.raises(Cancelled):
        pool.call(model, messages, max_new_tokens=64, cancel=token)
    assert pool.drain(60) == 0
    assert state["forwards"] == 5  # the row ended with the token being generated when it was cancelled
    # honest accounting: the prompt and the 5 tokens it generated are charged, not 64, not 0
    assert budget.tokens == full.prompt_tokens + 5


def test_only_the_cancelled_row_of_an_hf_batch_stops(endless_hf):
    from recallm.eval.types import GenerationSettings, TextRequest

    model, state = endless_hf
    backend, settings = model.backend, GenerationSettings(max_new_tokens=24)
    flag = threading.Event()
    state["on_forward"] = lambda n: flag.set() if n == 3 else None
    requests = [TextRequest(model.render([{"role": "user", "content": k}]), None, 24) for k in ("kept", "dropped")]
    kept, dropped = backend.generate(requests, settings, cancelled=[lambda: False, flag.is_set])
    assert (kept.n_tokens, kept.finish_reason) == (24, "length") and state["forwards"] == 24
    assert (dropped.text, dropped.n_tokens, dropped.finish_reason) == ("", 3, "cancelled")
    # a batch whose every request is cancelled stops at the next token
    state["forwards"] = 0
    everything = threading.Event()
    state["on_forward"] = lambda n: everything.set() if n == 2 else None
    out = backend.generate(requests, settings, cancelled=[everything.is_set, everything.is_set])
    assert state["forwards"] == 2 and [(g.n_tokens, g.finish_reason) for g in out] == [(2, "cancelled")] * 2
    # a lone row cancelled mid-way is "cancelled", not "length": its batch ends where it was stopped
    state["forwards"] = 0
    alone = threading.Event()
    state["on_forward"] = lambda n: alone.set() if n == 5 else None
    (only,) = backend.generate(requests[:1], settings, cancelled=[alone.is_set])
    assert state["forwards"] == 5 and (only.n_tokens, only.finish_reason) == (5, "cancelled")
    # and a batch cancelled before it starts never runs
    state["forwards"] = 0
    out = backend.generate(requests, settings, cancelled=[lambda: True, lambda: True])
    assert state["forwards"] == 0 and {g.finish_reason for g in out} == {"cancelled"}


def _holding_server():
    """The shared stub, reading a request and then holding it (no answer) until the client closes
    the connection or ``release`` is set; ``got`` is set when a request arrived, ``closed`` when
    the client hung up on a held request."""
    import select

    got, closed, release = threading.Event(), threading.Event(), threading.Event()
    answered: list[int] = []

    def hold(path: str, body: dict):
        got.set()
        connection = stub.connection()
        while not release.is_set():  # "generating": watch the connection meanwhile
            readable, _, _ = select.select([connection], [], [], 0.05)
            if readable and not connection.recv(1, 2):  # MSG_PEEK: EOF, the client hung up
                closed.set()
                return None
        answered.append(1)
        return {"choices": [{"message": {"content": "late"}, "finish_reason": "stop"}]}

    stub = OpenAIStub(hold, models=())
    return stub, got, closed, release, answered


def test_a_cancelled_server_request_is_aborted_in_flight_and_charged_its_prompt():
    """Before: only a request that had not left stopped; one in flight held its connection (and
    the server kept generating) until the server answered."""
    from recallm.rlm.budget import Budget, BudgetLimits
    from recallm.rlm.subcalls import CallPool

    stub, got, closed, release, answered = _holding_server()
    url = stub.url
    try:
        model = make_model(
            {"name": "openai", "served_model": "o", "base_url": url, "api_key_env": None, "timeout": 60}, "sub"
        )
        budget = Budget(BudgetLimits())
        pool = CallPool(2, budget)
        token = CancelToken()
        messages = [{"role": "user", "content": "y" * 400}]
        errors: list[BaseException] = []

        def ask() -> None:
            try:
                pool.call(model, messages, max_new_tokens=None, cancel=token)
            except BaseException as exc:
                errors.append(exc)

        caller = threading.Thread(target=ask)
        caller.start()
        assert got.wait(30), "the request never reached the server"
        token.cancel("the cell ended")
        caller.join(30)
        assert closed.wait(30), "the client kept the request open after its cancellation"
        assert pool.drain(30) == 0 and not answered
        assert len(errors) == 1 and isinstance(errors[0], Cancelled)
        assert budget.tokens == 100  # its prompt (400 characters, counted locally); the server reported nothing
        # the client still works afterwards
        release.set()
        assert model.complete(messages, max_new_tokens=None).text == "late"
        model.close()
    finally:
        release.set()
        stub.close()

"""Issue 17, item 3 for vLLM's in-process engine: a request cancelled while it runs is aborted in
the engine (``LLMEngine.abort_request``) before its next step and charged what it spent.

vLLM is not installed in the main suite, so the engine here is a stand-in with ``LLMEngine``'s
interface (``add_request`` / ``step`` / ``abort_request`` / ``has_unfinished_requests``, outputs
in ``RequestOutputKind.DELTA``: each step's new tokens) that records what it was asked. The same
path against the real CPU build of vLLM is ``tests/vllm_tier/test_vllm_engine.py``.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from recallm.cancel import Cancelled, CancelToken
from recallm.eval.backends import VLLMBackend, drive_engine
from recallm.rlm.models import BackendModel


class FakeEngine:
    """``LLMEngine`` as ``drive_engine`` uses it: every step adds one token (id 7) to every
    running request, a request finishes (``length``) at its ``max_tokens``; an aborted request
    gets no more output. ``on_step(n)`` runs after the n-th step."""

    def __init__(self, on_step=lambda n: None, fail_at: int | None = None) -> None:
        self.running: dict[str, list] = {}  # request id -> [generated, max_tokens]
        self.added: list[str] = []
        self.aborted: list[list[str]] = []
        self.steps = 0
        self.worked: dict[str, int] = {}  # steps each request was worked on
        self.on_step = on_step
        self.fail_at = fail_at

    def add_request(self, request_id, prompt, params) -> str:
        assert request_id not in self.running
        self.added.append(request_id)
        self.running[request_id] = [0, params.max_tokens]
        return request_id

    def abort_request(self, request_ids, internal: bool = False) -> None:
        self.aborted.append(list(request_ids))
        for rid in request_ids:
            self.running.pop(rid, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def step(self) -> list:
        self.steps += 1
        if self.fail_at is not None and self.steps == self.fail_at:
            raise RuntimeError("engine step failed")
        outputs = []
        for rid, state in list(self.running.items()):
            state[0] += 1
            self.worked[rid] = self.worked.get(rid, 0) + 1
            finished = state[0] >= state[1]
            if finished:
                del self.running[rid]
            completion = SimpleNamespace(token_ids=[7], finish_reason="length" if finished else None)
            outputs.append(SimpleNamespace(request_id=rid, outputs=[completion], finished=finished))
        self.on_step(self.steps)
        return outputs


def _params(*limits):
    return [SimpleNamespace(max_tokens=n) for n in limits]


def test_a_request_cancelled_while_running_is_aborted_in_the_engine():
    flag = {"set": False}
    engine = FakeEngine(on_step=lambda n: flag.update(set=True) if n == 3 else None)
    done = drive_engine(engine, ["a", "b"], [None, None], _params(20, 20), [lambda: False, lambda: flag["set"]])
    assert engine.aborted == [["b"]]  # aborted once, before the 4th step
    assert engine.worked == {"a": 20, "b": 3}  # the engine stopped working on it; its sibling ran on
    assert done["b"] == ([7, 7, 7], "cancelled") and done["a"] == ([7] * 20, "length")
    assert not engine.has_unfinished_requests()


def test_progress_counts_each_steps_tokens_and_each_request_as_it_ends():
    flag = {"set": False}
    engine = FakeEngine(on_step=lambda n: flag.update(set=True) if n == 2 else None)
    calls = []
    drive_engine(
        engine, ["a", "b", "c"], [None] * 3, _params(3, 5, 5), [lambda: False, lambda: flag["set"], lambda: False],
        progress=lambda tokens, finished: calls.append((tokens, finished)),
    )  # fmt: skip
    # b is cancelled after step 2, a ends at step 3, c at step 5
    assert calls == [(3, 0), (3, 0), (0, 1), (2, 1), (1, 0), (1, 1)]


def test_requests_cancelled_before_they_start_never_reach_the_engine_and_all_cancelled_stops():
    engine = FakeEngine()
    done = drive_engine(engine, ["a", "b"], [None, None], _params(5, 5), [lambda: True, lambda: True])
    assert engine.added == [] and engine.steps == 0 and done == {"a": ([], "cancelled"), "b": ([], "cancelled")}
    # every running request cancelled: no further step is made
    flag = {"set": False}
    engine = FakeEngine(on_step=lambda n: flag.update(set=True) if n == 2 else None)
    done = drive_engine(engine, ["a", "b"], [None, None], _params(50, 50), [lambda: flag["set"]] * 2)
    assert engine.steps == 2 and engine.aborted == [["a", "b"]] and not engine.has_unfinished_requests()
    assert {rid: len(t) for rid, (t, _) in done.items()} == {"a": 2, "b": 2}


def test_an_engine_failure_leaves_no_request_running():
    engine = FakeEngine(fail_at=3)
    with pytest.raises(RuntimeError, match="engine step failed"):
        drive_engine(engine, ["a", "b"], [None, None], _params(10, 10))
    assert engine.aborted == [["a", "b"]] and not engine.has_unfinished_requests()


def test_drive_engine_refuses_mismatched_lengths():
    with pytest.raises(ValueError, match="one prompt"):
        drive_engine(FakeEngine(), ["a"], [None, None], _params(1))


class _WordTokenizer:
    """Words as tokens (id 7 is the word ``w``; 0 is the end of sequence)."""

    def __call__(self, text, add_special_tokens=False, **_):
        return {"input_ids": [7] * len(text.split())}

    def decode(self, ids, skip_special_tokens=False):
        return " ".join("w" for _ in ids)


class _StubVLLM(VLLMBackend):
    """``VLLMBackend`` with the engine above in place of ``vllm.LLM`` (no vLLM here): its real
    ``generate`` and ``stops_cancelled``; only the vLLM objects of ``_engine_inputs`` differ."""

    def __init__(self, engine: FakeEngine) -> None:
        self.llm = SimpleNamespace(llm_engine=engine)
        self.tokenizer = _WordTokenizer()
        self.recall, self.recall_constrained = None, False
        self.eos_ids, self.max_model_len = {0}, 4096
        self._request_ids = itertools.count()

    def _engine_inputs(self, requests, settings):
        prompts = [{"prompt_token_ids": self.tokenizer(r.prompt_text + r.prefix)["input_ids"]} for r in requests]
        return prompts, _params(*(r.max_new_tokens for r in requests))


def test_a_cancelled_vllm_sub_call_is_aborted_and_charged_what_it_spent():
    """Before: ``BackendModel`` ran vLLM's started batch to its end (64 tokens) after its caller
    gave up."""
    from recallm.eval.types import GenerationSettings
    from recallm.rlm.budget import Budget, BudgetLimits
    from recallm.rlm.subcalls import CallPool

    token = CancelToken()
    engine = FakeEngine()
    model = BackendModel(_StubVLLM(engine), None, GenerationSettings(max_new_tokens=64), label="sub:vllm")
    messages = [{"role": "user", "content": "count to a hundred"}]
    full = model.complete(messages, max_new_tokens=64)
    assert (full.completion_tokens, full.finish_reason) == (64, "length") and engine.aborted == []
    engine.on_step = lambda n: token.cancel("the cell ended") if n == 64 + 5 else None
    budget = Budget(BudgetLimits())
    pool = CallPool(2, budget)
    with pytest.raises(Cancelled):
        pool.call(model, messages, max_new_tokens=64, cancel=token)
    assert pool.drain(60) == 0
    assert len(engine.aborted) == 1 and engine.steps == 64 + 5 and not engine.has_unfinished_requests()
    # the prompt and the 5 tokens of the steps it ran are charged, not 64, not 0
    assert budget.tokens == full.prompt_tokens + 5
    model.close()

"""Sub-calls under concurrency, timeouts and budgets (issue 17, items 1-5): each test was written
against the old executor and failed there. Counters and events, never elapsed-time thresholds."""

from __future__ import annotations

import threading

import pytest

from recallm.rlm.budget import BudgetLimits
from recallm.rlm.models import ScriptedModel, approx_tokens
from recallm.rlm.runner import RLM
from recallm.rlm.sandbox import SandboxLimits
from recallm.rlm.subcalls import SubCallSettings
from tests import rlm_helpers


def repl(code: str, after: str = "") -> str:
    return rlm_helpers.repl(code, after, lead="")


def make(root, sub=None, **kwargs) -> RLM:
    kwargs.setdefault("max_wall_s", 120)
    return rlm_helpers.make(root, sub, **kwargs)


def turns_of(result, rlm="0"):
    return rlm_helpers.events_of(result, "turn", rlm)


# --- 1. rlm_query_batched reserves per batch ------------------------------------------------------


def test_a_recursive_batch_is_reserved_whole_and_the_root_keeps_its_turn():
    """Before: children were counted one by one; the third of three with max_subcalls=2 marked
    the whole budget spent, the batch raised, the two finished answers were lost and the root
    never got another turn."""

    def child(messages):
        return "FINAL(child of " + messages[1]["content"].split("`context` is a str of ")[1].split(" ")[0] + ")"

    root = [
        repl("rs = rlm_query_batched(['a', 'bb', 'ccc'], 'size?')"),
        repl("rs = rlm_query_batched(['a', 'bb'], 'size?')", "FINAL_VAR(rs)"),
    ]
    budget = BudgetLimits(max_tokens=None, max_subcalls=2, max_wall_s=120)
    result = make(root, ScriptedModel(child), budget=budget, max_depth=2).run("ctx")
    assert (result.outcome, result.turns) == ("final", 2)
    assert result.answer == str(["child of 1", "child of 2"])
    first = turns_of(result)[0]["observation"]
    assert "BudgetExhausted" in first and "3 more asked" in first
    assert result.usage["subcalls"] == 2 and result.usage["exhausted"] is None
    assert not [e for e in result.events if e["event"] == "start" and e["rlm"] == "0.3"]  # none of the 3 started


def test_the_sub_call_cap_refuses_calls_but_does_not_end_the_run():
    budget = BudgetLimits(max_tokens=None, max_subcalls=1, max_wall_s=120)
    root = [repl("a = llm_query('x')"), repl("b = llm_query('y')"), "FINAL(after the cap)"]
    result = make(root, ScriptedModel(["ok"]), budget=budget).run("c")
    assert (result.outcome, result.answer) == ("final", "after the cap")
    assert "max_subcalls=1" in turns_of(result)[1]["observation"]


# --- 2. a timed-out attempt keeps its slot; its tokens are charged ---------------------------------


class Gate:
    """A sub-model whose first ``blocked`` calls wait until ``release()``: it does not honour
    cancellation (a backend that cannot be interrupted). Counts calls in flight."""

    def __init__(self, blocked: int) -> None:
        self.blocked = blocked
        self.gate = threading.Event()
        self.lock = threading.Lock()
        self.started = 0
        self.active = 0
        self.peak = 0
        self.replies: list[str] = []

    def __call__(self, messages):
        with self.lock:
            self.started += 1
            mine = self.started
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            if mine <= self.blocked:
                self.gate.wait()
            reply = f"answer {mine}"
            with self.lock:
                self.replies.append(reply)
            return reply
        finally:
            with self.lock:
                self.active -= 1


def test_timed_out_calls_keep_their_pool_slot_and_their_tokens_are_charged():
    """Before: a timed-out attempt freed its slot while its thread ran on (pool 2, 5 in flight)
    and the abandoned attempts' tokens were never charged."""
    gate = Gate(blocked=2)
    sub = ScriptedModel(gate)

    def root(messages):
        if sum(m["role"] == "assistant" for m in messages) == 0:
            return repl("rs = llm_query_batched(['p1', 'p2', 'p3'])\nprint(rs)")
        gate.gate.set()  # the root's second turn lets the stuck calls finish
        return "FINAL(done)"

    settings = SubCallSettings(pool_size=2, timeout_s=0.3, retries=1, backoff_s=0.0)
    rlm = make(ScriptedModel(root), sub, subcalls=settings, limits=SandboxLimits(cpu_s=5, wall_s=30, memory_mb=512))
    result = rlm.run("c")
    assert result.outcome == "final"
    assert gate.peak <= 2  # the bound held while abandoned calls were still running
    observation = turns_of(result)[0]["observation"]
    assert observation.count("[llm_query error") == 3
    # every completed model call is charged, those that finished after being abandoned included
    sub_tokens = sum(approx_tokens(c.messages[-1]["content"]) + approx_tokens(r) for c, r in _pairs(sub))
    root_tokens = sum(e["prompt_tokens"] + e["completion_tokens"] for e in turns_of(result))
    assert len(gate.replies) == len(sub.calls) >= 2
    assert result.usage["tokens"] == sub_tokens + root_tokens


def _pairs(model: ScriptedModel):
    return [(call, call.reply) for call in model.calls]


# --- 3. waiting on sub-calls is not cell time; abandoned calls are cancelled -----------------------


def test_a_cell_waiting_on_a_slow_sub_call_is_not_cut_by_its_wall_clock():
    """Before: a cell with wall_s=1 waiting on a 2 s sub-call was cut at 1 s and the answer dropped."""
    sub = ScriptedModel(["slow answer"], latency_s=2.0)
    result = make([repl("r = llm_query('q')", "FINAL_VAR(r)")], sub).run("c")
    assert (result.outcome, result.answer) == ("final", "slow answer")
    cell = turns_of(result)[0]["cells"][0]
    assert not cell["timed_out"] and cell["error"] is None


def test_sub_calls_of_a_cell_that_is_killed_are_cancelled():
    """The task's wall budget ends a cell waiting on a 60 s sub-call: the call is cancelled (the
    model sees it and stops) instead of running on after the task ended."""
    sub = ScriptedModel(["never"], latency_s=60.0)
    # the budget must outlast the REPL's start and the cell's first line on a loaded machine (2 s did
    # not, under load), and end long before the 60 s call would
    budget = BudgetLimits(max_tokens=None, max_subcalls=None, max_wall_s=6.0)
    subcalls = SubCallSettings(pool_size=8, timeout_s=120, retries=0)  # only the budget ends the call
    result = make([repl("answer = 'stored'\nr = llm_query('q')")], sub, budget=budget, subcalls=subcalls).run("c")
    assert (result.outcome, result.answer) == ("budget_exhausted", "stored")
    assert sub.cancelled == 1 and not sub.calls  # cancelled, never completed


def test_a_timed_out_attempt_is_cancelled_and_its_slot_comes_back():
    sub = ScriptedModel(["late"], latency_s=60.0)
    settings = SubCallSettings(pool_size=1, timeout_s=0.2, retries=2, backoff_s=0.0)
    root = [repl("r = llm_query_batched(['a', 'b'])\nprint(r)"), "FINAL(x)"]
    result = make(root, sub, subcalls=settings).run("c")
    assert result.outcome == "final"
    assert sub.cancelled == 6 and not sub.calls  # 2 prompts x 3 attempts, each cancelled at its timeout


# --- 5. one pool and one bound on live REPLs per task ---------------------------------------------


class Peak:
    """Counts model calls in flight across models (a shared counter)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = 0
        self.peak = 0

    def wrap(self, fn):
        def inner(messages):
            with self.lock:
                self.active += 1
                self.peak = max(self.peak, self.active)
            try:
                return fn(messages)
            finally:
                with self.lock:
                    self.active -= 1

        return inner


def test_child_root_turns_share_the_task_pool():
    """Before: the root turns of recursive children bypassed the pool (pool 2, 4 in flight)."""
    peak = Peak()

    def sub(messages):
        if messages[0]["role"] == "system":
            return "FINAL(child)"
        return "plain"

    sub_model = ScriptedModel(peak.wrap(sub), latency_s=0.3)
    code = "rs = rlm_query_batched(['a', 'b', 'c', 'd'], 'q?')\nprint(rs)"
    settings = SubCallSettings(pool_size=2, timeout_s=30, retries=0, max_repls=8)
    result = make([repl(code, "FINAL_VAR(rs)")], sub_model, subcalls=settings, max_depth=2).run("c")
    assert result.answer == str(["child"] * 4)
    assert peak.peak <= 2


@pytest.mark.slow
def test_live_repls_are_bounded_and_a_child_without_one_falls_back_to_a_plain_call(monkeypatch):
    """Depth 3 with batches of 3 at each level would start 1 + 3 + 9 REPL processes; with
    max_repls=3 at most 3 live at once, and children that cannot get one (every REPL is held by a
    parent waiting on its children) are answered by a plain sub-call instead."""
    from recallm.rlm import runner

    live = {"now": 0, "peak": 0}
    lock = threading.Lock()
    original = runner.Sandbox

    class Counting(original):
        def start(self):
            fresh = not self.alive
            super().start()
            if fresh:
                with lock:
                    live["now"] += 1
                    live["peak"] = max(live["peak"], live["now"])

        def close(self):
            was = self.alive
            super().close()
            if was:
                with lock:
                    live["now"] -= 1

    monkeypatch.setattr(runner, "Sandbox", Counting)

    def sub(messages):
        if messages[0]["role"] == "system":
            return repl("rs = rlm_query_batched([context + '1', context + '2', context + '3'], 'q')", "FINAL_VAR(rs)")
        return "leaf"

    root = [repl("rs = rlm_query_batched(['1', '2', '3'], 'q')", "FINAL_VAR(rs)")]
    settings = SubCallSettings(pool_size=4, timeout_s=30, retries=0, max_repls=3)
    result = make(root, ScriptedModel(sub), subcalls=settings, max_depth=3).run("c")
    assert result.outcome == "final"
    assert live["peak"] <= 3 and live["now"] == 0
    fallbacks = [e for e in result.events if e["event"] == "subcall" and e.get("fallback")]
    assert fallbacks and all("no REPL free" in e["fallback"] for e in fallbacks)
    assert "leaf" in result.answer

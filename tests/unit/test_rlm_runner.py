"""The RLM root loop, driven by scripted models (deterministic replies): every path of a run."""

from __future__ import annotations

import re
import socket
import threading

import pytest

from recallm.errors import RecallmError
from recallm.rlm import prompts
from recallm.rlm.budget import BudgetLimits
from recallm.rlm.models import ScriptedModel, make_model
from recallm.rlm.runner import RLM, RLMSettings
from recallm.rlm.sandbox import SandboxLimits
from recallm.rlm.subcalls import SubCallSettings
from recallm.rlm.trajectory import load_trajectory, root_conversation
from tests.rlm_helpers import LIMITS, events_of, isolation, make, repl, wait_for


def test_code_runs_variables_persist_and_the_root_never_sees_the_context():
    context = "a" * 5000 + " SECRET-MARKER-AT-THE-END"
    root = ScriptedModel([repl("n = context.count('a')"), repl("print(n * 2)"), "FINAL(done)"])
    result = make(root).run(context, "How many a?")
    assert (result.answer, result.outcome, result.turns) == ("done", "final", 3)
    turns = events_of(result, "turn")
    assert turns[0]["observation"].startswith("[block 1 output]\n(nothing printed)\n\n")
    assert turns[1]["observation"].startswith("[block 1 output]\n10000\n\n")
    assert turns[1]["observation"].endswith(prompts.turn_reminder("How many a?"))
    seen = [m["content"] for call in root.calls for m in call.messages]
    assert all("SECRET-MARKER" not in text for text in seen)  # metadata and a preview only
    assert "5,025 characters" in root.calls[0].messages[1]["content"]
    assert "The question to answer: How many a?" in root.calls[0].messages[1]["content"]


def test_final_var_written_after_code_is_read_after_the_code_ran():
    result = make([repl("result = 6 * 7", 'FINAL_VAR("result")')]).run("ctx")
    assert (result.answer, result.outcome, result.turns) == ("42", "final", 1)


def test_final_in_code_ends_the_message_and_later_blocks_do_not_run():
    reply = "```repl\nFINAL('from code')\n```\n```repl\nprint('never')\n```\nFINAL(from text)"
    result = make([reply]).run("ctx")
    assert (result.answer, result.outcome) == ("from code", "final")
    assert len(events_of(result, "turn")[0]["cells"]) == 1


def test_final_var_of_a_missing_variable_is_refused_and_the_run_goes_on():
    result = make(["FINAL_VAR(nope)", "FINAL('ok then')"]).run("ctx")
    assert (result.answer, result.turns) == ("ok then", 2)
    first = events_of(result, "turn")[0]
    assert first["final"] is None and "no variable named 'nope'" in first["notes"][0]
    assert "FINAL_VAR(nope) was not accepted" in first["observation"]


def test_final_is_refused_when_a_block_of_the_same_message_failed():
    result = make([repl("1 / 0", "FINAL(wrong)"), "FINAL(right)"]).run("ctx")
    assert result.answer == "right"
    observation = events_of(result, "turn")[0]["observation"]
    assert "ZeroDivisionError" in observation and "FINAL(...) was not accepted" in observation


def test_plain_text_is_nudged_then_taken_as_the_answer():
    result = make(["I believe it is 7.", "It is 7."], plain_text_retries=1).run("ctx")
    assert (result.answer, result.outcome, result.turns) == ("It is 7.", "plain_text", 2)
    assert events_of(result, "turn")[0]["observation"].startswith(prompts.NO_CODE_NUDGE)
    again = make(["<think>hmm</think>Seven."], plain_text_retries=0).run("ctx")
    assert (again.answer, again.outcome) == ("Seven.", "plain_text")  # reasoning is not the answer


def test_cell_errors_and_timeouts_are_observations_not_crashes():
    root = ScriptedModel([repl("def f(:"), repl("while True:\n    pass"), repl("x = 1"), "FINAL(survived)"])
    result = make(root).run("ctx")
    assert (result.answer, result.outcome) == ("survived", "final")
    observations = [m["content"] for m in root.calls[-1].messages if m["role"] == "user"][1:]
    assert "SyntaxError" in observations[0]
    assert "TimeoutError: the cell ran longer than its wall-clock limit of 1s" in observations[1]


def test_iteration_limit_returns_the_stored_answer_when_the_final_call_gives_none():
    root = ScriptedModel([repl("answer = 'partial'")])  # the final call writes code again: no answer
    result = make(root, max_iterations=3).run("ctx")
    assert (result.outcome, result.answer, result.turns) == ("max_iterations", "partial", 3)
    assert "returning the stored answer (variable 'answer')" in result.reason
    assert prompts.FINAL_ANSWER_REQUEST in root.calls[-1].messages[-1]["content"]
    assert prompts.FINAL_ANSWER_REQUEST not in root.calls[-2].messages[-1]["content"]
    empty = make([repl("x = 1")], max_iterations=2).run("ctx")
    assert empty.answer is None and "no stored answer" in empty.reason


def test_batched_sub_calls_overlap_in_time_and_respect_the_pool():
    together = threading.Barrier(8, timeout=60)  # opens only when all eight calls are in flight at once

    def upper(messages):
        together.wait()
        return messages[-1]["content"].upper()

    sub = ScriptedModel(upper, latency_s=0.3)
    code = "out = llm_query_batched(['p%d' % i for i in range(8)])\nprint(out)"
    result = make([repl(code, "FINAL_VAR(out)")], sub).run("ctx")
    assert result.answer == str([f"P{i}" for i in range(8)])  # every call passed the barrier: not one after another
    assert not together.broken and len(sub.calls) == 8
    assert max(c.start for c in sub.calls) < min(c.end for c in sub.calls)  # all eight in flight together
    subcalls = events_of(result, "subcall")
    assert sorted(e["index"] for e in subcalls) == list(range(8))
    assert all(e["latency_s"] >= 0.3 and e["completion_tokens"] >= 1 and e["attempts"] == 1 for e in subcalls)

    narrow = ScriptedModel(lambda m: "x", latency_s=0.2)
    make([repl(code, "FINAL_VAR(out)")], narrow, subcalls=SubCallSettings(pool_size=2, retries=0)).run("ctx")
    edges = sorted([(c.start, 1) for c in narrow.calls] + [(c.end, -1) for c in narrow.calls])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    assert peak == 2

    serial = ScriptedModel(lambda m: "x", latency_s=0.1)
    make([repl("out = [llm_query(p) for p in 'abcd']", "FINAL_VAR(out)")], serial).run("ctx")
    calls = sorted(serial.calls, key=lambda c: c.start)
    assert all(b.start >= a.end for a, b in zip(calls, calls[1:], strict=False))  # one after another


def test_depth_0_is_the_repl_alone():
    sub = ScriptedModel(["never"])
    root = ScriptedModel([repl("llm_query('hi')"), "FINAL(none)"])
    result = make(root, sub, max_depth=0).run("ctx")
    assert not sub.calls
    assert "llm_query is not available in this REPL" in events_of(result, "turn")[0]["observation"]
    assert "No model sub-calls are available" in root.calls[0].messages[0]["content"]


def test_depth_1_rlm_query_falls_back_to_a_plain_sub_call():
    sub = ScriptedModel(lambda m: "saw: " + m[-1]["content"])
    result = make([repl("r = rlm_query('CHUNK', 'what?')", "FINAL_VAR(r)")], sub, max_depth=1).run("ctx")
    assert result.answer == "saw: CHUNK\n\nwhat?"
    assert [e["rlm"] for e in result.events if e["event"] == "start"] == ["0"]


def _recursive_sub(messages):
    """Child roots (a system prompt) recurse once more; plain prompts get a leaf answer."""
    if messages[0]["role"] == "system":
        return repl("r = rlm_query(context + '>', 'deeper?')", "FINAL_VAR(r)")
    return "leaf(" + messages[-1]["content"].split("\n")[0] + ")"


@pytest.mark.parametrize("depth, instances", [(2, ["0", "0.1"]), (3, ["0", "0.1", "0.1.1"])])
def test_deeper_levels_recurse_then_fall_back(depth, instances):
    root = ScriptedModel([repl("r = rlm_query('C', 'q?')", "FINAL_VAR(r)")])
    result = make(root, ScriptedModel(_recursive_sub), max_depth=depth).run("ctx")
    starts = [e for e in result.events if e["event"] == "start"]
    assert [e["rlm"] for e in starts] == instances
    assert [e["depth"] for e in starts] == list(range(depth))
    assert result.answer == "leaf(C" + ">" * (depth - 1) + ")"
    children = [e for e in result.events if e["event"] == "subcall" and e.get("child")]
    assert [e["child"] for e in children] == instances[1:][::-1]  # innermost finishes first
    deepest = [e for e in result.events if e["event"] == "start"][-1]
    assert "at this depth they ask a plain model" in deepest["messages"][0]["content"]


def test_transient_sub_call_errors_are_retried_and_timeouts_enforced():
    attempts = []

    def flaky(messages):
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("connection reset")
        return "finally"

    fast_retries = SubCallSettings(pool_size=4, timeout_s=5, retries=2, backoff_s=0.01)
    result = make([repl("r = llm_query('x')", "FINAL_VAR(r)")], ScriptedModel(flaky), subcalls=fast_retries).run("c")
    assert result.answer == "finally" and events_of(result, "subcall")[0]["attempts"] == 3

    slow = ScriptedModel(["late"], latency_s=60.0)  # it would answer after a minute (a hang guard)
    timeouts = SubCallSettings(pool_size=4, timeout_s=0.2, retries=1, backoff_s=0.01)
    result = make([repl("r = llm_query_batched(['x'])\nprint(r)"), "FINAL(x)"], slow, subcalls=timeouts).run("c")
    # the run never waited for the slow answer: both attempts were cancelled at their timeout
    wait_for(lambda: slow.cancelled == 2, "both timed-out attempts cancelled")
    assert slow.started == 2 and not slow.calls
    record = events_of(result, "subcall")[0]
    assert record["attempts"] == 2 and "no answer within 0.2s" in record["error"]
    assert "[llm_query error: failed after 2 attempt(s): TimeoutError" in events_of(result, "turn")[0]["observation"]


def test_a_prompt_longer_than_the_sub_model_reads_is_refused():
    settings = SubCallSettings(max_prompt_chars=10, retries=0)
    sub = ScriptedModel(["unused"])
    result = make([repl("llm_query('x' * 11)"), "FINAL(x)"], sub, subcalls=settings).run("c")
    assert not sub.calls
    assert "11 characters, more than the sub-model reads (10); split it" in events_of(result, "turn")[0]["observation"]


def test_the_sub_call_cap_refuses_sub_calls_and_the_root_answers_with_what_it_has():
    code1 = "llm_query_batched(['a'] * 5)"
    code2 = "answer = [llm_query('a') for _ in range(3)]"
    code3 = "more = llm_query('one too many')"
    budget = BudgetLimits(max_tokens=None, max_subcalls=3, max_wall_s=None)
    sub = ScriptedModel(["a-answer"])
    result = make([repl(code1), repl(code2), repl(code3), "FINAL_VAR(answer)"], sub, budget=budget).run("c")
    assert result.outcome == "final" and result.turns == 4 and len(sub.calls) == 3
    assert result.answer == str(["a-answer"] * 3)
    first = events_of(result, "turn")[0]["observation"]
    assert "BudgetExhausted: budget exhausted: 0 sub-calls made, 5 more asked" in first  # refused whole
    third = events_of(result, "turn")[2]["observation"]
    assert "3 sub-calls made, 1 more asked, max_subcalls=3" in third
    assert result.usage["subcalls"] == 3 and result.usage["exhausted"] is None


def test_token_budget_ends_the_run():
    budget = BudgetLimits(max_tokens=400, max_subcalls=None, max_wall_s=None)
    result = make([repl("answer = 'kept'"), repl("x = 2"), "FINAL(unreached)"], budget=budget).run("c")
    assert result.outcome == "budget_exhausted" and result.answer == "kept"
    assert "max_tokens=400" in result.reason and result.turns == 1  # the system prompt alone is ~600 tokens


def test_wall_budget_ends_a_run_that_would_hang():
    budget = BudgetLimits(max_tokens=None, max_subcalls=None, max_wall_s=1.5)
    slow_cells = SandboxLimits(cpu_s=60, wall_s=30, memory_mb=512, kill_grace_s=0.5)
    result = make([repl("answer = 'early'\nwhile True:\n    pass")], budget=budget, limits=slow_cells).run("c")
    # the cell was stopped at the task's remaining wall time (at most 1.5 s), not at its own 30 s
    cell = events_of(result, "turn")[0]["cells"][0]
    limit = re.search(r"(?:wall-clock limit of |wall-clock budget \()([0-9.]+)s", cell["error"])
    assert cell["timed_out"] and limit and float(limit.group(1)) <= 1.5, cell["error"]
    assert (result.outcome, result.answer) == ("budget_exhausted", "early")
    assert "max_wall_s=1.5s" in result.reason

    stuck_root = ScriptedModel(["FINAL(too late)"], latency_s=30)
    result = make(stuck_root, budget=BudgetLimits(max_wall_s=1.0)).run("c")
    assert result.outcome == "budget_exhausted" and result.answer is None
    # the root's call was cancelled when the wall budget ran out: it never answered
    wait_for(lambda: stuck_root.cancelled == 1, "the stuck root call cancelled")
    assert stuck_root.started == 1 and not stuck_root.calls


def test_a_failing_or_unreachable_root_backend_is_a_clear_outcome():
    def down(messages):
        raise RecallmError("backend endpoint http://127.0.0.1:9/v1 is not reachable (ConnectError); is it running?")

    result = make(ScriptedModel(down)).run("c")
    assert result.outcome == "error" and result.answer is None
    assert result.reason == "root model failed: backend endpoint http://127.0.0.1:9/v1 is not reachable " \
        "(ConnectError); is it running?"  # fmt: skip

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = {"name": "openai", "served_model": "m", "base_url": f"http://127.0.0.1:{port}/v1", "api_key_env": None}
    with pytest.raises(RecallmError, match=f"endpoint http://127.0.0.1:{port}/v1 is not reachable"):
        make_model({**cfg, "timeout": 2, "retries": 0}, "root")
    with pytest.raises(RecallmError, match="root.served_model is required"):
        make_model({"name": "openai"}, "root")
    with pytest.raises(RecallmError, match="root has unknown keys \\['temprature'\\]"):
        make_model({"name": "scripted", "replies": ["x"], "temprature": 0}, "root")


def test_the_trajectory_file_replays_what_the_root_read(tmp_path):
    root = ScriptedModel([repl("xs = llm_query_batched(['a', 'b'])\nprint(xs)"), repl("y = 1"), "FINAL(end)"])
    sub = ScriptedModel(lambda m: "ok")
    path = tmp_path / "t.jsonl"
    result = make(root, sub).run("the context", "q?", task_id="task-1", trajectory=path)
    events = load_trajectory(path)
    assert events == result.events and result.trajectory == str(path)
    assert [e["event"] for e in events] == ["start", "subcall", "subcall", "turn", "turn", "turn", "end"]
    assert events[0]["task_id"] == "task-1" and events[0]["context"]["chars"] == 11
    assert "isolation" in events[0] and events[0]["settings"]["rlm"]["max_depth"] == 1
    assert events[-1]["usage"]["subcalls"] == 2 and events[-1]["outcome"] == "final"
    replayed = root_conversation(events)
    assert [msgs for msgs, _ in replayed] == [list(c.messages) for c in root.calls]


def test_settings_are_checked():
    with pytest.raises(RecallmError, match=r"rlm.max_depth must be in \[0, 3\], got 4"):
        RLMSettings.from_mapping({"max_depth": 4})
    with pytest.raises(RecallmError, match="rlm has unknown keys \\['depth'\\]"):
        RLMSettings.from_mapping({"depth": 1})
    with pytest.raises(RecallmError, match="answer_var must be a Python identifier"):
        RLMSettings.from_mapping({"answer_var": "my answer"})
    with pytest.raises(RecallmError, match="subcalls.pool_size must be > 0"):
        SubCallSettings.from_mapping({"pool_size": 0})
    with pytest.raises(RecallmError, match="budget.max_tokens must be positive"):
        BudgetLimits.from_mapping({"max_tokens": -5})
    assert BudgetLimits.from_mapping({"max_wall_s": None}).max_wall_s is None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("done.\nFINAL(42)", ("FINAL", "42")),
        ('FINAL("a (nested) answer")', ("FINAL", "a (nested) answer")),
        ("FINAL(f(x) = 3)\n", ("FINAL", "f(x) = 3")),
        ("FINAL_VAR(result)", ("FINAL_VAR", "result")),
        ("FINAL_VAR('result')", ("FINAL_VAR", "result")),
        ("I will call FINAL(x) later", None),  # not at the start of a line: a plan, not an answer
        ("FINAL(first)\nFINAL(second)", ("FINAL", "second")),
    ],
)
def test_final_parsing(text, expected):
    found = prompts.find_final(text)
    assert (None if found is None else (found.kind, found.value)) == expected


def test_code_extraction_and_truncation():
    reply = "a\n```python\nx = 1\n```\nb\n```json\n{}\n```\n```\ny = 2\n```\n```repl\n\n```"
    blocks, outside = prompts.extract_code(reply)
    assert blocks == ["x = 1\n", "y = 2\n"] and "```json" in outside and "x = 1" not in outside
    assert prompts.truncate("abcdef", 3) == "abc\n[... output cut: 3 more characters not shown; print less ...]"
    assert prompts.truncate("abc", 3, total=10).endswith("7 more characters not shown; print less ...]")
    assert prompts.visible_text("x</think>\n<|start_recall|>copied<|end_recall|> rest") == "copied rest"


def test_batched_recursive_queries_start_concurrent_children_and_fall_back_at_the_limit():
    def sub(messages):
        if messages[0]["role"] == "system":  # a child RLM's root: answers with its own context
            return "```repl\nimport time\ntime.sleep(0.3)\nseen = 'child saw ' + context\n```\nFINAL_VAR(seen)"
        return "plain: " + messages[-1]["content"]

    code = "rs = rlm_query_batched(['one', 'two', 'three'], 'what?')\nprint(rs)"
    result = make([repl(code, "FINAL_VAR(rs)")], ScriptedModel(sub), max_depth=2).run("ctx")
    assert result.answer == str(["child saw one", "child saw two", "child saw three"])
    children = [e for e in result.events if e["event"] in ("start", "end") and e["rlm"] != "0"]
    assert sorted(e["rlm"] for e in children if e["event"] == "start") == ["0.1", "0.2", "0.3"]
    assert [e["event"] for e in children][:3] == ["start"] * 3  # all three started before any ended
    flat = make([repl(code, "FINAL_VAR(rs)")], ScriptedModel(sub), max_depth=1).run("ctx")
    assert flat.answer == str([f"plain: {c}\n\nwhat?" for c in ("one", "two", "three")])


def test_an_openai_compatible_root_with_its_key_from_the_environment(monkeypatch):
    from tests.openai_stub import OpenAIStub

    def respond(path, body):
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        content = ["```repl\nanswer = len(context)\n```", "FINAL_VAR(answer)"][min(turn, 1)]
        return {"choices": [{"message": {"content": content}, "finish_reason": "stop"}],
                "usage": {"completion_tokens": 7}}  # fmt: skip

    stub = OpenAIStub(respond, models=())
    try:
        monkeypatch.setenv("RLM_TEST_KEY", "sk-test-123")
        cfg = {
            "name": "openai",
            "served_model": "stub",
            "base_url": stub.url,
            "api_key_env": "RLM_TEST_KEY",
            "timeout": 10,
            "retries": 0,
            "max_new_tokens": 64,
        }
        root = make_model(cfg, "root")
        result = RLM(root, settings=RLMSettings(max_iterations=3, isolation=isolation()), sandbox=LIMITS).run("twelve chars")
        assert (result.answer, result.outcome, result.turns) == ("12", "final", 2)
        seen = [(call["auth"], call["body"]) for call in stub.calls if call["method"] == "POST"]
        assert [auth for auth, _ in seen] == ["Bearer sk-test-123"] * 2
        assert seen[0][1]["model"] == "stub" and seen[0][1]["messages"][0]["role"] == "system"
        assert result.events[-2]["completion_tokens"] == 7
        root.close()
    finally:
        stub.close()


def test_a_reply_cut_off_at_the_token_limit_is_not_an_answer():
    long_thought = "<think>\n" + "hmm " * 400  # never closes: the whole reply is reasoning, cut at the cap
    root = ScriptedModel([long_thought, "", "FINAL(acted)"])
    result = make(root, root_max_new_tokens=50, plain_text_retries=0).run("ctx")
    assert (result.answer, result.outcome, result.turns) == ("acted", "final", 3)
    turns = events_of(result, "turn")
    assert turns[0]["finish_reason"] == "length" and turns[0]["observation"].startswith(prompts.CUT_OFF_NUDGE)
    assert turns[1]["observation"].startswith(prompts.NO_CODE_NUDGE)  # an empty reply


# --- issue 17, item 6: one reading of FINAL and of code fences -----------------------------------


def test_a_final_cut_off_at_the_token_limit_is_not_the_answer():
    """Before: ``FINAL(`` cut off mid-answer at the token limit was accepted."""
    root = ScriptedModel(["FINAL(" + "the answer is a long sentence that goes on " * 20, "FINAL(short)"])
    result = make(root, root_max_new_tokens=40).run("ctx")
    assert (result.answer, result.outcome, result.turns) == ("short", "final", 2)
    first = events_of(result, "turn")[0]
    assert first["finish_reason"] == "length" and "cut off" in first["observation"]


def test_final_var_in_code_returns_the_variable_it_names():
    """Before: FINAL_VAR(x) with x == 'total' returned the variable `total` instead of x."""
    result = make([repl("total = 5\nx = 'total'\nFINAL_VAR(x)")]).run("ctx")
    assert result.answer == "total"
    result = make([repl("total = 5\nFINAL_VAR('total')")]).run("ctx")
    assert result.answer == "5"


def test_a_final_in_code_followed_by_an_error_is_refused_like_a_written_one():
    """Before: FINAL called in code was accepted although the cell then raised."""
    result = make([repl("FINAL('too early')\n1 / 0"), "FINAL(right)"]).run("ctx")
    assert (result.answer, result.turns) == ("right", 2)
    assert "FINAL(...) was not accepted" in events_of(result, "turn")[0]["observation"]


@pytest.mark.parametrize(
    "code, value",
    [
        ("s = 'a```b'\nprint(len(s))\n", "a```b"),
        ('s = """\n```\n"""\nprint(len(s))\n', "\n```\n"),
        ("s = 'x'  # ``` in a comment\n", "x"),
    ],
)
def test_a_fence_inside_a_string_or_comment_does_not_end_the_block(code, value):
    """Before: the block ended at the first ``` wherever it was (here: inside a string)."""
    reply = f"```repl\n{code}```\nFINAL_VAR(s)"
    assert prompts.extract_code(reply)[0] == [code]
    result = make([reply]).run("ctx")
    assert (result.outcome, result.answer) == ("final", value)


# --- issue 17, item 9: the paper's prompts ---------------------------------------------------------


def test_prompts_follow_the_paper():
    assert (RLMSettings().max_iterations, RLMSettings().max_observation_chars) == (20, 20_000)
    root = ScriptedModel([repl("print(len(context))"), repl("x = 1"), "FINAL(7)"])
    make(root, max_iterations=5).run("some context", "How many widgets?")
    system = root.calls[0].messages[0]["content"]
    assert system.count("```repl") >= 3  # worked decomposition examples
    assert "llm_query_batched(" in system and "FINAL(" in system and "not inside code" in system
    first_user = root.calls[0].messages[1]["content"]
    assert "have not looked at `context` yet" in first_user  # the first-turn safeguard
    for call in root.calls[1:]:  # every later turn repeats the query
        assert "How many widgets?" in call.messages[-1]["content"]


def test_at_the_iteration_limit_one_last_call_asks_for_the_answer():
    """Before: a run that reached the limit returned nothing unless `answer` was set."""
    root = ScriptedModel([repl("x = 1"), repl("x = 2"), "I think it is FINAL(forced)"])
    result = make(root, max_iterations=2).run("ctx", "q?")
    assert (result.outcome, result.answer, result.turns) == ("max_iterations", "forced", 2)
    assert len(root.calls) == 3 and prompts.FINAL_ANSWER_REQUEST in root.calls[-1].messages[-1]["content"]
    plain = ScriptedModel([repl("x = 1"), "It is seven."])
    result = make(plain, max_iterations=1).run("ctx", "q?")
    assert (result.outcome, result.answer) == ("max_iterations", "It is seven.")

"""recallm-annotate: teacher traces -> <recall> rewrites -> aligned spans -> SFT JSONL and a report.

Teacher and annotator are a stub OpenAI-compatible server on 127.0.0.1 (or a plain function)
answering with canned text built from each row (``tests/annotate_fixtures.py``): a quote copied
exactly, one misspelled within the fuzzy bound, one beyond it, one that is nowhere in the prompt,
a wrong answer... The command line itself: tests/integration/test_data_annotate_cli.py.
"""

from __future__ import annotations

import json
import logging
import random
import re
import socket

import pytest

from data_gen.annotate import (
    REASONS,
    AnnotateSettings,
    ChatClient,
    ChatError,
    Checks,
    EndpointConfig,
    align_span,
    annotate_from_config,
    reasoning_similarity,
    run_annotation,
    split_trace,
)
from recallm.errors import RecallmError
from tests import annotate_fixtures
from tests.annotate_fixtures import KEY_ENV, SECRET, annotated, check_examples, read_jsonl, teacher_trace

# the shared fixtures (tests/annotate_fixtures.py), named here for pytest
parquet, rows, stub_factory, tokenizer = (
    annotate_fixtures.parquet,
    annotate_fixtures.rows,
    annotate_fixtures.stub_factory,
    annotate_fixtures.tokenizer,
)


def _endpoint(url, model, **kw):
    return EndpointConfig.from_mapping(
        {"base_url": url, "model": model, "api_key_env": KEY_ENV, "retries": 3, "backoff": 0.01, **kw}, model
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- units


def test_split_trace():
    assert split_trace("a\nb\nAnswer: 42") == ("a\nb", "42")
    assert split_trace("<think>\nsteps\n</think>\n\nThe result.\n**Answer:** 7") == ("steps", "7")
    assert split_trace("first answer: 1, no wait\nthen\nFinal answer: 2\n") == ("first answer: 1, no wait\nthen", "2")
    assert split_trace("no marker at all") == ("no marker at all", None)
    assert split_trace("reasoning\nAnswer:") == ("reasoning", None)
    assert reasoning_similarity("a b c d", "a <recall>b c</recall> d") == 1.0
    assert reasoning_similarity("a b c d", "w x y z") == 0.0


def test_align_span_exact_gold_first_and_fuzzy_bounds():
    prompt = "header\nalpha beta gamma\nfiller text here\nalpha beta gamma\nkey 31337: value-abcdef\nend"
    second = prompt.rindex("alpha")
    gold = [{"text": "alpha beta gamma", "start": second, "end": second + 16}]
    # an exact quote occurring twice: the occurrence in the gold passage wins
    found = align_span("alpha beta gamma", prompt, gold)
    assert (found.start, found.end, found.dist, found.in_gold) == (second, second + 16, 0, True)
    assert align_span("alpha beta gamma", prompt, []).start == prompt.index("alpha")
    # edge whitespace is not part of the span
    assert prompt[slice(*_se(align_span("  filler text here\n", prompt)))] == "filler text here"
    # fuzzy: one edit in 22 characters is within a 0.1 ratio; four are not
    checks = Checks(fuzzy_ratio=0.1, fuzzy_min_dist=1)
    near = align_span("key 31337: value-abXdef", prompt, [], max_dist=checks.max_dist)
    assert near is not None and near.dist == 1 and prompt[near.start : near.end] == "key 31337: value-abcdef"
    assert align_span("key 31337: vXlXe-XbXdef", prompt, [], max_dist=checks.max_dist) is None
    assert align_span("key 31337: vXlXe-XbXdef", prompt, [], max_dist=4) is not None
    assert align_span("nowhere to be seen", prompt, [], max_dist=checks.max_dist) is None
    assert align_span("  ", prompt) is None and align_span("x", "abc", max_dist=5) is None
    assert checks.max_dist(5) == 1 and checks.max_dist(40) == 4 and Checks(fuzzy_min_dist=0).max_dist(5) == 0


def _se(alignment):
    return alignment.start, alignment.end


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"min_similarity": 1.5}, r"checks.min_similarity must be in \[0.0, 1.0\]"),
        ({"min_answer_score": -0.1}, r"checks.min_answer_score"),
        ({"fuzzy_ratio": 1.0}, r"checks.fuzzy_ratio must be in \[0.0, 1.0\)"),
        ({"max_span_tokens": 0}, r"max_span_tokens must be >= 1"),
    ],
)
def test_checks_out_of_range(kwargs, pattern):
    with pytest.raises(RecallmError, match=pattern):
        Checks(**kwargs)


# --------------------------------------------------------------------------- pipelines

FILE_PLAN = ["exact", "fuzzy", "far", "hopeless", "wrong", "noanswer", "changed", "nospan"]


def test_file_teacher_pipeline(rows, tokenizer, tmp_path):
    """Teacher traces from a list (as read from a file); the annotator is a plain function."""
    traces = [(i, teacher_trace(rows[i], kind)) for i, kind in enumerate(FILE_PLAN)]
    calls = []

    def annotator(messages):
        index = next(i for i, r in enumerate(rows) if r.question in messages[1]["content"])
        calls.append(index)
        assert messages[0]["role"] == "system" and "<recall>" in messages[0]["content"]
        assert rows[index].gold[0]["text"] in messages[1]["content"]  # the context goes to the annotator
        return annotated(rows[index], FILE_PLAN[index])

    report = run_annotation(rows, tokenizer, annotator=annotator, traces=traces, output_dir=tmp_path, val_fraction=0.5)
    assert sorted(calls) == [0, 1, 2, 3, 6, 7]  # no annotator call for a wrong or missing answer
    assert report["traces"] == 8 and report["kept"] == 2 and report["dropped"] == 6
    assert report["dropped_by_reason"] == {r: 0 for r in REASONS} | {
        "unaligned_span": 2,
        "wrong_answer": 1,
        "no_answer": 1,
        "rewrite_changed": 1,
        "no_span": 1,
    }
    assert report["by_category"]["retrieval"]["kept"] == 2
    assert report["spans"] == {"total": 2, "exact": 1, "fuzzy": 1, "in_gold": 2, "per_kept_trace": 1.0}
    assert report["splits"] == {"train": 1, "val": 1}
    records = read_jsonl(tmp_path / "train.jsonl") + read_jsonl(tmp_path / "val.jsonl")
    check_examples(records, tokenizer, rows)
    by_prompt = {r.prompt_text: r for r in rows}
    for rec in records:  # the fuzzy quote's span is the gold line itself, not the misspelling
        copied = tokenizer.decode(rec["prompt_ids"][slice(*rec["spans"][0])])
        assert by_prompt[rec["prompt_text"]].gold[0]["text"] in copied
        assert "#" not in rec["completion"]
    outcomes = read_jsonl(tmp_path / "traces.jsonl")
    assert [o["reason"] for o in outcomes] == [
        None,
        None,
        "unaligned_span",
        "unaligned_span",
        "wrong_answer",
        "no_answer",
        "rewrite_changed",
        "no_span",
    ]
    assert json.loads((tmp_path / "report.json").read_text())["kept"] == 2


def test_bad_tags_annotator_failure_and_long_spans(rows, tokenizer, tmp_path):
    value = {i: rows[i].answers[0] for i in range(3)}

    def annotator(messages):
        index = next(i for i, r in enumerate(rows) if r.question in messages[1]["content"])
        if index == 0:
            return f"Unpaired <recall>{rows[0].gold[0]['text']} here.\nAnswer: {value[0]}"
        if index == 1:
            raise ChatError("gave up after 5 attempt(s): HTTP 503")
        return "```\n" + annotated(rows[index], "exact") + "\n```"  # fences are removed

    traces = [(i, teacher_trace(rows[i], "ok")) for i in range(3)] + [(2, teacher_trace(rows[2], "ok"))]
    report = run_annotation(
        rows, tokenizer, annotator=annotator, traces=traces, output_dir=tmp_path, checks=Checks(max_span_tokens=2)
    )
    assert report["dropped_by_reason"]["bad_tags"] == 1 and report["dropped_by_reason"]["annotator_error"] == 1
    assert report["dropped_by_reason"]["span_too_long"] == 2 and report["kept"] == 0
    assert [(o["index"], o["sample"]) for o in read_jsonl(tmp_path / "traces.jsonl")] == [
        (0, 0),
        (1, 0),
        (2, 0),
        (2, 1),
    ]
    report = run_annotation(rows, tokenizer, annotator=annotator, traces=traces[2:], output_dir=tmp_path)
    assert report["kept"] == 2 and report["rows_with_traces"] == 1


def test_http_teacher_and_annotator_with_retries(rows, tokenizer, tmp_path, stub_factory, monkeypatch, caplog):
    monkeypatch.setenv(KEY_ENV, SECRET)
    plan = {0: ("ok", "exact"), 1: ("ok", "fuzzy"), 2: ("ok", "hopeless"), 3: ("wrong", "exact")}
    stub = stub_factory(rows[:4], plan, fail_first=1, reasoning_rows=[0])
    caplog.set_level(logging.DEBUG)
    teacher = ChatClient(_endpoint(stub.url, "teacher-m", temperature=0.7, concurrency=2), "teacher")
    annotator = ChatClient(_endpoint(stub.url, "annotator-m"), "annotator")
    with teacher, annotator:
        teacher.ping()
        report = run_annotation(
            rows[:4], tokenizer, annotator=annotator, teacher=teacher, output_dir=tmp_path, val_fraction=0.0, workers=4
        )
    posts = [r for r in stub.calls if r["method"] == "POST"]
    assert len(posts) == 4 + 3 + 1  # 4 teacher calls, 3 annotator calls, 1 retry after the first 500
    assert {r["path"] for r in posts} == {"/v1/chat/completions"}
    assert all(r["auth"] == f"Bearer {SECRET}" for r in stub.calls)  # the key is sent...
    assert {r["body"]["temperature"] for r in posts if r["body"]["model"] == "teacher-m"} == {0.7}
    teacher_body = next(r["body"] for r in posts if r["body"]["model"] == "teacher-m")
    assert "Answer: <answer>" in teacher_body["messages"][-1]["content"]
    assert report["kept"] == 2 and report["dropped_by_reason"]["unaligned_span"] == 1
    assert report["dropped_by_reason"]["wrong_answer"] == 1 and report["dropped_by_reason"]["teacher_error"] == 0
    assert report["splits"] == {"train": 2, "val": 0}
    check_examples(read_jsonl(tmp_path / "train.jsonl"), tokenizer, rows)
    written = "".join(p.read_text() for p in tmp_path.iterdir())
    assert SECRET not in written and SECRET not in caplog.text  # ...but never logged nor written
    assert "retry 1/3" in caplog.text


def test_chat_client_failures(stub_factory, rows, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)  # no key: fine for a local server
    messages = [{"role": "user", "content": rows[0].question}]
    stub = stub_factory(rows, {}, status=503)
    with ChatClient(_endpoint(stub.url, "teacher-m", retries=2), "teacher", sleep=lambda s: None) as client:
        with pytest.raises(ChatError, match=r"gave up after 3 attempt\(s\): HTTP 503"):
            client.complete(messages)
    assert len(stub.calls) == 3 and stub.calls[0]["auth"] is None
    for status, error, pattern in [
        (400, ChatError, r"HTTP 400"),
        (401, RecallmError, rf"refused the request \(HTTP 401\): check the key in \${KEY_ENV}"),
        (404, RecallmError, r"HTTP 404 .*check teacher.base_url"),
    ]:
        stub.status = status
        with ChatClient(_endpoint(stub.url, "teacher-m"), "teacher") as client, pytest.raises(error, match=pattern):
            client.complete(messages)
    down = f"http://127.0.0.1:{_free_port()}/v1"
    with ChatClient(_endpoint(down, "teacher-m"), "teacher") as client:
        with pytest.raises(RecallmError, match=rf"teacher endpoint {re.escape(down)} is not reachable"):
            client.ping()


# --------------------------------------------------------------------------- config and CLI


def _config(parquet, model, out, url, **over):
    cfg = {
        "input": str(parquet),
        "tokenizer": str(model),
        "output_dir": str(out),
        "val_fraction": 0.25,
        "teacher": {"base_url": url, "model": "teacher-m", "api_key_env": KEY_ENV, "backoff": 0.01},
        "annotator": {"base_url": url, "model": "annotator-m", "api_key_env": KEY_ENV, "backoff": 0.01},
        "checks": {},
    }
    for key, value in over.items():
        section, _, name = key.rpartition(".")
        (cfg[section] if section else cfg)[name] = value
    return cfg


@pytest.mark.parametrize(
    "over, pattern",
    [
        ({"input": "/nonexistent/rows.parquet"}, r"input file /nonexistent/rows.parquet does not exist"),
        ({"teacher.base_url": "ftp://example.org"}, r"teacher.base_url must be an http\(s\) URL"),
        ({"annotator.base_url": "not a url"}, r"annotator.base_url must be an http\(s\) URL"),
        ({"teacher.model": None}, r"teacher.model is required"),
        ({"checks.min_similarity": 2}, r"checks.min_similarity must be in"),
        ({"checks.fuzzy_ratio": -0.5}, r"checks.fuzzy_ratio must be in"),
        ({"val_fraction": 1.0}, r"val_fraction must be in"),
        ({"teacher.concurrency": 0}, r"teacher.concurrency must be >= 1"),
        ({"teacher.traces": "/nonexistent/traces.jsonl"}, r"teacher.traces file .* does not exist"),
        ({"teacher.base_url": "https://api.example.org/v1"}, rf"environment variable {KEY_ENV} is not set"),
    ],
)
def test_bad_config_fails_before_any_request(
    parquet, tiny_dir, tmp_path, stub_factory, rows, monkeypatch, over, pattern
):
    monkeypatch.delenv(KEY_ENV, raising=False)
    stub = stub_factory(rows, {})
    with pytest.raises(RecallmError, match=pattern):
        annotate_from_config(_config(parquet, tiny_dir, tmp_path / "out", stub.url, **over))
    assert stub.calls == []
    assert not (tmp_path / "out").exists()


def test_teacher_file_config_and_endpoint_down(parquet, tiny_dir, tmp_path, stub_factory, rows):
    traces = tmp_path / "traces.jsonl"
    traces.write_text(json.dumps({"index": 99, "trace": "x\nAnswer: y"}) + "\n")
    with pytest.raises(RecallmError, match=r"traces.jsonl:1: row index 99 is out of range \(the input has 8 rows\)"):
        annotate_from_config(
            _config(parquet, tiny_dir, tmp_path / "o", "http://127.0.0.1:9/v1", **{"teacher.traces": str(traces)})
        )
    down = f"http://127.0.0.1:{_free_port()}/v1"
    with pytest.raises(RecallmError, match=rf"annotator endpoint {re.escape(down)} is not reachable"):
        annotate_from_config(_config(parquet, tiny_dir, tmp_path / "o", down))
    # a teacher file: no teacher endpoint is needed or called
    lines = [{"index": 2, "trace": teacher_trace(rows[2], "ok")}, {"index": 5, "trace": teacher_trace(rows[5], "ok")}]
    lines.append({"index": 6, "trace": None, "reason": "teacher_error"})  # a failed call in an earlier traces.jsonl
    traces.write_text("".join(json.dumps(x) + "\n" for x in lines))
    stub = stub_factory(rows, {2: ("ok", "exact"), 5: ("ok", "fuzzy")})
    cfg = _config(parquet, tiny_dir, tmp_path / "o", stub.url, **{"teacher.traces": str(traces), "teacher.model": None})
    assert AnnotateSettings.from_config(cfg).teacher is None
    report = annotate_from_config(cfg)
    assert report["kept"] == 2 and report["rows"] == 8 and report["rows_with_traces"] == 2
    assert {r["body"]["model"] for r in stub.calls if r["method"] == "POST"} == {"annotator-m"}
    assert report["settings"]["teacher"] == f"file {traces}"


# --------------------------------------------------------------------------- the paper's annotator prompt and split


def test_annotator_prompt_follows_figs_7_and_8(rows, tokenizer):
    from data_gen.annotate import DEFAULT_ANNOTATOR_SYSTEM, Prompts, annotator_messages, row_instructions
    from data_gen.base import make_task
    from data_gen.fit import PromptRenderer, build_row

    row = rows[0]
    trace = "<think>\nreasoning\n</think>\n\nAnswer: x"
    system, user = annotator_messages(row, trace, Prompts())
    assert system["content"] == DEFAULT_ANNOTATOR_SYSTEM
    for rule in (  # Fig. 7: few long spans, re-recall, question and instructions, inside <think>, verbatim
        "whole supporting sentence or clause",
        "Recall again when reused",
        "The question and the instructions",
        "appear only inside <think>",
        "exact, contiguous copy",
        "Do not change the final answer",
    ):
        assert rule in system["content"], rule
    text, content = user["content"], row.messages[-1]["content"]
    assert row.instruction and content.startswith(row.instruction)  # recorded at generation
    assert f"QUESTION:\n{row.question}\n" in text and f"INSTRUCTIONS:\n{row.instruction}\n" in text
    assert f"GOLD DOCUMENTS:\n{row.gold[0]['text']}\n" in text
    assert "NEGATIVE DOCUMENTS (optional; may be empty):\n\n" in text  # left empty (App. C.2)
    assert text.endswith(f"REASONING TRACE:\n{trace}")
    assert len(text) < len(content)  # the question, instructions and gold only: not the whole dictionary
    _, user = annotator_messages(row, trace, Prompts(negative_documents=True))
    negatives = user["content"].split("NEGATIVE DOCUMENTS (optional; may be empty):\n")[1].split("REASONING TRACE")[0]
    assert negatives.strip() and row.gold[0]["text"] not in negatives
    # no segmented gold evidence (a vote list): the whole user message is the document
    task = make_task("majority_vote")
    votes = build_row(task, task.draft(random.Random(0)), PromptRenderer(tokenizer), 512, random.Random(0))
    _, user = annotator_messages(votes, trace, Prompts())
    assert f"GOLD DOCUMENTS:\n{votes.messages[-1]['content']}\n" in user["content"]
    # rows written before the instruction was recorded: the first paragraph of the user message
    old = type(row)(**{**row.__dict__, "instruction": ""})
    assert row_instructions(old) == row.instruction
    with pytest.raises(RecallmError, match=r"must contain \{trace\}"):
        Prompts(annotator_user="{question}")
    with pytest.raises(RecallmError, match="at least one of"):
        Prompts(annotator_user="{trace}")
    assert "{context}" in Prompts(annotator_user="{context} {trace}").annotator_user  # the old field still works


def test_sft_split_as_the_paper(rows, tokenizer, tmp_path):
    from data_gen.annotate import PAPER_VAL_FRACTION

    assert round(1795 * PAPER_VAL_FRACTION) == 195  # 1,600 train / 195 val (App. C.2)
    traces = [(i, teacher_trace(rows[i], "exact")) for i in range(4)]

    def annotator(messages):
        index = next(i for i, r in enumerate(rows) if r.question in messages[1]["content"])
        return annotated(rows[index], "exact")

    report = run_annotation(rows, tokenizer, annotator=annotator, traces=traces, output_dir=tmp_path, val_count=3)
    assert report["kept"] == 4 and report["splits"] == {"train": 1, "val": 3}
    settings = AnnotateSettings.from_config(
        {
            "input": str(tmp_path / "train.jsonl"),
            "tokenizer": str(tmp_path),
            "output_dir": str(tmp_path),
            "val_count": 195,
            "teacher": {"traces": str(tmp_path / "train.jsonl")},
            "annotator": {"model": "m", "base_url": "http://127.0.0.1:9/v1"},
        }
    )
    assert settings.val_count == 195 and settings.val_fraction == pytest.approx(PAPER_VAL_FRACTION)

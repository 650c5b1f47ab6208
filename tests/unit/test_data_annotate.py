"""recallm-annotate: teacher traces -> <recall> rewrites -> aligned spans -> SFT JSONL and a report.

Teacher and annotator are a stub OpenAI-compatible server on 127.0.0.1 (or a plain function)
answering with canned text built from each row: a quote copied exactly, one misspelled within
the fuzzy bound, one beyond it, one that is nowhere in the prompt, a wrong answer...
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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

KEY_ENV = "RECALLM_TEST_ANNOTATE_KEY"
SECRET = "sk-test-0123456789-do-not-leak"


# --------------------------------------------------------------------------- rows and canned text


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    from recallm.tokens import load_tokenizer

    return load_tokenizer(tiny_dir)


@pytest.fixture(scope="module")
def rows(tokenizer):
    from data_gen.base import make_task
    from data_gen.fit import PromptRenderer, build_row

    task, renderer, out = make_task("kv_retrieval"), PromptRenderer(tokenizer), []
    for seed in range(8):
        rng = random.Random(seed)
        out.append(build_row(task, task.draft(rng), renderer, 384, rng))
    assert len({r.question for r in out}) == len(out)
    return out


def _misspell(text: str, n: int) -> str:
    """``text`` with ``n`` characters of its end replaced by '#' (never in a KV prompt)."""
    chars = list(text)
    for k in range(n):
        chars[len(chars) - 2 - 2 * k] = "#"
    return "".join(chars)


def teacher_trace(row, kind: str) -> str:
    value = row.answers[0]
    answer = {"wrong": "zzzzzzzz", "noanswer": None}.get(kind, value)
    lines = [
        f"I need to answer this: {row.question}",
        f"Looking through the data, the entry for that key gives the value {value}.",
        f"So the value is {value}.",
    ]
    if answer is not None:
        lines.append(f"Answer: {answer}")
    return "\n".join(lines)


def annotated(row, kind: str) -> str:
    value, gold = row.answers[0], row.gold[0]["text"]
    limit = Checks().max_dist(len(gold))
    quote = {
        "exact": gold,
        "fuzzy": _misspell(gold, 1),
        "far": _misspell(gold, limit + 2),
        "hopeless": "the harbour lights were purple that evening",
    }.get(kind, gold)
    if kind == "nospan":
        return teacher_trace(row, kind)
    if kind == "changed":
        return f"Completely different reasoning: <recall>{gold}</recall> was chosen at random.\nAnswer: {value}"
    return (
        f"I need to answer this: {row.question}\n"
        f"Looking through the data, <recall>{quote}</recall> gives the value {value}.\n"
        f"So the value is {value}.\nAnswer: {value}"
    )


def check_examples(records, tokenizer, rows):
    """Every span of every kept example copies a contiguous run of its prompt's ids."""
    from recallm.tokens import RecallTokenIds

    ids = RecallTokenIds.from_tokenizer(tokenizer)
    texts = {r.prompt_text for r in rows}
    for rec in records:
        assert rec["source"] == "annotated" and rec["prompt_text"] in texts
        prompt, completion = rec["prompt_ids"], rec["completion_ids"]
        assert completion[-1] == tokenizer.eos_token_id
        starts = [i for i, t in enumerate(completion) if t == ids.start]
        assert len(starts) == len(rec["spans"]) >= 1
        for (i, j), s in zip(rec["spans"], starts, strict=True):
            e = completion.index(ids.end, s)
            copied = completion[s + 1 : e]
            assert copied == prompt[i:j]  # a contiguous sub-sequence of the prompt ids, at the recorded range
            assert tokenizer.decode(copied) in rec["prompt_text"]
        assert rec["completion"].endswith(f"</think>\nAnswer: {rec['answer']}{tokenizer.eos_token}")


def read_jsonl(path):
    return [json.loads(line) for line in open(path) if line.strip()]


# --------------------------------------------------------------------------- stub server


class Stub:
    """A stub OpenAI-compatible server: ``plan`` maps a row index to (teacher kind, annotator kind);
    ``fail_first`` answers the first N chat requests with HTTP 500."""

    def __init__(self, rows, plan, *, fail_first=0, status=None, reasoning_rows=()):
        self.rows, self.plan, self.fail_first, self.status = rows, plan, fail_first, status
        self.reasoning_rows = set(reasoning_rows)
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status, payload):
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                stub.record("GET", self.path, self.headers, None)
                self._send(200, {"data": [{"id": "teacher-m"}, {"id": "annotator-m"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                n = stub.record("POST", self.path, self.headers, body)
                if stub.status is not None:
                    return self._send(stub.status, {"error": {"message": "nope"}})
                if n <= stub.fail_first:
                    return self._send(500, {"error": {"message": "overloaded"}})
                self._send(200, stub.answer(body))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def record(self, method, path, headers, body) -> int:
        with self.lock:
            self.requests.append({"method": method, "path": path, "auth": headers.get("Authorization"), "body": body})
            return sum(r["method"] == "POST" for r in self.requests)

    def row_of(self, body) -> int:
        content = "\n".join(m["content"] for m in body["messages"])
        return next(i for i, r in enumerate(self.rows) if r.question in content)

    def answer(self, body) -> dict:
        index = self.row_of(body)
        teacher_kind, annotator_kind = self.plan[index]
        message = {"role": "assistant"}
        if body["model"] == "teacher-m":
            trace = teacher_trace(self.rows[index], teacher_kind)
            if index in self.reasoning_rows:  # vLLM's reasoning parser: thinking apart from the content
                reasoning, _, answer = trace.rpartition("\n")
                message.update(reasoning_content=reasoning, content=answer)
            else:
                message["content"] = trace
        else:
            message["content"] = annotated(self.rows[index], annotator_kind)
        return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub_factory():
    made = []

    def make(*args, **kwargs):
        made.append(Stub(*args, **kwargs))
        return made[-1]

    yield make
    for s in made:
        s.close()


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
    posts = [r for r in stub.requests if r["method"] == "POST"]
    assert len(posts) == 4 + 3 + 1  # 4 teacher calls, 3 annotator calls, 1 retry after the first 500
    assert {r["path"] for r in posts} == {"/v1/chat/completions"}
    assert all(r["auth"] == f"Bearer {SECRET}" for r in stub.requests)  # the key is sent...
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
    assert len(stub.requests) == 3 and stub.requests[0]["auth"] is None
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


@pytest.fixture(scope="module")
def parquet(rows, tmp_path_factory):
    from data_gen.io import row_record, write_parquet

    path = tmp_path_factory.mktemp("annotate-in") / "rows.parquet"
    write_parquet([row_record(r, i, "train") for i, r in enumerate(rows)], path)
    return path


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
    assert stub.requests == []
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
    assert {r["body"]["model"] for r in stub.requests if r["method"] == "POST"} == {"annotator-m"}
    assert report["settings"]["teacher"] == f"file {traces}"


def _cli(*args, cwd, env_extra=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "recallm.cli.annotate", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


def test_cli_end_to_end(parquet, tiny_dir, tmp_path, stub_factory, rows, tokenizer):
    plan = {i: ("ok", "exact") for i in range(6)} | {3: ("ok", "hopeless"), 6: ("wrong", "exact"), 7: ("ok", "fuzzy")}
    stub = stub_factory(rows, plan, fail_first=2)
    out = tmp_path / "out"
    proc = _cli(
        f"input={parquet}",
        f"tokenizer={tiny_dir}",
        f"output_dir={out}",
        f"teacher.base_url={stub.url}",
        "teacher.model=teacher-m",
        "annotator.model=annotator-m",
        f"teacher.api_key_env={KEY_ENV}",
        "teacher.backoff=0.01",
        "annotator.backoff=0.01",
        "val_fraction=0.2",
        "progress=false",
        cwd=tmp_path,
        env_extra={KEY_ENV: SECRET},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "kept 6, dropped 2" in proc.stdout and "unaligned_span" in proc.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["kept"] == 6 and report["dropped_by_reason"]["wrong_answer"] == 1
    assert report["splits"] == {"train": 5, "val": 1}
    assert report["settings"]["annotator"] == f"annotator-m @ {stub.url}"  # interpolated from teacher.base_url
    check_examples(read_jsonl(out / "train.jsonl") + read_jsonl(out / "val.jsonl"), tokenizer, rows)
    assert all(r["auth"] == f"Bearer {SECRET}" for r in stub.requests)
    everything = (
        proc.stdout
        + proc.stderr
        + "".join(p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".parquet")
    )
    assert SECRET not in everything


@pytest.mark.parametrize(
    "args, pattern",
    [
        (["output_dir={tmp}/o", "checks.min_similarity=1.5"], r"^error: checks.min_similarity must be in \[0.0, 1.0\]"),
        ([], r"^error: missing required config value\(s\): output_dir$"),
    ],
)
def test_cli_bad_config_is_one_line(parquet, tiny_dir, tmp_path, args, pattern):
    args = [a.format(tmp=tmp_path) for a in args]
    proc = _cli(f"input={parquet}", f"tokenizer={tiny_dir}", "teacher.model=t", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and re.search(pattern, lines[0]), proc.stderr
    assert "Traceback" not in proc.stderr


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

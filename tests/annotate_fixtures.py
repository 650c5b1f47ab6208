"""What the recallm-annotate tests share (tests/unit/test_data_annotate.py and
tests/integration/test_data_annotate_cli.py): KV rows on the tiny tokenizer, canned teacher
traces and annotator rewrites built from each row, the stub OpenAI-compatible server answering
as both, and the checks of the SFT examples written."""

from __future__ import annotations

import json
import random

import pytest

from data_gen.annotate import Checks
from tests.openai_stub import OpenAIStub, Raw

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


class Stub(OpenAIStub):
    """The shared stub server answering as teacher and annotator: ``plan`` maps a row index to
    (teacher kind, annotator kind); ``fail_first`` answers the first N chat requests with HTTP 500;
    every request (GETs too) is in ``calls``."""

    def __init__(self, rows, plan, *, fail_first=0, status=None, reasoning_rows=()):
        self.rows, self.plan, self.fail_first, self.status = rows, plan, fail_first, status
        self.reasoning_rows = set(reasoning_rows)
        super().__init__(self.respond, models=("teacher-m", "annotator-m"))

    def respond(self, path, body):
        n = self.post_index()
        if self.status is not None:
            return Raw(self.status, {"error": {"message": "nope"}})
        if n <= self.fail_first:
            return Raw(500, {"error": {"message": "overloaded"}})
        return self.answer(body)

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


@pytest.fixture
def stub_factory():
    made = []

    def make(*args, **kwargs):
        made.append(Stub(*args, **kwargs))
        return made[-1]

    yield make
    for s in made:
        s.close()


@pytest.fixture(scope="module")
def parquet(rows, tmp_path_factory):
    from data_gen.io import row_record, write_parquet

    path = tmp_path_factory.mktemp("annotate-in") / "rows.parquet"
    write_parquet([row_record(r, i, "train") for i, r in enumerate(rows)], path)
    return path

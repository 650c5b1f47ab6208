"""Annotated SFT traces (paper App. C.2): teacher traces rewritten with verbatim recall spans.

The pipeline, one trace at a time:

1. **Teacher trace.** Read from a JSONL file of ``{"index": <row position in the input parquet>,
   "trace": <text>}`` lines, or asked of any OpenAI-compatible endpoint (``POST
   {base_url}/chat/completions``, e.g. a vLLM server) with the row's chat messages and an
   instruction to end with ``Answer: <answer>``. A trace is reasoning (inside or outside a
   ``<think>`` block) followed by the final answer.
2. **Answer check.** The final answer is parsed (``rewards.parsing``) and scored with the row's
   answer metric (``rewards.score_response(...).answer``); a trace without an answer or below
   ``min_answer_score`` is dropped before the annotator sees it.
3. **Annotator rewrite.** A second chat call (another model, possibly) gets the instructions of
   the paper's Fig. 7 and, as in its Fig. 8, the recallable sources — the question, the task
   instructions and the gold documents only (negative documents empty, App. C.2) — with the
   trace, and returns it rewritten with verbatim quotes in ``<recall>...</recall>``: few, long
   spans of whole sentences or clauses, the evidence before each claim, a string recalled again
   where it is reused, the question and instructions recalled when the trace refers to them.
4. **Checks and alignment.** The rewrite must pair its tags, keep the reasoning (word-level
   ``difflib`` similarity of the tag-stripped rewrite to the original reasoning at least
   ``min_similarity``) and keep the answer. Each quote is located in the prompt text: exactly
   (``str.find``), else with Levenshtein fuzzy matching (``fuzzysearch``, at most
   ``max(fuzzy_min_dist, fuzzy_ratio * len(quote))`` edits); occurrences overlapping a gold
   passage win. The aligned prompt substring, not the annotator's text, becomes the span, so the
   spans of the SFT example copy the prompt's own token ids (``data_gen.traces.sft_example``).
   One quote that cannot be aligned drops the trace; so does a trace without spans
   (``require_span``) or with a span longer than the model's ``max_recall_tokens``.

Kept traces become ``SFTExample`` records (``source="annotated"``) split into ``train.jsonl`` and
``val.jsonl`` (the paper's proportion by default: 1,600 / 195 of 1,795; ``val_count`` fixes the
number instead); ``traces.jsonl`` keeps every trace with its outcome (it is also a valid teacher
trace file for a rerun) and ``report.json`` counts kept and dropped traces per reason and per
category. Every file is written atomically.

Everything in the configuration is checked before the first request; an endpoint that cannot be
reached is named in a one-line ``RecallmError``. The API key is read from the environment
variable that ``api_key_env`` names and is never logged nor written. The endpoint settings and
the HTTP client (``EndpointConfig``, ``ChatClient``, ``ChatError``) live in ``recallm.clients``
(re-exported here).
"""

from __future__ import annotations

import difflib
import json
import logging
import random
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_gen.base import Row
from recallm.clients import ChatClient, ChatError, EndpointConfig
from recallm.config import MAX_CHARS, MAX_TOKENS, dataclass_values
from recallm.config import as_number as _number
from recallm.config import check_range as _check_range
from recallm.errors import RecallmError

__all__ = [
    "REASONS",
    "PAPER_VAL_FRACTION",
    "TEMPLATE_FIELDS",
    "row_sources",
    "row_instructions",
    "DEFAULT_TEACHER_INSTRUCTION",
    "DEFAULT_ANNOTATOR_SYSTEM",
    "DEFAULT_ANNOTATOR_USER",
    "EndpointConfig",
    "Checks",
    "Prompts",
    "AnnotateSettings",
    "ChatClient",
    "ChatError",
    "Alignment",
    "Outcome",
    "split_trace",
    "strip_recall_tags",
    "reasoning_similarity",
    "align_span",
    "teacher_messages",
    "annotator_messages",
    "annotate_trace",
    "read_teacher_traces",
    "run_annotation",
    "annotate_from_config",
    "format_report",
]

log = logging.getLogger(__name__)

#: Why a trace is dropped, in pipeline order (the report lists every one, zeros included).
REASONS = (
    "teacher_error",  # the teacher call failed (after retries) or returned nothing
    "no_answer",  # the teacher trace has no parseable final answer
    "wrong_answer",  # its answer scores below checks.min_answer_score
    "annotator_error",  # the annotator call failed, returned nothing or was cut off
    "bad_tags",  # unpaired or nested <recall> tags
    "rewrite_changed",  # the rewrite changed the reasoning beyond the tags, or the answer
    "unaligned_span",  # a quote is not in the prompt, even fuzzily
    "no_span",  # no recall span at all (checks.require_span)
    "span_too_long",  # a span longer than checks.max_span_tokens tokens
)

DEFAULT_TEACHER_INSTRUCTION = (
    "Work through the question step by step, referring to the parts of the context you use. "
    "When you are done, give the final answer on the last line, written as `Answer: <answer>`."
)

# The annotator's instructions follow the paper's Fig. 7 rule for rule (our wording): recall spans
# as quick glances inside the think block; evidence before the claim; prune only fake browsing;
# few, long spans of whole sentences or clauses; re-recall a string each time it is reused; recall
# the question and the instructions too; spans verbatim and specific; the answer unchanged.
DEFAULT_ANNOTATOR_SYSTEM = """\
You edit reasoning traces that language models wrote while solving long-context retrieval and \
reasoning tasks. Your edit makes a trace rely on recall spans, <recall> ... </recall>: a recall span \
holds text the model copies, through a recall tool, from the sources it was given.

You receive RECALLABLE SOURCES and a REASONING TRACE. Rewrite the trace so that wherever it uses \
information from the sources, it first recalls the relevant text in a <recall>...</recall> span \
(inside <think>...</think>) and only then draws its conclusion. You may reorder and rewrite sentences \
to do this. Otherwise keep the trace's structure, length and style: make only the edits these rules \
need. Do not summarise or shorten it, and keep its backtracking, checks and thinking aloud, unless a \
passage only pretends to browse or repeats a listing. Keep the text after the think block. Return \
the whole edited trace and nothing else.

The RECALLABLE SOURCES are the QUESTION, the INSTRUCTIONS, the GOLD DOCUMENTS and the NEGATIVE \
DOCUMENTS.

The idea: the think block is a private inner monologue written while looking at the sources. A recall \
span is a quick glance at the text in front of you, for example "Looking at the text, I see \
<recall>...</recall>." Never describe the tool ("I will use the recall tool", "calling recall").

Rules:
1) Use recall: whenever the trace relies on information from a recallable source, it recalls that \
evidence in a <recall> span. Recall often, but only key information from the sources.
2) Evidence first: never state a fact taken from a source in free text and cite it afterwards. Where \
a sentence introduces such a fact (a name, number, date, ID, key/value pair, definition or title), \
rewrite it locally so that the <recall> span comes before or at that first mention.
3) Remove only fake browsing: delete or shorten sentences that act out using a tool or scan without \
content ("I scan the documents", "I look around"). Keep every real reasoning step: backtracking, \
verification, elimination, doubt, testing a hypothesis. Do not reorder what need not move.
4) Few, long spans: prefer fewer and longer spans that take a whole supporting sentence or clause. \
When a fact sits in one contiguous sentence or clause of a source, wrap that whole sentence or clause \
in one span, even with its parentheses. Never split one claim over several spans to keep them short.
5) Supported claims: every claim that depends on a source comes after the recall span that \
supports it.
6) Recall again when reused: when the trace uses a source-specific string again later (an ID, number, \
title, rare name, key:value), recall it again in a new span next to each reuse, taking the whole \
sentence or clause it sits in when it sits in one.
7) The question and the instructions: when the trace refers to the question or to the instructions, \
recall the relevant part of them. They are key information too.

Constraints:
- <recall> spans appear only inside <think> ... </think>, never after it.
- The text inside a span is an exact, contiguous copy of a recallable source: the same characters, \
punctuation, capitals and spaces. Never paraphrase inside a span.
- A span may be ungrammatical if that keeps its supporting text verbatim.
- A span stays on its subject and names it clearly enough that it could not belong to another one. \
Good: <recall>5065: 9BJk8Q32AL</recall>. Bad: 5065: <recall>9BJk8Q32AL</recall> (the value alone is \
tied to nothing). Also bad: <recall>5065:</recall> <recall>9BJk8Q32AL</recall>.
- Delete sentences that talk about using recall; the trace just uses it.
- Do not change the final answer.
- Output only the edited trace, with no comment before or after it."""

# The user message of Fig. 8: the sources as named fields. The negative documents stay empty by
# default, as in the paper (App. C.2: with negatives the annotator over-recalled irrelevant text).
DEFAULT_ANNOTATOR_USER = """\
You are editing a model's reasoning trace.

RECALLABLE SOURCES:

QUESTION:
{question}

INSTRUCTIONS:
{instructions}

GOLD DOCUMENTS:
{gold_docs}

NEGATIVE DOCUMENTS (optional; may be empty):
{neg_docs}

REASONING TRACE:
{trace}"""

#: The paper's SFT split: 195 of its 1,795 annotated examples for validation, 1,600 for training (App. C.2).
PAPER_VAL_FRACTION = 195 / 1795

_FENCE = re.compile(r"^```[\w-]*\n(.*)\n```$", re.DOTALL)
TEMPLATE_FIELDS = ("question", "instructions", "gold_docs", "neg_docs", "context", "trace")
_TEMPLATE_FIELD = re.compile(r"\{(" + "|".join(TEMPLATE_FIELDS) + r")\}")


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Checks:
    """What a trace must pass to be kept."""

    min_answer_score: float = 1.0  # the row's answer metric, in [0, 1]
    min_similarity: float = 0.6  # word-level similarity of the tag-stripped rewrite to the original
    fuzzy_ratio: float = 0.1  # edits allowed per character of a quote
    fuzzy_min_dist: int = field(default=1, metadata={"max": MAX_CHARS})  # ... and at least this many
    require_span: bool = True
    max_span_tokens: int | None = field(default=128, metadata={"max": MAX_TOKENS})  # None: no limit

    def __post_init__(self) -> None:
        _check_range(self.min_answer_score, "checks.min_answer_score", 0.0, 1.0)
        _check_range(self.min_similarity, "checks.min_similarity", 0.0, 1.0)
        _check_range(self.fuzzy_ratio, "checks.fuzzy_ratio", 0.0, 1.0, hi_open=True)
        if self.fuzzy_min_dist < 0:
            raise RecallmError(f"checks.fuzzy_min_dist must be >= 0, got {self.fuzzy_min_dist}")
        if self.max_span_tokens is not None and self.max_span_tokens < 1:
            raise RecallmError(f"checks.max_span_tokens must be >= 1 or null, got {self.max_span_tokens}")

    def max_dist(self, quote_length: int) -> int:
        """Edits allowed when aligning a quote of ``quote_length`` characters (always fewer than it has)."""
        return max(0, min(max(self.fuzzy_min_dist, int(self.fuzzy_ratio * quote_length)), quote_length - 1))


@dataclass(frozen=True)
class Prompts:
    """The wording of the teacher instruction and of the annotator request."""

    teacher_instruction: str | None = DEFAULT_TEACHER_INSTRUCTION  # appended to the row's last user message
    teacher_system: str | None = None  # replaces the row's system message when set
    annotator_system: str = DEFAULT_ANNOTATOR_SYSTEM
    # fields: {question} {instructions} {gold_docs} {neg_docs} (Fig. 8), {context} (the whole prompt), {trace}
    annotator_user: str = DEFAULT_ANNOTATOR_USER
    negative_documents: bool = False  # fill {neg_docs} with the row's other documents (the paper leaves it empty)

    def __post_init__(self) -> None:
        if "{trace}" not in self.annotator_user:
            raise RecallmError("annotator.user_template must contain {trace}")
        sources = ("{question}", "{instructions}", "{gold_docs}", "{context}")
        if not any(f in self.annotator_user for f in sources):
            raise RecallmError(f"annotator.user_template must contain at least one of {', '.join(sources)}")


# --------------------------------------------------------------------------- traces


def split_trace(text: str) -> tuple[str, str | None]:
    """(reasoning, final answer or None) of a trace.

    With a ``</think>``, the reasoning is what precedes it (a leading ``<think>`` dropped) and the
    answer is the response parser's. Without, the answer starts at the last line holding an
    ``Answer:`` marker (as the response parser recognises it) and the reasoning is the lines before.
    """
    from rewards.parsing import parse_response

    text = (text or "").strip()
    if text.startswith("<think>"):
        text = text[len("<think>") :]
    if "</think>" in text:
        reasoning = text[: text.index("</think>")]
        answer = parse_response(text).answer
    else:
        lines = text.splitlines(keepends=True)
        reasoning, answer = text, None
        for i in range(len(lines) - 1, -1, -1):
            if parse_response("</think>" + lines[i]).n_answers:
                reasoning = "".join(lines[:i])
                answer = parse_response("</think>" + "".join(lines[i:])).answer
                break
    return reasoning.strip(), (answer or None)


def strip_recall_tags(text: str) -> str:
    """``text`` without recall markers (their content kept)."""
    from rewards.parsing import END_MARKERS, START_MARKERS

    for marker in (*START_MARKERS, *END_MARKERS):
        text = text.replace(marker, "")
    return text


def reasoning_similarity(original: str, rewrite: str) -> float:
    """Word-level ``difflib`` ratio of the tag-stripped rewrite to the original, in [0, 1]."""
    a, b = original.split(), strip_recall_tags(rewrite).split()
    if not a and not b:
        return 1.0
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


@dataclass(frozen=True)
class Alignment:
    start: int
    end: int
    dist: int  # Levenshtein distance of the quote to prompt_text[start:end] before edge trimming
    in_gold: bool


def _overlaps(start: int, end: int, gold: Sequence[Mapping[str, Any]]) -> bool:
    return any(start < int(g["end"]) and int(g["start"]) < end for g in gold)


def _trim(prompt_text: str, start: int, end: int) -> tuple[int, int]:
    from rewards.recall import clean_span

    piece = prompt_text[start:end]
    inner = clean_span(piece)
    if not inner:
        return start, start
    offset = piece.find(inner)
    return start + offset, start + offset + len(inner)


def align_span(
    quote: str, prompt_text: str, gold: Sequence[Mapping[str, Any]] = (), *, max_dist: int | Callable[[int], int] = 0
) -> Alignment | None:
    """Where ``quote`` is in ``prompt_text``: exactly if it can be, else the fuzzy match within
    ``max_dist`` edits (an int, or a function of the quote's length); among candidates, one
    overlapping a gold passage first, then the fewest edits, then the earliest. None if none."""
    from fuzzysearch import find_near_matches

    from rewards.recall import clean_span

    quote = clean_span(quote)
    if not quote:
        return None
    n = len(quote)
    for g in gold:  # an exact occurrence overlapping a gold passage
        pos = prompt_text.find(quote, max(0, int(g["start"]) - n + 1), int(g["end"]) + n - 1)
        if pos != -1:
            return Alignment(pos, pos + n, 0, True)
    pos = prompt_text.find(quote)
    if pos != -1:
        return Alignment(pos, pos + n, 0, _overlaps(pos, pos + n, gold))
    k = max_dist(n) if callable(max_dist) else int(max_dist)
    if k <= 0:
        return None
    matches = find_near_matches(quote, prompt_text, max_l_dist=min(k, n - 1))
    candidates = []
    for m in matches:
        start, end = _trim(prompt_text, m.start, m.end)
        if end > start:
            candidates.append((not _overlaps(start, end, gold), m.dist, start, end))
    if not candidates:
        return None
    outside, dist, start, end = min(candidates)
    return Alignment(start, end, dist, not outside)


def _row_context(row: Row) -> str:
    return "\n\n".join(m["content"] for m in row.messages if m.get("role") in ("system", "user"))


def _user_content(row: Row) -> str:
    users = [m["content"] for m in row.messages if m.get("role") == "user"]
    return users[-1] if users else ""


def row_instructions(row: Row) -> str:
    """The task instructions of a row: recorded at generation, else the first paragraph of its user
    message (where ``data_gen.fit`` puts them)."""
    if row.instruction:
        return row.instruction
    return _user_content(row).split("\n\n", 1)[0].strip()


def row_sources(row: Row, *, negatives: bool = False) -> dict[str, str]:
    """The RECALLABLE SOURCES of Fig. 8: the question, the instructions, the gold documents (a row
    without segmented gold evidence — a long document, a vote list, a short problem — gives its
    whole user message instead) and, with ``negatives``, the other documents (empty otherwise)."""
    gold = "\n\n".join(str(g["text"]) for g in row.gold)
    content = _user_content(row)
    neg = ""
    if negatives and row.gold:
        rest = content
        for g in row.gold:
            rest = rest.replace(str(g["text"]), "\n")
        neg = "\n".join(line for line in rest.splitlines() if line.strip())
    return {
        "question": row.question.strip(),
        "instructions": row_instructions(row),
        "gold_docs": gold if gold else content,
        "neg_docs": neg,
    }


def teacher_messages(row: Row, prompts: Prompts) -> list[dict[str, str]]:
    """The row's chat messages, the teacher instruction appended to the last user message."""
    messages = [dict(m) for m in row.messages]
    if prompts.teacher_system:
        messages = [{"role": "system", "content": prompts.teacher_system}] + [
            m for m in messages if m.get("role") != "system"
        ]
    if prompts.teacher_instruction:
        last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
        if last is None:
            messages.append({"role": "user", "content": prompts.teacher_instruction})
        else:
            messages[last]["content"] = f"{messages[last]['content']}\n\n{prompts.teacher_instruction}"
    return messages


def annotator_messages(row: Row, trace: str, prompts: Prompts) -> list[dict[str, str]]:
    """The annotator request (Figs. 7-8): its instructions, the row's recallable sources and the
    (normalised) trace, ``<think>`` reasoning ``</think>`` then the answer line."""
    fields = {**row_sources(row, negatives=prompts.negative_documents), "context": _row_context(row), "trace": trace}
    user = _TEMPLATE_FIELD.sub(lambda m: fields[m.group(1)], prompts.annotator_user)
    return [{"role": "system", "content": prompts.annotator_system}, {"role": "user", "content": user}]


def _clean_rewrite(text: str) -> str:
    """The annotator's output without its own thinking (text up to a ``</think>``) and fences."""
    text = text.strip()
    if "</think>" in text:
        text = text[text.rindex("</think>") + len("</think>") :].strip()
    fenced = _FENCE.match(text)
    return fenced.group(1).strip() if fenced else text


@dataclass
class Outcome:
    """What became of one teacher trace (``reason`` None: kept)."""

    index: int
    sample: int
    category: str
    reason: str | None = None
    detail: str = ""
    trace: str | None = None
    annotated: str | None = None
    answer: str | None = None
    segments: list[tuple[str, Any]] = field(default_factory=list)
    alignments: list[Alignment] = field(default_factory=list)

    def drop(self, reason: str, detail: str = "") -> Outcome:
        assert reason in REASONS, reason
        self.reason, self.detail = reason, detail
        return self

    def record(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "sample": self.sample,
            "category": self.category,
            "kept": self.reason is None,
            "reason": self.reason,
            "detail": self.detail,
            "trace": self.trace,
            "annotated": self.annotated,
            "answer": self.answer,
            "spans": [[a.start, a.end, a.dist, a.in_gold] for a in self.alignments],
        }


def _segments(original: str, reasoning: str, row: Row, checks: Checks, out: Outcome) -> list[tuple[str, Any]] | None:
    """Segments of an annotated reasoning (tags paired, the rest of ``original`` kept, quotes
    aligned); None after ``out.drop``."""
    from rewards.parsing import END_MARKERS, START_MARKERS, parse_response

    parsed = parse_response(reasoning)
    if parsed.n_start != parsed.n_end or len(parsed.spans) != parsed.n_start:
        out.drop("bad_tags", f"{parsed.n_start} opening and {parsed.n_end} closing tags, {len(parsed.spans)} pairs")
        return None
    similarity = reasoning_similarity(original, reasoning)
    if similarity < checks.min_similarity:
        out.drop("rewrite_changed", f"similarity {similarity:.3f} < {checks.min_similarity}")
        return None
    segments: list[tuple[str, Any]] = []
    cursor = 0
    for number, span in enumerate(parsed.spans, 1):
        opener = next(m for m in START_MARKERS if reasoning.startswith(m, span.start - len(m)))
        closer = next(m for m in END_MARKERS if reasoning.startswith(m, span.end))
        if span.start - len(opener) > cursor:
            segments.append(("text", reasoning[cursor : span.start - len(opener)]))
        found = align_span(span.text, row.prompt_text, row.gold, max_dist=checks.max_dist)
        if found is None:
            out.drop("unaligned_span", f"span {number} not in the prompt: {span.text[:80]!r}")
            return None
        out.alignments.append(found)
        segments.append(("span", (found.start, found.end)))
        cursor = span.end + len(closer)
    tail = reasoning[cursor:].rstrip()
    segments.append(("text", tail + "\n") if tail else ("text", "\n"))
    return segments


def annotate_trace(
    row: Row,
    trace: str,
    annotator: ChatClient | Callable[[list[dict[str, str]]], str],
    *,
    checks: Checks,
    prompts: Prompts,
    reward_config=None,
    index: int = 0,
    sample: int = 0,
) -> Outcome:
    """Check one teacher trace, have it annotated and align its spans (no tokenisation here)."""
    from rewards.score import score_response

    out = Outcome(index=index, sample=sample, category=row.category, trace=trace)
    reasoning, answer = split_trace(trace)
    if answer is None:
        return out.drop("no_answer", "no `Answer:` line after the reasoning")
    out.answer = answer
    normalised = f"{reasoning}\n</think>\n\nAnswer: {answer}"
    try:
        score = score_response(
            normalised, row.ground_truth, prompt_text=row.prompt_text, data_source=row.data_source, config=reward_config
        ).answer
    except ValueError as exc:  # RecallmError included: the row's ground truth, not the trace, is at fault
        raise RecallmError(f"row {index}: cannot score its answer: {exc}") from exc
    if score < checks.min_answer_score:
        return out.drop("wrong_answer", f"answer {answer[:80]!r} scores {score:.3g}")
    messages = annotator_messages(row, f"<think>\n{reasoning}\n</think>\n\nAnswer: {answer}", prompts)
    try:
        raw = annotator.complete(messages) if isinstance(annotator, ChatClient) else annotator(messages)
    except ChatError as exc:
        return out.drop("annotator_error", str(exc))
    out.annotated = rewrite = _clean_rewrite(raw)
    if not rewrite:
        return out.drop("annotator_error", "empty rewrite")
    new_reasoning, new_answer = split_trace(rewrite)
    if new_answer is not None and new_answer.strip() != answer.strip():
        return out.drop("rewrite_changed", f"the answer became {new_answer[:80]!r}")
    segments = _segments(reasoning, new_reasoning, row, checks, out)
    if segments is None:
        return out
    if checks.require_span and not out.alignments:
        return out.drop("no_span", "the rewrite has no <recall> span")
    out.segments = segments
    return out


def teacher_outcome(
    row: Row,
    teacher: ChatClient,
    annotator: ChatClient,
    *,
    checks: Checks,
    prompts: Prompts,
    reward_config=None,
    index: int = 0,
    sample: int = 0,
) -> Outcome:
    """Ask the teacher for a trace of ``row``, then ``annotate_trace`` it."""
    try:
        trace = teacher.complete(teacher_messages(row, prompts), with_reasoning=True)
    except ChatError as exc:
        return Outcome(index=index, sample=sample, category=row.category).drop("teacher_error", str(exc))
    return annotate_trace(
        row, trace, annotator, checks=checks, prompts=prompts, reward_config=reward_config, index=index, sample=sample
    )


def read_teacher_traces(path: str | Path, n_rows: int) -> list[tuple[int, str]]:
    """(row index, trace) of every line of a teacher trace file; indices checked against ``n_rows``.
    Lines with a null trace (a failed teacher call in a ``traces.jsonl`` of an earlier run) are skipped."""
    from recallm.io import read_jsonl

    traces = []
    for number, record in enumerate(read_jsonl(path), 1):
        if not isinstance(record, dict):
            raise RecallmError(f"{path}:{number}: expected an object with index and trace")
        index, trace = record.get("index"), record.get("trace")
        if trace is None and "trace" in record:
            continue
        if isinstance(index, bool) or not isinstance(index, int) or not isinstance(trace, str):
            raise RecallmError(f"{path}:{number}: expected an integer index and a string trace")
        if not 0 <= index < n_rows:
            raise RecallmError(f"{path}:{number}: row index {index} is out of range (the input has {n_rows} rows)")
        traces.append((index, trace))
    return traces


# --------------------------------------------------------------------------- the run


@dataclass
class AnnotateSettings:
    """A whole run, checked (``from_config``) before anything is requested."""

    input: Path
    tokenizer: Path  # the RecaLLM model/tokenizer directory (its config gives max_recall_tokens)
    output_dir: Path
    annotator: EndpointConfig
    teacher: EndpointConfig | None = None
    teacher_traces: Path | None = None
    samples: int = 1
    checks: Checks = field(default_factory=Checks)
    prompts: Prompts = field(default_factory=Prompts)
    val_fraction: float = PAPER_VAL_FRACTION
    val_count: int | None = None
    seed: int = 0
    limit: int | None = None
    progress: bool = False
    reward: Any = None  # a reward config source (``rewards.load_reward_config``)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> AnnotateSettings:
        try:
            from omegaconf import DictConfig, OmegaConf

            if isinstance(cfg, DictConfig):
                missing = sorted(OmegaConf.missing_keys(cfg))
                if missing:
                    raise RecallmError(f"missing required config value(s): {', '.join(missing)}")
                cfg = OmegaConf.to_container(cfg, resolve=True)
        except ImportError:  # pragma: no cover - omegaconf is a dependency
            pass
        teacher_cfg = dict(cfg.get("teacher") or {})
        annotator_cfg = dict(cfg.get("annotator") or {})
        checks_cfg = dict(cfg.get("checks") or {})
        for name in ("input", "tokenizer", "output_dir"):
            if not cfg.get(name) or cfg.get(name) == "???":
                raise RecallmError(f"{name}=... is required")
        source = Path(cfg["input"])
        if not source.is_file():
            raise RecallmError(f"input file {source} does not exist (a parquet of rows from `recallm-data`)")
        model = Path(cfg["tokenizer"])
        if not model.is_dir():
            raise RecallmError(f"tokenizer directory {model} does not exist (the RecaLLM model/tokenizer of the rows)")
        traces = teacher_cfg.get("traces")
        if traces and not Path(traces).is_file():
            raise RecallmError(f"teacher.traces file {traces} does not exist")
        checks_values = dataclass_values(Checks, checks_cfg, "checks")  # Checks is the section's schema
        if checks_values.get("max_span_tokens") is None:  # null here: the model's max_recall_tokens
            checks_values["max_span_tokens"] = _model_max_recall_tokens(model)
        checks = Checks(**checks_values)
        prompts = Prompts(
            teacher_instruction=teacher_cfg.get("instruction") or DEFAULT_TEACHER_INSTRUCTION,
            teacher_system=teacher_cfg.get("system_prompt") or None,
            annotator_system=annotator_cfg.get("system_prompt") or DEFAULT_ANNOTATOR_SYSTEM,
            annotator_user=annotator_cfg.get("user_template") or DEFAULT_ANNOTATOR_USER,
            negative_documents=bool(annotator_cfg.get("negative_documents", False)),
        )
        val_fraction = _number(cfg.get("val_fraction", PAPER_VAL_FRACTION), "val_fraction")
        _check_range(val_fraction, "val_fraction", 0.0, 1.0, hi_open=True)
        val_count = cfg.get("val_count")
        if val_count is not None and _number(val_count, "val_count", int) < 0:
            raise RecallmError(f"val_count must be >= 0 or null, got {val_count}")
        limit = cfg.get("limit")
        if limit is not None and _number(limit, "limit", int) < 1:
            raise RecallmError(f"limit must be >= 1 or null, got {limit}")
        samples = _number(teacher_cfg.get("samples", 1), "teacher.samples", int)
        if samples < 1:
            raise RecallmError(f"teacher.samples must be >= 1, got {samples}")
        return cls(
            input=source,
            tokenizer=model,
            output_dir=Path(cfg["output_dir"]),
            annotator=EndpointConfig.from_mapping(annotator_cfg, "annotator"),
            teacher=None if traces else EndpointConfig.from_mapping(teacher_cfg, "teacher"),
            teacher_traces=Path(traces) if traces else None,
            samples=samples,
            checks=checks,
            prompts=prompts,
            val_fraction=val_fraction,
            val_count=None if val_count is None else int(val_count),
            seed=_number(cfg.get("seed", 0), "seed", int),
            limit=None if limit is None else int(limit),
            progress=bool(cfg.get("progress", False)),
            reward=cfg.get("reward"),
        )


def _model_max_recall_tokens(model: Path) -> int:
    from recallm.tokens import DEFAULT_MAX_RECALL_TOKENS

    try:
        value = json.loads((model / "config.json").read_text()).get("max_recall_tokens")
    except (OSError, ValueError):
        value = None
    return int(value) if isinstance(value, int) and value > 0 else DEFAULT_MAX_RECALL_TOKENS


def _span_tokens(example) -> int:
    return max((j - i for i, j in example.spans), default=0)


def run_annotation(
    rows: Sequence[Row],
    tokenizer,
    *,
    annotator: ChatClient | Callable[[list[dict[str, str]]], str],
    output_dir: str | Path,
    traces: Sequence[tuple[int, str]] | None = None,
    teacher: ChatClient | None = None,
    samples: int = 1,
    checks: Checks | None = None,
    prompts: Prompts | None = None,
    reward_config=None,
    val_fraction: float = PAPER_VAL_FRACTION,
    val_count: int | None = None,
    seed: int = 0,
    workers: int = 8,
    progress: bool = False,
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Annotate the teacher traces of ``rows`` (``traces`` given, or asked of ``teacher``), write
    ``train.jsonl``, ``val.jsonl``, ``traces.jsonl`` and ``report.json`` under ``output_dir`` and
    return the report."""
    from tqdm import tqdm

    from data_gen.traces import sft_example
    from recallm.io import atomic_path, write_jsonl
    from rewards.config import load_reward_config

    if (traces is None) == (teacher is None):
        raise RecallmError("give either teacher traces or a teacher endpoint, not both or neither")
    checks, prompts = checks or Checks(), prompts or Prompts()
    reward_config = load_reward_config(reward_config)
    output_dir = Path(output_dir)
    jobs = list(traces) if traces is not None else [(i, s) for i in range(len(rows)) for s in range(samples)]
    common = {"checks": checks, "prompts": prompts, "reward_config": reward_config}
    sample_of: Counter[int] = Counter()

    def job(item) -> Outcome:
        if traces is not None:
            index, trace, sample = item
            return annotate_trace(rows[index], trace, annotator, index=index, sample=sample, **common)
        index, sample = item
        return teacher_outcome(rows[index], teacher, annotator, index=index, sample=sample, **common)

    if traces is not None:  # number repeated traces of one row
        numbered = []
        for index, trace in jobs:
            numbered.append((index, trace, sample_of[index]))
            sample_of[index] += 1
        jobs = numbered

    outcomes: list[Outcome] = []
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(job, item) for item in jobs]
        try:
            for future in tqdm(as_completed(futures), total=len(futures), desc="annotating", disable=not progress):
                outcomes.append(future.result())
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    outcomes.sort(key=lambda o: (o.index, o.sample))

    examples = []
    for out in outcomes:
        if out.reason is not None:
            log.debug("row %d sample %d dropped: %s (%s)", out.index, out.sample, out.reason, out.detail)
            continue
        example = sft_example(tokenizer, rows[out.index], out.segments, out.answer, source="annotated")
        longest = _span_tokens(example)
        if checks.max_span_tokens is not None and longest > checks.max_span_tokens:
            out.drop("span_too_long", f"a span of {longest} tokens > {checks.max_span_tokens}")
            continue
        examples.append(example)

    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    n_val = min(len(examples), round(len(examples) * val_fraction) if val_count is None else val_count)
    val_ids = set(order[:n_val])
    train = [e.to_record() for k, e in enumerate(examples) if k not in val_ids]
    val = [e.to_record() for k, e in enumerate(examples) if k in val_ids]
    files = {
        "train": write_jsonl(train, output_dir / "train.jsonl"),
        "val": write_jsonl(val, output_dir / "val.jsonl"),
        "traces": write_jsonl((o.record() for o in outcomes), output_dir / "traces.jsonl"),
    }
    report = build_report(outcomes, len(rows), train=len(train), val=len(val))
    report["seconds"] = round(time.monotonic() - started, 3)
    report["files"] = {name: str(path) for name, path in files.items()} | {"report": str(output_dir / "report.json")}
    if meta:
        report["settings"] = dict(meta)
    with atomic_path(output_dir / "report.json") as tmp:
        tmp.write_text(json.dumps(report, indent=2) + "\n")
    return report


def build_report(outcomes: Sequence[Outcome], n_rows: int, *, train: int = 0, val: int = 0) -> dict[str, Any]:
    """Counts of kept and dropped traces, per reason and per category, and span statistics."""
    dropped = Counter(o.reason for o in outcomes if o.reason is not None)
    per_category: dict[str, dict[str, Any]] = defaultdict(lambda: {"traces": 0, "kept": 0, "dropped": Counter()})
    for o in outcomes:
        cat = per_category[o.category]
        cat["traces"] += 1
        if o.reason is None:
            cat["kept"] += 1
        else:
            cat["dropped"][o.reason] += 1
    kept = [o for o in outcomes if o.reason is None]
    spans = [a for o in kept for a in o.alignments]
    return {
        "rows": n_rows,
        "rows_with_traces": len({o.index for o in outcomes}),
        "traces": len(outcomes),
        "kept": len(kept),
        "dropped": sum(dropped.values()),
        "dropped_by_reason": {reason: dropped.get(reason, 0) for reason in REASONS},
        "by_category": {
            name: {"traces": c["traces"], "kept": c["kept"], "dropped": dict(sorted(c["dropped"].items()))}
            for name, c in sorted(per_category.items())
        },
        "spans": {
            "total": len(spans),
            "exact": sum(a.dist == 0 for a in spans),
            "fuzzy": sum(a.dist > 0 for a in spans),
            "in_gold": sum(a.in_gold for a in spans),
            "per_kept_trace": round(len(spans) / len(kept), 3) if kept else 0.0,
        },
        "splits": {"train": train, "val": val},
    }


def format_report(report: Mapping[str, Any]) -> str:
    """A human-readable summary of a report."""
    lines = [
        f"traces: {report['traces']} over {report['rows_with_traces']}/{report['rows']} rows; "
        f"kept {report['kept']}, dropped {report['dropped']}"
    ]
    for reason, count in report["dropped_by_reason"].items():
        if count:
            lines.append(f"  dropped {reason:16} {count}")
    lines.append(f"{'category':22}{'traces':>8}{'kept':>8}  dropped")
    for name, cat in report["by_category"].items():
        drops = ", ".join(f"{r}={n}" for r, n in cat["dropped"].items()) or "-"
        lines.append(f"{name:22}{cat['traces']:>8}{cat['kept']:>8}  {drops}")
    s = report["spans"]
    lines.append(f"spans: {s['total']} ({s['exact']} exact, {s['fuzzy']} fuzzy, {s['in_gold']} in gold passages)")
    lines.append(f"splits: train {report['splits']['train']}, val {report['splits']['val']}")
    return "\n".join(lines)


def annotate_from_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The ``recallm-annotate`` run: check the config, load rows and tokenizer, check that the
    endpoints answer, annotate, write. Returns the report."""
    from data_gen.io import read_rows
    from recallm.tokens import RecallTokenIds, load_tokenizer
    from rewards.config import load_reward_config

    settings = AnnotateSettings.from_config(cfg)
    reward_config = load_reward_config(settings.reward)
    tokenizer = load_tokenizer(settings.tokenizer)
    RecallTokenIds.from_tokenizer(tokenizer)  # spans need the recall tokens
    rows = read_rows(settings.input, tokenizer)
    traces = None
    if settings.teacher_traces is not None:
        traces = read_teacher_traces(settings.teacher_traces, len(rows))
    if settings.limit is not None:
        rows = rows[: settings.limit]
        if traces is not None:
            traces = [(i, t) for i, t in traces if i < settings.limit]
    meta = {
        "input": str(settings.input),
        "tokenizer": str(settings.tokenizer),
        "teacher": f"file {settings.teacher_traces}"
        if settings.teacher is None
        else f"{settings.teacher.model} @ {settings.teacher.base_url}",
        "annotator": f"{settings.annotator.model} @ {settings.annotator.base_url}",
        "checks": {k: getattr(settings.checks, k) for k in Checks.__dataclass_fields__},
        "val_fraction": settings.val_fraction,
        "val_count": settings.val_count,
        "seed": settings.seed,
    }
    clients: list[ChatClient] = []
    try:
        annotator = ChatClient(settings.annotator, "annotator")
        clients.append(annotator)
        teacher = None
        if settings.teacher is not None:
            teacher = ChatClient(settings.teacher, "teacher")
            clients.append(teacher)
        for client in clients:
            client.ping()
        workers = settings.annotator.concurrency + (settings.teacher.concurrency if settings.teacher else 0)
        return run_annotation(
            rows,
            tokenizer,
            annotator=annotator,
            output_dir=settings.output_dir,
            traces=traces,
            teacher=teacher,
            samples=settings.samples,
            checks=settings.checks,
            prompts=settings.prompts,
            reward_config=reward_config,
            val_fraction=settings.val_fraction,
            val_count=settings.val_count,
            seed=settings.seed,
            workers=workers,
            progress=settings.progress,
            meta=meta,
        )
    finally:
        for client in clients:
            client.close()

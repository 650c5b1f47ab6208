"""SFT traces: completions whose recall spans are verbatim token copies of the prompt.

A trace is a list of segments — ``("text", str)`` for free reasoning and ``("span", (start,
end))`` for a recall span over the characters ``[start, end)`` of the prompt text — followed by
the final answer. ``build_completion`` turns it into the completion text and token ids:

* free text is tokenised as text;
* a span becomes ``<|start_recall|>`` + the prompt's own token ids covering ``[start, end)``
  (widened to token boundaries) + ``<|end_recall|>`` — so every span's ids are a contiguous
  sub-sequence of the prompt's ids, which the constrained decoder (and the training mask) demand;
  re-tokenising the span text could give other ids (a token may straddle the span's edge);
* then ``</think>\\nAnswer: <answer>`` and the end-of-sequence token.

The generation prompt of the chat template already opens ``<think>\\n``, so completions start
inside the think block. ``programmatic_trace`` builds the segments of a synthetic task's row
from the task's own ``trace``.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from data_gen.base import Row, Task
from recallm.errors import RecallmError
from recallm.tokens import END_RECALL, START_RECALL, THINK_END, RecallTokenIds

__all__ = ["SFTExample", "prompt_encoding", "span_token_range", "build_completion", "programmatic_trace", "sft_example"]


def prompt_encoding(tokenizer, prompt_text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """(token ids, character offsets) of a rendered prompt, special tokens parsed from the text."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        enc = backend.encode(prompt_text, add_special_tokens=False)
        return list(enc.ids), [tuple(o) for o in enc.offsets]
    enc = tokenizer(prompt_text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def span_token_range(offsets: list[tuple[int, int]], start: int, end: int) -> tuple[int, int]:
    """The smallest token range ``[i, j)`` whose characters cover ``[start, end)``."""
    if not 0 <= start < end:
        raise RecallmError(f"empty or negative character interval [{start}, {end})")
    i = next((k for k, (_, e) in enumerate(offsets) if e > start), None)
    if i is None:
        raise RecallmError(f"character interval [{start}, {end}) lies beyond the prompt")
    j = i
    while j < len(offsets) and offsets[j][0] < end:
        j += 1
    return i, j


@dataclass
class SFTExample:
    """One SFT record: the prompt (as chat messages, text and ids) and the completion."""

    messages: list[dict[str, str]]
    prompt_text: str
    prompt_ids: list[int]
    completion: str
    completion_ids: list[int]
    spans: list[tuple[int, int]]  # token ranges of the prompt the spans copy
    answer: str
    category: str
    data_source: str
    ground_truth: dict[str, Any] = field(default_factory=dict)
    source: str = "programmatic"

    def to_record(self) -> dict[str, Any]:
        record = asdict(self)
        record["ground_truth"] = json.dumps(self.ground_truth)
        return record


def build_completion(
    tokenizer,
    prompt_text: str,
    segments: list[tuple[str, Any]],
    answer: str,
    *,
    encoding: tuple[list[int], list[tuple[int, int]]] | None = None,
) -> tuple[str, list[int], list[tuple[int, int]]]:
    """(completion text, completion ids, the prompt token range of each span)."""
    ids = RecallTokenIds.from_tokenizer(tokenizer)
    prompt_ids, offsets = encoding or prompt_encoding(tokenizer, prompt_text)
    text_parts: list[str] = []
    out_ids: list[int] = []
    ranges: list[tuple[int, int]] = []

    def add_text(text: str) -> None:
        if text:
            text_parts.append(text)
            out_ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])

    for kind, value in segments:
        if kind == "text":
            add_text(value)
        elif kind == "span":
            i, j = span_token_range(offsets, *value)
            ranges.append((i, j))
            copied = prompt_ids[i:j]
            text_parts.append(START_RECALL + tokenizer.decode(copied) + END_RECALL)
            out_ids.extend([ids.start, *copied, ids.end])
        else:
            raise RecallmError(f"unknown trace segment kind {kind!r}")
    add_text(f"{THINK_END}\nAnswer: {answer}")
    if tokenizer.eos_token_id is None:
        raise RecallmError("the tokenizer has no end-of-sequence token")
    text_parts.append(tokenizer.eos_token)
    out_ids.append(tokenizer.eos_token_id)
    return "".join(text_parts), out_ids, ranges


def programmatic_trace(task: Task, row: Row, rng: random.Random) -> list[tuple[str, Any]] | None:
    """The task's trace with gold references resolved to prompt character intervals."""
    steps = task.trace(row, rng)
    if steps is None:
        return None
    segments: list[tuple[str, Any]] = []
    for kind, value in steps:
        if kind == "recall":
            gold = row.gold[value]
            segments.append(("span", (gold["start"], gold["end"])))
        elif kind == "recall_at":
            segments.append(("span", tuple(value)))
        else:
            segments.append((kind, value))
    return segments


def sft_example(
    tokenizer, row: Row, segments: list[tuple[str, Any]], answer: str, source: str = "programmatic"
) -> SFTExample:
    encoding = prompt_encoding(tokenizer, row.prompt_text)
    completion, completion_ids, spans = build_completion(
        tokenizer, row.prompt_text, segments, answer, encoding=encoding
    )
    return SFTExample(
        messages=row.messages,
        prompt_text=row.prompt_text,
        prompt_ids=encoding[0],
        completion=completion,
        completion_ids=completion_ids,
        spans=spans,
        answer=answer,
        category=row.category,
        data_source=row.data_source,
        ground_truth=row.ground_truth,
        source=source,
    )

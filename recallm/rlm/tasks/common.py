"""What every RLM task shares: the task names and lengths, the token counter, one example and its score,
the fitting of lines to a length, and the reading of a stated answer.

Lengths are in tokens, counted with ``TokenCounter``: a tokenizer's exact count, or 4
characters per token without one (the default) - on the text of the context (the JSON of a
conversation). Contexts land within ``tolerance`` of the target. The gold answer is always
computed from the context as finally generated.

Scoring reads the *stated* answer, as the benchmarks' graders do: the text after the last
``Answer:`` / ``answer is`` marker when there is one, else the whole answer; a count is the
first number stated there, a label or a comparison the first option stated there.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "TASKS",
    "MIN_LENGTH",
    "MAX_LENGTH",
    "TokenCounter",
    "TaskExample",
    "TaskScore",
    "context_text",
    "fit",
    "stated_answer",
    "numeric_partial_credit",
    "first_number",
    "first_option",
]

TASKS = ("s_niah", "oolong", "oolong_pairs", "mrcr")
MIN_LENGTH, MAX_LENGTH = 1024, 4 * 1024 * 1024


class TokenCounter:
    """Counts tokens with ``tokenizer`` (exact) or 4 characters per token (``None``)."""

    def __init__(self, tokenizer=None) -> None:
        self.tokenizer = tokenizer

    def count(self, text: str) -> int:
        if self.tokenizer is None:
            return math.ceil(len(text) / 4)
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def chars_per_token(self, sample: str) -> float:
        if self.tokenizer is None or not sample:
            return 4.0
        return len(sample) / max(1, self.count(sample))

    def describe(self) -> str:
        return "tokenizer" if self.tokenizer is not None else "4 chars/token"


@dataclass
class TaskExample:
    """One generated task: the context (a str, or a list of messages for ``mrcr``), the query,
    and what scoring needs."""

    task: str
    length: int
    index: int
    context: Any
    query: str
    reference: dict[str, Any] = field(default_factory=dict)
    tokens: int = 0

    @property
    def task_id(self) -> str:
        return f"{self.task}/{self.length}/{self.index}"


@dataclass(frozen=True)
class TaskScore:
    score: float
    correct: bool
    metrics: dict[str, float] = field(default_factory=dict)


def context_text(context: Any) -> str:
    """The text a context's length is counted on (a conversation: its JSON)."""
    return context if isinstance(context, str) else json.dumps(context, ensure_ascii=False)


def fit(lines: list[str], target: int, counter: TokenCounter, tolerance: float, keep: set[int]) -> list[str]:
    """Drop lines (never those in ``keep``) from the end until ``"\\n".join(lines)`` fits
    ``target`` tokens (+ ``tolerance``)."""
    text = "\n".join(lines)
    tokens = counter.count(text)
    if tokens <= target * (1 + tolerance):
        return lines
    ratio = len(text) / max(1, tokens)
    excess = len(text) - int(target * ratio)
    out = list(lines)
    i = len(out) - 1
    while excess > 0 and i >= 0:
        if i not in keep:
            excess -= len(out[i]) + 1
            out[i] = None  # type: ignore[call-overload]
        i -= 1
    return [line for line in out if line is not None]


_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w])")
_MARKER = re.compile(r"(?:final\s+answer|answer)\s*(?:is\s*:?|:)", re.IGNORECASE)


def stated_answer(text: str) -> str:
    """The part of ``text`` that states the answer: after the last ``Answer:`` / ``answer is``
    marker, or all of it."""
    markers = list(_MARKER.finditer(text))
    return text[markers[-1].end() :] if markers else text


def numeric_partial_credit(predicted: float | None, gold: float) -> float:
    """OOLONG's score of a numeric answer: ``0.75 ** |predicted - gold|`` (0 without a number)."""
    if predicted is None:
        return 0.0
    return float(0.75 ** abs(predicted - gold))


def first_number(text: str) -> float | None:
    found = _NUMBER.search(text.replace(",", ""))
    return float(found.group(0)) if found else None


def first_option(text: str, options: Sequence[str]) -> str | None:
    """The option stated first in ``text`` (normalised, whole words)."""
    norm = _normalize(text)
    found = [(m.start(), o) for o in options for m in [re.search(rf"\b{re.escape(o)}\b", norm)] if m]
    return min(found)[1] if found else None


def _normalize(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9 ]", " ", text.lower()).split())


"""Parse a model response into think block, recall spans and final answer.

Robust to any string: unbalanced or nested recall tokens, a missing ``</think>``, several
``Answer:`` markers, empty output. One left-to-right pass over the markers.

Conventions (the prompt's generation prompt already opens ``<think>\\n``):

* the think block ends at the first ``</think>``; a ``<think>`` at the very start of the
  response is taken as the opening one, any other ``<think>`` is stray;
* a recall span opens with ``<|start_recall|>`` (or ``<recall>``, the annotation form) and
  closes with the next ``<|end_recall|>`` (or ``</recall>``); a start inside an open span
  restarts it (innermost pairing), an end with no open span is unpaired;
* the answer is the text after the last ``Answer:`` marker after the think block (to the end
  of the response, stripped); before ``</think>`` nothing counts as the answer.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["Span", "ParsedResponse", "parse_response", "START_MARKERS", "END_MARKERS"]

START_MARKERS = ("<|start_recall|>", "<recall>")
END_MARKERS = ("<|end_recall|>", "</recall>")
_MARKERS = ("<|start_recall|>", "<|end_recall|>", "<recall>", "</recall>", "<think>", "</think>")
_ANSWER = re.compile(r"(?:\*\*)?\banswer(?:\*\*)?\s*:(?:\*\*)?", re.IGNORECASE)


class Span(NamedTuple):
    """A complete recall span: ``text`` is the content between its delimiters, ``start:end``
    its character offsets in the response."""

    text: str
    start: int
    end: int
    in_think: bool


class ParsedResponse(NamedTuple):
    spans: tuple[Span, ...]
    n_start: int  # recall start markers
    n_end: int  # recall end markers
    n_think_end: int  # </think> markers
    n_stray_think: int  # <think> markers other than a leading one
    think_end: int | None  # offset of the first </think>, None if the block never closes
    n_answers: int  # Answer: markers after the think block
    answer: str | None  # text after the last of them
    n_markers_after_think: int  # recall markers (start or end) after the think block

    @property
    def n_spans(self) -> int:
        return len(self.spans)


_MARKER_RE = re.compile("|".join(re.escape(m) for m in _MARKERS))


def _markers(text: str):
    """(offset, marker) of every marker, left to right. One alternation of literals: the regex
    engine tries each at every ``<`` and never backtracks, so this is linear in the text (a run
    of 40K ``<`` is as cheap as ordinary text)."""
    for m in _MARKER_RE.finditer(text):
        yield m.start(), m.group()


def parse_response(text: str) -> ParsedResponse:
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    leading_think = len(text) - len(text.lstrip())
    spans: list[Span] = []
    n_start = n_end = n_think_end = n_stray = n_after = 0
    think_end: int | None = None
    open_at: int | None = None  # content offset of the open span
    for pos, tok in _markers(text):
        if tok in START_MARKERS:
            n_start += 1
            n_after += think_end is not None
            open_at = pos + len(tok)
        elif tok in END_MARKERS:
            n_end += 1
            n_after += think_end is not None
            if open_at is not None:
                inside = think_end is None
                spans.append(Span(text[open_at:pos], open_at, pos, inside))
                open_at = None
        elif tok == "</think>":
            n_think_end += 1
            if think_end is None:
                think_end = pos
        elif pos != leading_think:  # <think> anywhere but at the very start
            n_stray += 1
    answer, n_answers = None, 0
    if think_end is not None:
        after = text[think_end + len("</think>") :]
        markers = list(_ANSWER.finditer(after))
        n_answers = len(markers)
        if markers:
            answer = after[markers[-1].end() :].strip()
    return ParsedResponse(
        spans=tuple(spans),
        n_start=n_start,
        n_end=n_end,
        n_think_end=n_think_end,
        n_stray_think=n_stray,
        think_end=think_end,
        n_answers=n_answers,
        answer=answer,
        n_markers_after_think=n_after,
    )

"""Recall spans of a token sequence, and whether each is a verbatim copy of its context.

Verbatim is judged by the matcher itself (the one definition): a span is verbatim when every
token inside it was in the allowed set decoding would have used at that point, i.e. the span
is a contiguous copy of its searchable context and no longer than ``max_recall_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recallm.recall.matcher import iter_allowed_sets

__all__ = ["RecallSpan", "find_spans"]


@dataclass(frozen=True)
class RecallSpan:
    """One span: ``ids[start]`` is the start token, ``ids[start+1:stop]`` its content, and
    ``ids[stop]`` the end token when ``closed``."""

    start: int
    stop: int
    closed: bool
    verbatim: bool
    tokens: tuple[int, ...]

    @property
    def context_length(self) -> int:
        """Length of the span's searchable context (everything before its start token)."""
        return self.start


def find_spans(ids, start_id: int, end_id: int, *, max_recall_tokens: int = 128) -> list[RecallSpan]:
    """All recall spans of ``ids`` in order, each marked verbatim or not."""
    arr = np.asarray(ids, dtype=np.int64).ravel()
    spans: list[RecallSpan] = []
    current: int | None = None  # start position of the open span
    ok = True
    for t, allowed in iter_allowed_sets(arr, start_id, end_id, max_recall_tokens=max_recall_tokens):
        if current is None:  # the first position of a span is its start token
            current, ok = t, True
        if t + 1 == arr.size:  # the sequence ends inside the span
            spans.append(_span(arr, current, arr.size, False, ok))
            current = None
        elif arr[t + 1] == end_id:
            spans.append(_span(arr, current, t + 1, True, ok))
            current = None
        elif not np.any(allowed == arr[t + 1]):
            ok = False
    return spans


def _span(arr: np.ndarray, start: int, stop: int, closed: bool, ok: bool) -> RecallSpan:
    return RecallSpan(
        start=int(start), stop=int(stop), closed=closed, verbatim=ok, tokens=tuple(arr[start + 1 : stop].tolist())
    )

"""Independent reference implementations used by the tests (deliberately naive)."""

from __future__ import annotations


def reference_allowed(seq, start_id: int, end_id: int, max_recall_tokens: int = 128):
    """Allowed set after ``seq`` straight from the definition (paper §3.1 + DESIGN.md), or None
    outside spans. O(context x span) per call."""
    seq = [int(t) for t in seq]
    open_at = -1
    for i, tok in enumerate(seq):
        if open_at < 0:
            if tok == start_id:
                open_at = i
        elif tok == end_id:
            open_at = -1
    if open_at < 0:
        return None
    context, prefix = seq[:open_at], seq[open_at + 1 :]
    k = len(prefix)
    if k >= max_recall_tokens or start_id in prefix:
        return {end_id}
    allowed = {context[i + k] for i in range(len(context) - k) if context[i : i + k] == prefix}
    allowed.discard(start_id)
    allowed.add(end_id)
    return allowed


def contains(haystack, needle) -> bool:
    """Is ``needle`` a contiguous sub-sequence of ``haystack``?"""
    haystack, needle = list(haystack), list(needle)
    n = len(needle)
    return any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def reference_spans(seq, start_id: int, end_id: int):
    """(start index, content) of every span, found by scanning for the delimiter tokens."""
    spans, open_at = [], -1
    for i, tok in enumerate(seq):
        if open_at < 0:
            if tok == start_id:
                open_at = i
        elif tok == end_id:
            spans.append((open_at, list(seq[open_at + 1 : i])))
            open_at = -1
    if open_at >= 0:
        spans.append((open_at, list(seq[open_at + 1 :])))
    return spans

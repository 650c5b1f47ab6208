"""The recall matcher: the one implementation of the allowed set inside recall spans.

Definitions (paper §3.1, DESIGN.md "One searchable context everywhere"):

* A recall span opens with ``<|start_recall|>`` and closes with ``<|end_recall|>``.
* The *searchable context* ``c`` of a span is every token of the sequence before the span's
  start token: the prompt, everything generated so far, earlier spans and their delimiter
  tokens included; the start token itself and the span's own tokens excluded.
* With ``r`` the ``k`` tokens emitted inside the span so far, the allowed set is
  ``{c[i+k] : c[i:i+k] == r, i+k < len(c)}`` plus the end token. The start token is never
  allowed inside a span. After ``max_recall_tokens`` tokens only the end token is allowed,
  and so it is when no occurrence of ``r`` can be continued.
* Outside spans nothing is constrained (``allowed_ids()`` returns ``None``).

A token that is not in the allowed set (teacher-forced data that is not verbatim, or a caller
that did not apply the mask) leaves no surviving occurrence: from then on only the end token
is allowed. The same rule serves decoding and the training-time mask, so both always agree.

Implementation (App. B.1): a token -> positions index over the context is built once and
extended as the sequence grows (outside spans a new token is one array write). At the first
token of a span the survivors are that token's positions; every later token filters the
survivors, so per-step work is proportional to the number of survivors, not to the context.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np

__all__ = ["RecallMatcher", "iter_allowed_sets"]

_TOKEN_DTYPE = np.int32
_EMPTY = np.empty(0, dtype=np.int64)


class _PositionIndex:
    """token -> ascending positions, over a growing prefix of a token buffer.

    A sorted base (one ``np.sort`` of ``token * n + position`` keys) plus a small tail of
    positions appended since the last rebuild; the base is rebuilt when the tail grows past
    half of it, so extension is amortised O(1) per token.
    """

    __slots__ = ("indexed", "_base_n", "_base_tokens", "_base_positions", "_tail")

    def __init__(self) -> None:
        self.indexed = 0  # buffer[:indexed] is indexed
        self._base_n = 0
        self._base_tokens = np.empty(0, dtype=np.int64)
        self._base_positions = np.empty(0, dtype=np.int64)
        self._tail: dict[int, list[int]] = {}

    def extend(self, buffer: np.ndarray, upto: int) -> None:
        if upto <= self.indexed:
            return
        new = upto - self.indexed
        tail_len = self.indexed - self._base_n
        if tail_len + new > max(2048, self._base_n // 2):
            self._rebuild(buffer, upto)
            return
        tail = self._tail
        for pos, tok in enumerate(buffer[self.indexed : upto].tolist(), start=self.indexed):
            lst = tail.get(tok)
            if lst is None:
                tail[tok] = [pos]
            else:
                lst.append(pos)
        self.indexed = upto

    def _rebuild(self, buffer: np.ndarray, upto: int) -> None:
        tokens = buffer[:upto].astype(np.int64)
        keys = np.sort(tokens * upto + np.arange(upto, dtype=np.int64))
        self._base_tokens = keys // upto
        self._base_positions = keys - self._base_tokens * upto
        self._base_n = upto
        self._tail = {}
        self.indexed = upto

    def positions(self, token: int) -> np.ndarray:
        """Ascending positions of ``token`` in the indexed prefix."""
        lo = int(np.searchsorted(self._base_tokens, token, side="left"))
        hi = int(np.searchsorted(self._base_tokens, token, side="right"))
        base = self._base_positions[lo:hi]
        tail = self._tail.get(token)
        if tail:
            return np.concatenate((base, np.asarray(tail, dtype=np.int64)))
        return base


class RecallMatcher:
    """Recall-span state of one sequence, fed token by token (or in bulk).

    Args:
        start_id: id of ``<|start_recall|>``.
        end_id: id of ``<|end_recall|>``.
        max_recall_tokens: tokens allowed inside one span before only the end token is.
        vocab_size: if given, token ids are checked against it.
    """

    def __init__(
        self,
        start_id: int,
        end_id: int,
        *,
        max_recall_tokens: int = 128,
        vocab_size: int | None = None,
    ) -> None:
        start_id, end_id = int(start_id), int(end_id)
        if start_id < 0 or end_id < 0:
            raise ValueError(f"recall token ids must be non-negative, got start={start_id} end={end_id}")
        if start_id == end_id:
            raise ValueError(f"recall start and end token ids must differ, both are {start_id}")
        if vocab_size is not None and max(start_id, end_id) >= vocab_size:
            raise ValueError(
                f"recall token ids start={start_id} end={end_id} are out of range for vocab size {vocab_size}"
            )
        if max_recall_tokens < 0:
            raise ValueError(f"max_recall_tokens must be >= 0, got {max_recall_tokens}")
        self.start_id = start_id
        self.end_id = end_id
        self.max_recall_tokens = int(max_recall_tokens)
        self.vocab_size = vocab_size
        self._buf = np.empty(1024, dtype=_TOKEN_DTYPE)
        self._n = 0
        self._index = _PositionIndex()
        self._present = np.zeros(max(start_id, end_id) + 1 if vocab_size is None else vocab_size, dtype=bool)
        self._span_start = -1  # buffer position of the open span's start token, -1 outside spans
        self._span_len = 0
        self._cand: np.ndarray | None = None  # survivors: positions p with c[p-k:p] == span so far
        self._cand_tokens: np.ndarray = _EMPTY  # c[cand], the continuations

    # ------------------------------------------------------------------ state
    @property
    def in_span(self) -> bool:
        """True when the next token is generated inside a recall span."""
        return self._span_start >= 0

    @property
    def span_length(self) -> int:
        """Tokens emitted inside the open span so far (0 right after the start token)."""
        return self._span_len if self._span_start >= 0 else 0

    @property
    def context_length(self) -> int:
        """Length of the open span's searchable context (the whole sequence outside spans)."""
        return self._span_start if self._span_start >= 0 else self._n

    @property
    def num_candidates(self) -> int:
        """Surviving occurrences of the span so far (context length right after the start token)."""
        if self._span_start < 0:
            return 0
        return self._span_start if self._cand is None else int(self._cand.size)

    def __len__(self) -> int:
        return self._n

    def tokens(self) -> np.ndarray:
        """The sequence fed so far (a read-only view)."""
        view = self._buf[: self._n]
        view.flags.writeable = False
        return view

    # ---------------------------------------------------------------- feeding
    def _reserve(self, extra: int) -> None:
        need = self._n + extra
        if need > self._buf.size:
            new = np.empty(max(need, 2 * self._buf.size), dtype=_TOKEN_DTYPE)
            new[: self._n] = self._buf[: self._n]
            self._buf = new

    def _check_ids(self, arr: np.ndarray) -> None:
        if arr.size == 0:
            return
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or (self.vocab_size is not None and hi >= self.vocab_size):
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} is out of range for vocab size {self.vocab_size}")

    def feed(self, tokens: Iterable[int] | np.ndarray) -> None:
        """Append tokens. Outside spans a whole stretch is appended in one copy."""
        arr = np.asarray(tokens if isinstance(tokens, np.ndarray) else list(tokens), dtype=np.int64).ravel()
        self._check_ids(arr)
        i, n = 0, arr.size
        while i < n:
            if self._span_start >= 0:
                self._span_token(int(arr[i]))
                i += 1
                continue
            hits = np.flatnonzero(arr[i:] == self.start_id)
            j = n if hits.size == 0 else i + int(hits[0]) + 1  # stretch ends after the start token
            self._reserve(j - i)
            self._buf[self._n : self._n + (j - i)] = arr[i:j]
            self._n += j - i
            if hits.size:
                self._open_span()
            i = j

    def feed_one(self, token: int) -> None:
        """Append one token (the decoding fast path; same semantics as ``feed``)."""
        token = int(token)
        if token < 0 or (self.vocab_size is not None and token >= self.vocab_size):
            raise ValueError(f"token id {token} is out of range for vocab size {self.vocab_size}")
        if self._span_start >= 0:
            self._span_token(token)
            return
        if self._n == self._buf.size:
            self._reserve(1)
        self._buf[self._n] = token
        self._n += 1
        if token == self.start_id:
            self._open_span()

    def index_now(self) -> None:
        """Index the context fed so far now (e.g. at prefill) instead of when the next span opens;
        outside a span this is everything fed, inside one its searchable context."""
        self._extend_index(self.context_length)

    def _extend_index(self, upto: int) -> None:
        idx = self._index
        if upto > idx.indexed:
            new = self._buf[idx.indexed : upto]
            top = int(new.max())
            if top >= self._present.size:
                grown = np.zeros(top + 1, dtype=bool)
                grown[: self._present.size] = self._present
                self._present = grown
            self._present[new] = True
            idx.extend(self._buf, upto)

    def _open_span(self) -> None:
        ctx = self._n - 1  # the start token just appended is not part of the context
        self._span_start = ctx
        self._span_len = 0
        self._cand = None
        self._cand_tokens = _EMPTY
        self._extend_index(ctx)

    def _span_token(self, token: int) -> None:
        if self._n == self._buf.size:
            self._reserve(1)
        self._buf[self._n] = token
        self._n += 1
        if token == self.end_id:
            self._span_start = -1
            self._cand = None
            self._cand_tokens = _EMPTY
            return
        self._span_len += 1
        ctx = self._span_start
        if token == self.start_id or self._span_len > self.max_recall_tokens:
            cand = _EMPTY  # never allowed: nothing survives, only the end token from now on
        elif self._cand is None:  # first token of the span
            cand = self._index.positions(token) + 1
        else:
            cand = self._cand[self._cand_tokens == token] + 1
        if cand.size and cand[-1] >= ctx:  # ascending, so only the last can run off the context
            cand = cand[:-1]
        self._cand = cand
        self._cand_tokens = self._buf[cand]

    # ----------------------------------------------------------- allowed set
    def _only_end(self) -> bool:
        return self._span_len >= self.max_recall_tokens or (self._cand is not None and self._cand.size == 0)

    def allowed_ids(self) -> np.ndarray | None:
        """Sorted allowed token ids for the next token, or ``None`` outside spans."""
        if self._span_start < 0:
            return None
        if self._only_end():
            return np.array([self.end_id], dtype=np.int64)
        if self._cand is None:
            ids = np.flatnonzero(self._present)
        else:
            ids = np.unique(self._cand_tokens)
        ids = ids[ids != self.start_id]
        pos = int(np.searchsorted(ids, self.end_id))
        if pos < ids.size and ids[pos] == self.end_id:
            return ids.astype(np.int64, copy=False)
        return np.insert(ids, pos, self.end_id).astype(np.int64, copy=False)

    def allowed_tokens(self) -> np.ndarray | None:
        """Allowed ids for the next token, unsorted and possibly repeated (cheapest form).

        Always contains the end token; never the start token. ``None`` outside spans.
        """
        if self._span_start < 0:
            return None
        if self._only_end():
            return np.array([self.end_id], dtype=np.int64)
        ids = np.flatnonzero(self._present) if self._cand is None else self._cand_tokens
        if self.start_id < self._present.size and self._present[self.start_id]:
            ids = ids[ids != self.start_id]
        return np.append(ids, self.end_id)

    def continuation(self, limit: int) -> list[int]:
        """The tokens decoding inside the open span must produce next unless it closes the span: the
        continuation every surviving occurrence shares (at most ``limit`` tokens; a speculative
        decoder's draft). Where only the end token remains allowed (``max_recall_tokens`` reached, no
        occurrence left to continue, or every occurrence continues with the start token) the draft ends
        with the end token. Empty outside spans and right after the start token (the first token of a
        span may be any token of the context). The matcher is not changed."""
        if self._span_start < 0 or limit < 1:
            return []
        if self._only_end():
            return [self.end_id]
        if self._cand is None:
            return []
        out: list[int] = []
        ctx, length = self._span_start, self._span_len
        alive, tokens = self._cand, self._cand_tokens
        while len(out) < limit:
            if length + len(out) >= self.max_recall_tokens or alive.size == 0:
                out.append(self.end_id)
                break
            first = int(tokens[0])
            if tokens.size > 1 and not (tokens == first).all():
                break  # the occurrences part: which one the model continues is its choice
            if first == self.start_id:
                out.append(self.end_id)
                break
            out.append(first)
            alive = alive + 1
            if alive[-1] >= ctx:  # ascending: only the last can run off the context
                alive = alive[:-1]
            tokens = self._buf[alive]
        return out

    def fill_mask_row(self, row: np.ndarray) -> bool:
        """Write the allowed set into a vocab-sized boolean ``row`` (True = allowed).

        Returns False (and leaves ``row`` untouched) outside spans, where nothing is masked.
        """
        if self._span_start < 0:
            return False
        if self._only_end():
            row[:] = False
        elif self._cand is None:
            n = min(row.size, self._present.size)
            row[:n] = self._present[:n]
            row[n:] = False
        else:
            row[:] = False
            row[self._cand_tokens] = True
        row[self.start_id] = False
        row[self.end_id] = True
        return True


def iter_allowed_sets(
    tokens: Sequence[int] | np.ndarray,
    start_id: int,
    end_id: int,
    *,
    max_recall_tokens: int = 128,
    vocab_size: int | None = None,
) -> Iterator[tuple[int, np.ndarray]]:
    """Teacher forcing: yield ``(t, allowed)`` for every position ``t`` whose *next* token is
    constrained, where ``allowed`` is what decoding would allow after ``tokens[:t+1]``
    (the ``allowed_tokens()`` form: unsorted, may repeat). Stretches outside spans are fed in
    bulk; inside spans the matcher advances one token at a time, exactly as in decoding.
    """
    arr = np.asarray(tokens, dtype=np.int64).ravel()
    m = RecallMatcher(start_id, end_id, max_recall_tokens=max_recall_tokens, vocab_size=vocab_size)
    m._check_ids(arr)
    starts = np.flatnonzero(arr == m.start_id)
    t, n = 0, arr.size
    while t < n:
        # outside a span: feed in bulk up to and including the next start token
        k = int(np.searchsorted(starts, t))
        if k == starts.size:
            return  # no further span: nothing left to constrain
        s = int(starts[k])
        m.feed(arr[t : s + 1])
        yield s, m.allowed_tokens()
        # inside the span: one token at a time, as in decoding
        t = s + 1
        while t < n and m.in_span:
            m.feed_one(int(arr[t]))
            if m.in_span:
                yield t, m.allowed_tokens()
            t += 1

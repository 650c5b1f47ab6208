"""The matcher against the definition, token by token, on random sequences."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from recallm.recall.matcher import RecallMatcher, iter_allowed_sets
from tests.reference import reference_allowed

S, E = 0, 1  # start / end token ids in these tests

sequences = st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=60)
max_tokens = st.integers(min_value=0, max_value=8)


@given(sequences, max_tokens)
def test_feed_one_matches_definition(seq, max_recall):
    m = RecallMatcher(S, E, max_recall_tokens=max_recall, vocab_size=6)
    for i, tok in enumerate(seq):
        m.feed_one(tok)
        expected = reference_allowed(seq[: i + 1], S, E, max_recall)
        got = m.allowed_ids()
        assert (got is None) == (expected is None)
        assert m.in_span == (expected is not None)
        if expected is not None:
            assert set(got.tolist()) == expected
            assert list(got) == sorted(got)  # sorted, unique
            assert set(m.allowed_tokens().tolist()) == expected
            row = np.zeros(6, dtype=bool)
            assert m.fill_mask_row(row)
            assert set(np.flatnonzero(row).tolist()) == expected
        else:
            assert m.allowed_tokens() is None
            assert not m.fill_mask_row(np.zeros(6, dtype=bool))


@given(sequences, max_tokens, st.data())
def test_bulk_feed_equals_token_by_token(seq, max_recall, data):
    cut = data.draw(st.integers(min_value=0, max_value=len(seq)))
    a = RecallMatcher(S, E, max_recall_tokens=max_recall)
    b = RecallMatcher(S, E, max_recall_tokens=max_recall)
    a.feed(seq[:cut])
    a.feed(seq[cut:])
    for tok in seq:
        b.feed_one(tok)
    ga, gb = a.allowed_ids(), b.allowed_ids()
    assert (ga is None) == (gb is None)
    if ga is not None:
        assert ga.tolist() == gb.tolist()
    assert a.tokens().tolist() == list(seq)


@given(sequences, max_tokens)
def test_teacher_forcing_matches_definition(seq, max_recall):
    got = {t: set(a.tolist()) for t, a in iter_allowed_sets(seq, S, E, max_recall_tokens=max_recall)}
    expected = {
        i: reference_allowed(seq[: i + 1], S, E, max_recall)
        for i in range(len(seq))
        if reference_allowed(seq[: i + 1], S, E, max_recall) is not None
    }
    assert got == expected


def test_long_sequence_index_rebuilds_and_tail():
    """Thousands of tokens with spans spread out: exercises the sorted base, the tail and rebuilds."""
    rng = np.random.default_rng(0)
    vocab = 50
    seq: list[int] = list(rng.integers(2, vocab, size=3000))
    m = RecallMatcher(S, E, max_recall_tokens=16, vocab_size=vocab)
    m.feed(seq)
    for _round in range(40):
        # a span copying a random stretch of the context, then some free text
        m.feed_one(S)
        seq.append(S)
        src = int(rng.integers(0, len(seq) - 20))
        for tok in seq[src : src + int(rng.integers(1, 10))]:
            allowed = m.allowed_ids()
            assert set(allowed.tolist()) == reference_allowed(seq, S, E, 16)
            assert tok in allowed or tok == S
            if tok == S:
                break
            m.feed_one(tok)
            seq.append(tok)
        m.feed_one(E)
        seq.append(E)
        free = rng.integers(2, vocab, size=int(rng.integers(1, 400))).tolist()
        m.feed(free)
        seq.extend(free)
    assert m.tokens().tolist() == seq


def test_start_of_span_allows_every_context_token_but_start():
    m = RecallMatcher(S, E, vocab_size=10)
    m.feed([5, 6, S, 7, E, 8, S])
    assert m.in_span and m.span_length == 0 and m.context_length == 6
    # context = 5 6 S 7 E 8: every token except the start token, plus the end token
    assert m.allowed_ids().tolist() == [E, 5, 6, 7, 8]
    m.feed_one(8)  # last context token: nothing can continue it
    assert m.allowed_ids().tolist() == [E]


def test_span_never_copies_from_itself():
    # the span's own tokens are not part of its searchable context
    m = RecallMatcher(S, E)
    m.feed([4, 5, S, 4])
    assert m.allowed_ids().tolist() == [E, 5]
    m.feed_one(5)
    assert m.allowed_ids().tolist() == [E]


def test_earlier_spans_and_generation_are_searchable():
    m = RecallMatcher(S, E)
    m.feed([4, 5, S, 4, 5, E, 9, 9, 3, S, 9])
    assert set(m.allowed_ids().tolist()) == {E, 9, 3}


def test_max_recall_tokens_only_end():
    m = RecallMatcher(S, E, max_recall_tokens=2)
    m.feed([4, 4, 4, 4, S, 4, 4])
    assert m.allowed_ids().tolist() == [E]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(start_id=3, end_id=3), "must differ"),
        (dict(start_id=-1, end_id=3), "non-negative"),
        (dict(start_id=3, end_id=10, vocab_size=10), "out of range"),
        (dict(start_id=3, end_id=4, max_recall_tokens=-1), "max_recall_tokens"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RecallMatcher(**kwargs)


def test_token_out_of_range():
    m = RecallMatcher(S, E, vocab_size=8)
    with pytest.raises(ValueError, match="token id 8 is out of range for vocab size 8"):
        m.feed([2, 8])
    with pytest.raises(ValueError, match="token id -3"):
        m.feed_one(-3)


@given(sequences, max_tokens, st.data())
def test_eager_index_changes_nothing(seq, max_recall, data):
    cut = data.draw(st.integers(min_value=0, max_value=len(seq)))
    a = RecallMatcher(S, E, max_recall_tokens=max_recall)
    b = RecallMatcher(S, E, max_recall_tokens=max_recall)
    a.feed(seq[:cut])
    a.index_now()
    b.feed(seq[:cut])
    for tok in seq[cut:]:
        a.feed_one(tok)
        b.feed_one(tok)
        ga, gb = a.allowed_ids(), b.allowed_ids()
        assert (ga is None) == (gb is None)
        if ga is not None:
            assert ga.tolist() == gb.tolist()


@given(sequences, max_tokens, st.integers(min_value=1, max_value=12))
def test_continuation_is_what_the_allowed_sets_force(seq, max_recall, limit):
    """``continuation`` (a speculative decoder's draft inside a span): fed token by token, each drafted
    token is allowed, and it is the only allowed token besides the end token (the end token, drafted
    last, only when it is the only one); the draft stops where the definition leaves a choice; the
    matcher is unchanged by asking."""
    m = RecallMatcher(S, E, max_recall_tokens=max_recall, vocab_size=6)
    for tok in seq:
        m.feed_one(tok)
    before = (m.in_span, m.span_length, m.num_candidates, len(m), m.allowed_tokens() is None)
    draft = m.continuation(limit)
    assert (m.in_span, m.span_length, m.num_candidates, len(m), m.allowed_tokens() is None) == before
    if not m.in_span:
        assert draft == []
        return
    assert len(draft) <= limit
    prefix = list(seq)
    for i, tok in enumerate(draft):
        allowed = reference_allowed(prefix, S, E, max_recall)
        assert allowed is not None and tok in allowed
        if tok == E:
            assert allowed == {E} and i == len(draft) - 1
        else:
            assert allowed == {tok, E}
        prefix.append(tok)
    first_token = m.span_length == 0 and not draft  # the span's first token: any context token, no draft
    if len(draft) < limit and (not draft or draft[-1] != E) and not first_token:
        assert len(reference_allowed(prefix, S, E, max_recall) - {E}) > 1  # stopped at a choice

"""Interval-F1 recall reward and its penalties, against hand-computed values."""

from __future__ import annotations

import pytest

from rewards.recall import (
    GoldPassage,
    correctness_penalty,
    density_penalty,
    interval_f1,
    locate_gold,
    recall_overlap,
    span_gold_f1,
)


def test_interval_f1():
    assert interval_f1(10, 30, 20, 40) == pytest.approx(2 * 10 / (20 + 20))  # 0.5
    assert interval_f1(10, 30, 10, 30) == 1.0
    assert interval_f1(10, 30, 30, 40) == 0.0  # touching, not overlapping
    assert interval_f1(0, 100, 40, 50) == pytest.approx(2 * 10 / 110)


def test_best_occurrence_per_gold():
    prompt = "xx abc yy abc zz"
    # "abc" occurs at 3 and 10; gold [9, 14) = " abc " contains the second one
    assert span_gold_f1(prompt, "abc", 9, 14) == pytest.approx(2 * 3 / (5 + 3))
    # gold [0, 5) = "xx ab" overlaps the first occurrence by 2 characters
    assert span_gold_f1(prompt, "abc", 0, 5) == pytest.approx(2 * 2 / (5 + 3))
    assert span_gold_f1(prompt, "nope", 0, 16) == 0.0


def test_overlap_tau_and_top_k():
    prompt = "AAAAAAAAAA BBBBBBBBBB CCCCCCCCCC"
    golds = [GoldPassage("AAAAAAAAAA", 0, 10), GoldPassage("BBBBBBBBBB", 11, 21), GoldPassage("CCCCCCCCCC", 22, 32)]
    spans = ["AAAAAAAAAA", "BBBB"]  # F1: A 1.0; B 2*4/14 = 0.5714; C 0
    tau = 0.5
    per_gold = [min(1.0, tau) / tau, min(8 / 14, tau) / tau, 0.0]  # 1, 1, 0
    assert recall_overlap(prompt, spans, golds, tau=tau) == pytest.approx(sum(per_gold) / 3)
    assert recall_overlap(prompt, spans, golds, tau=0.9) == pytest.approx((1 + (8 / 14) / 0.9 + 0) / 3)
    assert recall_overlap(prompt, spans, golds, tau=0.9, top_k=1) == pytest.approx(1.0)
    assert recall_overlap(prompt, spans, golds, tau=0.9, top_k=2) == pytest.approx((1 + (8 / 14) / 0.9) / 2)
    assert recall_overlap(prompt, spans, golds, tau=0.9, top_k=10) == pytest.approx((1 + (8 / 14) / 0.9) / 3)
    assert recall_overlap(prompt, [], golds, tau=0.9) == 0.0
    assert recall_overlap(prompt, ["  AAAAAAAAAA\n"], golds[:1], tau=1.0) == 1.0  # edge whitespace ignored


def test_gold_relocated_or_error():
    prompt = "zz the gold text here"
    assert locate_gold(prompt, GoldPassage("gold text", 7, 16)) == (7, 16)
    assert locate_gold(prompt, GoldPassage("gold text", 5, 14)) == (7, 16)  # shifted offsets
    with pytest.raises(ValueError, match="does not occur in the prompt"):
        locate_gold(prompt, GoldPassage("missing", 0, 7))


def test_density_penalty():
    # 10 spans in 512 tokens, 2 free: d = 8 / 0.5 = 16 -> 0.5 ** ((16 - 4) / 4) = 0.125
    assert density_penalty(10, 512, free_spans=2) == pytest.approx(0.125)
    # 6 spans in 1024 tokens, 2 free: d = 4 -> no penalty
    assert density_penalty(6, 1024, free_spans=2) == 1.0
    # 8 spans in 1024 tokens, 2 free: d = 6 -> 0.5 ** (2 / 4)
    assert density_penalty(8, 1024, free_spans=2) == pytest.approx(0.5**0.5)
    assert density_penalty(1, 0, free_spans=2) == 1.0  # fewer spans than free
    assert density_penalty(3, 0, free_spans=2) == pytest.approx(0.5 ** ((1024 - 4) / 4))  # 0 tokens counts as 1


def test_correctness_penalty():
    assert correctness_penalty(1, 1, 4) == 0.0  # 1 - 2/2
    assert correctness_penalty(1, 0, 16) == pytest.approx(0.75)  # 1 - 1/4
    assert correctness_penalty(0, 0, 0) == 1.0
    assert correctness_penalty(0, 3, 0) == 1.0  # no complete span: 1 (the authors' release)
    assert correctness_penalty(0, 3, 1) == 0.0  # clamped


def _brute_overlap(prompt, spans, golds, tau, top_k):
    """Eq. 4-5 by enumerating every occurrence of every span in the whole prompt."""
    scores = []
    for g in golds:
        best = 0.0
        for s in spans:
            s = s.strip(" \t\r\n\ufffd")
            if not s:
                continue
            for pos in range(len(prompt) - len(s) + 1):
                if prompt[pos : pos + len(s)] == s:
                    best = max(best, interval_f1(g.start, g.end, pos, pos + len(s)))
        scores.append(min(best, tau) / tau)
    if top_k:
        scores = sorted(scores, reverse=True)[: min(top_k, len(scores))]
    return sum(scores) / len(scores)


from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rewards.recall import recall_overlap_detail  # noqa: E402


@given(
    prompt=st.text(alphabet="ab c", min_size=1, max_size=60),
    data=st.data(),
    tau=st.sampled_from([0.4, 0.7, 0.9, 1.0]),
    top_k=st.sampled_from([None, 1, 2]),
)
def test_overlap_equals_brute_force(prompt, data, tau, top_k):
    golds = []
    for _ in range(data.draw(st.integers(1, 3))):
        a = data.draw(st.integers(0, len(prompt) - 1))
        b = data.draw(st.integers(a + 1, len(prompt)))
        golds.append(GoldPassage(prompt[a:b], a, b))
    spans = []
    for _ in range(data.draw(st.integers(0, 4))):
        a = data.draw(st.integers(0, len(prompt)))
        b = data.draw(st.integers(a, len(prompt)))
        spans.append(prompt[a:b] if data.draw(st.booleans()) else data.draw(st.text(alphabet="abcz ", max_size=5)))
    detail = recall_overlap_detail(prompt, spans, golds, tau=tau, top_k=top_k)
    assert detail.overlap == pytest.approx(_brute_overlap(prompt, spans, golds, tau, top_k))
    assert detail.spans_in_prompt == sum(bool(t) and t in prompt for t in (s.strip(" \t\r\n\ufffd") for s in spans))
    for g in golds:
        for s in spans:
            t = s.strip(" \t\r\n\ufffd")
            if t:
                assert span_gold_f1(prompt, t, g.start, g.end) == pytest.approx(
                    _brute_overlap(prompt, [t], [g], 1.0, None)
                )

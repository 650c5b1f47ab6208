"""Parsing responses: think block, spans, answer; never raises."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rewards.parsing import parse_response


def test_well_formed():
    r = "I look. <|start_recall|>18: kuri<|end_recall|> then <recall>doc two</recall> ok</think>\nAnswer: kuri"
    p = parse_response(r)
    assert [s.text for s in p.spans] == ["18: kuri", "doc two"]
    assert all(s.in_think for s in p.spans)
    assert r[p.spans[0].start : p.spans[0].end] == "18: kuri"
    assert (p.n_start, p.n_end, p.n_think_end, p.n_stray_think, p.n_answers) == (2, 2, 1, 0, 1)
    assert p.answer == "kuri" and p.n_markers_after_think == 0


def test_missing_think_end_means_no_answer():
    p = parse_response("thinking <|start_recall|>abc<|end_recall|> Answer: x")
    assert p.think_end is None and p.answer is None and p.n_answers == 0
    assert p.spans[0].in_think


def test_nested_and_unpaired_markers():
    p = parse_response("<|start_recall|>a <|start_recall|>bcdef<|end_recall|> <|end_recall|> x</think>Answer: y")
    assert [s.text for s in p.spans] == ["bcdef"]  # innermost pairing
    assert (p.n_start, p.n_end) == (2, 2)
    p = parse_response("<|end_recall|><|start_recall|>never closed")
    assert p.spans == () and (p.n_start, p.n_end) == (1, 1)


def test_several_answers_stray_think_and_markers_after_think():
    p = parse_response("<think>\nreason <think> more</think>\nAnswer: 1\nAnswer: 2 <|start_recall|>x<|end_recall|>")
    assert p.n_stray_think == 1  # the leading <think> is the opening one
    assert p.n_answers == 2 and p.answer.startswith("2")
    assert p.n_markers_after_think == 2 and not p.spans[0].in_think


def test_answer_marker_variants():
    assert parse_response("</think>\n**Answer:** Paris").answer == "Paris"
    assert parse_response("</think>\nfinal answer: Paris").answer == "Paris"
    assert parse_response("</think>\nthe answerer said Paris").answer is None


def test_empty_and_non_string():
    for r in ("", None, 12):
        p = parse_response(r)
        assert p.spans == () and p.answer is None


soup = st.lists(
    st.sampled_from(
        [
            "<|start_recall|>",
            "<|end_recall|>",
            "<recall>",
            "</recall>",
            "<think>",
            "</think>",
            "Answer:",
            "answer :",
            " ",
            "\n",
            "x",
            "Paris",
            "[1]",
            "\ufffd",
        ]
    )
    | st.text(max_size=8),
    max_size=40,
).map("".join)


@given(soup)
def test_token_soup_never_raises(text):
    p = parse_response(text)
    for s in p.spans:
        assert text[s.start : s.end] == s.text
    assert p.n_start >= len(p.spans) and p.n_end >= len(p.spans)

"""Scoring functions of recallm.eval against hand-computed cases."""

from __future__ import annotations

import pytest

from recallm.errors import RecallmError
from recallm.eval.scoring import (
    answer_region,
    close_open_span,
    final_answer,
    find_key,
    helmet_normalize,
    injection_prefix,
    ruler_postprocess,
    string_match_all,
    string_match_part,
    substring_exact_match,
    text_span_stats,
    value_follows,
)
from recallm.eval.types import GenerationSettings, parse_length

S, E = "<|start_recall|>", "<|end_recall|>"


def test_string_match_all_is_rulers_fraction_of_references():
    pred = "The special magic numbers are 1234567 and 7654321."
    assert string_match_all(pred, ["1234567", "7654321", "1111111"]) == pytest.approx(2 / 3)
    assert string_match_all(pred, ["1234567"]) == 1.0
    assert string_match_all(pred, ["9999999", "8888888"]) == 0.0
    # case-insensitive, and a plain substring test as in RULER (no word boundaries)
    assert string_match_all("answer: QWERT and asdfg", ["qwert", "ASDFG"]) == 1.0
    assert string_match_all("x123y", ["12"]) == 0.0  # not inside a longer alphanumeric run
    assert string_match_all("the numbers: 12, 7.", ["12", "7"]) == 1.0
    with pytest.raises(ValueError):
        string_match_all("x", [])


def test_string_match_part_is_one_if_any_reference_is_found():
    assert string_match_part("Paris is the capital", ["paris", "Lyon"]) == 1.0
    assert string_match_part("Paris is the capital", ["Lyon", "Nice"]) == 0.0
    assert string_match_part("PARIS", ["paris"]) == 1.0


def test_ruler_postprocess():
    assert ruler_postprocess("  a\x01b\tc \n") == "a\nb\nc"
    assert ruler_postprocess("\n\n keep  spaces \n") == "keep  spaces"


def test_helmet_substring_exact_match():
    assert helmet_normalize("The Value: A-b_c!") == "value abc"
    assert helmet_normalize("  An  apple ") == "apple"
    value = "09f93d4e-6d1a-46d9-993f-d20ab934ada5"
    assert substring_exact_match(f"The value is {value.upper()}.", [value]) == 1.0
    assert substring_exact_match("Answer: 09f93d4e-6d1a-46d9", value) == 0.0
    assert substring_exact_match("1234", ["12345"]) == 0.0
    assert substring_exact_match("12345", ["1234", "9"]) == 1.0


def test_answer_region_and_final_answer():
    out = "I look it up.</think>\nThe value.\nAnswer: kusose"
    assert answer_region(out) == "\nThe value.\nAnswer: kusose"
    assert answer_region("never closes Answer: x") == ""
    assert answer_region("no think Answer: x", "full") == "no think Answer: x"
    assert final_answer(out) == "kusose"
    assert final_answer("think</think>  kusose  ") == "kusose"
    assert final_answer("never closes Answer: x") is None
    assert final_answer("Answer: a\nAnswer: b", "full") == "b"
    assert final_answer("Answer: a", "after_think") is None
    with pytest.raises(ValueError):
        answer_region("x", "middle")


def test_find_key_matches_whole_numbers_only():
    m = find_key("so x = 4827, not 48270", "4827")
    assert m is not None and (m.start(), m.end()) == (7, 11)
    assert find_key("48270 and 14827 and 4827.5", "4827") is None
    assert find_key("x = -4827", "4827") is None
    assert find_key("key 4827:", "4827").start() == 4


def test_injection_prefix_is_the_entry_text_up_to_the_value():
    assert injection_prefix("lines", "4827") == "4827: "
    assert injection_prefix("csv", "4827") == "4827,"
    assert injection_prefix("json", "4827") == '"4827": "'
    from data_gen.tasks.kv import _Dictionary

    for fmt in ("lines", "csv", "json"):  # the prefix really is how the dictionary writes the entry
        assert _Dictionary.line(fmt, "4827", "h7x2mf9d3k").lstrip().startswith(injection_prefix(fmt, "4827"))


def test_close_open_span_and_value_follows():
    assert close_open_span(f"a {S}4827") == f"a {S}4827{E}"
    assert close_open_span(f"a {S}4827{E} 4827") == f"a {S}4827{E} 4827"
    assert close_open_span("plain 4827") == "plain 4827"
    assert value_follows("h7x2mf9d3k\n", "h7x2mf9d3k")
    assert value_follows(" \th7x2mf9d3k", "h7x2mf9d3k")
    assert not value_follows("\nh7x2mf9d3k", "h7x2mf9d3k")
    assert not value_follows("h7x2mf9c5a", "h7x2mf9d3k")
    assert not value_follows("anything", "")


def test_text_span_stats_judges_spans_against_their_searchable_context():
    prompt = "4827: h7x2mf9d3k\n4828: q1w2e3r4t5"
    output = (
        f"look {S}4827: h7x2mf9d3k{E} then "  # from the prompt: verbatim
        f"{S}then{E} "  # from the output before the span: verbatim
        f"{S}4827: q1w2e3r4t5{E} "  # stitched: not verbatim
        f"{S}unclosed"  # not a complete span
    )
    stats = text_span_stats(output, prompt)
    assert (stats.count, stats.verbatim, stats.source) == (3, 2, "text")
    # a span may not copy text that only comes after it
    assert text_span_stats(f"{S}later{E} later", "prompt").verbatim == 0
    assert text_span_stats("no spans", "p").count == 0


def test_parse_length():
    assert parse_length(4096, "x") == 4096
    assert parse_length("4K", "x") == 4096
    assert parse_length("128k", "x") == 131072
    assert parse_length("1000", "x") == 1000
    for bad in (0, -5, "abc", "4Q", True, "0k"):
        with pytest.raises(RecallmError, match="bad length|lengths must be positive"):
            parse_length(bad, "x")


def test_generation_settings_are_checked():
    assert GenerationSettings(max_new_tokens=8).greedy
    assert not GenerationSettings(max_new_tokens=8, temperature=0.6, top_p=0.95).greedy
    for bad in ({"max_new_tokens": 0}, {"max_new_tokens": 8, "top_p": 0.0}, {"max_new_tokens": 8, "temperature": 3}):
        with pytest.raises(RecallmError):
            GenerationSettings.from_mapping(bad)
    with pytest.raises(RecallmError, match="unknown keys"):
        GenerationSettings.from_mapping({"max_new_tokens": 8, "temprature": 0.6})
    with pytest.raises(RecallmError, match="max_new_tokens is required"):
        GenerationSettings.from_mapping({"temperature": 0.6})

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
    assert string_match_all("x123y", ["12"]) == 1.0  # RULER's plain substring test: inside a longer run counts
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
    from data_gen.tasks.kv import KVDictionary

    for fmt in ("lines", "csv", "json"):  # the prefix really is how the dictionary writes the entry
        assert KVDictionary.line(fmt, "4827", "h7x2mf9d3k").lstrip().startswith(injection_prefix(fmt, "4827"))


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


# --------------------------------------------------------------------------- HELMET's metrics


def test_helmet_parse_output_reads_after_the_prefix_else_the_first_line():
    from recallm.eval.scoring import helmet_parse_output

    assert helmet_parse_output("I think.\nANSWER: Paris \nmore") == "Paris"
    assert helmet_parse_output("first line\nsecond") == "first line"
    assert helmet_parse_output("label: label: 5\n", "label:") == "5"  # a repeated prefix is stripped again
    assert helmet_parse_output("Ranking: 3 > 1", "Ranking:") == "3 > 1"


def test_exact_match_token_f1_and_rouge_l_by_hand():
    from recallm.eval.scoring import exact_match, helmet_metrics, rouge_l, token_f1

    assert exact_match("The Paris!", ["paris"]) == 1.0 and exact_match("Paris France", ["paris"]) == 0.0
    assert exact_match("x", [["y", "X"]]) == 1.0  # alias lists are flattened
    # pred {cat, sat}, gold {cat, sat, down}: P = 1, R = 2/3, F1 = 0.8
    assert token_f1("the cat sat", ["a cat sat down", "dog"]) == pytest.approx(0.8)
    assert token_f1("yes it is", ["no"]) == 0.0 and token_f1("Yes.", ["yes"]) == 1.0
    # LCS(the cat sat on the mat, the cat is on the mat) = 5 of 6 tokens each way
    r = rouge_l("the cat sat on the mat", ["the cat is on the mat", "nothing"])
    assert r["rougeL_f1"] == pytest.approx(5 / 6) and r["rougeL_recall"] == pytest.approx(5 / 6)
    assert rouge_l("cats running", ["cat runs"])["rougeL_f1"] == pytest.approx(1.0)  # the Porter stemmer
    # each metric is the best over the readings of one output
    best = helmet_metrics(["The answer is Paris, surely.", "Paris"], ["paris"], rouge=False)
    assert best == {"exact_match": 1.0, "f1": 1.0, "substring_exact_match": 1.0}
    assert helmet_metrics([None], ["x"], rouge=False)["substring_exact_match"] == 0.0


def test_rankings_and_trec_ndcg_by_hand():
    import math

    from recallm.eval.scoring import parse_rankings, trec_ndcg

    assert parse_rankings("Ranking: [3] > [1] > 2, then 7 > 8") == {"3": 3.0, "1": 2.0, "2": 1.0}
    assert parse_rankings("ID3 > ID1 > ID3 > ID2") == {"3": 4.0, "1": 3.0, "2": 1.0}  # repeats keep their first place
    assert parse_rankings("no numbers") == {"no numbers": 1.0}  # no chain: matches nothing
    qrels = {"a": 0, "b": 2, "c": 1, "d": 3}
    dcg = 2 / math.log2(3) + 1 / math.log2(4)  # linear gains: a (0), b (2), c (1)
    ideal = 3 + 2 / math.log2(3) + 1 / math.log2(4)
    assert trec_ndcg({"a": 3, "b": 2, "c": 1}, qrels) == pytest.approx(dcg / ideal)
    assert trec_ndcg({"d": 3, "b": 2, "c": 1}, qrels) == pytest.approx(1.0)
    assert trec_ndcg({"b": 2, "d": 1}, qrels, k=1) == pytest.approx(2 / 3)
    # score ties are broken by document id, descending (trec_eval): b before a
    assert trec_ndcg({"a": 1, "b": 1}, {"a": 1}) == pytest.approx(1 / math.log2(3))
    assert trec_ndcg({"x": 1}, {"a": 0}) == 0.0


def test_alce_correctness_metrics_by_hand():
    from recallm.eval.scoring import asqa_str_em, qampari_scores, remove_citations

    assert remove_citations("Paris [1][2] is big [3].") == "Paris is big."
    s = qampari_scores("item1 [1], Item2 [2], wrong.", [["item1"], ["item2", "i2"], ["item3"]])
    assert s["qampari_prec"] == pytest.approx(2 / 3) and s["qampari_rec"] == pytest.approx(2 / 3)
    assert s["qampari_rec_top5"] == pytest.approx(2 / 3) and s["num_preds"] == 3
    many = [[f"e{i}"] for i in range(7)]
    assert qampari_scores("e0, e1, e2, e3, e4", many)["qampari_rec_top5"] == 1.0  # 5 found of min(5, 7)
    assert qampari_scores("", many)["qampari_prec"] == 0.0
    pairs = [{"short_answers": ["alpha"]}, {"short_answers": ["beta", "b2"]}]
    assert asqa_str_em("It was Alpha [1] and gamma.", pairs) == (0.5, 0.0)
    assert asqa_str_em("alpha and b2", pairs) == (1.0, 1.0)


def test_citation_recall_and_precision_by_hand():
    from recallm.eval.scoring import citation_scores

    docs = ["Title: A\nParis is in France", "Title: B\nBerlin is in Germany", "Title: C\nRome"]
    calls = []

    def entails(premise: str, claim: str) -> bool:  # supported when the claim's first word is in the premise
        calls.append((premise, claim))
        return claim.split()[0] in premise

    out = "Paris is in France [1]. Berlin is big [1][2]. No citation here. Rome rules [9]."

    def batch(pairs):  # the NLI judges a batch of (premise, claim) pairs
        return [entails(p, c) for p, c in pairs]

    scores = citation_scores(out, docs, batch)
    # claims: Paris [1] supported; Berlin [1][2] supported jointly, [1] is not needed, [2] is; no citation;
    # [9] is out of range. Recall 2/4; precision: 1 (Paris) + 1 ([2] of Berlin) over 3 citations in range
    assert scores == {"citation_rec": pytest.approx(2 / 4), "citation_prec": pytest.approx(2 / 3)}
    assert ("Title: A\nParis is in France\nTitle: B\nBerlin is in Germany", "Berlin is big.") in calls
    assert citation_scores("", docs, batch) is None
    # QAMPARI: the claims are "question item", one per comma-separated item
    q = citation_scores(
        "Paris [1], Rome [2]", docs, lambda ps: [c.split()[-1] in p for p, c in ps], question="Cities?", qampari=True
    )
    assert q == {"citation_rec": 0.5, "citation_prec": 0.5}

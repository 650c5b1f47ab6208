"""Answer metrics against hand-computed cases."""

from __future__ import annotations

import math

import pytest

from rewards.metrics import (
    citation_id_scores,
    cited_ids,
    entity_citation_scores,
    exact_match,
    extract_choice,
    ndcg_at_k,
    net_recall,
    normalize_math,
    normalize_tokens,
    parse_citations,
    parse_ranking,
    split_items,
    sub_em,
)


def test_normalize():
    assert normalize_tokens("The  Eiffel-Tower, Paris!") == ("eiffel", "tower", "paris")


def test_exact_match():
    assert exact_match("The Paris.", ["paris"]) == 1.0
    assert exact_match("Paris France", ["Paris"]) == 0.0
    assert exact_match("12.0", ["12"]) == 1.0
    assert exact_match("\\boxed{1,000}", ["1000"]) == 1.0
    assert exact_match("1/2", ["0.5"]) == 1.0
    assert exact_match("", ["x"]) == 0.0 and exact_match(None, ["x"]) == 0.0


def test_sub_em_is_token_sequence_containment():
    assert sub_em("12", ["2"]) == 0.0  # "2" is not inside "12"
    assert sub_em("It is Paris, France.", ["Paris"]) == 1.0  # gold inside prediction
    assert sub_em("Paris", ["Paris, France"]) == 1.0  # prediction inside gold
    assert sub_em("France Paris", ["Paris, France"]) == 0.0  # order matters
    assert sub_em("the", ["the thing"]) == 0.0  # nothing left after normalisation
    assert sub_em("x", ["a", "b x c"]) == 1.0  # any alias


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("B", 1),
        ("(C)", 2),
        ("c.", 2),
        ("D) Lyon", 3),
        ("Option D", 3),
        ("The answer is A.", 0),
        ("**B**", 1),
        ("I think B is right", None),
        ("E", None),
        ("A cat sat", None),
        ("Lyon", 3),
        ("B Berlin", 1),
        ("B Paris", None),
    ],
)
def test_extract_choice_is_strict(answer, expected):
    choices = ["Paris", "Berlin", "Rome", "Lyon"]
    assert extract_choice(answer, 4, choices) == expected


def test_net_recall():
    gold = ["alpha", "beta", ["gamma", "g"]]
    assert net_recall("alpha, beta", gold) == pytest.approx(2 / 3)
    assert net_recall("alpha, beta, zeta", gold) == pytest.approx((2 - 1) / 3)
    assert net_recall("zeta; eta", gold) == 0.0  # clamped at 0
    assert net_recall("g\nalpha\nbeta", gold) == 1.0  # alias, one per line
    assert net_recall("alpha and beta", gold) == pytest.approx(2 / 3)
    assert net_recall("alpha, alpha", gold) == pytest.approx(1 / 3)  # a repeat finds nothing new
    assert net_recall(None, gold) == 0.0


def test_ndcg_hand_computed_linear_gains():
    rel = {"1": 3, "2": 2, "3": 0}
    # linear gains (MS MARCO's standard): ranking [2, 1]: DCG = 2/log2(2) + 3/log2(3) = 3.8928; IDCG = 4.2619; 0.91340
    # ideal [1, 2]: IDCG = 3/1 + 2/log2(3) = 4.2619
    expected = (2 + 3 / math.log2(3)) / (3 + 2 / math.log2(3))
    assert ndcg_at_k(parse_ranking("[2] > [1]"), rel) == pytest.approx(expected)
    assert ndcg_at_k(parse_ranking("[2] > [1]"), rel, gain="linear") == pytest.approx(0.91340, abs=1e-5)
    assert ndcg_at_k(parse_ranking("1 > 2 > 3"), rel) == pytest.approx(1.0)
    assert ndcg_at_k(parse_ranking("[9] > [2] > [2] > [1]"), rel) == pytest.approx(
        (2 / math.log2(3) + 3 / math.log2(4)) / (3 + 2 / math.log2(3))  # unknown id 9 gains 0, repeats dropped
    )
    assert ndcg_at_k([], rel) == 0.0 and ndcg_at_k(["1"], {"1": 0}) == 0.0
    ranking = [str(i) for i in range(20, 0, -1)]  # the relevant one at rank 20: beyond k=10
    assert ndcg_at_k(ranking, {"1": 1}) == 0.0


def test_ndcg_hand_computed_exponential_gains():
    rel = {"1": 3, "2": 2, "3": 0}
    # ranking [2, 1]: DCG = (2^2-1)/log2(2) + (2^3-1)/log2(3) = 3 + 7/1.5849625 = 7.4165
    # ideal [1, 2]:  IDCG = 7/1 + 3/1.5849625 = 8.8928
    expected = (3 + 7 / math.log2(3)) / (7 + 3 / math.log2(3))
    assert ndcg_at_k(parse_ranking("[2] > [1]"), rel, gain="exponential") == pytest.approx(expected)
    assert ndcg_at_k(parse_ranking("[2] > [1]"), rel, gain="exponential") == pytest.approx(0.83399, abs=1e-5)
    # with one relevant grade the two gains agree
    assert ndcg_at_k(["5", "1"], {"1": 1}, gain="exponential") == ndcg_at_k(["5", "1"], {"1": 1})
    with pytest.raises(ValueError, match="gain"):
        ndcg_at_k(["1"], rel, gain="cubic")


def test_parse_citations():
    assert parse_citations("Paris [1][5], Lyon [3]\nNice") == [("Paris", ["1", "5"]), ("Lyon", ["3"]), ("Nice", [])]
    assert parse_citations("A [1, 2]; B [3]") == [("A", ["1", "2"]), ("B", ["3"])]
    assert parse_citations("[4] Rome [2]") == [("", ["4"]), ("Rome", ["2"])]
    assert parse_citations("A, B [1]") == [("A, B", ["1"])]  # commas before a citation stay in its text
    assert parse_citations("junk ] Paris [1] x [2") == [("Paris", ["1"]), ("x [2", [])]  # stray brackets
    assert parse_citations("[] Paris") == [("[] Paris", [])]  # an empty bracket is no citation
    assert cited_ids("see [3] and [4, 7]") == {"3", "4", "7"} and cited_ids(None) == set()


def test_linear_parsers_keep_their_meaning():
    assert split_items(" [alpha ;  beta,\n - 'gamma' ,,  ] ") == ["alpha", "beta", "gamma"]
    assert normalize_math("so \\boxed{ 42 } done") == "42"
    assert normalize_math("\\boxed {a{b}c}") == "a{b}c"  # to the last closing brace
    assert normalize_math("\\boxed x \\boxed{7}") == "7"  # the first \\boxed followed by a brace
    assert normalize_math("\\boxed{7") == "\\boxed{7"  # never closed: no box
    assert exact_match("1" * 5000 + "/3", ["2"]) == 0.0  # more digits than int() reads: no crash


def test_entity_citation_scores_hand_computed():
    entities = [
        {"answers": ["Paris"], "docs": ["1", "2"]},
        {"answers": ["Lyon"], "docs": ["3"]},
        {"answers": ["Nice"], "docs": ["4"]},
    ]
    f1, coverage = entity_citation_scores("Paris [1][5], Lyon [3], Marseille [4]", entities, k=5)
    # cited 4 ids, 2 support their entity -> precision 1/2; 2 of min(5, 3) entities supported -> recall 2/3
    p, r = 0.5, 2 / 3
    assert f1 == pytest.approx(2 * p * r / (p + r))
    assert coverage == pytest.approx(2 / 3)
    assert entity_citation_scores("Paris [1]", entities, k=1) == (1.0, 1.0)  # top-1 of 3 gold: target is 1
    assert entity_citation_scores("", entities) == (0.0, 0.0)


def test_citation_id_scores_hand_computed():
    entities = [
        {"answers": ["Paris"], "docs": ["1", "2"]},
        {"answers": ["Lyon"], "docs": ["3"]},
        {"answers": ["Nice"], "docs": ["4"]},
    ]
    # gold ids {1, 2, 3, 4}; cited {1, 5, 3, 4}: 3 correct -> precision 3/4, recall 3/min(5, 4) = 3/4
    s = citation_id_scores("Paris [1][5], Lyon [3], Marseille [4]", entities, k=5)
    assert (s.precision, s.recall, s.f1) == pytest.approx((0.75, 0.75, 0.75))
    assert s.coverage == pytest.approx(2 / 3)  # Paris and Lyon named, Nice not (Marseille is no entity)
    # ids, not entities, are judged: a right id cited under a wrong name still counts
    assert citation_id_scores("Marseille [3]", entities).precision == 1.0
    # top-k recall: k=2 -> recall = min(3, 2) / min(2, 4) = 1
    s = citation_id_scores("Paris [1][2], Lyon [3]", entities, k=2)
    assert (s.precision, s.recall, s.coverage) == pytest.approx((1.0, 1.0, 1.0))
    # "A, B [1]" names both A and B
    assert citation_id_scores("Paris, Nice [1]", entities).coverage == pytest.approx(2 / 3)
    assert citation_id_scores("", entities) == (0.0, 0.0, 0.0, 0.0)
    assert citation_id_scores("Paris [1]", []) == (0.0, 0.0, 0.0, 0.0)
    # release-style credit: an id no recall span cites counts 0.5 (numerator and denominator)
    s = citation_id_scores("Paris [1], Lyon [3], X [9]", entities, recalled_ids={"1"}, unrecalled_credit=0.5)
    # cited weights: 1 (recalled) + 0.5 + 0.5 = 2; correct: 1 + 0.5 = 1.5 -> precision 0.75; recall 1.5 / 4
    assert (s.precision, s.recall) == pytest.approx((0.75, 0.375))

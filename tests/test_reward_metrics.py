"""Answer metrics against hand-computed cases."""

from __future__ import annotations

import math

import pytest

from rewards.metrics import (
    citation_scores,
    exact_match,
    extract_choice,
    ndcg_at_k,
    net_recall,
    normalize_tokens,
    parse_citations,
    parse_ranking,
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


def test_ndcg_hand_computed():
    rel = {"1": 3, "2": 2, "3": 0}
    # ranking [2, 1]: DCG = (2^2-1)/log2(2) + (2^3-1)/log2(3) = 3 + 7/1.5849625 = 7.4165
    # ideal [1, 2]:  IDCG = 7/1 + 3/1.5849625 = 8.8928
    expected = (3 + 7 / math.log2(3)) / (7 + 3 / math.log2(3))
    assert ndcg_at_k(parse_ranking("[2] > [1]"), rel) == pytest.approx(expected)
    assert ndcg_at_k(parse_ranking("1 > 2 > 3"), rel) == pytest.approx(1.0)
    assert ndcg_at_k(parse_ranking("[9] > [2] > [2] > [1]"), rel) == pytest.approx(
        (3 / math.log2(3) + 7 / math.log2(4)) / (7 + 3 / math.log2(3))  # unknown id 9 gains 0, repeats dropped
    )
    assert ndcg_at_k([], rel) == 0.0 and ndcg_at_k(["1"], {"1": 0}) == 0.0
    ranking = [str(i) for i in range(20, 0, -1)]  # the relevant one at rank 20: beyond k=10
    assert ndcg_at_k(ranking, {"1": 1}) == 0.0


def test_parse_citations():
    assert parse_citations("Paris [1][5], Lyon [3]\nNice") == [("Paris", ["1", "5"]), ("Lyon", ["3"]), ("Nice", [])]
    assert parse_citations("A [1, 2]; B [3]") == [("A", ["1", "2"]), ("B", ["3"])]
    assert parse_citations("[4] Rome [2]") == [("", ["4"]), ("Rome", ["2"])]


def test_citation_scores_hand_computed():
    entities = [
        {"answers": ["Paris"], "docs": ["1", "2"]},
        {"answers": ["Lyon"], "docs": ["3"]},
        {"answers": ["Nice"], "docs": ["4"]},
    ]
    f1, coverage = citation_scores("Paris [1][5], Lyon [3], Marseille [4]", entities, k=5)
    # cited 4 ids, 2 support their entity -> precision 1/2; 2 of min(5, 3) entities supported -> recall 2/3
    p, r = 0.5, 2 / 3
    assert f1 == pytest.approx(2 * p * r / (p + r))
    assert coverage == pytest.approx(2 / 3)
    assert citation_scores("Paris [1]", entities, k=1) == (1.0, 1.0)  # top-1 of 3 gold: target is 1
    assert citation_scores("", entities) == (0.0, 0.0)

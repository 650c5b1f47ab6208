"""The composite reward, one hand-computed example per category, errors, and fuzzing."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recallm.errors import RecallmError
from rewards import load_reward_config, score_response
from rewards.config import RewardConfig, check_ground_truth
from rewards.score import composite, overlong_factor

CFG = load_reward_config()
EPS = 0.01


def R(fmt, ans, ret):
    """Eq. 1-3 written out."""
    return 0.2 * fmt + 0.4 * (0.5 * ans + 0.5 * ret) + 0.4 * (math.sqrt((ans + EPS) * (ret + EPS)) - EPS)


def prompt_with(*docs):
    """A prompt listing documents; returns (text, [gold dict per doc])."""
    text, golds = "Documents:\n", []
    for i, doc in enumerate(docs, 1):
        text += f"[{i}] "
        golds.append({"text": doc, "start": len(text), "end": len(text) + len(doc)})
        text += doc + "\n"
    return text + "Question: ?\n", golds


def test_composite_and_overlong_arithmetic():
    assert composite(1, 1, 1, CFG) == pytest.approx(1.0)
    assert composite(0, 0, 0, CFG) == pytest.approx(0.0)
    # 0.2 + 0.4 * 0.75 + 0.4 * (sqrt(1.01 * 0.51) - 0.01) = 0.783082
    assert composite(1, 1, 0.5, CFG) == pytest.approx(0.2 + 0.3 + 0.4 * (math.sqrt(1.01 * 0.51) - 0.01))
    assert overlong_factor(4096, CFG) == 1.0
    assert overlong_factor(4096 + 512, CFG) == 0.5
    assert overlong_factor(6000, CFG) == 0.0


def test_multi_hop_qa():
    docs = ["Alice was born in Lyon in 1950.", "Lyon is a city in France.", "Bob likes tea."]
    prompt, golds = prompt_with(*docs)
    gt = {"category": "multi_hop_qa", "answers": ["France"], "gold": golds[:2]}
    response = (
        "<|start_recall|>Alice was born in Lyon<|end_recall|> and <|start_recall|>Lyon is a city in France."
        "<|end_recall|></think>\nAnswer: France"
    )
    b = score_response(response, gt, prompt_text=prompt, n_tokens=100)
    # gold 1: span 21 chars of 31 -> F1 = 42/52 = 0.8077 >= tau 0.4 -> 1; gold 2: exact -> 1
    assert b.recall_overlap == 1.0 and b.answer == 1.0 and b.format == 1.0
    assert b.score == pytest.approx(R(1, 1, 1))
    only_first = score_response(
        response.split(" and ")[0] + "</think>\nAnswer: France", gt, prompt_text=prompt, n_tokens=100
    )
    assert only_first.recall_overlap == pytest.approx(0.5)  # (1 + 0) / 2
    assert only_first.score == pytest.approx(R(1, 1, 0.5))


def test_single_hop_top1_tau():
    prompt, golds = prompt_with("The Eiffel Tower is in Paris and was built in 1889.")
    gt = {"category": "single_hop_qa", "answers": ["1889"], "gold": golds}
    b = score_response(
        "<|start_recall|>built in<|end_recall|></think>\nAnswer: 1889", gt, prompt_text=prompt, n_tokens=50
    )
    # span "built in" (8 chars) inside a 51-char gold: F1 = 16/59 = 0.2712; / tau 0.4 = 0.678
    assert b.recall_overlap == pytest.approx((16 / 59) / 0.4)
    assert b.score == pytest.approx(R(1, 1, (16 / 59) / 0.4))


def test_retrieval_kv_and_niah():
    prompt, golds = prompt_with("17: bako", "18: kuri", "19: sela")
    kv = {"category": "retrieval", "answers": ["kuri"], "gold": [golds[1]]}
    b = score_response(
        "<|start_recall|>18: kuri<|end_recall|></think>\nAnswer: kuri",
        kv,
        prompt_text=prompt,
        data_source="kv_retrieval",
        n_tokens=30,
    )
    assert (b.answer, b.recall, b.score) == (1.0, 1.0, pytest.approx(1.0))
    niah = {"category": "retrieval", "answers": ["bako", "sela"], "gold": [golds[0], golds[2]]}
    b = score_response(
        "<|start_recall|>17: bako<|end_recall|></think>\nAnswer: bako, kuri",
        niah,
        prompt_text=prompt,
        data_source="multi_niah",
        n_tokens=30,
    )
    # net recall (1 found - 1 wrong) / 2 = 0; overlap (1 + 0) / 2 = 0.5
    assert b.answer == 0.0 and b.recall_overlap == 0.5
    assert b.score == pytest.approx(R(1, 0, 0.5))


def test_reasoning_retrieval_density_and_correctness():
    prompt, golds = prompt_with("42: zemipa")
    gt = {"category": "reasoning_retrieval", "answers": ["zemipa"], "gold": golds}
    spans = "".join("<|start_recall|>42: zemipa<|end_recall|>" for _ in range(8)) + "<|start_recall|>42<|end_recall|>"
    b = score_response(spans + "</think>\nAnswer: zemipa", gt, prompt_text=prompt, n_tokens=512)
    # 9 spans, 2 free, 512 tokens: d = 7 / 0.5 = 14 -> 0.5 ** (10 / 4); one short span: 1 - 1/3
    assert b.density_penalty == pytest.approx(0.5**2.5)
    assert b.correctness_penalty == pytest.approx(1 - 1 / 3)
    assert b.recall == pytest.approx(0.5**2.5 * (2 / 3))
    assert b.score == pytest.approx(R(1, 1, 0.5**2.5 * (2 / 3)))


def test_short_math_always_and_choice():
    gt = {"category": "short_math", "answers": ["12"]}
    b = score_response("3 * 4 = 12</think>\nAnswer: \\boxed{12}", gt, n_tokens=20)
    assert (b.recall_overlap, b.recall, b.answer) == (1.0, 1.0, 1.0) and b.score == pytest.approx(1.0)
    mcqa = {"category": "short_math", "answers": ["C"], "choices": ["1", "2", "3", "4"]}
    assert score_response("</think>\nAnswer: (C)", mcqa, n_tokens=5).answer == 1.0
    assert score_response("</think>\nAnswer: I pick C", mcqa, n_tokens=5).answer == 0.0
    # a mismatched marker next to a complete span costs: 1 - 1/sqrt(1) = 0
    b = score_response(
        "<|start_recall|>3 * 4 = 12<|end_recall|> <|start_recall|>3</think>\nAnswer: 12", gt, n_tokens=20
    )
    assert b.correctness_penalty == 0.0 and b.score == pytest.approx(R(1, 1, 0))
    # without any complete span P_correct is 1, as in the authors' release (eq. 8 is undefined there)
    b = score_response("<|start_recall|>3 * 4</think>\nAnswer: 12", gt, n_tokens=20)
    assert (b.n_spans, b.n_mismatch, b.correctness_penalty) == (0, 1, 1.0) and b.score == pytest.approx(1.0)


def test_icl_top2():
    prompt, golds = prompt_with(
        "text: card lost -> label: 7", "text: card stolen -> label: 7", "text: hi -> label: 3", "text: pin -> label: 5"
    )
    gt = {"category": "icl", "answers": ["7"], "gold": golds[:2] + golds[3:]}
    b = score_response(
        "<|start_recall|>text: card lost -> label: 7<|end_recall|></think>\nAnswer: 7",
        gt,
        prompt_text=prompt,
        n_tokens=40,
    )
    # per gold (tau 0.95): 1, 0 (shares no interval), 0 -> top-2 mean = 0.5
    assert b.recall_overlap == pytest.approx(0.5)
    assert b.score == pytest.approx(R(1, 1, 0.5))


def test_long_doc_qa_binary():
    gt = {"category": "long_doc_qa", "answers": ["B"], "choices": ["red", "blue", "green", "black"]}
    b = score_response("<|start_recall|>the sky was blue<|end_recall|></think>\nAnswer: B", gt, n_tokens=30)
    assert (b.recall_overlap, b.answer, b.score) == (1.0, 1.0, pytest.approx(1.0))
    b = score_response("</think>\nAnswer: B", gt, n_tokens=30)
    assert b.recall_overlap == 0.0 and b.score == pytest.approx(R(1, 1, 0))


def test_aggregation():
    gt = {"category": "aggregation", "answers": ["Paris", "Rome"]}
    b = score_response("</think>\nAnswer: Paris, Rome", gt, n_tokens=10)
    assert (b.answer, b.recall, b.score) == (1.0, 1.0, pytest.approx(1.0))
    b = score_response("</think>\nAnswer: Paris", gt, n_tokens=10)
    assert b.score == pytest.approx(R(1, 0.5, 1))


def test_reranking_ndcg_and_format_part():
    prompt, golds = prompt_with("relevant passage one", "other text", "relevant passage two")
    gt = {
        "category": "reranking",
        "relevance": {"1": 2, "3": 1},
        "doc_ids": ["1", "2", "3"],
        "gold": [golds[0], golds[2]],
    }
    b = score_response(
        "<|start_recall|>relevant passage one<|end_recall|></think>\nAnswer: [3] > [1] > [9]",
        gt,
        prompt_text=prompt,
        n_tokens=40,
    )
    ndcg = (1 / 1 + 2 / math.log2(3)) / (2 / 1 + 1 / math.log2(3))  # linear gains: the grades
    # format: the paper's (no task-specific term); overlap top-2 (tau 0.7): (1 + 0) / 2
    assert b.answer == pytest.approx(ndcg) and b.format == 1.0 and b.format_part == 1.0
    assert b.recall_overlap == pytest.approx(0.5)
    assert b.score == pytest.approx(R(1.0, ndcg, 0.5))
    # the options: exponential gains, and the release's task-specific format term (2 of 3 ranked ids valid)
    cfg = load_reward_config(overrides=["format.task_specific=true", "categories.reranking.ndcg_gain=exponential"])
    b = score_response(
        "<|start_recall|>relevant passage one<|end_recall|></think>\nAnswer: [3] > [1] > [9]",
        gt,
        prompt_text=prompt,
        n_tokens=40,
        config=cfg,
    )
    ndcg = (1 / 1 + 3 / math.log2(3)) / (3 / 1 + 1 / math.log2(3))
    assert b.answer == pytest.approx(ndcg) and b.format == pytest.approx(0.5 + 0.5 * 2 / 3)
    assert b.score == pytest.approx(R(0.5 + 0.5 * 2 / 3, ndcg, 0.5))


def test_entity_citation():
    prompt, golds = prompt_with("Paris is in France.", "Lyon is in France.", "Rome is in Italy.")
    gt = {
        "category": "entity_citation",
        "entities": [{"answers": ["Paris"], "docs": ["1"]}, {"answers": ["Lyon"], "docs": ["2"]}],
        "gold": golds[:2],
    }
    b = score_response(
        "<|start_recall|>Paris is in France.<|end_recall|></think>\nAnswer: Paris [1], Lyon",
        gt,
        prompt_text=prompt,
        n_tokens=40,
    )
    # ids: cited {1}, gold ids {1, 2} -> P 1, R 1/min(5, 2) = 0.5, F1 2/3; coverage: both named -> 1
    answer = 0.8 * (2 / 3) + 0.2 * 1.0
    # format: the paper's (1); overlap top-5 over 2 gold: (1 + 0) / 2
    assert b.answer == pytest.approx(answer) and b.format == 1.0
    assert b.score == pytest.approx(R(1.0, answer, 0.5))
    # the earlier variant (citations judged per entity, 0.5 / 0.5) and the task-specific format term
    cfg = load_reward_config(
        overrides=[
            "categories.entity_citation.citation_mode=entities",
            "categories.entity_citation.citation_coverage_weight=0.5",
            "format.task_specific=true",
        ]
    )
    b = score_response(
        "<|start_recall|>Paris is in France.<|end_recall|></think>\nAnswer: Paris [1], Lyon",
        gt,
        prompt_text=prompt,
        n_tokens=40,
        config=cfg,
    )
    # citations: 1 cited, 1 supported -> P 1; 1 of 2 entities supported -> R 0.5; F1 2/3; coverage 1
    answer = 0.5 * (2 / 3) + 0.5 * 1.0
    # format: mean(base 1, 1 of 2 items cited)
    assert b.answer == pytest.approx(answer) and b.format == pytest.approx(0.75)
    assert b.score == pytest.approx(R(0.75, answer, 0.5))
    # the release's credit for citations no recall span backs: [1] is recalled ("[1]" in a span), [2] not
    cfg = load_reward_config(overrides=["categories.entity_citation.citation_unrecalled_credit=0.5"])
    b = score_response(
        "<|start_recall|>[1] Paris is in France.<|end_recall|></think>\nAnswer: Paris [1], Lyon [2]",
        gt,
        prompt_text=prompt,
        n_tokens=40,
        config=cfg,
    )
    # weights 1 + 0.5: P = 1.5 / 1.5 = 1, R = 1.5 / 2 = 0.75, F1 = 6/7; coverage 1
    assert b.answer == pytest.approx(0.8 * (6 / 7) + 0.2)


def test_format_violations():
    gt = {"category": "aggregation", "answers": ["x"]}
    for bad in (
        "no think end\nAnswer: x",
        "</think></think>\nAnswer: x",
        "<think> a <think></think>\nAnswer: x",
        "</think>\nAnswer: x\nAnswer: x",
        "</think>\nAnswer: x <|start_recall|>x<|end_recall|>",
    ):
        assert score_response(bad, gt, n_tokens=10).format == 0.0, bad
    assert score_response("<think>\nok</think>\nAnswer: x", gt, n_tokens=10).format == 1.0


def test_ground_truth_errors():
    with pytest.raises(RecallmError, match="unknown reward category 'poetry'"):
        check_ground_truth({"category": "poetry"}, None, CFG)
    with pytest.raises(RecallmError, match="has no 'answers'"):
        check_ground_truth({"category": "single_hop_qa", "gold": [{"text": "a", "start": 0, "end": 1}]}, None, CFG)
    with pytest.raises(RecallmError, match="has no 'gold'"):
        check_ground_truth({"category": "single_hop_qa", "answers": ["a"]}, None, CFG)
    with pytest.raises(RecallmError, match="needs 'text', 'start' and 'end'"):
        check_ground_truth({"category": "icl", "answers": ["a"], "gold": [{"text": "a"}]}, None, CFG)
    with pytest.raises(RecallmError, match="no 'relevance'"):
        check_ground_truth({"category": "reranking", "doc_ids": ["1"], "gold": []}, None, CFG)
    with pytest.raises(RecallmError, match="no 'entities'"):
        check_ground_truth({"category": "entity_citation"}, None, CFG)
    with pytest.raises(RecallmError, match="name no option"):
        check_ground_truth({"category": "long_doc_qa", "answers": ["Z"], "choices": ["a", "b"]}, None, CFG)
    with pytest.raises(RecallmError, match="prompt_text is required"):
        score_response("x", {"category": "retrieval", "answers": ["a"], "gold": [{"text": "a", "start": 0, "end": 1}]})
    with pytest.raises(RecallmError, match="must be a mapping"):
        check_ground_truth(42, None, CFG)


def test_config_overrides_and_validation(tmp_path):
    cfg = load_reward_config(overrides=["categories.icl.tau=0.5", "overlong.enable=false"])
    assert cfg.categories["icl"].tau == 0.5 and not cfg.overlong.enable
    assert cfg.for_row("retrieval", "multi_niah").answer == "net_recall"
    assert cfg.for_row("retrieval", "multi_niah").free_spans == 6
    assert cfg.for_row("retrieval", "kv_retrieval").free_spans == 2
    with pytest.raises(RecallmError, match="belongs to category 'retrieval', but the row says 'icl'"):
        cfg.for_row("icl", "multi_niah")
    with pytest.raises(RecallmError, match="must name its category"):
        load_reward_config(overrides=["data_sources.foo.free_spans=3"])
    with pytest.raises(RecallmError, match="unknown answer metric 'bleu'"):
        load_reward_config(overrides=["categories.icl.answer=bleu"])
    with pytest.raises(RecallmError, match="needs tau in"):
        load_reward_config(overrides=["categories.icl.tau=0"])
    with pytest.raises(RecallmError, match="sum to 1"):
        load_reward_config(overrides=["weights.format=0.5"])
    with pytest.raises(RecallmError, match="does not exist"):
        load_reward_config(tmp_path / "nope.yaml")
    assert isinstance(load_reward_config(CFG), RewardConfig)


SAMPLE_TRUTHS = [
    {
        "category": "multi_hop_qa",
        "answers": ["France"],
        "gold": [{"text": "Lyon is in France.", "start": 0, "end": 18}],
    },
    {"category": "single_hop_qa", "answers": ["1889"], "gold": [{"text": "Lyon is in France.", "start": 0, "end": 18}]},
    {"category": "retrieval", "answers": ["kuri", "bako"], "gold": [{"text": "18: kuri", "start": 19, "end": 27}]},
    {"category": "reasoning_retrieval", "answers": ["kuri"], "gold": [{"text": "18: kuri", "start": 19, "end": 27}]},
    {"category": "short_math", "answers": ["12"]},
    {"category": "icl", "answers": ["7"], "gold": [{"text": "18: kuri", "start": 19, "end": 27}]},
    {"category": "long_doc_qa", "answers": ["A"], "choices": ["x", "y"]},
    {"category": "aggregation", "answers": ["Paris"]},
    {
        "category": "reranking",
        "relevance": {"1": 1},
        "doc_ids": ["1", "2"],
        "gold": [{"text": "18: kuri", "start": 19, "end": 27}],
    },
    {
        "category": "entity_citation",
        "entities": [{"answers": ["Lyon"], "docs": ["1"]}],
        "gold": [{"text": "Lyon is in France.", "start": 0, "end": 18}],
    },
]
PROMPT = "Lyon is in France.\n18: kuri\n17: bako\n"

response_soup = st.lists(
    st.sampled_from(
        [
            "<|start_recall|>",
            "<|end_recall|>",
            "<recall>",
            "</recall>",
            "<think>",
            "</think>",
            "Answer:",
            "\n",
            " ",
            "18: kuri",
            "Lyon",
            "[1]",
            " > ",
            ",",
            "12",
            "A",
            "\ufffd",
        ]
    )
    | st.text(max_size=12),
    max_size=60,
).map("".join)


@given(
    response_soup,
    st.sampled_from(range(len(SAMPLE_TRUTHS))),
    st.integers(0, 10_000),
    st.sampled_from([None, "multi_niah", "some_dataset"]),
)
def test_fuzz_any_response_is_finite_in_unit_interval(response, which, n_tokens, source):
    if source == "multi_niah" and SAMPLE_TRUTHS[which]["category"] != "retrieval":
        source = None
    b = score_response(response, SAMPLE_TRUTHS[which], prompt_text=PROMPT, n_tokens=n_tokens, data_source=source)
    values = b.as_dict()
    assert all(isinstance(v, float) and math.isfinite(v) for v in values.values())
    assert 0.0 <= b.score <= 1.0
    for key in ("format", "answer", "recall", "recall_overlap", "density_penalty", "correctness_penalty"):
        assert 0.0 <= values[key] <= 1.0, key


def test_majority_and_top_n_votes():
    majority = {"category": "aggregation", "answers": ["Paris"]}
    assert score_response("</think>\nAnswer: Paris", majority, n_tokens=5).answer == 1.0
    assert score_response("</think>\nAnswer: Paris, Rome", majority, n_tokens=5).answer == 0.0  # hedging costs
    top3 = {"category": "aggregation", "answers": ["Paris", "Rome", "Oslo"]}
    assert score_response("</think>\nAnswer: Oslo\nParis\nRome", top3, n_tokens=5).answer == 1.0
    assert score_response("</think>\nAnswer: Oslo, Paris, Lima", top3, n_tokens=5).answer == pytest.approx(1 / 3)


def test_check_rows_names_the_bad_row():
    from rewards import check_rows

    good = {"data_source": "dapo", "reward_model": {"ground_truth": {"category": "short_math", "answers": ["1"]}}}
    bad = {"data_source": "nq", "reward_model": {"ground_truth": {"category": "single_hop_qa", "answers": ["x"]}}}
    assert check_rows([good, good]) == 2
    with pytest.raises(RecallmError, match=r"row 2: .*has no 'gold'"):
        check_rows([good, good, bad])
    with pytest.raises(RecallmError, match="row 0: ground truth must be a mapping"):
        check_rows([{"reward_model": {}}])


def test_ground_truth_as_json_string():
    import json

    gt = {"category": "short_math", "answers": ["12"]}
    assert score_response("</think>\nAnswer: 12", json.dumps(gt), n_tokens=5).score == pytest.approx(1.0)
    with pytest.raises(RecallmError, match="not JSON"):
        score_response("x", "kuri")
    with pytest.raises(RecallmError, match="must be a mapping, got JSON list"):
        score_response("x", "[1, 2]")

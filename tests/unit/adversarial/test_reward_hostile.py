"""Hostile ground truth and garbage inputs to the reward (issue 18 items 5-7): one ``RecallmError``
naming the field, refused by ``check_rows`` before training (``recallm-grpo --print-config``'s refusal is in
tests/integration/adversarial/test_cli_inputs.py, it imports verl),
``recallm-score`` on ground truth stored as a JSON string, and the adversarial answers that made
the old parsers quadratic (their results; their cost is ``bench/rewards.py``'s adversarial row)."""

from __future__ import annotations

import json
import math

import pytest

from recallm.errors import RecallmError
from rewards import check_ground_truth, check_rows, load_reward_config, score_response

CFG = load_reward_config()
PROMPT = "Documents:\n[1] Paris is in France.\n[2] Lyon is in France.\nQuestion: ?\n"
GOLD = [{"text": "Paris is in France.", "start": 15, "end": 34}]
assert PROMPT[15:34] == GOLD[0]["text"]

GOOD = {
    "single_hop_qa": {"category": "single_hop_qa", "answers": ["Paris"], "gold": GOLD},
    "reranking": {"category": "reranking", "relevance": {"1": 2}, "doc_ids": ["1", "2"], "gold": GOLD},
    "entity_citation": {
        "category": "entity_citation",
        "entities": [{"answers": ["Paris"], "docs": ["1"]}],
        "gold": GOLD,
    },
    "aggregation": {"category": "aggregation", "answers": ["x", ["y", "yy"]]},
    "long_doc_qa": {"category": "long_doc_qa", "answers": ["B"], "choices": ["a", "b"]},
}

# (base row, field path, hostile value, what the message must name) — the cases of issue 18 item 6 and more
HOSTILE = [
    ("single_hop_qa", ("gold",), "Paris is in France.", r"'gold' must be a list"),
    ("single_hop_qa", ("gold", 0, "start"), "abc", r"gold\[0\]\.start must be a non-negative integer"),
    ("single_hop_qa", ("gold", 0, "start"), float("nan"), r"gold\[0\]\.start"),
    ("single_hop_qa", ("gold", 0, "end"), float("inf"), r"gold\[0\]\.end"),
    ("single_hop_qa", ("gold", 0, "start"), -3, r"gold\[0\]\.start"),
    ("single_hop_qa", ("gold", 0, "start"), True, r"gold\[0\]\.start"),
    ("single_hop_qa", ("gold", 0, "end"), 99, r"gold\[0\] interval \[15, 99\) does not have the length"),
    ("single_hop_qa", ("gold", 0, "text"), 7, r"gold\[0\]\.text must be a non-empty string"),
    ("single_hop_qa", ("gold", 0), "x", r"gold\[0\] needs 'text', 'start' and 'end'"),
    ("single_hop_qa", ("answers",), {"a": 1}, r"'answers' must be a string or a non-empty list"),
    ("single_hop_qa", ("answers",), [None], r"answers\[0\] must be a string or a number"),
    ("single_hop_qa", ("answers",), [float("nan")], r"answers\[0\]"),
    ("single_hop_qa", ("category",), ["single_hop_qa"], r"'category' must be a string"),
    ("reranking", ("relevance",), [2, 1], r"'relevance' must be a non-empty mapping"),
    ("reranking", ("relevance", "1"), "high", r"relevance\['1'\] must be a finite number in \[0, 100\]"),
    ("reranking", ("relevance", "1"), 5000, r"relevance\['1'\] must be a finite number"),
    ("reranking", ("relevance", "1"), float("inf"), r"relevance\['1'\]"),
    ("reranking", ("relevance", "1"), float("nan"), r"relevance\['1'\]"),
    ("reranking", ("relevance", "1"), [2], r"relevance\['1'\]"),
    ("reranking", ("doc_ids",), "1 2", r"'doc_ids' must be a list of document ids"),
    ("entity_citation", ("entities",), "Paris", r"'entities' must be a non-empty list"),
    ("entity_citation", ("entities", 0), "Paris", r"entities\[0\] must be a mapping"),
    ("entity_citation", ("entities", 0, "docs"), 5, r"'entities\[0\]\.docs' must be a list of document ids"),
    ("entity_citation", ("entities", 0, "answers"), {"x": 1}, r"entities\[0\]\.answers"),
    ("aggregation", ("answers", 1), [None], r"answers\[1\] must be a string or a number"),
    ("long_doc_qa", ("choices",), "ab", r"'choices' must be a list of option texts"),
]


def _hostile(base: str, path: tuple, value):
    gt = json.loads(json.dumps(GOOD[base]))
    target = gt
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return gt


@pytest.mark.parametrize("base, path, value, message", HOSTILE)
def test_hostile_ground_truth_is_one_recallm_error(base, path, value, message):
    gt = _hostile(base, path, value)
    with pytest.raises(RecallmError, match=message):
        check_ground_truth(gt, None, CFG)
    # the same error from the reward itself (never a TypeError, ValueError, AttributeError or OverflowError)
    with pytest.raises(RecallmError, match=message):
        score_response("<think>\nx</think>\nAnswer: Paris [1]", gt, prompt_text=PROMPT, n_tokens=10, config=CFG)
    # and as JSON text, the way the data stores it (NaN and Infinity are JSON extensions Python reads)
    with pytest.raises(RecallmError, match=message):
        check_ground_truth(json.dumps(gt), None, CFG)


@pytest.mark.parametrize("base", sorted(GOOD))
def test_good_rows_pass_and_score_finite(base):
    check_ground_truth(GOOD[base], None, CFG)
    b = score_response("<think>\nx</think>\nAnswer: Paris [1]", GOOD[base], prompt_text=PROMPT, n_tokens=10)
    assert all(math.isfinite(v) for v in b.as_dict().values())


def test_gold_not_in_the_prompt_is_a_recallm_error():
    gt = {**GOOD["single_hop_qa"], "gold": [{"text": "abc", "start": 0, "end": 3}]}
    check_ground_truth(gt, None, CFG)  # well typed: only the prompt can tell
    with pytest.raises(RecallmError, match="does not occur in the prompt text"):
        score_response("</think>\nAnswer: x", gt, prompt_text=PROMPT, n_tokens=5)


@pytest.mark.parametrize("n_tokens", [float("nan"), float("inf"), -1, "12", True, 2.0**60])
def test_bad_token_count_is_refused(n_tokens):
    with pytest.raises(RecallmError, match="n_tokens must be a non-negative finite number"):
        score_response("</think>\nAnswer: x", GOOD["aggregation"], n_tokens=n_tokens)


def test_garbage_json_ground_truth():
    for text, message in (
        ("{", "not JSON"),
        ("[1, 2]", "must be a mapping"),
        ("[" * 100_000, "nested too deeply|not JSON"),
        ('"just a string"', "must be a mapping"),
    ):
        with pytest.raises(RecallmError, match=message):
            check_ground_truth(text, None, CFG)


def test_check_rows_names_the_row_and_field():
    rows = [
        {"data_source": "nq", "reward_model": {"ground_truth": json.dumps(GOOD["single_hop_qa"])}},
        {
            "data_source": "nq",
            "reward_model": {"ground_truth": json.dumps(_hostile("single_hop_qa", ("gold", 0, "start"), "abc"))},
        },
    ]
    with pytest.raises(RecallmError, match=r"row 1: .*gold\[0\]\.start must be a non-negative integer, got 'abc'"):
        check_rows(rows, CFG)
    assert check_rows(rows[:1], CFG) == 1


def test_score_cli_reads_json_string_ground_truth(tmp_path):
    from recallm.cli.score import score_file

    rows = [
        {"response": "</think>\nAnswer: 12", "ground_truth": json.dumps({"category": "short_math", "answers": ["12"]})},
        {
            "response": "<|start_recall|>Paris is in France.<|end_recall|></think>\nAnswer: Paris",
            "prompt_text": PROMPT,
            "ground_truth": json.dumps(GOOD["single_hop_qa"]),
            "n_tokens": 30,
        },
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    means = score_file(src, tmp_path / "out.jsonl", None)
    assert means["short_math"]["score"] == pytest.approx(1.0) and means["single_hop_qa"]["answer"] == 1.0
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [o["category"] for o in out] == ["short_math", "single_hop_qa"]
    # garbage lines: one RecallmError naming the line, nothing written
    for line, message in (
        ("[1, 2]", r"in\.jsonl:3: expected a JSON object"),
        ('{"response": "x", "ground_truth": "{"}', r"in\.jsonl:3: ground truth is a string but not JSON"),
        (
            '{"response": "x", "ground_truth": {"category": "short_math", "answers": ["1"]}, "n_tokens": NaN}',
            r"in\.jsonl:3: n_tokens",
        ),
        (
            '{"response": "x", "ground_truth": ' + "[" * 50_000 + "}",
            r"in\.jsonl:3: (JSON nested too deeply|not valid JSON)",
        ),
    ):
        src.write_text("\n".join(json.dumps(r) for r in rows) + "\n" + line + "\n")
        with pytest.raises(RecallmError, match=message):
            score_file(src, tmp_path / "out2.jsonl", None)
        assert not (tmp_path / "out2.jsonl").exists() and not list(tmp_path.glob("*.tmp"))


N = 40_000  # characters: a 10K-token rollout


@pytest.mark.parametrize(
    "category, answer, expected",
    [
        ("entity_citation", "a" * N, 0.0),  # quadratic before: 97 s
        ("entity_citation", "[a" * (N // 2), 0.0),
        ("entity_citation", "Paris [1], " * (N // 11), 0.8 * 1.0 + 0.2 * 1.0),
        ("aggregation", "x" + " " * N + "y", 1 / 2 - 1 / 2),  # quadratic before: 3.8 s at 20K; x found, y wrong
        ("aggregation", ", ".join(f"w{i}" for i in range(N // 6)), 0.0),
        ("aggregation", "x, yy, " * (N // 7), 1.0),
        ("short_math", "\\boxed{" * (N // 7), 0.0),  # quadratic before: 1.2 s
        ("short_math", "1" * (N // 2) + "/" + "3" * (N // 2), 0.0),  # more digits than int() reads
    ],
)
def test_adversarial_answers_score_right(category, answer, expected):
    gt = GOOD.get(category) or {"category": "short_math", "answers": ["12"]}
    b = score_response("<think>\nx</think>\nAnswer: " + answer, gt, prompt_text=PROMPT, n_tokens=10_000)
    assert b.answer == pytest.approx(expected) and 0.0 <= b.score <= 1.0


def test_adversarial_markers_and_spans():
    for response in ("<" * N, "<|start_recall|>" * (N // 16), "</think>" + "Answer: " * (N // 8)):
        b = score_response(response, GOOD["single_hop_qa"], prompt_text=PROMPT, n_tokens=10_000)
        assert 0.0 <= b.score <= 1.0 and b.n_spans == 0
    spans = "".join(f"<|start_recall|>{PROMPT[15 + i % 10 : 18 + i % 10]}<|end_recall|>" for i in range(1300))
    b = score_response(spans + "</think>\nAnswer: Paris", GOOD["single_hop_qa"], prompt_text=PROMPT, n_tokens=10_000)
    assert b.n_spans == 1300 and b.n_short_spans == 1300 and b.correctness_penalty == 0.0
    assert b.spans_in_prompt == 1.0 and b.answer == 1.0


def test_numpy_numbers_are_numbers():
    """Ground truth read through numpy/pandas keeps numpy scalars: they are valid, a numpy bool is not."""
    np = pytest.importorskip("numpy")
    gold = [{"text": GOLD[0]["text"], "start": np.int64(15), "end": np.int64(34)}]
    check_ground_truth({**GOOD["single_hop_qa"], "gold": gold}, None, CFG)
    check_ground_truth({**GOOD["reranking"], "relevance": {"1": np.float32(2.0)}}, None, CFG)
    assert score_response("</think>\nAnswer: x", GOOD["aggregation"], n_tokens=np.int64(7)).n_tokens == 7
    with pytest.raises(RecallmError, match=r"relevance\['1'\]"):
        check_ground_truth({**GOOD["reranking"], "relevance": {"1": np.bool_(True)}}, None, CFG)

"""Fuzz target for the reward and the ground-truth check (hypothesis).

* any response, for every category: ``score_response`` returns a breakdown of finite numbers in
  range and raises nothing;
* any ground truth (JSON-like values of every type in every field, NaN and infinities included):
  ``check_ground_truth`` either accepts it or raises one ``RecallmError``; an accepted one is then
  scored without any other exception;
* the linear-time parsers mean what the regular expressions they replaced meant (on inputs short
  enough for those to run).

``RECALLM_FUZZ_EXAMPLES`` (default 200) sets the examples per fuzz test; with
``RECALLM_FUZZ_REPORT=<file>`` the counts (cases tried, crashes) are written there as JSON.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_gen.base import CATEGORIES
from recallm.errors import RecallmError
from rewards import check_ground_truth, load_reward_config, metrics, score_response
from rewards.parsing import parse_response

EXAMPLES = int(os.environ.get("RECALLM_FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
CFG = load_reward_config()
COUNTS: Counter[str] = Counter()

PROMPT = "Documents:\n[1] Paris is in France.\n[2] Lyon is in France.\nkey 18: kuri\nQuestion: ?\n"
GOLD = [{"text": "Paris is in France.", "start": 15, "end": 34}, {"text": "key 18: kuri", "start": 58, "end": 70}]
TRUTHS = {
    "multi_hop_qa": {"answers": ["France"], "gold": GOLD},
    "single_hop_qa": {"answers": ["Paris"], "gold": GOLD[:1]},
    "retrieval": {"answers": ["kuri"], "gold": GOLD[1:]},
    "reasoning_retrieval": {"answers": ["kuri"], "gold": GOLD[1:]},
    "short_math": {"answers": ["12"]},
    "icl": {"answers": ["7"], "gold": GOLD},
    "long_doc_qa": {"answers": ["B"], "choices": ["Paris", "Lyon", "Nice"]},
    "aggregation": {"answers": ["Paris", ["Lyon", "Lyons"]]},
    "reranking": {"relevance": {"1": 2, "2": 1}, "doc_ids": ["1", "2"], "gold": GOLD},
    "entity_citation": {
        "entities": [{"answers": ["Paris"], "docs": ["1"]}, {"answers": "Lyon", "docs": [2]}],
        "gold": GOLD,
    },
}
assert set(TRUTHS) == set(CATEGORIES) and all(PROMPT[g["start"] : g["end"]] == g["text"] for g in GOLD)


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    path = os.environ.get("RECALLM_FUZZ_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(dict(COUNTS), f, indent=2, sort_keys=True)


# pieces a response is made of: every marker, answer syntax of every category, and garbage
PIECES = [
    "<|start_recall|>",
    "<|end_recall|>",
    "<recall>",
    "</recall>",
    "<think>",
    "</think>",
    "Answer:",
    "**Answer:**",
    "answer :",
    "\n",
    " ",
    "   ",
    ",",
    ";",
    ">",
    "[",
    "]",
    "[1]",
    "[2][1]",
    "[1, 2]",
    "[]",
    "(B)",
    "B",
    "\\boxed{",
    "}",
    "\\boxed{12}",
    "12",
    "1/0",
    "9" * 60,
    "1e999",
    "nan",
    "inf",
    "-0",
    "Paris",
    "Lyon",
    "Lyons",
    "and",
    "the",
    "Paris is in France.",
    "key 18: kuri",
    "kuri",
    "7",
    "\ufffd",
    "\x00",
    "\u03a3",
    "Ⅻ",
    "ǅ",
    "\u2028",
    "$",
    "*",
    "-",
]
responses = st.lists(
    st.sampled_from(PIECES)
    | st.text(max_size=12)
    | st.tuples(st.sampled_from(PIECES), st.integers(2, 400)).map(lambda p: p[0] * p[1]),
    max_size=40,
).map("".join)


def _score(response, gt, **kw):
    COUNTS["score_cases"] += 1
    try:
        return score_response(response, gt, prompt_text=PROMPT, config=CFG, **kw)
    except RecallmError:
        raise
    except Exception:
        COUNTS["score_crashes"] += 1
        raise


@FUZZ
@given(category=st.sampled_from(sorted(TRUTHS)), response=responses, n_tokens=st.none() | st.integers(0, 10**7))
def test_fuzz_any_response_scores_in_range(category, response, n_tokens):
    b = _score(response, {"category": category, **TRUTHS[category]}, n_tokens=n_tokens)
    values = b.as_dict()
    assert all(math.isfinite(v) for v in values.values()), values
    for key in ("score", "format", "answer", "recall", "recall_overlap", "density_penalty", "correctness_penalty"):
        assert 0.0 <= values[key] <= 1.0, (key, values)
    assert b.n_spans == len(parse_response(response).spans)


# any JSON-like value, NaN and infinities included (Python's json reads and writes them)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.sampled_from(["Paris", "1", "2", "B", "abc", "", "Paris is in France."])
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
FIELDS = ["answers", "choices", "gold", "relevance", "doc_ids", "entities"]
gold_items = st.fixed_dictionaries({"text": values, "start": values, "end": values}) | st.sampled_from(GOLD)
entity_items = st.fixed_dictionaries({"answers": values, "docs": values}) | values
field_values = {
    "gold": values | st.lists(gold_items, max_size=3),
    "entities": values | st.lists(entity_items, max_size=3),
    "relevance": values | st.dictionaries(st.sampled_from(["1", "2", "x"]), values, max_size=3),
}


@st.composite
def ground_truths(draw):
    category = draw(st.sampled_from(sorted(TRUTHS)) | values)
    gt = dict(TRUTHS.get(category, {})) if isinstance(category, str) else {}
    gt["category"] = category
    for field in draw(st.sets(st.sampled_from(FIELDS), max_size=3)):
        gt[field] = draw(field_values.get(field, values))
    return gt


@FUZZ
@given(gt=ground_truths(), response=responses, as_json=st.booleans())
def test_fuzz_ground_truth_check_accepts_or_names_the_problem(gt, response, as_json):
    COUNTS["ground_truth_cases"] += 1
    source = json.dumps(gt) if as_json else gt
    try:
        check_ground_truth(source, None, CFG)
    except RecallmError:
        COUNTS["ground_truth_refused"] += 1
        return
    except Exception:
        COUNTS["ground_truth_crashes"] += 1
        raise
    COUNTS["ground_truth_accepted"] += 1
    try:
        b = _score(response, source, n_tokens=100)
    except RecallmError as exc:  # only a gold passage that is not in the prompt may be refused here
        assert "does not occur in the prompt" in str(exc), exc
        return
    assert all(math.isfinite(v) for v in b.as_dict().values())


# ---- the linear-time parsers against the regular expressions they replaced (short inputs only)
_OLD_CITED_ITEM = re.compile(r"([^\[\]\n;]*?)\s*((?:\[[^\[\]]+\]\s*)+)")
_OLD_ITEM_SPLIT = re.compile(r"\s*[\n;,]\s*")
_OLD_BOXED = re.compile(r"\\boxed\s*\{(.*)\}", re.DOTALL)
short_text = st.lists(
    st.sampled_from(
        ["[", "]", "[1]", "[2, 3]", " ", "\n", ";", ",", "a", "Paris", "\\boxed", "{", "}", "-", "'", "the"]
    )
    | st.text(max_size=4),
    max_size=25,
).map("".join)


def _old_parse_citations(answer):
    items = []
    for line in re.split(r"[\n;]", answer):
        pos = 0
        for m in _OLD_CITED_ITEM.finditer(line):
            text = m.group(1).strip().strip(",").strip()
            ids = [
                i.strip() for group in re.findall(r"\[([^\[\]]+)\]", m.group(2)) for i in group.split(",") if i.strip()
            ]
            items.append((text, ids))
            pos = m.end()
        rest = line[pos:].strip().strip(",").strip()
        items += [(p, []) for p in filter(None, (p.strip() for p in rest.split(",")))]
    return [(t, i) for t, i in items if t or i]


@FUZZ
@given(short_text)
def test_parsers_mean_what_the_old_regexes_meant(text):
    COUNTS["parser_cases"] += 1
    assert metrics.parse_citations(text) == _old_parse_citations(text)
    old_items = [
        item
        for item in (
            r.strip().strip("-*•").strip().strip("'\"").strip() for r in _OLD_ITEM_SPLIT.split(text.strip().strip("[]"))
        )
        if metrics.normalize_tokens(item)
    ]
    assert metrics.split_items(text) == old_items
    m = _OLD_BOXED.search(text.strip())
    assert metrics._boxed(text.strip()) == (m.group(1) if m else None)


@FUZZ
@given(st.text(alphabet=st.characters(blacklist_characters="[]\n;,\x00"), max_size=30))
def test_named_items_match_token_normalisation(segment):
    COUNTS["parser_cases"] += 1
    key = metrics.canonical(segment)
    assert metrics.named_items(segment) == ({key} if key else set())
